//! Recovery: state as a crash leaves it, built by hand and produced by real aborts at each
//! failpoint in a child process.

use super::*;

#[cfg(debug_assertions)]
const CRASH_DIR: &str = "CRASH_TEST_DIR";

fn spec_path(f: &Fixture, uid: &str) -> PathBuf {
    f.cdi_dir().join(format!("k8s.gpu.edra.dev-claim_{uid}.json"))
}

fn started_record(f: &Fixture, uid: &str, device: &str) -> ClaimRecord {
    ClaimRecord {
        schema: SCHEMA_VERSION,
        uid: uid.into(),
        namespace: "ns".into(),
        name: "c".into(),
        phase: Phase::PrepareStarted,
        devices: vec![crate::state::DeviceRecord {
            request: "gpu".into(),
            request_names: vec!["gpu".into()],
            device: device.into(),
            pool: NODE.into(),
            cdi_ids: vec![cdi::device_id("k8s.gpu.edra.dev", uid, device)],
            admin_access: false,
            share_id: None,
            share: None,
            mig: None,
            config: Default::default(),
        }],
        cdi_spec_path: spec_path(f, uid),
        created_at: 1,
        boot_id: "boot-0".into(),
    }
}

#[tokio::test]
async fn recovery_converges_after_a_simulated_crash_and_reboot() {
    let f = Fixture::new();
    let store = f.preparer.store().clone();
    store.set_boot_id("boot-0").unwrap();
    // UID1: crashed after PrepareStarted, with a half-written spec.
    store.put_claim(&started_record(&f, UID1, "gpu-0")).unwrap();
    std::fs::create_dir_all(f.cdi_dir()).unwrap();
    std::fs::write(spec_path(&f, UID1), b"{\"cdiVer").unwrap();
    // UID2: completed before a reboot that emptied the CDI directory.
    let mut done = started_record(&f, UID2, "gpu-1");
    done.phase = Phase::PrepareCompleted;
    store.put_claim(&done).unwrap();
    // An orphaned spec of ours, a temp file of an interrupted write, and a foreign file.
    std::fs::write(spec_path(&f, UID3), b"{}").unwrap();
    let tmp_file = f.cdi_dir().join(format!(".k8s.gpu.edra.dev-claim_{UID3}.json.tmp-1-0000abcd"));
    std::fs::write(&tmp_file, b"{").unwrap();
    let foreign = f.cdi_dir().join("nvidia.com-gpu.json");
    std::fs::write(&foreign, b"{}").unwrap();

    let report = f.preparer.recover().unwrap();
    assert!(report.rebooted, "boot-0 → boot-1");
    assert_eq!(report.rolled_back, [UID1]);
    assert_eq!(report.rewritten, [UID2]);
    assert_eq!(report.orphans_removed.len(), 2, "{report:?}");
    assert!(!spec_path(&f, UID1).exists() && !spec_path(&f, UID3).exists() && !tmp_file.exists());
    assert!(foreign.exists(), "files of other kinds are left alone");
    assert!(store.claim(UID1).unwrap().is_none());
    assert!(store.holder("gpu-0").unwrap().is_none());
    let spec: cdi::Spec = serde_json::from_slice(&std::fs::read(spec_path(&f, UID2)).unwrap()).unwrap();
    assert_eq!(spec.devices[0].name, format!("{UID2}-gpu-1"));
    assert_eq!(store.boot_id().unwrap().as_deref(), Some("boot-1"));

    // A second recovery has nothing to do.
    let again = f.preparer.recover().unwrap();
    assert_eq!(again, RecoveryReport::default());
    // The rolled-back claim prepares normally; the kept one answers from state.
    f.claims.put(claim(UID1, "c", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([])));
    let r = f.preparer.prepare(vec![cref(UID1, "c"), cref(UID2, "c")]).await;
    assert!(r.values().all(Result::is_ok), "{r:?}");
    assert_eq!(f.claims.fetches.load(Ordering::SeqCst), 1);
}

/// Runs in a child process only: prepares (and unprepares) a claim in CRASH_TEST_DIR with
/// a failpoint enabled, so the process aborts part-way. Failpoints exist in debug builds
/// only, so do these tests.
#[cfg(debug_assertions)]
#[tokio::test]
#[ignore = "run by crash_at_every_failpoint_converges in a child process"]
async fn crash_child() {
    let Ok(dir) = std::env::var(CRASH_DIR) else { return };
    let f = Fixture::at(Path::new(&dir));
    f.claims.put(crash_claim());
    let r = f.preparer.prepare(vec![cref(UID1, "c")]).await;
    assert!(r[UID1].is_ok(), "{r:?}");
    f.preparer.unprepare(vec![cref(UID1, "c")]).await;
}

