use super::*;
use crate::test_support::gpu::FakeMpsControl;

const GPU_A: &str = "GPU-00000000-aaaa-bbbb-cccc-000000000000";
const GPU_B: &str = "GPU-00000001-aaaa-bbbb-cccc-000000000000";

/// A daemon's private mount namespace needs root: tests that start one skip (saying so)
/// without it.
pub(crate) fn root_or_skip(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("{test}: skipped, starting an MPS daemon in its own mount namespace needs root");
    }
    root
}

fn spec(id: &str, gpus: &[&str]) -> DaemonSpec {
    DaemonSpec {
        id: id.into(),
        gpus: gpus.iter().map(|g| g.to_string()).collect(),
        active_thread_percentage: None,
        pinned_memory_mib: Vec::new(),
    }
}

fn supervisor(root: &Path, fake: &FakeMpsControl) -> Supervisor {
    Supervisor {
        settings: MpsSettings {
            control: fake.path.clone(),
            control_key: "paths.mps_control",
            runtime_dir: root.join("run"),
            proc_root: PathBuf::from("/proc"),
            // Generous: the machine running the tests may be loaded.
            ready_timeout: Duration::from_secs(20),
            quit_grace: Duration::from_secs(10),
            library_dir: None,
        },
    }
}

#[test]
fn a_daemon_starts_for_its_gpus_answers_and_quits_as_root() {
    if !root_or_skip("a_daemon_starts_for_its_gpus_answers_and_quits_as_root") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeMpsControl::install(&tmp.path().join("bin"));
    let sup = supervisor(tmp.path(), &fake);
    let daemon = sup.start(&spec("claim-1", &[GPU_A, GPU_B])).unwrap();
    assert!(sup.is_running(&daemon));
    let dirs = sup.settings.dirs("claim-1");
    assert_eq!(dirs.pipe, tmp.path().join("run/mps/claim-1/pipe"));
    assert_eq!(std::fs::read_to_string(dirs.pipe.join(PID_FILE)).unwrap().trim(), daemon.pid.to_string());
    assert_eq!(fake.calls()[..2], [format!("-d CUDA_VISIBLE_DEVICES={GPU_A},{GPU_B}"), "get_server_list".into()]);
    assert!(log_tail(&dirs).contains(&format!("control daemon started for {GPU_A},{GPU_B}")), "{}", log_tail(&dirs));
    // Another identity with the same pid (a reused pid) is not the daemon.
    assert!(!sup.is_running(&DaemonIdentity { pid: daemon.pid, start_time: daemon.start_time + 1 }));

    sup.stop("claim-1", Some(&daemon)).unwrap();
    assert!(!sup.is_running(&daemon));
    assert_eq!(fake.calls().last().unwrap(), "quit");
    assert!(!dirs.root.exists(), "the directories are removed");
    // Idempotent.
    sup.stop("claim-1", Some(&daemon)).unwrap();
}

#[test]
fn a_daemon_that_ignores_quit_is_killed_after_the_grace_period_as_root() {
    if !root_or_skip("a_daemon_that_ignores_quit_is_killed_after_the_grace_period_as_root") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeMpsControl::install(&tmp.path().join("bin"));
    let mut sup = supervisor(tmp.path(), &fake);
    sup.settings.quit_grace = Duration::from_millis(300);
    let daemon = sup.start(&spec("hangs", &[GPU_A])).unwrap();
    fake.set("mps.hang", "");
    sup.stop("hangs", Some(&daemon)).unwrap();
    assert!(!sup.is_running(&daemon), "SIGKILL after the grace period");
    assert_eq!(fake.calls().last().unwrap(), "quit", "quit was tried first");
}

#[test]
fn a_daemon_that_dies_at_start_fails_with_its_log_as_root() {
    if !root_or_skip("a_daemon_that_dies_at_start_fails_with_its_log_as_root") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeMpsControl::install(&tmp.path().join("bin"));
    let mut sup = supervisor(tmp.path(), &fake);
    sup.settings.ready_timeout = Duration::from_millis(500);
    fake.set("mps.crash", "nvidia-cuda-mps-server exited with status 1");
    let e = sup.start(&spec("crashes", &[GPU_A])).unwrap_err();
    let msg = crate::util::error_chain(&e);
    assert!(msg.contains("did not answer get_server_list within 500 ms"), "{msg}");
    assert!(msg.contains("daemon failed: nvidia-cuda-mps-server exited with status 1"), "{msg}");
}

#[test]
fn a_daemon_that_never_answers_is_killed_and_reported_as_root() {
    if !root_or_skip("a_daemon_that_never_answers_is_killed_and_reported_as_root") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeMpsControl::install(&tmp.path().join("bin"));
    let mut sup = supervisor(tmp.path(), &fake);
    sup.settings.ready_timeout = Duration::from_millis(500);
    fake.set("mps.mute", "");
    let e = sup.start(&spec("mute", &[GPU_A])).unwrap_err();
    assert!(e.to_string().contains("does not answer yet"), "{e}");
    let pid: u32 =
        std::fs::read_to_string(sup.settings.dirs("mute").pipe.join(PID_FILE)).unwrap().trim().parse().unwrap();
    let gone = (0..500).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        !matches!(process_start(Path::new("/proc"), pid), Some((_, false)))
    });
    assert!(gone, "the unanswering daemon {pid} is killed");
}

