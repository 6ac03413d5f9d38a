//! Crash consistency of the real `edra run` binary: the process is aborted at each
//! failpoint of prepare and unprepare (`FAILPOINT_EDRA`), or killed with SIGKILL during a
//! burst of prepares, then restarted without failpoints. After the restart, prepare and
//! unprepare must succeed, exactly one spec file per prepared claim must exist, and after
//! unprepare nothing may be left: no spec files, no records, no device holdings.

use std::time::Duration;

use edra::plugin::ClaimRef;
#[cfg(debug_assertions)]
use edra::state::Phase;
use edra::state::Store;

use crate::support::agent::{ChildAgent, Cluster, GPUS, NodeFs, WAIT, prepare, prepare_ok, unprepare, unprepare_ok};
#[cfg(debug_assertions)]
use crate::support::agent::{DRIVER, NODE};
#[cfg(debug_assertions)]
use crate::support::apiserver::{AllocatedDevice, ClaimBuilder};

/// Opens the state of a stopped agent and asserts it holds no claims and no devices.
fn assert_state_empty(fs: &NodeFs) {
    let store = Store::open(&fs.state_dir()).expect("open the state of the stopped agent");
    assert_eq!(store.claims().expect("read claims"), Vec::new(), "claim records left");
    for i in 0..GPUS {
        assert_eq!(store.holder(&format!("gpu-{i}")).expect("read holder"), None, "gpu-{i} still held");
        assert_eq!(store.shares_of(&format!("gpu-{i}")).expect("read shares"), Vec::new(), "shares of gpu-{i} left");
    }
    assert_eq!(store.gpu_changes().expect("read GPU changes"), Vec::new(), "GPU change records left");
    assert_eq!(store.mps_daemons().expect("read MPS daemons"), Vec::new(), "MPS daemon records left");
}

#[cfg(debug_assertions)]
/// Waits for the aborted child, asserts it died by a signal.
pub(super) async fn assert_died(child: &mut ChildAgent, point: &str) {
    let status = child.wait_exit().await;
    assert!(!status.success() && status.code().is_none(), "edra should abort at {point}, exited with {status}");
    let said = format!("edra: failpoint {point} hit; aborting");
    assert!(child.stderr().contains(&said), "edra should say {said:?}; its stderr:\n{}", child.stderr());
}

#[cfg(debug_assertions)]
/// After the crash and a restart: the claim prepares, has exactly one spec, unprepares,
/// and a second claim for the same device prepares too (no holding left behind).
async fn converge(cluster: &Cluster, claim: &ClaimRef, other: &ClaimRef, sharing: Sharing) {
    let fs = cluster.fs();
    let child = start_agent(cluster, "", sharing).await;
    let mut v1 = child.v1().await;
    let ids = prepare_ok(&mut v1, claim).await;
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(fs.spec_files(), [fs.spec_file(&claim.uid)], "exactly one spec file");
    assert_eq!(prepare_ok(&mut v1, claim).await, ids, "the completed claim answers the same");
    unprepare_ok(&mut v1, claim).await;
    assert!(fs.spec_files().is_empty(), "spec files left: {:?}", fs.spec_files());
    prepare_ok(&mut v1, other).await;
    unprepare_ok(&mut v1, other).await;
    assert!(fs.spec_files().is_empty());
    child.terminate().await;
    assert_state_empty(&fs);
}

#[cfg(debug_assertions)]
/// The phase of `uid`'s record in the state of a stopped agent, if any.
fn phase_of(fs: &NodeFs, uid: &str) -> Option<Phase> {
    let store = Store::open(&fs.state_dir()).expect("open the state of the stopped agent");
    store.claim(uid).expect("read the claim record").map(|r| r.phase)
}

/// What the crash left: the record's phase and whether the spec file exists.
#[cfg(debug_assertions)]
type Left = (Option<Phase>, bool);

#[cfg(debug_assertions)]
/// How the crash tests' claim shares its GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sharing {
    Exclusive,
    /// Passes the GPU setting failpoints.
    TimeSliced,
    /// Passes the MPS failpoints (and the compute mode ones).
    Mps,
    /// A 50Gi share of the 80Gi gpu-0: two cannot be held at once, so a share left behind
    /// by the crash would refuse the next claim.
    Share,
    /// [`Sharing::Share`] on an agent with `sharing.enforcement = "mps"`: passes the MPS
    /// failpoints (and the compute mode ones) for the GPU's daemon.
    ShareMps,
}

