use super::*;

/// A small report shared by the doctor's tests.
pub(crate) fn report() -> Report {
    Report {
        checks: vec![
            CheckResult::pass("backend", "NVML 550.54.15, 2 GPUs"),
            CheckResult::new("state", Status::Warn, "mode 0755", "chmod 700 /var/lib/edra"),
        ],
    }
}

#[test]
fn exit_code_is_one_only_when_a_check_fails() {
    let mut r = report();
    assert_eq!(r.worst(), Status::Warn);
    assert_eq!(r.exit_code(), 0);
    r.checks.push(CheckResult::skip("api-permissions", "API server not reachable"));
    assert_eq!(r.exit_code(), 0);
    r.checks.push(CheckResult::new("api-server", Status::Fail, "connection refused", "start it"));
    assert_eq!((r.worst(), r.exit_code()), (Status::Fail, 1));
    assert_eq!(Report::default().exit_code(), 0);
}

#[test]
fn text_from_outside_in_a_check_is_shown_escaped() {
    let hostile = "forbidden\x1b]0;owned\x07\x1b[2J\r\nFAKE LINE: all GPUs healthy";
    let check = CheckResult::new("api", Status::Fail, hostile, "ask \u{9b}31m");
    assert!(!check.detail.chars().any(crate::util::is_control), "{:?}", check.detail);
    assert!(check.detail.contains("\\u{1b}]0;owned\\u{7}"), "{}", check.detail);
    assert_eq!(check.fix, "ask \\u{9b}31m");
}
