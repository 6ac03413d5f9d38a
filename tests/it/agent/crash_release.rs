//! A release lost to a crash: an exclusive claim's unprepare removes its record lazily (in
//! sled's memory, on disk within about half a second), so a kill -9 right after it brings
//! the record back. It must not refuse the next claim of its GPU: the restarted agent
//! checks the holder against the API server when the device is needed and releases it.

#[cfg(debug_assertions)]
use edra::state::{Phase, Store};

#[cfg(debug_assertions)]
use crate::support::agent::{ChildAgent, Cluster, NodeFs, prepare_ok, unprepare, unprepare_ok};

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