#[cfg(debug_assertions)]
/// Starts the agent with `failpoints`, configured for `sharing`.
async fn start_agent(cluster: &Cluster, failpoints: &str, sharing: Sharing) -> ChildAgent {
    let config = match sharing {
        Sharing::ShareMps => {
            cluster.config_file_with(NODE, &format!("gpus = {GPUS}\n[sharing]\nenforcement = \"mps\""))
        }
        _ => cluster.config_file(NODE),
    };
    ChildAgent::start_configured(cluster, &config, failpoints, &[]).await
}

#[cfg(debug_assertions)]
/// A claim for gpu-0, shared as `sharing` says.
fn gpu0_claim(cluster: &Cluster, name: &str, sharing: Sharing) -> ClaimRef {
    let strategy = match sharing {
        Sharing::Exclusive => return cluster.allocated_claim(name, "gpu-0"),
        Sharing::Share | Sharing::ShareMps => {
            let share_id = if name == "victim" {
                "6de5d941-c79d-4a8a-ba10-668351620525"
            } else {
                "1b4e28ba-2fa1-41d2-883f-0016d3cca427"
            };
            let device = AllocatedDevice::new("gpu", DRIVER, NODE, "gpu-0").share(share_id, "50Gi");
            return cluster.put_claim(ClaimBuilder::new("default", name).allocated(device));
        }
        Sharing::TimeSliced => serde_json::json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Medium"}}),
        Sharing::Mps => serde_json::json!({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 20}}),
    };
    let config =
        serde_json::json!({"apiVersion": format!("{DRIVER}/v1alpha1"), "kind": "GpuConfig", "sharing": strategy});
    cluster.put_claim(
        ClaimBuilder::new("default", name).allocated(AllocatedDevice::new("gpu", DRIVER, NODE, "gpu-0")).opaque_config(
            "FromClaim",
            &[],
            DRIVER,
            config,
        ),
    )
}

