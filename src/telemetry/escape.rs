//! Log lines that show text from outside without letting it act. An API server's message,
//! a claim's name or a driver's string may hold control characters: ESC sequences that
//! retitle or clear the terminal a person reads the log on, or CR/LF that would start a
//! forged line of its own. Every field and message of every event passes through here on
//! its way into a line, so no call site has to remember it:
//!
//! - text lines: [`EscapedFields`] formats the fields as tracing-subscriber's own
//!   `DefaultFields` does, with each value's control characters written as `\u{1b}`
//!   ([`crate::util::escape_controls`]); the formatter's own colours and the line's
//!   newline are written around the fields and stay as they are;
//! - JSON lines: serde_json already escapes C0 inside strings; [`JsonEscaped`] writes the
//!   DEL and C1 characters it passes through as `\u009b` escapes, so each line stays one
//!   valid JSON object.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultFields, DefaultVisitor, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::util::escape_controls;

/// Fields as `DefaultFields` writes them, control characters escaped.
#[derive(Debug, Default)]
pub struct EscapedFields(DefaultFields);

impl<'a> MakeVisitor<Writer<'a>> for EscapedFields {
    type Visitor = Escaping<DefaultVisitor<'a>>;

    fn make_visitor(&self, target: Writer<'a>) -> Self::Visitor {
        Escaping(self.0.make_visitor(target))
    }
}

/// A visitor that hands `V` each value with its control characters escaped.
pub struct Escaping<V>(V);

impl<V: Visit> Visit for Escaping<V> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.record_debug(field, &Escaped(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        // As `DefaultVisitor`: the message bare, other text quoted.
        match field.name() {
            "message" => self.0.record_debug(field, &Escaped(&format_args!("{value}"))),
            _ => self.0.record_debug(field, &Escaped(&value)),
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let chain = crate::util::error_chain(value);
        self.0.record_debug(field, &Escaped(&format_args!("{chain}")));
    }
}

impl<V: VisitOutput<fmt::Result>> VisitOutput<fmt::Result> for Escaping<V> {
    fn finish(self) -> fmt::Result {
        self.0.finish()
    }
}

impl<V: VisitFmt> VisitFmt for Escaping<V> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        self.0.writer()
    }
}

/// `Debug` of the value inside, its control characters escaped as they are written.
struct Escaped<'a>(&'a dyn fmt::Debug);

impl fmt::Debug for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::write(&mut EscapingWriter(f), format_args!("{:?}", self.0))
    }
}

struct EscapingWriter<'a, 'b>(&'a mut fmt::Formatter<'b>);

impl fmt::Write for EscapingWriter<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.write_str(&escape_controls(s))
    }
}

/// A JSON line from `F` with the raw DEL and C1 characters in its strings escaped.
pub struct JsonEscaped<F>(pub F);

impl<S, N, F> FormatEvent<S, N> for JsonEscaped<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        writer.write_str(&crate::util::escape_json_controls(&line))
    }
}
