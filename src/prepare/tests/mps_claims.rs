//! MPS claims through the stand-in `nvidia-cuda-mps-control` (a real process tree): one
//! daemon per claim with the claim's GPUs, limits and private /dev/shm, EXCLUSIVE_PROCESS
//! while it runs, the pipe and shm mounts in the CDI spec; unprepare, rollback, recovery
//! (adoption, restart, orphans) and supervision. Starting a daemon needs root (its own
//! mount namespace): these tests say so in their names and skip without it.

use std::time::Duration;

use super::*;
use crate::gpu::ComputeMode;
use crate::gpu::mps::tests::root_or_skip;
use crate::gpu::mps::{DaemonIdentity, DaemonSpec, MpsDaemons, PID_FILE, process_start};

const GPU0: &str = "GPU-00000000-aaaa-bbbb-cccc-000000000000";
const GPU1: &str = "GPU-00000001-aaaa-bbbb-cccc-000000000000";

fn mps_config(requests: &[&str], mps: serde_json::Value) -> serde_json::Value {
    json!({"source": "FromClaim", "requests": requests, "opaque": {"driver": DRIVER, "parameters":
        {"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mps": mps}}}})
}

pub(super) fn daemon_of(f: &Fixture, uid: &str) -> DaemonIdentity {
    let rec = f.preparer.store().mps_daemon(uid).unwrap().expect("an MPS daemon record");
    let (pid, start_time) = rec.daemon.expect("the daemon's pid is recorded");
    DaemonIdentity { pid, start_time }
}

pub(super) fn alive(d: &DaemonIdentity) -> bool {
    matches!(process_start(Path::new("/proc"), d.pid), Some((t, false)) if t == d.start_time)
}

pub(super) fn wait_gone(d: &DaemonIdentity) -> bool {
    (0..500).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        !alive(d)
    })
}

pub(super) fn kill(d: &DaemonIdentity) {
    // SAFETY: kill(2) on a pid this test started (checked alive just before).
    assert!(alive(d));
    unsafe { libc::kill(d.pid as i32, libc::SIGKILL) };
    assert!(wait_gone(d), "the daemon {} dies", d.pid);
}

fn prepare_two_gpu_claim(f: &Fixture) {
    f.claims.put(claim(
        UID1,
        "mps",
        &[("gpu", DRIVER, NODE, "gpu-0", false), ("gpu", DRIVER, NODE, "gpu-1", false)],
        json!([mps_config(
            &["gpu"],
            json!({"defaultActiveThreadPercentage": 25, "defaultPinnedDeviceMemoryLimit": "4Gi",
                   "defaultPerDevicePinnedMemoryLimit": {"gpu-1": "1536Mi"}})
        )]),
    ));
    ok(&f.preparer.block_on_prepare(vec![cref(UID1, "mps")]), UID1);
}

impl Preparer {
    /// Prepare from a plain test thread.
    fn block_on_prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(self.prepare(claims))
    }

    fn block_on_unprepare(&self, claims: Vec<ClaimRef>) -> crate::plugin::handler::UnprepareResults {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(self.unprepare(claims))
    }
}