#[cfg(debug_assertions)]
/// After a claim converged: the last thing done to a time-sliced GPU reset its interval,
/// and no MPS daemon is left (every daemon the agent started has quit).
fn assert_gpu_put_back(cluster: &Cluster, sharing: Sharing) {
    let fs = cluster.fs();
    let daemons = std::fs::read_dir(fs.paths().runtime_dir.join("mps")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(daemons, 0, "MPS daemon directories left");
    assert_eq!(fs.mps_control().running_daemons(), Vec::<u32>::new(), "MPS daemons left running");
    let mps = fs.mps_control().calls();
    let (starts, quits) =
        (mps.iter().filter(|c| c.starts_with("-d")).count(), mps.iter().filter(|c| *c == "quit").count());
    if matches!(sharing, Sharing::Mps | Sharing::ShareMps) {
        assert!(starts > 0 && quits > 0, "{mps:?}");
    } else {
        assert!(mps.is_empty(), "{mps:?}");
    }
    assert_interval_reset(cluster, sharing == Sharing::TimeSliced);
}

#[cfg(debug_assertions)]
fn assert_interval_reset(cluster: &Cluster, time_sliced: bool) {
    let calls = cluster.fs().nvidia_smi().calls();
    if time_sliced {
        assert!(calls.last().is_some_and(|c| c.ends_with("--set-timeslice=0")), "{calls:?}");
    } else {
        assert!(calls.is_empty(), "{calls:?}");
    }
}

#[cfg(debug_assertions)]
async fn crash_in_prepare(point: &str, left: Left, sharing: Sharing) {
    if matches!(sharing, Sharing::Mps | Sharing::ShareMps) && !crate::support::mps::is_root() {
        eprintln!("{point}: skipped, an MPS daemon's own mount namespace needs root");
        return;
    }
    let time_sliced = sharing == Sharing::TimeSliced;
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let claim = gpu0_claim(&cluster, "victim", sharing);
    let other = gpu0_claim(&cluster, "next", sharing);
    let mut child = start_agent(&cluster, point, sharing).await;
    let mut v1 = child.v1().await;
    let outcome = prepare(&mut v1, std::slice::from_ref(&claim)).await;
    assert!(outcome.is_err(), "prepare should fail when edra dies at {point}: {outcome:?}");
    assert_died(&mut child, point).await;
    assert_eq!((phase_of(&fs, &claim.uid), fs.spec_file(&claim.uid).exists()), left, "left by a crash at {point}");
    // A completed record is kept, unless the crash cut it short before its devices were
    // taken (and so before the kubelet was answered).
    if left.0 == Some(Phase::PrepareCompleted) && point != "prepare-after-record" {
        // Durable: the restarted agent answers from its state, without the API server.
        let mark = cluster.server.request_mark();
        let restarted = start_agent(&cluster, "", sharing).await;
        prepare_ok(&mut restarted.v1().await, &claim).await;
        let claim_reads = cluster.server.requests()[mark..]
            .iter()
            .filter(|r| r.verb == "get" && r.path.contains("/resourceclaims/"))
            .count();
        assert_eq!(claim_reads, 0, "a completed prepare is answered from the state store");
        restarted.terminate().await;
    } else {
        // Rolled back at start: no spec until the kubelet retries.
        let restarted = start_agent(&cluster, "", sharing).await;
        assert!(fs.spec_files().is_empty(), "recovery rolls back: {:?}", fs.spec_files());
        restarted.terminate().await;
        assert_eq!(phase_of(&fs, &claim.uid), None, "recovery removes the interrupted record");
        assert_interval_reset(&cluster, time_sliced && !fs.nvidia_smi().calls().is_empty());
    }
    converge(&cluster, &claim, &other, sharing).await;
    assert_gpu_put_back(&cluster, sharing);
}

#[cfg(debug_assertions)]
async fn crash_in_unprepare(point: &str, left: Left, sharing: Sharing) {
    if matches!(sharing, Sharing::Mps | Sharing::ShareMps) && !crate::support::mps::is_root() {
        eprintln!("{point}: skipped, an MPS daemon's own mount namespace needs root");
        return;
    }
    let cluster = Cluster::start().await;
    let claim = gpu0_claim(&cluster, "victim", sharing);
    let other = gpu0_claim(&cluster, "next", sharing);
    let mut child = start_agent(&cluster, point, sharing).await;
    let mut v1 = child.v1().await;
    prepare_ok(&mut v1, &claim).await;
    let outcome = unprepare(&mut v1, std::slice::from_ref(&claim)).await;
    assert!(outcome.is_err(), "unprepare should fail when edra dies at {point}: {outcome:?}");
    assert_died(&mut child, point).await;
    let fs = cluster.fs();
    assert_eq!((phase_of(&fs, &claim.uid), fs.spec_file(&claim.uid).exists()), left, "left by a crash at {point}");
    // The kubelet retries the unprepare first, then (for a new pod) may prepare again.
    let restarted = start_agent(&cluster, "", sharing).await;
    let kept = usize::from(left.0.is_some());
    assert_eq!(fs.spec_files().len(), kept, "recovery re-writes the spec of a kept record, removes nothing else");
    let mut v1 = restarted.v1().await;
    unprepare_ok(&mut v1, &claim).await;
    assert!(fs.spec_files().is_empty(), "spec files left: {:?}", fs.spec_files());
    restarted.terminate().await;
    assert_state_empty(&fs);
    converge(&cluster, &claim, &other, sharing).await;
    assert_gpu_put_back(&cluster, sharing);
}

#[cfg(debug_assertions)] // failpoints exist in debug builds only
#[tokio::test]
async fn crash_after_prepare_started() {
    // Only a claim that changes a GPU records PrepareStarted; an exclusive one makes one
    // durable step (its spec first, then PrepareCompleted).
    crash_in_prepare("prepare-after-started", (Some(Phase::PrepareStarted), false), Sharing::TimeSliced).await;
}

#[cfg(debug_assertions)] // failpoints exist in debug builds only
#[tokio::test]
async fn crash_after_cdi_write() {
    // The spec is written, nothing is recorded: recovery removes the spec as an orphan.
    crash_in_prepare("prepare-after-cdi-write", (None, true), Sharing::Exclusive).await;
}

#[cfg(debug_assertions)] // failpoints exist in debug builds only
#[tokio::test]
async fn crash_before_prepare_completed() {
    crash_in_prepare("prepare-before-completed", (None, true), Sharing::Exclusive).await;
}

#[cfg(debug_assertions)] // failpoints exist in debug builds only
#[tokio::test]
async fn crash_after_the_record_before_its_devices_were_taken() {
    // An exclusive claim's first record is made without a transaction: the record, then
    // its devices. The failpoint makes the record durable first, as sled's background
    // flusher may; recovery rolls it back (its devices are not held) and removes the spec.
    crash_in_prepare("prepare-after-record", (Some(Phase::PrepareCompleted), true), Sharing::Exclusive).await;
}

#[cfg(debug_assertions)] // failpoints exist in debug builds only
#[tokio::test]
async fn crash_after_prepare_completed() {
    crash_in_prepare("prepare-after-completed", (Some(Phase::PrepareCompleted), true), Sharing::Exclusive).await;
}

#[cfg(debug_assertions)] // failpoints exist in debug builds only
#[tokio::test]
async fn crash_after_unprepare_removed_the_spec() {
    crash_in_unprepare("unprepare-after-cdi-remove", (Some(Phase::PrepareCompleted), false), Sharing::Exclusive).await;
}

#[cfg(debug_assertions)] // failpoints exist in debug builds only
#[tokio::test]
async fn crash_after_unprepare_removed_the_record() {
    // An exclusive claim's record is removed lazily: the crash brings it back (see
    // crash_release.rs), and the kubelet's retried unprepare releases it.
    crash_in_unprepare("unprepare-after-record-remove", (Some(Phase::PrepareCompleted), false), Sharing::Exclusive)
        .await;
}

#[cfg(debug_assertions)] // failpoints exist in debug builds only
#[tokio::test]
async fn crash_after_a_gpu_change_was_recorded() {
    crash_in_prepare("prepare-after-gpu-recorded", (Some(Phase::PrepareStarted), false), Sharing::TimeSliced).await;
}

#[cfg(debug_assertions)] // failpoints exist in debug builds only
#[tokio::test]
async fn crash_after_the_compute_mode_was_set() {
    crash_in_prepare("prepare-after-compute-mode", (Some(Phase::PrepareStarted), false), Sharing::TimeSliced).await;
}

#[cfg(debug_assertions)] // failpoints exist in debug builds only
#[tokio::test]
async fn crash_after_the_timeslice_was_set() {
    crash_in_prepare("prepare-after-timeslice", (Some(Phase::PrepareStarted), false), Sharing::TimeSliced).await;
}

#[cfg(debug_assertions)] // failpoints exist in debug builds only
#[tokio::test]
async fn crash_after_unprepare_reset_the_timeslice() {
    crash_in_unprepare("unprepare-after-timeslice-reset", (Some(Phase::PrepareCompleted), false), Sharing::TimeSliced)
        .await;
}

#[cfg(debug_assertions)] // failpoints exist in debug builds only
#[tokio::test]
async fn crash_after_unprepare_restored_the_compute_mode() {
    crash_in_unprepare(
        "unprepare-after-compute-mode-restore",
        (Some(Phase::PrepareCompleted), false),
        Sharing::TimeSliced,
    )
    .await;
}

#[cfg(debug_assertions)] // failpoints exist in debug builds only
#[tokio::test]
async fn a_time_sliced_claim_converges_after_a_crash_once_completed() {
    crash_in_prepare("prepare-after-completed", (Some(Phase::PrepareCompleted), true), Sharing::TimeSliced).await;
}

#[cfg(debug_assertions)] // failpoints exist in debug builds only
#[tokio::test]
async fn crash_after_the_mps_daemon_was_recorded() {
    crash_in_prepare("prepare-after-mps-recorded", (Some(Phase::PrepareStarted), false), Sharing::Mps).await;
}

#[cfg(debug_assertions)] // failpoints exist in debug builds only
#[tokio::test]
async fn crash_after_the_mps_daemon_started() {
    crash_in_prepare("prepare-after-mps-started", (Some(Phase::PrepareStarted), false), Sharing::Mps).await;
}

#[cfg(debug_assertions)] // failpoints exist in debug builds only
#[tokio::test]
async fn crash_after_unprepare_stopped_the_mps_daemon() {
    crash_in_unprepare("unprepare-after-mps-stop", (Some(Phase::PrepareCompleted), false), Sharing::Mps).await;
}

#[cfg(debug_assertions)] // failpoints exist in debug builds only
#[tokio::test]
async fn an_mps_claim_converges_after_a_crash_once_completed() {
    crash_in_prepare("prepare-after-completed", (Some(Phase::PrepareCompleted), true), Sharing::Mps).await;
}

#[test]
fn every_failpoint_is_covered() {
    let covered = [
        "prepare-after-mig-intent",
        "prepare-after-started",
        "prepare-after-mig-created",
        "prepare-after-mig-recorded",
        "prepare-after-gpu-recorded",
        "prepare-after-compute-mode",
        "prepare-after-timeslice",
        "prepare-after-mps-recorded",
        "prepare-after-mps-started",
        "prepare-after-cdi-write",
        "prepare-before-completed",
        "prepare-after-record",
        "prepare-after-completed",
        "unprepare-after-cdi-remove",
        "unprepare-after-mps-stop",
        "unprepare-after-timeslice-reset",
        "unprepare-after-compute-mode-restore",
        "unprepare-after-mig-releasing",
        "unprepare-after-mig-destroyed",
        "unprepare-after-record-remove",
    ];
    assert_eq!(edra::prepare::failpoint::POINTS, covered);
}

#[tokio::test]
async fn sigkill_during_a_burst_of_prepares_converges() {
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let claims: Vec<ClaimRef> =
        (0..GPUS).map(|i| cluster.allocated_claim(&format!("burst-{i}"), &format!("gpu-{i}"))).collect();
    for round in 0..4 {
        let mut child = ChildAgent::start(&cluster, "").await;
        let mark = cluster.server.request_mark();
        let calls: Vec<_> = claims
            .iter()
            .map(|c| {
                let socket = fs.dra_socket();
                let c = c.clone();
                tokio::spawn(async move {
                    let mut v1 = crate::support::kubelet::dra_v1(&socket).await;
                    prepare(&mut v1, &[c]).await
                })
            })
            .collect();
        // Kill once a random number of the claims have been fetched, i.e. while prepares
        // are in progress, plus up to 5 ms at random.
        let fetched = fastrand::usize(1..=claims.len());
        cluster
            .server
            .wait_for("claim fetches", WAIT, |s| {
                s.requests()[mark..].iter().filter(|r| r.path.contains("/resourceclaims/")).count() >= fetched
            })
            .await
            .expect("the agent fetches the claims");
        tokio::time::sleep(Duration::from_micros(fastrand::u64(0..5_000))).await;
        child.kill().await;
        let finished = futures_util::future::join_all(calls).await;
        let answered = finished.iter().filter(|r| matches!(r, Ok(Ok(_)))).count();
        let phases: Vec<_> = {
            let store = Store::open(&fs.state_dir()).expect("open the state after SIGKILL");
            store.claims().expect("read claims").into_iter().map(|r| r.phase).collect()
        };
        eprintln!(
            "round {round}: SIGKILL after {fetched} fetches; {answered} of {} answered; records left {phases:?}; spec files {}",
            claims.len(),
            fs.spec_files().len()
        );

        let child = ChildAgent::start(&cluster, "").await;
        let mut v1 = child.v1().await;
        let answer = prepare(&mut v1, &claims).await.expect("NodePrepareResources after restart");
        for c in &claims {
            assert_eq!(answer[&c.uid].error, "", "round {round}: {}", c.name);
            assert_eq!(answer[&c.uid].devices.len(), 1);
        }
        let mut want: Vec<_> = claims.iter().map(|c| fs.spec_file(&c.uid)).collect();
        want.sort();
        assert_eq!(fs.spec_files(), want, "round {round}: one spec per claim");
        let released = unprepare(&mut v1, &claims).await.expect("NodeUnprepareResources");
        assert!(released.values().all(String::is_empty), "{released:?}");
        assert!(fs.spec_files().is_empty());
        child.terminate().await;
        assert_state_empty(&fs);
    }
}

fn dir_names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read a socket directory")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_restart_after_sigkill_replaces_stale_sockets() {
    use std::os::unix::fs::PermissionsExt;
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let mut child = ChildAgent::start(&cluster, "").await;
    child.kill().await;
    let registry = fs.registration_socket().parent().expect("registry dir").to_path_buf();
    let plugin_dir = fs.dra_socket().parent().expect("plugin dir").to_path_buf();
    // Left by a process killed between binding and renaming a socket into place: in the
    // driver's directory, or (by an earlier version) in the registry.
    let hidden = format!(".{}~", fs.registration_socket().file_name().and_then(|n| n.to_str()).expect("name"));
    for stale in [plugin_dir.join(&hidden), plugin_dir.join(".dra.sock~"), registry.join(&hidden)] {
        drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind a stale hidden socket"));
    }
    assert!(fs.registration_socket().exists() && fs.dra_socket().exists(), "SIGKILL leaves the sockets");

    let child = ChildAgent::start(&cluster, "").await;
    assert_eq!(dir_names(&registry), ["gpu.edra.dev-reg.sock"]);
    assert_eq!(dir_names(&plugin_dir), ["dra.sock", "edra.lock"]);
    for socket in [fs.registration_socket(), fs.dra_socket()] {
        let mode = std::fs::metadata(&socket).expect("socket").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", socket.display());
    }
    let claim = cluster.allocated_claim("after-restart", "gpu-1");
    let mut v1 = child.v1().await;
    prepare_ok(&mut v1, &claim).await;
    unprepare_ok(&mut v1, &claim).await;
    child.terminate().await;
    // systemd's fd store (played by the test) keeps the sockets listening: their files stay.
    assert_eq!(dir_names(&registry), ["gpu.edra.dev-reg.sock"]);
    // The instance lock file stays (removing it would let two starting agents race).
    assert_eq!(dir_names(&plugin_dir), ["dra.sock", "edra.lock"]);
}

