//! A release lost to a crash: an exclusive claim's unprepare removes its record lazily (in
//! sled's memory, on disk within about half a second), so a kill -9 right after it brings
//! the record back. It must not refuse the next claim of its GPU: the restarted agent
//! checks the holder against the API server when the device is needed and releases it,
//! and the stale-claim check releases it when nothing needs the device.

#[cfg(debug_assertions)]
use edra::state::{Phase, Store};

#[cfg(debug_assertions)]
use crate::support::agent::{ChildAgent, Cluster, GPUS, NODE, NodeFs, prepare_ok, unprepare, unprepare_ok, wait_until};

#[cfg(debug_assertions)]
/// The phase of `uid`'s record in the state of a stopped agent, if any.
fn phase_of(fs: &NodeFs, uid: &str) -> Option<Phase> {
    let store = Store::open(&fs.state_dir()).expect("open the state of the stopped agent");
    store.claim(uid).expect("read the claim record").map(|r| r.phase)
}

#[cfg(debug_assertions)] // failpoints exist in debug builds only
#[tokio::test]
async fn a_release_lost_to_a_crash_does_not_refuse_the_next_claim_of_its_gpu() {
    let point = "unprepare-after-record-remove";
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let a = cluster.allocated_claim("a", "gpu-0");
    let b = cluster.allocated_claim("b", "gpu-0");
    let mut child = ChildAgent::start(&cluster, point).await;
    let mut v1 = child.v1().await;
    prepare_ok(&mut v1, &a).await;
    let outcome = unprepare(&mut v1, std::slice::from_ref(&a)).await;
    assert!(outcome.is_err(), "unprepare should fail when edra dies at {point}: {outcome:?}");
    super::crash::assert_died(&mut child, point).await;
    // The removal was in sled's memory only: the record is back, holding gpu-0.
    assert_eq!(phase_of(&fs, &a.uid), Some(Phase::PrepareCompleted), "the lazy removal was lost");
    // The kubelet saw no answer; the pod is deleted, and so is its claim.
    cluster.server.delete_claim("default", "a").expect("claim a existed");
    let child = ChildAgent::start(&cluster, "").await;
    let mut v1 = child.v1().await;
    prepare_ok(&mut v1, &b).await;
    assert!(!fs.spec_file(&a.uid).exists(), "a's spec went with its release");
    let said = format!(
        "released claim default/a (UID {}), prepared on this node but gone: the ResourceClaim no longer exists",
        a.uid
    );
    assert!(child.stderr().contains(&said), "edra should say {said:?}; its stderr:\n{}", child.stderr());
    unprepare_ok(&mut v1, &b).await;
    child.terminate().await;
    assert_eq!(phase_of(&fs, &a.uid), None);
    assert_eq!(phase_of(&fs, &b.uid), None, "released at the terminate at the latest");
}

#[cfg(debug_assertions)] // an armed failpoint keeps sled's flusher off: the lost release is certain
#[tokio::test]
async fn an_answered_unprepare_lost_to_a_kill_comes_back_and_the_stale_claim_check_releases_it() {
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let a = cluster.reserved_claim("a", "gpu-0");
    // Armed but never hit by an exclusive GPU's claim: the flusher is off, nothing else.
    let mut child = ChildAgent::start(&cluster, "prepare-after-mig-intent").await;
    let mut v1 = child.v1().await;
    prepare_ok(&mut v1, &a).await;
    unprepare_ok(&mut v1, &a).await;
    assert!(!fs.spec_file(&a.uid).exists(), "the unprepare was answered after its spec went");
    // kill -9 before sled's flusher (within about 0.5 s on a node) wrote the release.
    child.kill().await;
    assert_eq!(phase_of(&fs, &a.uid), Some(Phase::PrepareCompleted), "the answered release was lost");
    // Its pod went and its claim with it; no kubelet call names the claim again.
    cluster.server.delete_claim("default", "a").expect("claim a existed");
    let quick = cluster
        .config_file_with(NODE, &format!("gpus = {GPUS}\n[claims]\ncheck_interval = \"1s\"\nrelease_after = \"1s\"\n"));
    let child = ChildAgent::start_configured(&cluster, &quick, "", &[]).await;
    assert!(fs.spec_file(&a.uid).exists(), "back as prepared: recovery wrote its spec again");
    wait_until("the stale-claim check released it", || !fs.spec_file(&a.uid).exists()).await;
    let said = format!(
        "released claim default/a (UID {}), prepared on this node but gone: the ResourceClaim no longer exists; its \
         devices are free again",
        a.uid
    );
    wait_until("the release logged", || child.stderr().contains(&said)).await;
    child.terminate().await;
    assert_eq!(phase_of(&fs, &a.uid), None);
}
