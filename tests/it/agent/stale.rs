//! Prepared claims that are gone from the API server (deleted while the node was down, an
//! unprepare never sent) are released after they stay gone; claims that hold are kept, and
//! so is everything while the API server cannot say. A claim a running pod of this node
//! names is not read at all; once its pod is gone it is checked again.

use std::time::Duration;

use crate::support::agent::{Agent, CapturedLogs, Cluster, DRIVER, GPUS, NODE, prepare_ok, wait_until};
use crate::support::apiserver::{AllocatedDevice, ClaimBuilder, bound_pod};

/// Checked every second, released after a second of being gone.
fn quick_checks() -> String {
    format!("gpus = {GPUS}\n[claims]\ncheck_interval = \"1s\"\nrelease_after = \"1s\"\n")
}

fn reserved_claim(cluster: &Cluster, name: &str, device: &str) -> edra::plugin::ClaimRef {
    cluster.put_claim(
        ClaimBuilder::new("default", name)
            .allocated(AllocatedDevice::new("gpu", DRIVER, NODE, device))
            .reserved_for_pod(&format!("pod-{name}"), &format!("00000000-0000-4000-8000-00000000000{}", name.len())),
    )
}

#[tokio::test]
async fn a_deleted_claim_is_released_and_its_gpu_prepared_for_another_while_held_claims_stay() {
    let cluster = Cluster::start().await;
    let (logs, _guard) = CapturedLogs::start();
    let agent = Agent::start(cluster.fs(), cluster.config_with(NODE, &quick_checks())).await;
    let gone = reserved_claim(&cluster, "gone", "gpu-0");
    let held = reserved_claim(&cluster, "held", "gpu-1");
    let mut v1 = agent.v1().await;
    prepare_ok(&mut v1, &gone).await;
    prepare_ok(&mut v1, &held).await;
    let fs = cluster.fs();
    cluster.server.delete_claim("default", "gone").expect("the claim existed");
    wait_until("the gone claim's spec removed", || !fs.spec_file(&gone.uid).exists()).await;
    assert!(fs.spec_file(&held.uid).exists(), "a claim still reserved is kept");
    // The release is logged once it returned (the spec goes first).
    let released = format!("released claim default/gone (UID {})", gone.uid);
    wait_until("the release logged", || logs.text().contains(&released)).await;
    let text = logs.text();
    assert!(text.contains("the ResourceClaim no longer exists"), "{text}");
    // gpu-0 is free: a new claim for it is prepared (local accounting would refuse it otherwise).
    let next = reserved_claim(&cluster, "next", "gpu-0");
    prepare_ok(&mut v1, &next).await;
    // Held claims stay held across further checks.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(fs.spec_file(&held.uid).exists() && fs.spec_file(&next.uid).exists());
    agent.stop().await;
}

#[tokio::test]
async fn nothing_is_released_while_the_api_server_cannot_say() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), cluster.config_with(NODE, &quick_checks())).await;
    let claim = reserved_claim(&cluster, "kept", "gpu-0");
    let mut v1 = agent.v1().await;
    prepare_ok(&mut v1, &claim).await;
    cluster.server.stop().await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(cluster.fs().spec_file(&claim.uid).exists(), "an unreachable server proves nothing");
    // Back, with the claim no longer reserved for any pod: released.
    cluster.server.set_claim_status(
        "default",
        "kept",
        serde_json::json!({"allocation": cluster.server.with_state(|s| s.claim("default", "kept"))
            .expect("claim")["status"]["allocation"].clone()}),
    );
    cluster.server.restart().expect("restart the API server");
    let fs = cluster.fs();
    wait_until("the unreserved claim released", || !fs.spec_file(&claim.uid).exists()).await;
    agent.stop().await;
}

/// GETs of claim `name` the API server answered from request `mark` on.
fn claim_reads(cluster: &Cluster, name: &str, mark: usize) -> usize {
    let path = format!("/resourceclaims/{name}");
    cluster
        .server
        .with_state(|s| s.requests()[mark..].iter().filter(|r| r.verb == "get" && r.path.ends_with(&path)).count())
}

#[tokio::test]
async fn a_claim_a_running_pod_uses_is_not_read_at_rest_and_one_whose_pod_went_is_checked_and_released() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), cluster.config_with(NODE, &quick_checks())).await;
    let used = reserved_claim(&cluster, "used", "gpu-0");
    let left = reserved_claim(&cluster, "left", "gpu-1");
    let mut v1 = agent.v1().await;
    prepare_ok(&mut v1, &used).await;
    prepare_ok(&mut v1, &left).await;
    for (pod, claim) in [("pod-used", "used"), ("pod-left", "left")] {
        let mut p = bound_pod("default", pod, NODE, &[("gpu", claim)]);
        p["status"]["phase"] = serde_json::json!("Running");
        cluster.server.put_pod(p);
    }
    // The pod watch sees them well within a check interval.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mark = cluster.server.with_state(|s| s.request_mark());
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!((claim_reads(&cluster, "used", mark), claim_reads(&cluster, "left", mark)), (0, 0), "3 checks at rest");
    // The pod of one ended and its claim was deleted (an unprepare the kubelet never sent):
    // read, found gone, released; the other is still not read.
    cluster.server.set_pod_phase("default", "pod-left", "Succeeded").expect("the pod exists");
    cluster.server.delete_claim("default", "left").expect("the claim existed");
    let fs = cluster.fs();
    wait_until("the claim whose pod ended released", || !fs.spec_file(&left.uid).exists()).await;
    assert!(claim_reads(&cluster, "left", mark) >= 2, "seen gone, then read again before the release");
    assert!(fs.spec_file(&used.uid).exists());
    assert_eq!(claim_reads(&cluster, "used", mark), 0);
    agent.stop().await;
}

#[tokio::test]
async fn a_claim_created_again_under_the_name_of_one_still_prepared_is_told_apart_by_its_uid() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), cluster.config_with(NODE, &quick_checks())).await;
    let mut v1 = agent.v1().await;
    // The first "c" was prepared, its pod went without an unprepare, and it was deleted;
    // a new "c" for a new pod of this node, on another GPU, is prepared too.
    let old = reserved_claim(&cluster, "c", "gpu-0");
    prepare_ok(&mut v1, &old).await;
    cluster.server.delete_claim("default", "c").expect("the claim existed");
    let new = reserved_claim(&cluster, "c", "gpu-1");
    assert_ne!(old.uid, new.uid);
    prepare_ok(&mut v1, &new).await;
    let mut pod = bound_pod("default", "pod-c", NODE, &[("gpu", "c")]);
    pod["status"]["phase"] = serde_json::json!("Running");
    cluster.server.put_pod(pod);
    // The running pod names "c", which both records are called: the old one is still read,
    // found replaced, and released; the new one stays.
    let fs = cluster.fs();
    wait_until("the replaced claim released", || !fs.spec_file(&old.uid).exists()).await;
    assert!(fs.spec_file(&new.uid).exists());
    agent.stop().await;
}
