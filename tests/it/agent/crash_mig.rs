//! Crash consistency of dynamic MIG with the real `edra run` binary and the mock backend
//! in MIG mode: the process aborts at each MIG-relevant failpoint of prepare and
//! unprepare, is restarted without failpoints, and must converge: after recovery the
//! mock's state file (the GPU's instances) holds exactly the instances of completed
//! claims, after the kubelet's retries nothing of edra's is left, and an instance edra
//! did not create is never destroyed.

#![cfg(debug_assertions)] // failpoints exist in debug builds only

use edra::gpu::mig_control::{MigControl, Placement};
use edra::inventory::mock::MockBackend;
use edra::plugin::ClaimRef;
use edra::state::{Phase, Store};

use super::crash::assert_died;
use super::mig::{MIG_MOCK, placements};
use crate::support::agent::{ChildAgent, Cluster, DRIVER, NODE, prepare, prepare_ok, unprepare, unprepare_ok};
use crate::support::apiserver::{AllocatedDevice, ClaimBuilder};

const DEVICE: &str = "gpu-0-mig-3g40gb-9-4";
const FOREIGN: Placement = Placement { start: 0, size: 1 };
const MINE: Placement = Placement { start: 4, size: 4 };

/// Creates a 1g.10gb instance at memory slice 0 that edra knows nothing of.
fn create_foreign(cluster: &Cluster) {
    let backend = MockBackend::new(&cluster.config_with(NODE, MIG_MOCK));
    let inventory = edra::inventory::DeviceBackend::discover(&backend).expect("discover");
    let profile = inventory.mig_gpus[0].capability.profile(19).expect("1g.10gb").clone();
    let control = backend.mig_control().expect("MIG mode");
    control.create_mig(&inventory.mig_gpus[0].uuid, &profile, FOREIGN).expect("create the foreign instance");
}

fn mig_claim(cluster: &Cluster, name: &str) -> ClaimRef {
    cluster.put_claim(ClaimBuilder::new("default", name).allocated(AllocatedDevice::new("gpu", DRIVER, NODE, DEVICE)))
}

/// The phase of `uid`'s record in the state of a stopped agent, if any.
fn phase_of(cluster: &Cluster, uid: &str) -> Option<Phase> {
    let store = Store::open(&cluster.fs().state_dir()).expect("open the state of the stopped agent");
    store.claim(uid).expect("read the claim record").map(|r| r.phase)
}

async fn crash_at(point: &str, in_unprepare: bool) {
    let cluster = Cluster::start().await;
    let config = cluster.config_file_with(NODE, MIG_MOCK);
    create_foreign(&cluster);
    let victim = mig_claim(&cluster, "victim");
    let next = mig_claim(&cluster, "next");
    let mut child = ChildAgent::start_configured(&cluster, &config, point, &[]).await;
    let mut v1 = child.v1().await;
    if in_unprepare {
        prepare_ok(&mut v1, &victim).await;
        let outcome = unprepare(&mut v1, std::slice::from_ref(&victim)).await;
        assert!(outcome.is_err(), "unprepare should fail when edra dies at {point}: {outcome:?}");
    } else {
        let outcome = prepare(&mut v1, std::slice::from_ref(&victim)).await;
        assert!(outcome.is_err(), "prepare should fail when edra dies at {point}: {outcome:?}");
    }
    assert_died(&mut child, point).await;

    // Recovery runs before the restarted agent serves.
    let restarted = ChildAgent::start_configured(&cluster, &config, "", &[]).await;
    restarted.terminate().await;
    let completed = phase_of(&cluster, &victim.uid) == Some(Phase::PrepareCompleted);
    let want = if completed { vec![FOREIGN, MINE] } else { vec![FOREIGN] };
    assert_eq!(placements(&cluster), want, "{point}: the instances of completed claims, and the foreign one");
    if !completed {
        assert_eq!(phase_of(&cluster, &victim.uid), None, "{point}: recovery drops the unfinished record");
    }

    // The kubelet retries: the unprepare, or the prepare and later the unprepare.
    let agent = ChildAgent::start_configured(&cluster, &config, "", &[]).await;
    let mut v1 = agent.v1().await;
    if !in_unprepare {
        prepare_ok(&mut v1, &victim).await;
        assert_eq!(placements(&cluster), [FOREIGN, MINE], "{point}");
    }
    unprepare_ok(&mut v1, &victim).await;
    assert_eq!(placements(&cluster), [FOREIGN], "{point}");
    prepare_ok(&mut v1, &next).await;
    unprepare_ok(&mut v1, &next).await;
    agent.terminate().await;
    assert_eq!(placements(&cluster), [FOREIGN], "{point}: nothing leaked, the foreign instance stays");
    let store = Store::open(&cluster.fs().state_dir()).expect("open the state");
    assert_eq!(store.claims().expect("read claims"), Vec::new(), "{point}: claim records left");
}

#[tokio::test]
async fn a_crash_at_each_mig_step_of_prepare_converges() {
    for point in [
        "prepare-after-mig-intent",
        "prepare-after-started",
        "prepare-after-mig-created",
        "prepare-after-mig-recorded",
        "prepare-after-cdi-write",
        "prepare-before-completed",
        "prepare-after-completed",
    ] {
        crash_at(point, false).await;
    }
}

#[tokio::test]
async fn a_crash_at_each_mig_step_of_unprepare_converges() {
    for point in [
        "unprepare-after-cdi-remove",
        "unprepare-after-mig-releasing",
        "unprepare-after-mig-destroyed",
        "unprepare-after-record-remove",
    ] {
        crash_at(point, true).await;
    }
}

#[tokio::test]
async fn a_reboot_loses_the_instance_and_the_restarted_agent_creates_it_again() {
    let cluster = Cluster::start().await;
    let config = cluster.config_file_with(NODE, MIG_MOCK);
    let victim = mig_claim(&cluster, "victim");
    let agent = ChildAgent::start_configured(&cluster, &config, "", &[]).await;
    let ids = prepare_ok(&mut agent.v1().await, &victim).await;
    agent.terminate().await;
    // A reboot empties the runtime directory (the GPU's instances) and the CDI directory.
    let fs = cluster.fs();
    std::fs::remove_file(fs.paths().runtime_dir.join(edra::inventory::mock::mig_state::STATE_FILE))
        .expect("state file");
    std::fs::remove_file(fs.spec_file(&victim.uid)).expect("spec file");
    let agent = ChildAgent::start_configured(&cluster, &config, "", &[]).await;
    assert_eq!(placements(&cluster), [MINE], "re-created at its placement before serving");
    assert!(fs.spec_file(&victim.uid).exists(), "the spec is written again");
    let mut v1 = agent.v1().await;
    assert_eq!(prepare_ok(&mut v1, &victim).await, ids);
    unprepare_ok(&mut v1, &victim).await;
    assert_eq!(placements(&cluster), []);
    agent.terminate().await;
}
