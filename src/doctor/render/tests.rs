use super::super::CheckResult;
use super::super::tests::report;
use super::*;

#[test]
fn json_has_checks_and_summary() {
    let v = report().to_json();
    assert_eq!(v["checks"][1]["name"], "state");
    assert_eq!(v["checks"][1]["status"], "warn");
    assert_eq!(v["checks"][1]["fix"], "chmod 700 /var/lib/edra");
    assert_eq!(v["summary"]["pass"], 1);
    assert_eq!(v["summary"]["warn"], 1);
    assert_eq!(v["summary"]["worst"], "warn");
    assert_eq!(v["summary"]["exit_code"], 0);
}

#[test]
fn table_aligns_columns_and_wraps_long_text() {
    let t = report().to_table();
    let lines: Vec<&str> = t.lines().collect();
    assert!(lines[0].starts_with("STATUS  CHECK    DETAIL"), "{t}");
    assert!(lines[1].starts_with("PASS    backend  NVML 550.54.15, 2 GPUs"), "{t}");
    assert!(lines[2].starts_with("WARN    state    mode 0755") && lines[2].ends_with("chmod 700 /var/lib/edra"), "{t}");
    assert!(t.contains("1 passed, 1 warnings, 0 failed, 0 skipped"), "{t}");
    let long = Report { checks: vec![CheckResult::pass("x", "word ".repeat(40))] };
    let t = long.to_table();
    assert!(t.lines().filter(|l| l.contains("word")).all(|l| l.chars().count() <= 6 + 2 + 5 + 2 + DETAIL_WIDTH), "{t}");
    assert_eq!(t.lines().filter(|l| l.contains("word")).count(), 4, "{t}");
}

#[test]
fn texts_become_one_line() {
    let e = "no Kubernetes credentials found; tried:\n  - KUBECONFIG: not set\n  - in-cluster: no\nset one";
    assert_eq!(one_line(e), "no Kubernetes credentials found; tried: KUBECONFIG: not set; in-cluster: no; set one");
    assert_eq!(CheckResult::pass("a", "x\ny").detail, "x y");
    assert_eq!(one_line("a\n- b"), "a; b");
}

#[test]
fn wrapping() {
    assert_eq!(wrap("aa bb cc", 5), ["aa bb", "cc"]);
    assert_eq!(wrap("abcdefgh", 3), ["abc", "def", "gh"]);
    assert_eq!(wrap("", 3), [""]);
}
