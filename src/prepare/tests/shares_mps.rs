//! `sharing.enforcement = "mps"`: one MPS control daemon per shared GPU, run by the real
//! supervisor through the stand-in `nvidia-cuda-mps-control` over real sled. The first
//! share sets EXCLUSIVE_PROCESS and starts it, later shares reuse it, each share's CDI
//! device carries its own pinned memory limit, the last release stops it and puts the
//! compute mode back; a failing start leaves the GPU as it was; recovery adopts, restarts,
//! puts back and sweeps. Starting a daemon needs root (its own mount namespace).

use std::time::Duration;

use super::mps_claims::{alive, daemon_of, kill, wait_gone};
use super::shares::{SHARE1, SHARE2, SHARE3, fixture, shared_claim};
use super::*;
use crate::gpu::ComputeMode;
use crate::gpu::mps::tests::root_or_skip;
use crate::sharing::Enforcement;

const GPU0: &str = "GPU-00000000-aaaa-bbbb-cccc-000000000000";
const GPU1: &str = "GPU-00000001-aaaa-bbbb-cccc-000000000000";
const HOLDER0: &str = "shared:gpu-0";

/// The shares fixture (gpu-0 and gpu-1 of 80Gi) with MPS enforcement; gpu-0 starts in
/// compute mode PROHIBITED so its put-back shows.
fn mps_fixture() -> Fixture {
    let f = fixture().restart_with(|s| s.sharing.enforcement = Enforcement::Mps);
    f.modes.set_compute_mode(GPU0, ComputeMode::Prohibited).unwrap();
    f
}

/// The env and (host, container) mounts of the CDI device `name` in `uid`'s spec.
fn edits_of(f: &Fixture, uid: &str, name: &str) -> (Vec<String>, Vec<(String, String)>) {
    let spec: cdi::Spec =
        serde_json::from_slice(&std::fs::read(f.preparer.settings().spec_path(uid)).unwrap()).unwrap();
    let device = spec.devices.iter().find(|d| d.name == name).unwrap_or_else(|| panic!("device {name}"));
    let edits = &device.container_edits;
    (edits.env.clone(), edits.mounts.iter().map(|m| (m.host_path.clone(), m.container_path.clone())).collect())
}

fn starts(f: &Fixture) -> usize {
    f.mps.calls().iter().filter(|c| c.starts_with("-d")).count()
}

