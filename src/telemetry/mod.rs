//! Logging, metrics and health checks.
//!
//! This file sets up logging: human-readable or JSON lines on stderr, filtered by
//! `log.level`. Structured fields (`claim.uid`, `device`, `pool`) carry the context;
//! secrets never do: types that hold tokens, keys or certificates redact themselves in
//! `Debug`. [`metrics`] holds the Prometheus registry, [`http`] serves it with `/healthz`
//! and `/readyz` on `metrics.address`; [`sdnotify`] speaks systemd's notification protocol
//! (ready, stopping, watchdog).

pub mod http;
pub mod metrics;
pub mod sdnotify;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber. Safe to call more than once (later calls are ignored),
/// so tests that run several agents in one process do not fail.
pub fn init(format: LogFormat, level: &str) {
    let filter = EnvFilter::builder().parse_lossy(level);
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.with_target(true).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).try_init(),
    };
}
