//! Log lines captured on one test's thread, for asserting what edra reports, while other
//! tests run on other threads of the same process.
//!
//! `tracing` decides once per call site, for the whole process, whether anybody may want
//! its events (the call site's *interest*). While a single subscriber is registered, that
//! decision is taken against the default subscriber of whichever thread reaches the call
//! site first. A sibling test's thread has none, so without care a call site it reaches
//! first is switched off for every thread, the capturing one included, and the capture
//! comes back without the line under test. [`CapturedLogs::start_at`] therefore registers
//! [`Undecided`] first: with two subscribers registered, every call site's interest is
//! the combination of both, and `Undecided` never lets it be "never".
//!
//! This file is compiled into the integration tests and, by path, into the library's
//! unit tests.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::{DefaultGuard, Interest};
use tracing::{Dispatch, Event, Metadata, level_filters::LevelFilter};
use tracing_subscriber::layer::SubscriberExt;

/// Log lines captured from the current thread (the test's current-thread runtime runs the
/// agent's tasks there).
#[derive(Clone, Default)]
pub struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl CapturedLogs {
    /// Captures `edra` events at `warn` and above on this thread until the guard drops.
    pub fn start() -> (CapturedLogs, DefaultGuard) {
        Self::start_at("warn")
    }

    /// [`CapturedLogs::start`] from `level` up (a filter list whose first entry applies to
    /// `edra`, such as `info,edra::plugin::dra=debug`).
    pub fn start_at(level: &str) -> (CapturedLogs, DefaultGuard) {
        UNDECIDED.get_or_init(|| Dispatch::new(Undecided));
        let logs = CapturedLogs::default();
        let filter: tracing_subscriber::filter::Targets = format!("edra={level}").parse().expect("a log filter");
        // Built as the agent builds its own: the filter on the registry, the lines above it.
        let subscriber = tracing_subscriber::registry()
            .with(filter)
            .with(tracing_subscriber::fmt::layer().with_ansi(false).with_writer(logs.clone()));
        let guard = tracing::subscriber::set_default(subscriber);
        (logs, guard)
    }

    /// Everything captured so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

impl std::io::Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for CapturedLogs {
    type Writer = CapturedLogs;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Registered (never installed) for the rest of the process by the first capture.
static UNDECIDED: OnceLock<Dispatch> = OnceLock::new();

/// A subscriber that records nothing and answers "sometimes" for every call site, so that
/// a call site's interest is asked again of the current thread's subscriber at each event.
/// Its level hint is `OFF`: alone, it leaves the process's maximum level where it was.
struct Undecided;

impl tracing::Subscriber for Undecided {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::sometimes()
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::OFF)
    }

    fn enabled(&self, _: &Metadata<'_>) -> bool {
        false
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, _: &Event<'_>) {}

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}
