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