#[test]
fn bad_input_and_a_missing_binary_are_refused_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeMpsControl::install(&tmp.path().join("bin"));
    let sup = supervisor(tmp.path(), &fake);
    for id in ["", "../x", "Upper", "-lead", &"a".repeat(101)] {
        assert!(matches!(sup.start(&spec(id, &[GPU_A])), Err(MpsError::InvalidId { .. })), "{id:?}");
    }
    assert!(matches!(sup.start(&spec("ok", &[])), Err(MpsError::NoGpus)));
    std::fs::remove_file(&fake.path).unwrap();
    let msg = sup.start(&spec("ok", &[GPU_A])).unwrap_err().to_string();
    assert!(msg.contains(&fake.path.display().to_string()) && msg.contains("paths.mps_control"), "{msg}");
    assert!(fake.calls().is_empty());
    assert!(!tmp.path().join("run/mps").exists(), "no directories made");
}

#[test]
fn start_times_come_from_proc_stat_after_the_command_name() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("42");
    std::fs::create_dir_all(&dir).unwrap();
    // A command name with spaces and a parenthesis must not shift the fields.
    let fields: Vec<String> = (3..=22).map(|i| if i == 22 { "987654".into() } else { "0".into() }).collect();
    std::fs::write(dir.join("stat"), format!("42 (a) b (c) S {}", fields[1..].join(" "))).unwrap();
    assert_eq!(process_start(tmp.path(), 42), Some((987654, false)));
    std::fs::write(dir.join("stat"), format!("42 (x) Z {}", fields[1..].join(" "))).unwrap();
    assert_eq!(process_start(tmp.path(), 42), Some((987654, true)));
    assert_eq!(process_start(tmp.path(), 43), None);
    let own = process_start(Path::new("/proc"), std::process::id()).expect("this process");
    assert!(!own.1);
}

#[test]
fn the_daemon_sees_the_claims_shm_directory_as_dev_shm_and_gets_its_limits_as_root() {
    if !root_or_skip("the_daemon_sees_the_claims_shm_directory_as_dev_shm_and_gets_its_limits_as_root") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeMpsControl::install(&tmp.path().join("bin"));
    let sup = supervisor(tmp.path(), &fake);
    let mut s = spec("limits", &[GPU_A, GPU_B]);
    s.active_thread_percentage = Some(40);
    s.pinned_memory_mib = vec![(GPU_A.into(), 2048), (GPU_B.into(), 512)];
    let daemon = sup.start(&s).unwrap();
    let dirs = sup.settings.dirs("limits");
    let marker = format!("edra-mps-stand-in.{}", daemon.pid);
    assert!(dirs.shm.join(&marker).exists(), "the daemon's /dev/shm is the claim's shm directory");
    assert!(!Path::new("/dev/shm").join(&marker).exists(), "nothing of the daemon lands in the host's /dev/shm");
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!((mode(&dirs.shm), mode(&dirs.pipe), mode(&dirs.log)), (0o1777, 0o755, 0o700));
    assert_eq!(
        fake.calls()[1..],
        [
            "get_server_list".to_string(),
            "set_default_active_thread_percentage 40".into(),
            format!("set_default_device_pinned_mem_limit {GPU_A} 2048M"),
            format!("set_default_device_pinned_mem_limit {GPU_B} 512M"),
        ]
    );
    // A crash between the start and the record of its pid: the pid file finds it, but
    // only as a process started after the recorded time.
    let before = clock_ticks_now(Path::new("/proc"));
    assert!(before >= daemon.start_time.saturating_sub(1), "the clock is read the way start times are");
    assert_eq!(sup.find("limits", daemon.start_time), Some(daemon));
    assert_eq!(sup.find("limits", daemon.start_time + 1), None, "a process older than the record is not it");
    assert_eq!(sup.find("other", 0), None);
    sup.stop("limits", Some(&daemon)).unwrap();
    assert_eq!(sup.find("limits", 0), None);
    assert!(!dirs.root.exists());
}

#[test]
fn a_refused_limit_kills_the_daemon_and_says_which_as_root() {
    if !root_or_skip("a_refused_limit_kills_the_daemon_and_says_which_as_root") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeMpsControl::install(&tmp.path().join("bin"));
    let sup = supervisor(tmp.path(), &fake);
    fake.set("mps.refuse", "set_default_device_pinned_mem_limit");
    let mut s = spec("refused", &[GPU_A]);
    s.pinned_memory_mib = vec![(GPU_A.into(), 1)];
    let e = sup.start(&s).unwrap_err().to_string();
    assert!(e.contains(&format!("refused `set_default_device_pinned_mem_limit {GPU_A} 1M`")), "{e}");
    let pid: u32 =
        std::fs::read_to_string(sup.settings.dirs("refused").pipe.join(PID_FILE)).unwrap().trim().parse().unwrap();
    let gone = (0..500).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        !matches!(process_start(Path::new("/proc"), pid), Some((_, false)))
    });
    assert!(gone, "the daemon {pid} is killed");
}
