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

#[test]
fn on_a_fake_jetson_the_backend_and_its_csv_lists_are_checked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = crate::test_support::tegra::make(dir.path(), &[("libcuda.so.1.1", b"cuda")]);
    let mut cfg =
        test_config(dir.path(), &[("backend", "tegra"), ("nvml.library", "libnvidia-ml-absent-for-tests.so.1")]);
    cfg.paths.proc_root = dir.path().join("proc");
    let (backend, discovered) = host::backend(&cfg);
    assert_eq!(backend.status, Status::Pass, "{backend:?}");
    assert!(
        backend.detail.contains("Jetson NVIDIA Jetson AGX Orin Developer Kit (tegra234, L4T 36.4.3)"),
        "{}",
        backend.detail
    );
    assert_eq!(host::device_nodes(&cfg, discovered.as_ref()).status, Status::Skip);
    let jetson = jetson::check(&cfg, discovered.as_ref());
    let want = if fake.nodes { Status::Pass } else { Status::Warn };
    assert_eq!(jetson.status, want, "{jetson:?}");
    assert!(
        jetson.detail.contains("1 libraries, 2 links, 1 folders") && jetson.detail.contains("no MPS"),
        "{}",
        jetson.detail
    );
    std::fs::remove_dir_all(dir.path().join("driver").join(crate::prepare::driver_files::csv::CSV_DIR)).expect("rm");
    let jetson = jetson::check(&cfg, discovered.as_ref());
    assert_eq!(jetson.status, Status::Fail, "{jetson:?}");
    assert!(jetson.detail.contains("no CSV files in"), "{}", jetson.detail);
    let mock = test_config(dir.path(), &[]);
    assert_eq!(jetson::check(&mock, host::backend(&mock).1.as_ref()).status, Status::Skip);
}