/// Whether the crash tests include an MPS device (its daemon needs root).
#[cfg(debug_assertions)]
fn with_mps() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The crash tests' claim: gpu-0 time-sliced and, as root, gpu-1 shared through MPS, so
/// every failpoint is passed.
#[cfg(debug_assertions)]
fn crash_claim() -> ResourceClaim {
    if !with_mps() {
        return claim(UID1, "c", &[("gpu", DRIVER, NODE, "gpu-0", false)], time_sliced());
    }
    let mut config = time_sliced();
    config[0]["requests"] = json!(["gpu"]);
    config.as_array_mut().unwrap().push(
        json!({"source": "FromClaim", "requests": ["alt"], "opaque": {"driver": DRIVER,
        "parameters": {"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig",
         "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50}}}}}),
    );
    claim(UID1, "c", &[("gpu", DRIVER, NODE, "gpu-0", false), ("alt/one", DRIVER, NODE, "gpu-1", false)], config)
}

/// The crash tests' claim config: TimeSlicing (Short), so every failpoint is passed.
#[cfg(debug_assertions)]
fn time_sliced() -> serde_json::Value {
    json!([{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters":
        {"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig",
         "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}}}}}])
}

#[cfg(debug_assertions)]
#[tokio::test]
async fn crash_at_every_failpoint_converges() {
    use crate::gpu::ComputeMode;
    use crate::test_support::gpu::FileModes;
    const GPU0: &str = "GPU-00000000-aaaa-bbbb-cccc-000000000000";
    use crate::gpu::mps::{DaemonIdentity, MpsDaemons, PID_FILE, process_start};
    const GPU1: &str = "GPU-00000001-aaaa-bbbb-cccc-000000000000";
    let alive =
        |d: &DaemonIdentity| matches!(process_start(Path::new("/proc"), d.pid), Some((t, false)) if t == d.start_time);
    let exe = std::env::current_exe().unwrap();
    if !with_mps() {
        eprintln!("crash_at_every_failpoint_converges: the MPS failpoints are skipped, an MPS daemon needs root");
    }
    // The MIG points are passed by MIG claims only (tests_mig), `prepare-after-record` by
    // claims prepared in one step only (tests/it/agent/crash.rs).
    let points = failpoint::POINTS.into_iter().filter(|p| *p != "prepare-after-record");
    for point in points.filter(|p| (with_mps() || !p.contains("-mps-")) && !p.contains("-mig-")) {
        let tmp = tempfile::tempdir().unwrap();
        // The GPUs' modes before edra touches them; the modes file outlives the child, as a GPU's state does.
        let before = FileModes::at(tmp.path().join("gpu-modes"));
        before.set_compute_mode(GPU0, ComputeMode::ExclusiveProcess).unwrap();
        before.set_compute_mode(GPU1, ComputeMode::Prohibited).unwrap();
        let out = std::process::Command::new(&exe)
            .args(["--ignored", "--exact", "prepare::tests::recovery::crash_child", "--nocapture"])
            .env(failpoint::ENV, point)
            .env(CRASH_DIR, tmp.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(&format!("failpoint {point} hit")), "{point}: {stderr}");

        let f = Fixture::at(tmp.path());
        // The daemon the child started, if it got that far (it outlives the child).
        let sup = crate::gpu::mps::Supervisor { settings: f.preparer.settings().mps.clone() };
        let started = std::fs::read_to_string(sup.settings.dirs(UID1).pipe.join(PID_FILE))
            .ok()
            .and_then(|pid| sup.find(UID1, 0).filter(|d| d.pid.to_string() == pid.trim()));
        let report = f.preparer.recover().unwrap();
        let store = f.preparer.store();
        match store.claim(UID1).unwrap() {
            // Completed before the crash: kept, with its spec and GPU settings in place.
            Some(rec) => {
                assert_eq!(rec.phase, Phase::PrepareCompleted, "{point}");
                assert!(spec_path(&f, UID1).exists(), "{point}");
                assert_eq!(store.holder("gpu-0").unwrap().as_deref(), Some(UID1), "{point}");
                assert_eq!(f.modes.mode(GPU0), ComputeMode::Default, "{point}");
                let last = f.smi.calls().last().cloned();
                assert_eq!(last, Some(format!("compute-policy -i {GPU0} --set-timeslice=1")), "{point}");
                if with_mps() {
                    assert_eq!(store.gpu_changes().unwrap().len(), 2, "{point}");
                    assert_eq!(f.modes.mode(GPU1), ComputeMode::ExclusiveProcess, "{point}");
                    let rec = store.mps_daemon(UID1).unwrap().expect("the daemon's record");
                    let (pid, start_time) = rec.daemon.expect("its pid");
                    assert!(alive(&DaemonIdentity { pid, start_time }), "{point}");
                    match started {
                        // Running: adopted, not started again.
                        Some(d) => {
                            assert_eq!(DaemonIdentity { pid, start_time }, d, "{point}");
                            assert_eq!(report.mps_adopted, [UID1], "{point}");
                        }
                        // Stopped by an unprepare that did not finish: the claim is still
                        // prepared until the kubelet's retry, so its daemon runs again.
                        None => assert_eq!(report.mps_restarted, [UID1], "{point}"),
                    }
                } else {
                    assert_eq!(store.gpu_changes().unwrap().len(), 1, "{point}");
                }
            }
            // Otherwise rolled back completely, the GPU as it was.
            None => {
                assert!(!spec_path(&f, UID1).exists(), "{point}: {report:?}");
                assert!(store.holder("gpu-0").unwrap().is_none(), "{point}");
                assert_eq!(f.modes.mode(GPU0), ComputeMode::ExclusiveProcess, "{point}");
                if let Some(last) = f.smi.calls().last() {
                    assert_eq!(last, &format!("compute-policy -i {GPU0} --set-timeslice=0"), "{point}");
                }
                assert!(store.gpu_changes().unwrap().is_empty(), "{point}");
                assert_eq!(f.modes.mode(GPU1), ComputeMode::Prohibited, "{point}");
                assert!(store.mps_daemon(UID1).unwrap().is_none(), "{point}");
                assert!(!sup.settings.dirs(UID1).root.exists(), "{point}");
                if let Some(d) = started {
                    let gone = (0..500).any(|_| {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        !alive(&d)
                    });
                    assert!(gone, "{point}: the daemon {} is stopped", d.pid);
                }
            }
        }
        let leftovers: Vec<_> =
            std::fs::read_dir(f.cdi_dir()).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
        assert!(leftovers.len() <= 1, "{point}: {leftovers:?}");
        // From any of these states, prepare then unprepare converge to nothing.
        f.claims.put(crash_claim());
        let r = f.preparer.prepare(vec![cref(UID1, "c")]).await;
        assert!(r[UID1].is_ok(), "{point}: {r:?}");
        assert_eq!(f.modes.mode(GPU0), ComputeMode::Default, "{point}");
        f.preparer.unprepare(vec![cref(UID1, "c")]).await;
        assert!(store.claims().unwrap().is_empty() && store.holder("gpu-0").unwrap().is_none(), "{point}");
        assert!(store.gpu_changes().unwrap().is_empty(), "{point}");
        assert_eq!(f.modes.mode(GPU0), ComputeMode::ExclusiveProcess, "{point}");
        assert_eq!(f.modes.mode(GPU1), ComputeMode::Prohibited, "{point}");
        assert!(store.mps_daemons().unwrap().is_empty(), "{point}");
        assert!(!f.root.join("run/edra/mps").join(UID1).exists(), "{point}");
        assert_eq!(f.smi.calls().last().unwrap(), &format!("compute-policy -i {GPU0} --set-timeslice=0"), "{point}");
        assert_eq!(std::fs::read_dir(f.cdi_dir()).unwrap().count(), 0, "{point}");
    }
}

#[tokio::test]
async fn a_cdi_directory_that_is_a_file_or_read_only_stops_the_start() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.cdi_dir().parent().unwrap()).unwrap();
    std::fs::write(f.cdi_dir(), b"").unwrap();
    let e = f.preparer.recover().unwrap_err().to_string();
    assert!(e.contains("exists and is not a directory; set cdi.dynamic_dir"), "{e}");
    std::fs::remove_file(f.cdi_dir()).unwrap();
    // A missing directory is created, and the probe leaves nothing behind.
    f.preparer.recover().unwrap();
    assert_eq!(std::fs::read_dir(f.cdi_dir()).unwrap().count(), 0);
    // Root writes to a 0555 directory, so the read-only case holds only for other users.
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(f.cdi_dir(), std::fs::Permissions::from_mode(0o555)).unwrap();
        let e = f.preparer.recover().unwrap_err().to_string();
        std::fs::set_permissions(f.cdi_dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(e.contains("is not writable"), "{e}");
    }
}

/// A full disk while preparing: the prepare fails, and until the state is re-opened from
/// disk no call is answered from memory — in particular not the claim whose
/// PrepareCompleted record reached sled's memory but not the disk.
#[tokio::test]
async fn a_failed_durability_step_is_never_answered_from_memory() {
    let f = Fixture::new();
    let store = f.preparer.store().clone();
    let health = store.health();
    // UID2 was prepared while the disk was fine: the kubelet was told so.
    f.claims.put(claim(UID2, "kept", &[("gpu", DRIVER, NODE, "gpu-1", false)], json!([])));
    assert!(f.preparer.prepare(vec![cref(UID2, "kept")]).await[UID2].is_ok());

    // The disk fills before UID1's PrepareCompleted (its one durable step) is made durable.
    f.claims.put(claim(UID1, "c", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([])));
    store.fail_syncs_after(Some(0));
    let r = f.preparer.prepare(vec![cref(UID1, "c")]).await;
    let first = r[UID1].as_ref().unwrap_err();
    assert!(first.contains("cannot make edra's state durable"), "{first}");
    assert!(health.borrow().is_some(), "the failed sync poisons the store");
    // The retry must not be answered from the PrepareCompleted record in memory.
    let r = f.preparer.prepare(vec![cref(UID1, "c"), cref(UID2, "kept")]).await;
    for uid in [UID1, UID2] {
        let e = r[uid].as_ref().unwrap_err();
        assert!(e.contains("is unusable since a change could not be made durable"), "{uid}: {e}");
    }
    let r = f.preparer.unprepare(vec![cref(UID2, "kept")]).await;
    assert!(r[UID2].is_err(), "unprepare is refused too: {r:?}");
    assert!(spec_path(&f, UID2).exists(), "a refused unprepare removes nothing");

    // While the disk is still full, healing fails and changes nothing.
    assert!(f.preparer.heal().is_err());
    assert!(health.borrow().is_some());

    // Space is freed: the state is re-opened from disk and recovered.
    store.fail_syncs_after(None);
    let report = f.preparer.heal().unwrap();
    assert!(health.borrow().is_none());
    // The claim the kubelet was told is prepared is kept, with its device and spec.
    let kept = store.claim(UID2).unwrap().expect("UID2 kept");
    assert_eq!(kept.phase, Phase::PrepareCompleted);
    assert_eq!(store.holder("gpu-1").unwrap().as_deref(), Some(UID2));
    assert!(spec_path(&f, UID2).exists());
    // UID1 is either gone (no record on disk: its spec was removed when the step failed)
    // or completed (sled wrote the record when it closed the database); never half of each.
    match store.claim(UID1).unwrap() {
        None => {
            assert!(report.rolled_back.is_empty(), "{report:?}");
            assert!(!spec_path(&f, UID1).exists() && store.holder("gpu-0").unwrap().is_none());
        }
        Some(rec) => {
            assert_eq!(rec.phase, Phase::PrepareCompleted, "{report:?}");
            assert!(spec_path(&f, UID1).exists());
        }
    }
    // Both claims answer again, and release normally.
    let r = f.preparer.prepare(vec![cref(UID1, "c"), cref(UID2, "kept")]).await;
    assert!(r.values().all(Result::is_ok), "{r:?}");
    let r = f.preparer.unprepare(vec![cref(UID1, "c"), cref(UID2, "kept")]).await;
    assert!(r.values().all(Result::is_ok), "{r:?}");
    assert!(store.claims().unwrap().is_empty());
}

/// A claim's first record made without a transaction, cut short by a crash after the
/// record reached the disk and before its devices were all taken: it was never answered.
/// A prepare does not answer from it (it prepares the claim again), and recovery rolls it
/// back, leaving alone the holding of the claim that has the device.
#[tokio::test]
async fn a_completed_record_without_its_devices_is_prepared_again_or_rolled_back() {
    let f = Fixture::new();
    let store = f.preparer.store().clone();
    let cut_short = |uid: &str, device: &str| {
        let rec = ClaimRecord { phase: Phase::PrepareCompleted, ..started_record(&f, uid, device) };
        store.raw_insert("claims", uid.as_bytes(), &crate::state::record::encode_claim(&rec));
        f.preparer.write_spec_of(&rec).unwrap();
    };
    cut_short(UID1, "gpu-0");
    f.claims.put(claim(UID1, "c", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([])));
    let r = f.preparer.prepare(vec![cref(UID1, "c")]).await;
    assert!(r[UID1].is_ok(), "{r:?}");
    assert_eq!(f.claims.fetches.load(Ordering::SeqCst), 1, "not answered from the record");
    assert_eq!(store.holder("gpu-0").unwrap().as_deref(), Some(UID1), "prepared again, it holds its device");
    f.preparer.unprepare(vec![cref(UID1, "c")]).await;

    // UID2 holds gpu-1 properly; UID1's record names gpu-0 (free), UID3's gpu-1 (UID2's).
    cut_short(UID1, "gpu-0");
    store.put_claim(&ClaimRecord { phase: Phase::PrepareCompleted, ..started_record(&f, UID2, "gpu-1") }).unwrap();
    f.preparer.write_spec_of(&store.claim(UID2).unwrap().unwrap()).unwrap();
    cut_short(UID3, "gpu-1");
    let report = f.preparer.recover().unwrap();
    let mut rolled_back = vec![UID1, UID3];
    rolled_back.sort_unstable();
    assert_eq!(report.rolled_back, rolled_back, "{report:?}");
    for uid in [UID1, UID3] {
        assert!(store.claim(uid).unwrap().is_none() && !spec_path(&f, uid).exists(), "{uid}");
    }
    assert_eq!(store.holder("gpu-0").unwrap(), None);
    assert_eq!(store.holder("gpu-1").unwrap().as_deref(), Some(UID2), "UID2's holding is left alone");
    assert!(spec_path(&f, UID2).exists());
}

/// A claim's first record made without a transaction took gpu-0, then saw another claim's
/// share of it and gave it back; sled's flusher wrote the record and the holding before the
/// undoing, and the crash came in between. The share's claim keeps the GPU.
#[tokio::test]
async fn a_completed_record_holding_a_gpu_another_claim_has_shares_of_is_rolled_back() {
    let f = Fixture::new();
    let store = f.preparer.store().clone();
    let mut share = started_record(&f, UID2, "gpu-0");
    share.phase = Phase::PrepareCompleted;
    share.devices[0].share_id = Some("6de5d941-c79d-4a8a-ba10-668351620525".into());
    share.devices[0].share =
        Some(crate::state::ShareRecord { gpu: "gpu-0".into(), memory: 10 << 30, gpu_memory: 80 << 30 });
    store.put_claim(&share).unwrap();
    f.preparer.write_spec_of(&share).unwrap();
    let rec = ClaimRecord { phase: Phase::PrepareCompleted, ..started_record(&f, UID1, "gpu-0") };
    store.raw_insert("claims", UID1.as_bytes(), &crate::state::record::encode_claim(&rec));
    store.raw_insert_device("gpu-0", UID1);
    f.preparer.write_spec_of(&rec).unwrap();
    let report = f.preparer.recover().unwrap();
    assert_eq!(report.rolled_back, [UID1], "{report:?}");
    assert!(store.claim(UID1).unwrap().is_none() && !spec_path(&f, UID1).exists());
    assert_eq!(store.holder("gpu-0").unwrap(), None, "UID1's holding went with it");
    let shares: Vec<String> = store.shares_of("gpu-0").unwrap().into_iter().map(|h| h.claim).collect();
    assert_eq!(shares, [UID2], "the share stays");
    assert!(spec_path(&f, UID2).exists());
}

/// Recovery removes only what it can prove stale: a temp file whose writer still runs is
/// another process's write in progress.
#[tokio::test]
async fn recovery_leaves_temp_files_of_live_writers() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.cdi_dir()).unwrap();
    let live_pid = 4_000_000u32;
    std::fs::create_dir_all(f.root.join(format!("proc/{live_pid}"))).unwrap();
    let live = f.cdi_dir().join(format!(".k8s.gpu.edra.dev-claim_{UID1}.json.tmp-{live_pid}-0000abcd"));
    let dead = f.cdi_dir().join(format!(".k8s.gpu.edra.dev-claim_{UID2}.json.tmp-4000001-0000abcd"));
    let odd = f.cdi_dir().join(format!(".k8s.gpu.edra.dev-claim_{UID3}.json.tmp-x"));
    for p in [&live, &dead, &odd] {
        std::fs::write(p, b"{").unwrap();
    }
    let report = f.preparer.recover().unwrap();
    assert_eq!(report.orphans_removed, std::slice::from_ref(&dead));
    assert!(live.exists() && odd.exists() && !dead.exists());
}