#[test]
fn an_mps_claim_runs_one_daemon_with_its_gpus_limits_and_shm_and_unprepare_stops_it_as_root() {
    if !root_or_skip("an_mps_claim_runs_one_daemon_with_its_gpus_limits_and_shm_and_unprepare_stops_it_as_root") {
        return;
    }
    let f = Fixture::new();
    f.modes.set_compute_mode(GPU1, ComputeMode::Prohibited).unwrap();
    prepare_two_gpu_claim(&f);
    assert_eq!(f.modes.mode(GPU0), ComputeMode::ExclusiveProcess);
    assert_eq!(f.modes.mode(GPU1), ComputeMode::ExclusiveProcess);
    assert_eq!(
        f.mps.calls(),
        [
            format!("-d CUDA_VISIBLE_DEVICES={GPU0},{GPU1}"),
            "get_server_list".into(),
            "set_default_active_thread_percentage 25".into(),
            format!("set_default_device_pinned_mem_limit {GPU0} 4096M"),
            format!("set_default_device_pinned_mem_limit {GPU1} 1536M"),
        ]
    );
    let daemon = daemon_of(&f, UID1);
    assert!(alive(&daemon));
    let dirs = f.preparer.settings().mps.dirs(UID1);
    assert_eq!(dirs.root, f.root.join("run/edra/mps").join(UID1));
    assert!(dirs.shm.join(format!("edra-mps-stand-in.{}", daemon.pid)).exists(), "the daemon's /dev/shm");

    // The spec: each MPS device carries the pipe (and its env) and the claim's shm.
    let path = f.preparer.settings().spec_path(UID1);
    let raw: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(super::spec::schema_errors(&super::spec::schema_validator(), &raw), Vec::<String>::new());
    for device in raw["devices"].as_array().unwrap() {
        let edits = &device["containerEdits"];
        assert!(edits["env"].as_array().unwrap().contains(&json!("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps")));
        let mounts: Vec<(String, String, serde_json::Value)> = edits["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["hostPath"].as_str().unwrap().into(),
                    m["containerPath"].as_str().unwrap().into(),
                    m["options"].clone(),
                )
            })
            .collect();
        let options = json!(["rw", "nosuid", "nodev", "bind"]);
        assert_eq!(
            mounts,
            [
                (dirs.pipe.display().to_string(), "/tmp/nvidia-mps".to_string(), options.clone()),
                (dirs.shm.display().to_string(), "/dev/shm".to_string(), options),
            ],
            "{device}"
        );
    }
    assert!(!raw.to_string().contains("\"/dev/shm\",\"hostPath\":\"/dev/shm\""), "never the host's /dev/shm");

    // A repeated prepare answers from state: no second daemon.
    ok(&f.preparer.block_on_prepare(vec![cref(UID1, "mps")]), UID1);
    assert_eq!(f.mps.calls().iter().filter(|c| c.starts_with("-d")).count(), 1);

    assert_eq!(f.preparer.block_on_unprepare(vec![cref(UID1, "mps")])[UID1], Ok(()));
    assert!(!alive(&daemon), "the daemon quit");
    assert_eq!(f.mps.calls().last().unwrap(), "quit");
    assert!(!dirs.root.exists(), "the directories are removed");
    assert_eq!(f.modes.mode(GPU0), ComputeMode::Default);
    assert_eq!(f.modes.mode(GPU1), ComputeMode::Prohibited, "the previous mode is back");
    let store = f.preparer.store();
    assert!(store.mps_daemon(UID1).unwrap().is_none() && store.gpu_changes().unwrap().is_empty());
    assert!(store.claim(UID1).unwrap().is_none());
}

