//! Offline operation: with the API server gone, claims prepared before are answered from
//! the state store and can be released; a new claim fails with a clear per-claim error
//! well within the kubelet's 45 s call timeout.

use std::time::{Duration, Instant};

use http::Method;

use crate::support::agent::{Agent, Cluster, NODE, prepare, prepare_ok, unprepare_ok};
use crate::support::apiserver::{Fault, FaultAction};

/// The kubelet gives up on a prepare call after 45 s; edra must answer well before.
const ANSWER_WITHIN: Duration = Duration::from_secs(25);

#[tokio::test]
async fn prepared_claims_keep_working_without_the_api_server() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    let fs = cluster.fs();
    let done = cluster.allocated_claim("done", "gpu-0");
    let new = cluster.allocated_claim("new", "gpu-1");
    let mut v1 = agent.v1().await;
    let ids = prepare_ok(&mut v1, &done).await;

    cluster.server.stop().await;
    // Only the state store can answer now: the claim cannot be read.
    assert_eq!(prepare_ok(&mut v1, &done).await, ids, "answered from the state store");
    assert!(fs.spec_file(&done.uid).exists());

    let started = Instant::now();
    let answer = prepare(&mut v1, std::slice::from_ref(&new)).await.expect("NodePrepareResources");
    let took = started.elapsed();
    eprintln!("prepare of a new claim with the API server down answered in {took:?}");
    assert!(took < ANSWER_WITHIN, "took {took:?}");
    let error = &answer[&new.uid].error;
    assert!(error.contains("cannot get ResourceClaim default/new"), "{error:?}");
    assert!(error.contains("API server"), "{error:?}");
    assert!(!fs.spec_file(&new.uid).exists());

    unprepare_ok(&mut v1, &done).await;
    assert!(fs.spec_files().is_empty());
    agent.stop().await;
}

#[tokio::test]
async fn a_restarted_agent_serves_prepared_claims_without_the_api_server() {
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let done = cluster.allocated_claim("done", "gpu-2");
    let agent = Agent::start(fs.clone(), cluster.config(NODE)).await;
    let ids = prepare_ok(&mut agent.v1().await, &done).await;
    agent.stop().await;

    cluster.server.stop().await;
    // The CDI directory is on tmpfs: a restart of the node empties it.
    std::fs::remove_file(fs.spec_file(&done.uid)).expect("remove the spec");
    let agent = Agent::start(fs.clone(), cluster.config(NODE)).await;
    assert!(fs.spec_file(&done.uid).exists(), "recovery re-wrote the missing spec");
    let mut v1 = agent.v1().await;
    assert_eq!(prepare_ok(&mut v1, &done).await, ids);
    unprepare_ok(&mut v1, &done).await;
    assert!(fs.spec_files().is_empty());
    agent.stop().await;
}

#[tokio::test]
async fn a_hanging_api_server_gets_a_per_claim_error_in_time() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    let claim = cluster.allocated_claim("slow", "gpu-3");
    // Connections are accepted but claim reads never answer in time (a black-holed link).
    cluster.server.inject(
        Fault::next(usize::MAX, FaultAction::Delay(Duration::from_secs(120)))
            .method(Method::GET)
            .path_contains("/resourceclaims/"),
    );
    let started = Instant::now();
    let answer = prepare(&mut agent.v1().await, std::slice::from_ref(&claim)).await.expect("NodePrepareResources");
    let took = started.elapsed();
    eprintln!("prepare with a hanging API server answered in {took:?}");
    assert!(took < ANSWER_WITHIN, "took {took:?}");
    let error = &answer[&claim.uid].error;
    assert!(error.contains("cannot get ResourceClaim default/slow"), "{error:?}");
    assert!(!cluster.fs().spec_file(&claim.uid).exists());
    agent.stop().await;
}
