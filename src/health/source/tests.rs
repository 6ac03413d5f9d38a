//! The mock events file: lines, events, and what an overlong or bad line costs.

use super::*;
use crate::test_support::captured_logs;

#[test]
fn lines_name_events_by_gpu_index() {
    let m = MockHealth::new("n1", 2, None);
    let gpu0 = crate::inventory::mock::gpu_uuid("n1", 0);
    assert_eq!(m.parse("xid 0 79").expect("xid"), Some(Event::Xid { gpu: gpu0.clone(), xid: 79 }));
    assert_eq!(m.parse("  # a comment").expect("comment"), None);
    assert_eq!(m.parse("lost 0").expect("lost"), Some(Event::Lost { gpu: Some(gpu0.clone()) }));
    assert!(!m.probe(&gpu0), "a lost GPU fails the probe");
    assert_eq!(m.parse("back 0").expect("back"), Some(Event::Probe { gpu: gpu0.clone(), ok: true }));
    assert!(m.probe(&gpu0));
    assert!(m.parse("xid 2 79").expect_err("no GPU 2").contains("does not exist"));
    assert!(m.parse("xid 0 lots").is_err());
    assert!(m.parse("reboot").is_err());
    assert_eq!(m.recovery_action(&gpu0), None);
    assert_eq!(m.parse("recovery 0 0").expect("recovery"), None);
    assert_eq!(m.recovery_action(&gpu0), Some(0));
}

#[test]
fn the_file_is_read_as_it_grows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("events");
    std::fs::write(&path, "xid 0 1\n").expect("write");
    let mut offset = std::fs::metadata(&path).expect("stat").len();
    assert_eq!(read_from(&path, &mut offset).expect("read"), b"");
    std::fs::write(&path, "xid 0 1\nxid 0 79\n").expect("append");
    assert_eq!(read_from(&path, &mut offset).expect("read"), b"xid 0 79\n");
    std::fs::write(&path, "x\n").expect("truncate");
    assert_eq!(read_from(&path, &mut offset).expect("read"), b"x\n", "a shrunk file is read from its start");
}

#[test]
fn lines_are_split_across_reads_and_an_overlong_one_is_skipped_holding_only_its_prefix() {
    let mut lines = Lines::default();
    let mut out = Vec::new();
    lines.push(b"xid 0 ", &mut |l| out.push(l));
    lines.push(b"79\nback", &mut |l| out.push(l));
    assert_eq!(out, [Line::Whole("xid 0 79".into())]);
    lines.push(b" 1\n", &mut |l| out.push(l));
    assert_eq!(out[1], Line::Whole("back 1".into()));
    out.clear();
    // 50 MB without a newline, 1 MiB at a time (as read_from reads), then a good line.
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..50 {
        lines.push(&chunk, &mut |l| out.push(l));
        assert!(lines.partial.capacity() <= MAX_LINE, "holds {} bytes", lines.partial.capacity());
    }
    lines.push(b"x\nxid 1 79\n", &mut |l| out.push(l));
    let prefix = format!("{}…", "x".repeat(LOGGED_PREFIX));
    assert_eq!(out, [Line::TooLong { prefix, bytes: 50 * (1 << 20) + 1 }, Line::Whole("xid 1 79".into())]);
    // Exactly MAX_LINE bytes is still a line.
    out.clear();
    lines.push(&[b' '; MAX_LINE], &mut |l| out.push(l));
    lines.push(b"\n", &mut |l| out.push(l));
    assert!(matches!(&out[..], [Line::Whole(l)] if l.len() == MAX_LINE));
}

#[test]
fn a_50_mb_line_is_logged_by_its_prefix_and_the_next_event_still_counts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("events");
    std::fs::write(&path, "").expect("create");
    let m = MockHealth::new("n1", 2, Some(path.clone()));
    let mut text = "y".repeat(50_000_000);
    text.push_str("\nxid 1 79\n");
    std::fs::write(&path, text).expect("write a 50 MB line");
    let (logs, _guard) = captured_logs::CapturedLogs::start();
    let stop = AtomicBool::new(false);
    let seen = Mutex::new(Vec::new());
    let sink = |e: Event| {
        if matches!(e, Event::Xid { .. }) {
            stop.store(true, Ordering::Relaxed);
        }
        seen.lock().unwrap().push(e);
    };
    m.watch(&["gpu".into()], &sink, &stop);
    let xid = Event::Xid { gpu: crate::inventory::mock::gpu_uuid("n1", 1), xid: 79 };
    assert_eq!(seen.lock().unwrap().last(), Some(&xid));
    let logged = logs.text();
    let warned: Vec<&str> = logged.lines().filter(|l| l.contains("ignoring a line")).collect();
    assert_eq!(warned.len(), 1, "{logged:.2000}");
    assert!(warned[0].len() < 500, "a short log line: {} bytes", warned[0].len());
    assert!(warned[0].contains("longer than 4096 bytes") && warned[0].contains("bytes=50000000"), "{}", warned[0]);
}

#[test]
fn a_jetson_without_thors_nvml_is_reported_unmonitored_with_the_reason() {
    let mut cfg = crate::config::Config::defaults_for("jetson-1");
    cfg.nvml.library = "libnvidia-ml-absent-for-tests.so.1".into();
    let health = crate::health::backend_for(&cfg, "tegra");
    let seen = std::sync::Mutex::new(Vec::new());
    health.watch(&["GPU-1".to_string()], &|e| seen.lock().expect("lock").push(e), &AtomicBool::new(false));
    assert_eq!(
        seen.into_inner().expect("lock"),
        vec![Event::Unmonitored { gpu: "GPU-1".into(), reason: crate::health::NO_TEGRA_EVENTS.into() }]
    );
}