#[test]
fn a_daemon_that_does_not_answer_fails_only_its_claim_and_everything_is_put_back_as_root() {
    if !root_or_skip("a_daemon_that_does_not_answer_fails_only_its_claim_and_everything_is_put_back_as_root") {
        return;
    }
    let mut f = Fixture::new();
    let mut settings = f.preparer.settings().clone();
    settings.mps.ready_timeout = Duration::from_millis(500);
    f.preparer = Preparer::new(
        f.preparer.store().clone(),
        f.inventory_tx.subscribe(),
        f.claims.clone(),
        settings,
        f.modes.clone(),
    );
    f.mps.set("mps.crash", "nvidia-cuda-mps-server exited with status 1");
    f.claims.put(claim(UID1, "mps", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([mps_config(&[], json!({}))])));
    f.claims.put(claim(UID2, "plain", &[("gpu", DRIVER, NODE, "gpu-1", false)], json!([])));
    let r = f.preparer.block_on_prepare(vec![cref(UID1, "mps"), cref(UID2, "plain")]);
    let e = err(&r, UID1);
    assert!(e.contains("cannot run the claim's MPS control daemon"), "{e}");
    assert!(e.contains("did not answer get_server_list within 500 ms"), "{e}");
    assert!(e.contains("daemon failed: nvidia-cuda-mps-server exited with status 1"), "the daemon's log: {e}");
    ok(&r, UID2);
    assert_eq!(f.modes.mode(GPU0), ComputeMode::Default);
    assert_eq!(f.modes.sets().last().unwrap(), &(GPU0.to_string(), ComputeMode::Default), "mode put back");
    let store = f.preparer.store();
    assert!(store.claim(UID1).unwrap().is_none() && store.mps_daemon(UID1).unwrap().is_none());
    assert!(store.gpu_changes().unwrap().is_empty());
    assert!(!f.preparer.settings().mps.dirs(UID1).root.exists());
    assert!(!f.preparer.settings().spec_path(UID1).exists());
    assert_eq!(f.preparer.mps_stats().failed.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn bad_mps_input_fails_its_claim_before_anything_changes() {
    let f = Fixture::new();
    // Two requests with different MPS settings: one daemon per claim cannot serve both.
    f.claims.put(claim(
        UID1,
        "differ",
        &[("gpu", DRIVER, NODE, "gpu-0", false), ("alt/one", DRIVER, NODE, "gpu-1", false)],
        json!([
            mps_config(&["gpu"], json!({"defaultActiveThreadPercentage": 10})),
            mps_config(&["alt"], json!({"defaultActiveThreadPercentage": 20}))
        ]),
    ));
    f.claims.put(claim(
        UID2,
        "quantity",
        &[("gpu", DRIVER, NODE, "gpu-0", false)],
        json!([mps_config(&[], json!({"defaultPinnedDeviceMemoryLimit": "lots"}))]),
    ));
    f.claims.put(claim(
        UID3,
        "tiny",
        &[("gpu", DRIVER, NODE, "gpu-1", false)],
        json!([mps_config(&[], json!({"defaultPinnedDeviceMemoryLimit": "1Ki"}))]),
    ));
    let r = f.preparer.block_on_prepare(vec![cref(UID1, "differ"), cref(UID2, "quantity"), cref(UID3, "tiny")]);
    assert!(
        err(&r, UID1).contains("requests gpu and alt/one ask for MPS with different settings"),
        "{}",
        err(&r, UID1)
    );
    assert!(err(&r, UID2).contains("defaultPinnedDeviceMemoryLimit expected a size"), "{}", err(&r, UID2));
    assert!(err(&r, UID3).contains("must be from 1Mi to 1024Ti, found \"1Ki\""), "{}", err(&r, UID3));

    // A missing control binary names the path and the key; nothing is recorded or changed.
    std::fs::remove_file(&f.mps.path).unwrap();
    f.claims.put(claim(UID1, "fine", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([mps_config(&[], json!({}))])));
    let e = err(&f.preparer.block_on_prepare(vec![cref(UID1, "fine")]), UID1);
    assert!(e.contains(&f.mps.path.display().to_string()) && e.contains("paths.mps_control"), "{e}");
    assert!(f.mps.calls().is_empty() && f.modes.sets().is_empty());
    assert!(f.preparer.store().claims().unwrap().is_empty());
}

#[test]
fn recovery_adopts_a_running_daemon_and_supervision_restarts_a_dead_one_as_root() {
    if !root_or_skip("recovery_adopts_a_running_daemon_and_supervision_restarts_a_dead_one_as_root") {
        return;
    }
    let f = Fixture::new();
    prepare_two_gpu_claim(&f);
    let first = daemon_of(&f, UID1);
    let f = f.restart();
    let report = f.preparer.recover().unwrap();
    assert_eq!(report.mps_adopted, [UID1]);
    assert_eq!(daemon_of(&f, UID1), first, "the same daemon, adopted");
    assert_eq!(f.mps.calls().iter().filter(|c| c.starts_with("-d")).count(), 1, "not started again");
    assert_eq!(f.preparer.check_mps_daemons().unwrap(), 1);

    kill(&first);
    let shm_marker = f.preparer.settings().mps.dirs(UID1).shm;
    assert_eq!(f.preparer.check_mps_daemons().unwrap(), 1);
    let second = daemon_of(&f, UID1);
    assert_ne!(second, first);
    assert!(alive(&second));
    let rec = f.preparer.store().mps_daemon(UID1).unwrap().unwrap();
    assert_eq!(rec.restarts, 1);
    let calls = f.mps.calls();
    assert_eq!(calls.iter().filter(|c| c.starts_with("-d")).count(), 2);
    assert_eq!(calls.last().unwrap(), &format!("set_default_device_pinned_mem_limit {GPU1} 1536M"), "limits again");
    assert!(shm_marker.join(format!("edra-mps-stand-in.{}", second.pid)).exists(), "same shm directory");
    assert_eq!(f.preparer.mps_stats().restarts.load(std::sync::atomic::Ordering::Relaxed), 1);

    // A daemon that cannot start again is retried later, not in a tight loop.
    kill(&second);
    f.mps.set("mps.crash", "out of memory");
    let mut settings = f.preparer.settings().clone();
    settings.mps.ready_timeout = Duration::from_millis(300);
    let quick = Preparer::new(
        f.preparer.store().clone(),
        f.inventory_tx.subscribe(),
        f.claims.clone(),
        settings,
        f.modes.clone(),
    );
    assert_eq!(quick.check_mps_daemons().unwrap(), 0);
    let starts = f.mps.calls().iter().filter(|c| c.starts_with("-d")).count();
    assert_eq!(quick.check_mps_daemons().unwrap(), 0);
    assert_eq!(f.mps.calls().iter().filter(|c| c.starts_with("-d")).count(), starts, "waits before the next try");
    std::fs::remove_file(f.root.join("mps-bin/mps.crash")).unwrap();
    assert_eq!(f.preparer.block_on_unprepare(vec![cref(UID1, "mps")])[UID1], Ok(()));
    assert!(f.preparer.store().mps_daemon(UID1).unwrap().is_none());
}

#[test]
fn a_daemon_whose_pid_was_not_recorded_is_found_and_orphans_are_stopped_as_root() {
    if !root_or_skip("a_daemon_whose_pid_was_not_recorded_is_found_and_orphans_are_stopped_as_root") {
        return;
    }
    let f = Fixture::new();
    prepare_two_gpu_claim(&f);
    let daemon = daemon_of(&f, UID1);
    // As after a crash between the start and the record of its pid: the record has none,
    // and the claim is still PrepareStarted.
    let store = f.preparer.store();
    let mut rec = store.mps_daemon(UID1).unwrap().unwrap();
    rec.daemon = None;
    store.put_mps_daemon(&rec).unwrap();
    let mut claim_rec = store.claim(UID1).unwrap().unwrap();
    claim_rec.phase = Phase::PrepareStarted;
    store.put_claim(&claim_rec).unwrap();

    // An orphan: a daemon in a directory no claim owns.
    let orphan_uid = UID3;
    let sup = crate::gpu::mps::Supervisor { settings: f.preparer.settings().mps.clone() };
    let orphan = sup
        .start(&DaemonSpec {
            id: orphan_uid.into(),
            gpus: vec![GPU0.into()],
            active_thread_percentage: None,
            pinned_memory_mib: vec![],
        })
        .unwrap();
    assert!(sup.settings.dirs(orphan_uid).pipe.join(PID_FILE).exists());

    let f = f.restart();
    let report = f.preparer.recover().unwrap();
    assert_eq!(report.rolled_back, [UID1]);
    assert!(wait_gone(&daemon), "the interrupted claim's daemon, found through its pid file, is stopped");
    assert_eq!(report.mps_orphans, [orphan_uid]);
    assert!(wait_gone(&orphan), "the orphan is stopped");
    assert!(!f.root.join("run/edra/mps").join(UID1).exists() && !sup.settings.dirs(orphan_uid).root.exists());
    assert_eq!(f.modes.mode(GPU0), ComputeMode::Default);
    assert!(f.preparer.store().gpu_changes().unwrap().is_empty());
}
