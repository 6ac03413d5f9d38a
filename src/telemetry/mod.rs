//! Logging, metrics and health checks.
//!
//! This file sets up logging: human-readable or JSON lines on stderr, filtered by
//! `log.level`. Structured fields (`claim.uid`, `device`, `pool`) carry the context;
//! secrets never do: types that hold tokens, keys or certificates redact themselves in
//! `Debug`. How lines look depends on where stderr goes ([`LogStyle`]): colour only on a
//! terminal and never with `NO_COLOR`; under systemd's journal no timestamps (the journal
//! keeps its own) and an sd-daemon priority prefix (`<3>` error … `<7>` debug) on each
//! line. Control characters in any field or message are written escaped (`\u{1b}`), so
//! text from outside cannot act on a terminal or forge a line (`escape`). [`metrics`] holds the Prometheus registry, [`http`] serves it with `/healthz`
//! and `/readyz` on `metrics.address`; [`sdnotify`] speaks systemd's notification protocol
//! (ready, stopping, watchdog).

mod escape;
mod gpu_use;
pub mod http;
pub mod metrics;
pub mod sdnotify;
#[cfg(test)]
mod tests;

use std::ffi::OsStr;
use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::LogFormat;

/// How log lines are written, decided once from the process's environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogStyle {
    /// ANSI colours: stderr is a terminal, `NO_COLOR` is unset or empty, not the journal.
    pub ansi: bool,
    /// stderr is systemd's journal stream (`JOURNAL_STREAM` names its device and inode):
    /// no timestamps, and a syslog priority prefix on each line.
    pub journald: bool,
}

impl LogStyle {
    /// The style for this process's stderr and environment.
    pub fn detect() -> Self {
        use std::io::IsTerminal;
        use std::os::fd::AsFd;
        use std::os::unix::fs::MetadataExt;
        let stderr = std::io::stderr();
        let id = stderr
            .as_fd()
            .try_clone_to_owned()
            .ok()
            .and_then(|fd| std::fs::File::from(fd).metadata().ok())
            .map(|m| (m.dev(), m.ino()));
        Self::decide(
            std::env::var_os("JOURNAL_STREAM").as_deref(),
            std::env::var_os("NO_COLOR").as_deref(),
            stderr.is_terminal(),
            id,
        )
    }

    /// The style from its inputs: `JOURNAL_STREAM` (`<device>:<inode>`, decimal), `NO_COLOR`,
    /// whether stderr is a terminal, and stderr's device and inode. A `JOURNAL_STREAM`
    /// inherited by a process whose stderr was redirected elsewhere does not count.
    pub fn decide(
        journal_stream: Option<&OsStr>,
        no_color: Option<&OsStr>,
        terminal: bool,
        stderr: Option<(u64, u64)>,
    ) -> Self {
        let journal = journal_stream.and_then(OsStr::to_str).and_then(|s| {
            let (dev, ino) = s.trim().split_once(':')?;
            Some((dev.parse::<u64>().ok()?, ino.parse::<u64>().ok()?))
        });
        let journald = journal.is_some() && journal == stderr;
        let no_color = no_color.is_some_and(|v| !v.is_empty());
        LogStyle { ansi: terminal && !no_color && !journald, journald }
    }
}

/// The sd-daemon(3) prefix for `level`: err, warning, info, debug.
pub fn syslog_priority(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "<3>",
        Level::WARN => "<4>",
        Level::INFO => "<6>",
        Level::DEBUG | Level::TRACE => "<7>",
    }
}

/// Puts the event's syslog priority in front of what `F` writes.
struct Priority<F>(F);

impl<S, N, F> FormatEvent<S, N> for Priority<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        // The line after the prefix starts with its text, not with the level's padding.
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        writer.write_str(syslog_priority(event.metadata().level()))?;
        writer.write_str(line.trim_start())
    }
}

/// Installs the global subscriber, styled for this process's stderr. Safe to call more
/// than once (later calls are ignored), so tests that run several agents in one process do
/// not fail.
pub fn init(format: LogFormat, level: &str) {
    init_with(format, level, LogStyle::detect());
}

/// [`init`] with a given style.
pub fn init_with(format: LogFormat, level: &str, style: LogStyle) {
    // The configuration checked the filter; one that does not parse here logs at INFO.
    let filter: Targets = level.parse().unwrap_or_else(|_| Targets::new().with_default(LevelFilter::INFO));
    // The filter sits right on the registry, so its most verbose level is also the global
    // one (what `log` records from dependencies are checked against first).
    let _ = tracing_subscriber::registry().with(filter).with(lines(format, style, std::io::stderr)).try_init();
}

/// The layer that writes log lines to `writer` in `format` and `style`, every field's
/// control characters escaped.
pub fn lines<S, W>(format: LogFormat, style: LogStyle, writer: W) -> Box<dyn Layer<S> + Send + Sync + 'static>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::fmt::format as line;
    let layer = tracing_subscriber::fmt::layer().with_writer(writer).with_ansi(style.ansi);
    let json = || line().json().flatten_event(true).with_current_span(true);
    match (format, style.journald) {
        (LogFormat::Text, false) => Box::new(layer.fmt_fields(escape::EscapedFields::default()).with_target(true)),
        (LogFormat::Text, true) => Box::new(
            layer
                .fmt_fields(escape::EscapedFields::default())
                .event_format(Priority(line().with_target(true).with_ansi(false).without_time())),
        ),
        (LogFormat::Json, false) => Box::new(layer.json().event_format(escape::JsonEscaped(json()))),
        // JSON keeps its timestamp field: log shippers read it from the object.
        (LogFormat::Json, true) => Box::new(layer.json().event_format(Priority(escape::JsonEscaped(json())))),
    }
}
