//! Where the time of one call goes: a tracing layer that times the spans edra opens on its
//! prepare path (`prepare.*`, `claim.*`, `http.*`, `state.*`, at trace level, so off in
//! production) and keeps, per span name, how long each took from creation to close, and
//! how long it waited before it was first entered (a blocking task's wait for a thread).
//! Installed by a bench as the process's subscriber only when it prints the breakdown:
//! it costs every span a few microseconds. Only spans inside a claim's `prepare` span
//! count.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::span::{Attributes, Id};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

use super::{Samples, latency_header};

/// The spans of one call, by name: (wall time, wait before first entered).
pub type Times = HashMap<&'static str, Vec<(Duration, Duration)>>;

/// The layer and what it collected since the last [`Phases::take`].
#[derive(Clone, Default)]
pub struct Phases {
    times: Arc<Mutex<Times>>,
}

struct Opened {
    at: Instant,
    entered: Option<Instant>,
}

impl Phases {
    /// Installs a layer timing edra's spans (and nothing else) as the global subscriber.
    pub fn install() -> Phases {
        let phases = Phases::default();
        let only_spans = tracing_subscriber::filter::filter_fn(|m| m.is_span() && m.target().starts_with("edra"));
        tracing_subscriber::registry().with(phases.clone().with_filter(only_spans)).init();
        phases
    }

    /// What was collected since the last call, which starts afresh.
    pub fn take(&self) -> Times {
        std::mem::take(&mut *self.times.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl<S> Layer<S> for Phases
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, _attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Opened { at: Instant::now(), entered: None });
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(opened) = span.extensions_mut().get_mut::<Opened>()
        {
            opened.entered.get_or_insert_with(Instant::now);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        // Only a prepare's own spans: not a claim status PATCH running beside it.
        if !span.scope().any(|s| s.name() == "prepare") {
            return;
        }
        let ext = span.extensions();
        let Some(opened) = ext.get::<Opened>() else { return };
        let wall = opened.at.elapsed();
        let wait = opened.entered.map_or(Duration::ZERO, |e| e.saturating_duration_since(opened.at));
        let mut times = self.times.lock().unwrap_or_else(PoisonError::into_inner);
        times.entry(span.name()).or_default().push((wall, wait));
    }
}

/// The steps of a first-time prepare, in the order they run, with their depth in the
/// call: edra's spans (see `common::phases`), timed from creation to close.
const STEPS: [(&str, usize, &str); 17] = [
    ("prepare", 1, "edra's part: the claim's prepare"),
    ("prepare.lock", 2, "the claim's lock"),
    ("prepare.lookup", 2, "its record looked up (sled)"),
    ("prepare.fetch", 2, "the claim read"),
    ("claim.request", 3, "the GET, body read"),
    ("http.throttle", 4, "rate limit"),
    ("http.headers", 4, "sent → answer's headers"),
    ("http.body", 4, "body"),
    ("claim.decode", 3, "decoded and checked"),
    ("prepare.plan", 2, "planned"),
    ("prepare.apply", 2, "applied (blocking pool)"),
    ("prepare.blocking", 3, "blocking work, from its hand-over"),
    ("prepare.spec_build", 4, "CDI spec built"),
    ("prepare.spec_write", 4, "CDI spec written (fsync, rename, dir fsync)"),
    ("prepare.record", 4, "recorded (durable)"),
    ("state.flush", 5, "sled flush"),
    ("state.fsync", 5, "fsync of sled's log"),
];

/// A first-time prepare's steps over many calls (`BENCH_PHASES`).
#[derive(Default)]
pub struct Steps {
    each: std::collections::HashMap<&'static str, Samples>,
    /// Waits of the blocking work for a thread of the pool.
    hop: Samples,
    /// The call at the client less edra's prepare span: gRPC both ways, the answer.
    outside: Samples,
}

impl Steps {
    pub fn add(&mut self, times: Times, call: Duration) {
        for (name, list) in &times {
            for (wall, wait) in list {
                self.each.entry(name).or_default().push(*wall);
                if *name == "prepare.blocking" {
                    self.hop.push(*wait);
                }
            }
        }
        if let Some([(prepare, _)]) = times.get("prepare").map(Vec::as_slice) {
            self.outside.push(call.saturating_sub(*prepare));
        }
    }

    pub fn print(&self) {
        println!("## Where a first-time prepare's time goes (edra's spans, timed in the same calls)\n");
        println!("{}", latency_header());
        println!("{}", self.outside.row("call at the client less edra's part (gRPC)"));
        for (name, depth, what) in STEPS {
            let Some(samples) = self.each.get(name) else { continue };
            println!("{}", samples.row(&format!("{}{what}", "  ".repeat(depth - 1))));
            if name == "prepare.blocking" {
                println!("{}", self.hop.row("    wait for a blocking thread"));
            }
        }
        println!();
    }
}