#[tokio::test]
async fn the_first_share_starts_the_gpus_daemon_later_ones_reuse_it_and_the_last_release_stops_it_as_root() {
    if !root_or_skip("the_first_share_starts_the_gpus_daemon_later_ones_reuse_it_and_the_last_release_stops_it_as_root")
    {
        return;
    }
    let f = mps_fixture();
    f.claims.put(shared_claim(UID1, "a", &[("gpu", "gpu-0", SHARE1, "30Gi")], json!([])));
    f.claims.put(shared_claim(UID2, "b", &[("gpu", "gpu-0", SHARE2, "20Gi")], json!([])));
    ok(&f.preparer.prepare(vec![cref(UID1, "a")]).await, UID1);
    assert_eq!(f.modes.mode(GPU0), ComputeMode::ExclusiveProcess);
    assert_eq!(f.mps.calls(), [format!("-d CUDA_VISIBLE_DEVICES={GPU0}"), "get_server_list".to_string()]);
    let daemon = daemon_of(&f, HOLDER0);
    assert!(alive(&daemon));
    let store = f.preparer.store();
    let changes = store.gpu_changes().unwrap();
    assert_eq!(
        changes.iter().map(|c| (c.claim.as_str(), c.compute_mode)).collect::<Vec<_>>(),
        [(HOLDER0, ComputeMode::ExclusiveProcess)]
    );
    assert!(store.mps_daemon(UID1).unwrap().is_none(), "the daemon is the GPU's, not the claim's");
    let dirs = f.preparer.settings().mps.dirs("shared-gpu-0");
    assert_eq!(dirs.root, f.root.join("run/edra/mps/shared-gpu-0"));
    assert!(dirs.shm.join(format!("edra-mps-stand-in.{}", daemon.pid)).exists(), "the daemon's /dev/shm");

    // The second share reuses the daemon; each share's device has its own limit.
    ok(&f.preparer.prepare(vec![cref(UID2, "b")]).await, UID2);
    assert_eq!(starts(&f), 1, "one daemon for the GPU: {:?}", f.mps.calls());
    assert_eq!(daemon_of(&f, HOLDER0), daemon);
    let (pipe, shm) = (dirs.pipe.display().to_string(), dirs.shm.display().to_string());
    let mounts = [(pipe, "/tmp/nvidia-mps".to_string()), (shm, "/dev/shm".to_string())];
    for (uid, share, mib) in [(UID1, SHARE1, 30720), (UID2, SHARE2, 20480)] {
        let (env, got) = edits_of(&f, uid, &format!("{uid}-gpu-0-{share}"));
        assert!(env.contains(&"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps".to_string()), "{env:?}");
        assert!(env.contains(&format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={mib}M")), "{env:?}");
        assert_eq!(got, mounts, "the GPU's pipe and shm, never the host's /dev/shm");
    }

    // The first share's release leaves the daemon to the second; the last stops it.
    assert_eq!(f.preparer.unprepare(vec![cref(UID1, "a")]).await.get(UID1), Some(&Ok(())));
    assert!(alive(&daemon), "a share is left");
    assert_eq!(f.modes.mode(GPU0), ComputeMode::ExclusiveProcess);
    assert_eq!(f.preparer.unprepare(vec![cref(UID2, "b")]).await.get(UID2), Some(&Ok(())));
    assert!(!alive(&daemon), "the daemon quit");
    assert_eq!(f.mps.calls().last().map(String::as_str), Some("quit"));
    assert!(!dirs.root.exists(), "its directories are removed");
    assert_eq!(f.modes.mode(GPU0), ComputeMode::Prohibited, "the compute mode before the first share is back");
    assert!(store.gpu_changes().unwrap().is_empty() && store.mps_daemons().unwrap().is_empty());
}

#[tokio::test]
async fn a_daemon_that_fails_to_start_fails_the_first_share_and_leaves_the_gpu_as_it_was_as_root() {
    if !root_or_skip("a_daemon_that_fails_to_start_fails_the_first_share_and_leaves_the_gpu_as_it_was_as_root") {
        return;
    }
    let f = mps_fixture().restart_with(|s| s.mps.ready_timeout = Duration::from_millis(500));
    f.mps.set("mps.crash", "nvidia-cuda-mps-server exited with status 1");
    f.claims.put(shared_claim(UID1, "a", &[("gpu", "gpu-0", SHARE1, "30Gi")], json!([])));
    let e = err(&f.preparer.prepare(vec![cref(UID1, "a")]).await, UID1);
    assert!(e.contains("cannot run the MPS control daemon of shared GPU gpu-0 (sharing.enforcement = \"mps\")"), "{e}");
    assert!(e.contains("nvidia-cuda-mps-server exited with status 1"), "the daemon's log: {e}");
    assert_eq!(f.modes.mode(GPU0), ComputeMode::Prohibited);
    assert_eq!(f.modes.sets().last(), Some(&(GPU0.to_string(), ComputeMode::Prohibited)), "mode put back");
    let store = f.preparer.store();
    assert!(store.claim(UID1).unwrap().is_none() && store.shares_of("gpu-0").unwrap().is_empty());
    assert!(store.gpu_changes().unwrap().is_empty() && store.mps_daemons().unwrap().is_empty());
    assert!(!f.preparer.settings().mps.dirs("shared-gpu-0").root.exists());
    assert!(!f.preparer.settings().spec_path(UID1).exists());

    // Without the binary the share fails before anything is recorded or changed.
    std::fs::remove_file(f.root.join("mps-bin/mps.crash")).unwrap();
    std::fs::remove_file(&f.mps.path).unwrap();
    let sets = f.modes.sets().len();
    let e = err(&f.preparer.prepare(vec![cref(UID1, "a")]).await, UID1);
    assert!(
        e.contains("cannot run the MPS control daemon of shared GPU gpu-0") && e.contains("paths.mps_control"),
        "{e}"
    );
    assert_eq!(f.modes.sets().len(), sets, "nothing was changed");
    assert!(store.claims().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_adopts_restarts_puts_back_and_sweeps_shared_gpu_daemons_as_root() {
    if !root_or_skip("recovery_adopts_restarts_puts_back_and_sweeps_shared_gpu_daemons_as_root") {
        return;
    }
    let f = mps_fixture();
    f.claims.put(shared_claim(UID1, "a", &[("gpu", "gpu-0", SHARE1, "30Gi")], json!([])));
    f.claims.put(shared_claim(UID2, "b", &[("gpu", "gpu-1", SHARE2, "30Gi")], json!([])));
    ok(&f.preparer.prepare(vec![cref(UID1, "a"), cref(UID2, "b")]).await, UID1);
    let (d0, d1) = (daemon_of(&f, HOLDER0), daemon_of(&f, "shared:gpu-1"));

    // kill -9 of edra: the restarted one adopts both daemons.
    let f = f.restart();
    let report = tokio::task::block_in_place(|| f.preparer.recover()).unwrap();
    assert_eq!(report.mps_adopted, [HOLDER0, "shared:gpu-1"]);
    assert_eq!(starts(&f), 2, "not started again");
    assert_eq!(tokio::task::block_in_place(|| f.preparer.check_mps_daemons()).unwrap(), 2);

    // gpu-0's daemon dies: supervision starts it again in the same directories.
    kill(&d0);
    assert_eq!(tokio::task::block_in_place(|| f.preparer.check_mps_daemons()).unwrap(), 2);
    let again = daemon_of(&f, HOLDER0);
    assert!(again != d0 && alive(&again));
    assert_eq!(f.preparer.store().mps_daemon(HOLDER0).unwrap().unwrap().restarts, 1);

    // A crash between the release of gpu-1's last share and its put-back; gpu-0's daemon
    // dies while edra is down; an orphaned shared-GPU daemon directory is left.
    f.preparer.store().remove_claim(UID2).unwrap();
    kill(&again);
    let sup = crate::gpu::mps::Supervisor { settings: f.preparer.settings().mps.clone() };
    let orphan = crate::gpu::mps::MpsDaemons::start(
        &sup,
        &crate::gpu::mps::DaemonSpec {
            id: "shared-gpu-7".into(),
            gpus: vec![GPU1.into()],
            active_thread_percentage: None,
            pinned_memory_mib: vec![],
        },
    )
    .unwrap();
    let f = f.restart();
    let report = tokio::task::block_in_place(|| f.preparer.recover()).unwrap();
    assert_eq!(report.mps_orphans, ["shared-gpu-7"]);
    assert!(wait_gone(&orphan), "the orphan is stopped");
    assert!(wait_gone(&d1), "gpu-1 has no share left: its daemon is stopped");
    assert_eq!(report.mps_restarted, [HOLDER0], "gpu-0 still has its share: its daemon runs again");
    assert!(alive(&daemon_of(&f, HOLDER0)));
    let holders: Vec<_> = f.preparer.store().gpu_changes().unwrap().into_iter().map(|c| c.claim).collect();
    assert_eq!(holders, [HOLDER0]);
    assert_eq!(f.modes.mode(GPU1), ComputeMode::Default, "gpu-1's compute mode is back");
    assert!(!f.preparer.settings().mps.dirs("shared-gpu-1").root.exists());

    assert_eq!(f.preparer.unprepare(vec![cref(UID1, "a")]).await.get(UID1), Some(&Ok(())));
    assert_eq!(f.modes.mode(GPU0), ComputeMode::Prohibited);
    assert!(f.preparer.store().mps_daemons().unwrap().is_empty());
}

#[tokio::test]
async fn strategies_on_a_share_and_shares_of_two_gpus_fail_their_claim_naming_the_enforcement() {
    let f = mps_fixture();
    let config = |strategy: &str| {
        json!([{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters":
            {"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": strategy}}}}])
    };
    f.claims.put(shared_claim(UID1, "ts", &[("gpu", "gpu-0", SHARE1, "10Gi")], config("TimeSlicing")));
    f.claims.put(shared_claim(UID2, "mps", &[("gpu", "gpu-0", SHARE2, "10Gi")], config("MPS")));
    let two = [("gpu", "gpu-0", SHARE1, "10Gi"), ("alt", "gpu-1", SHARE3, "10Gi")];
    f.claims.put(shared_claim(UID3, "two", &two, json!([])));
    let r = f.preparer.prepare(vec![cref(UID1, "ts"), cref(UID2, "mps"), cref(UID3, "two")]).await;
    for (uid, strategy) in [(UID1, "TimeSlicing"), (UID2, "MPS")] {
        let e = err(&r, uid);
        assert!(e.contains(&format!("sharing strategy {strategy} (request gpu) cannot apply to gpu-0")), "{e}");
        assert!(e.contains("sharing.enforcement = \"mps\": one MPS daemon serves all the GPU's shares"), "{e}");
    }
    let e = err(&r, UID3);
    assert!(e.contains("requests gpu and alt hold shares of GPUs gpu-0 and gpu-1"), "{e}");
    assert!(f.preparer.store().claims().unwrap().is_empty());
    assert!(f.mps.calls().is_empty() && f.modes.sets().len() == 1, "nothing was started or set");
}

#[test]
fn shared_gpu_daemons_are_named_by_their_gpu_and_limits_are_whole_mib_rounded_down() {
    use super::super::mps::{daemon_id, holder_of_dir, pinned_limit_env};
    assert_eq!(daemon_id(HOLDER0), "shared-gpu-0");
    assert_eq!(daemon_id(UID1), UID1, "a claim's daemon is named by its UID");
    for (dir, holder) in [
        ("shared-gpu-0", Some(HOLDER0)),
        ("shared-gpu-12", Some("shared:gpu-12")),
        (UID1, Some(UID1)),
        ("shared-gpu-", None),
        ("shared-gpu-0-mig-1g", None),
        ("shared-../etc", None),
        ("lost+found", None),
    ] {
        assert_eq!(holder_of_dir(dir).as_deref(), holder, "{dir}");
    }
    for (memory, env) in [
        (20 << 30, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M"),
        ((20 << 30) + (1 << 20) - 1, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M"),
        (80 * 1000 * 1000 * 1000 / 3, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=25431M"),
        // Never 0M (no share is that small: the smallest step is 1Mi).
        (1, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1M"),
    ] {
        assert_eq!(pinned_limit_env(memory), env, "{memory}");
    }
}

#[tokio::test]
async fn a_zero_share_never_gets_a_pinned_memory_limit_above_it() {
    // Refused before anything is set: no daemon, no spec with a 1M limit for a share of nothing.
    let f = mps_fixture();
    f.claims.put(shared_claim(UID1, "zero", &[("gpu", "gpu-0", SHARE1, "0")], json!([])));
    let e = err(&f.preparer.prepare(vec![cref(UID1, "zero")]).await, UID1);
    assert!(e.contains("has consumedCapacity memory \"0\", which is not a share edra publishes"), "{e}");
    assert!(f.mps.calls().is_empty(), "{:?}", f.mps.calls());
    assert!(!f.cdi_dir().join(format!("k8s.gpu.edra.dev-claim_{UID1}.json")).exists());
    assert_eq!(f.modes.mode(GPU0), ComputeMode::Prohibited, "the GPU is left as it was");
}
