use std::ffi::OsStr;

use tracing::Level;

use super::{LogStyle, lines, syslog_priority};
use crate::config::LogFormat;
use crate::test_support::captured_logs::CapturedLogs;

fn os(s: &str) -> Option<&OsStr> {
    Some(OsStr::new(s))
}

#[test]
fn colour_only_on_a_terminal_and_never_with_no_color() {
    let style = |no_color, terminal| LogStyle::decide(None, no_color, terminal, Some((1, 2)));
    assert!(style(None, true).ansi);
    assert!(!style(None, false).ansi, "a redirected stderr gets no escape codes");
    assert!(!style(os("1"), true).ansi);
    // The NO_COLOR convention: set and not empty.
    assert!(style(os(""), true).ansi);
    assert!(!style(None, true).journald);
}

#[test]
fn the_journal_is_recognised_by_stderrs_device_and_inode() {
    let journald = LogStyle::decide(os("8:12345"), None, false, Some((8, 12345)));
    assert_eq!(journald, LogStyle { ansi: false, journald: true });
    // Inherited by a process whose stderr now goes elsewhere.
    assert!(!LogStyle::decide(os("8:12345"), None, false, Some((8, 999))).journald);
    assert!(!LogStyle::decide(os("8:12345"), None, true, None).journald);
    for bad in ["", "8", "8:", ":1", "x:y", "8:1:2"] {
        assert!(!LogStyle::decide(os(bad), None, false, Some((8, 1))).journald, "{bad:?}");
    }
    // A terminal that is also the journal stream (not a real case) still gets no colour.
    assert!(!LogStyle::decide(os("8:1"), None, true, Some((8, 1))).ansi);
}

#[test]
fn levels_map_to_syslog_priorities() {
    let got: Vec<&str> =
        [Level::ERROR, Level::WARN, Level::INFO, Level::DEBUG, Level::TRACE].iter().map(syslog_priority).collect();
    assert_eq!(got, ["<3>", "<4>", "<6>", "<7>", "<7>"]);
}

/// What an API server may put in an error message: a new window title, a cleared screen,
/// and a line of its own.
const HOSTILE: &str = "\u{1b}]0;owned\u{7}\u{1b}[2J\r\nFAKE LINE: all GPUs healthy \u{9b}2J\u{7f}";

/// One event carrying [`HOSTILE`] in every way a field reaches a line, written by the
/// layer the agent installs.
fn logged(format: LogFormat, style: LogStyle) -> String {
    use tracing_subscriber::layer::SubscriberExt;
    let out = CapturedLogs::default();
    let subscriber = tracing_subscriber::registry().with(lines(format, style, out.clone()));
    tracing::subscriber::with_default(subscriber, || {
        let err = std::io::Error::other(HOSTILE);
        let span = tracing::info_span!("claim", claim = %HOSTILE);
        let _entered = span.enter();
        tracing::warn!(error = %HOSTILE, debug = ?HOSTILE, text = HOSTILE, cause = &err as &dyn std::error::Error, "refused: {HOSTILE}");
    });
    out.text()
}

#[test]
fn text_from_outside_cannot_act_on_a_terminal_or_forge_a_log_line() {
    let plain = LogStyle { ansi: false, journald: false };
    let styles = [plain, LogStyle { ansi: true, journald: false }, LogStyle { ansi: false, journald: true }];
    for style in styles {
        let line = logged(LogFormat::Text, style);
        assert_eq!(line.matches('\n').count(), 1, "one line, ended by its own newline: {line:?}");
        assert!(line.ends_with('\n') && !line.contains('\r'), "{line:?}");
        assert!(!line.chars().any(|c| matches!(c, '\u{7}' | '\u{7f}'..='\u{9f}')), "{line:?}");
        // The only ESC left is the formatter's own colour, which starts `ESC [` and a digit.
        let escapes = line
            .match_indices('\u{1b}')
            .map(|(i, _)| &line[i + 1..])
            .filter(|rest| !(rest.starts_with('[') && rest[1..].starts_with(|c: char| c.is_ascii_digit())));
        assert_eq!(escapes.count(), 0, "{line:?}");
        assert_eq!(line.contains("\u{1b}[2m"), style.ansi, "colours as before: {line:?}");
        let shown = "\\u{1b}]0;owned\\u{7}\\u{1b}[2J\\u{d}\\u{a}FAKE LINE: all GPUs healthy \\u{9b}2J\\u{7f}";
        assert!(line.contains(&format!("refused: {shown}")), "{line:?}");
        assert!(line.contains(&format!("claim{{claim={shown}}}")) || style.ansi, "{line:?}");
        // Quoted fields are `Debug` text, whose escapes (`\r\n`) were never raw.
        assert_eq!(line.matches(shown).count(), 4, "message, span and each shown field: {line:?}");
    }
}

#[test]
fn json_lines_stay_one_valid_object_with_every_control_character_escaped() {
    for journald in [false, true] {
        let line = logged(LogFormat::Json, LogStyle { ansi: false, journald });
        assert_eq!(line.matches('\n').count(), 1, "{line:?}");
        assert!(!line.trim_end().chars().any(crate::util::is_control), "{line:?}");
        let object = line.strip_prefix("<4>").unwrap_or(&line);
        let value: serde_json::Value = serde_json::from_str(object).expect("a JSON object");
        assert_eq!(value["message"], format!("refused: {HOSTILE}"), "the text itself is kept: {value}");
        assert_eq!(value["error"], HOSTILE);
        assert_eq!(value["span"]["claim"], HOSTILE);
        assert!(line.contains("\\u009b2J\\u007f"), "{line:?}");
    }
}
