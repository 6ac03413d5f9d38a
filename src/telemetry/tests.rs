use std::ffi::OsStr;

use tracing::Level;

use super::{LogStyle, syslog_priority};

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