#[cfg(debug_assertions)]
#[tokio::test]
async fn crash_after_a_shares_spec_is_written_leaves_no_share() {
    crash_in_prepare("prepare-after-cdi-write", (None, true), Sharing::Share).await;
    crash_in_prepare("prepare-before-completed", (None, true), Sharing::Share).await;
}

#[cfg(debug_assertions)]
#[tokio::test]
async fn crash_after_a_share_is_completed_keeps_it() {
    crash_in_prepare("prepare-after-completed", (Some(Phase::PrepareCompleted), true), Sharing::Share).await;
}

#[cfg(debug_assertions)]
#[tokio::test]
async fn crash_in_a_shares_unprepare_converges() {
    crash_in_unprepare("unprepare-after-cdi-remove", (Some(Phase::PrepareCompleted), false), Sharing::Share).await;
    // A share on a GPU without sharing.enforcement is released lazily: the crash brings it back.
    crash_in_unprepare("unprepare-after-record-remove", (Some(Phase::PrepareCompleted), false), Sharing::Share).await;
}

#[cfg(debug_assertions)]
#[tokio::test]
async fn crash_in_a_prepare_with_mps_enforcement_leaves_no_daemon_and_no_holding() {
    // The first share of gpu-0 records EXCLUSIVE_PROCESS, sets it, records the GPU's
    // daemon and starts it: a crash after each is rolled back at the next start.
    for point in [
        "prepare-after-gpu-recorded",
        "prepare-after-compute-mode",
        "prepare-after-mps-recorded",
        "prepare-after-mps-started",
    ] {
        crash_in_prepare(point, (Some(Phase::PrepareStarted), false), Sharing::ShareMps).await;
    }
}

#[cfg(debug_assertions)]
#[tokio::test]
async fn a_share_with_mps_enforcement_converges_after_a_crash_once_completed() {
    crash_in_prepare("prepare-after-completed", (Some(Phase::PrepareCompleted), true), Sharing::ShareMps).await;
}

#[cfg(debug_assertions)]
#[tokio::test]
async fn crash_in_the_last_shares_release_with_mps_enforcement_converges() {
    // The claim's record is gone; the GPU's daemon quit (or its compute mode is back) and
    // the GPU's records are left: the next start (or unprepare) finishes the put-back.
    crash_in_unprepare("unprepare-after-mps-stop", (None, false), Sharing::ShareMps).await;
    crash_in_unprepare("unprepare-after-compute-mode-restore", (None, false), Sharing::ShareMps).await;
    crash_in_unprepare("unprepare-after-cdi-remove", (Some(Phase::PrepareCompleted), false), Sharing::ShareMps).await;
}
