//! The assembled agent against an API server that misbehaves: absurd `Retry-After` delays
//! (header or Status details) on publishing and on claim fetches must neither abort the
//! agent nor stall it.

use std::time::{Duration, Instant};

use http::Method;

use edra::plugin::ClaimRef;

use crate::support::agent::{Agent, Cluster, GPUS, NODE, prepare, prepare_ok};
use crate::support::apiserver::{Fault, FaultAction};

const HUGE: [(u16, Option<u64>, Option<u64>); 3] =
    [(429, Some(u64::MAX), None), (503, None, Some(i64::MAX as u64)), (503, Some(i64::MAX as u64), Some(u64::MAX))];

#[tokio::test]
async fn absurd_retry_after_neither_aborts_publishing_nor_a_claim_fetch() {
    let cluster = Cluster::start().await;
    for (code, header_secs, details_secs) in HUGE {
        let throttled = FaultAction::Throttled { code, header_secs, details_secs };
        cluster.server.inject(Fault::next(1, throttled).method(Method::POST).path_contains("/resourceslices"));
    }
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    // Each throttled create fails at once (the delay is beyond the retry budget) and the
    // publisher's own backoff tries again.
    cluster.wait_published(NODE, GPUS).await;
    assert!(agent.is_running());

    let claim = cluster.allocated_claim("throttled", "gpu-0");
    let mut v1 = agent.v1().await;
    for (code, header_secs, details_secs) in HUGE {
        let throttled = FaultAction::Throttled { code, header_secs, details_secs };
        cluster.server.inject(Fault::next(1, throttled).method(Method::GET).path_contains("/resourceclaims/"));
        let started = Instant::now();
        let answer = prepare(&mut v1, std::slice::from_ref(&claim)).await.expect("NodePrepareResources");
        let error = &answer[&claim.uid].error;
        assert!(error.contains("cannot get ResourceClaim default/throttled"), "{error:?}");
        assert!(error.contains(&format!("HTTP {code}")), "{error:?}");
        assert!(started.elapsed() < Duration::from_secs(15), "waited {:?} for the server's delay", started.elapsed());
    }
    assert!(agent.is_running());
    assert!(!prepare_ok(&mut v1, &claim).await.is_empty(), "the claim is prepared once the server answers");
    agent.stop().await;
}

#[tokio::test]
async fn a_huge_call_neither_starves_others_nor_blames_the_server_for_edras_own_rate_limit() {
    let cluster = Cluster::start().await;
    let mut config = cluster.config_with(NODE, "gpus = 64");
    // Two requests a second: 60 claim reads take 30 s, more than a call may spend on them.
    config.kube.qps = 2.0;
    config.kube.burst = 1;
    let agent = Agent::start(cluster.fs(), config).await;
    cluster.wait_published(NODE, 64).await;
    let huge: Vec<ClaimRef> =
        (0..60).map(|i| cluster.allocated_claim(&format!("huge-{i}"), &format!("gpu-{i}"))).collect();
    let small = cluster.allocated_claim("small", "gpu-63");

    let mut v1 = agent.v1().await;
    let mut v1_small = agent.v1().await;
    let started = Instant::now();
    let big_call = tokio::spawn(async move { prepare(&mut v1, &huge).await });
    // The small call comes while the huge one is fetching its claims.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let answer = prepare(&mut v1_small, std::slice::from_ref(&small)).await.expect("NodePrepareResources");
    assert_eq!(answer[&small.uid].error, "", "a one-claim call waits behind a huge one");
    eprintln!("the one-claim call answered after {:?}", started.elapsed());

    let answers = big_call.await.expect("no panic").expect("NodePrepareResources");
    let took = started.elapsed();
    eprintln!("the 60-claim call answered after {took:?}");
    assert!(took < Duration::from_secs(40), "within the kubelet's 45 s: {took:?}");
    assert_eq!(answers.len(), 60);
    let failed: Vec<&str> = answers.values().map(|a| a.error.as_str()).filter(|e| !e.is_empty()).collect();
    let prepared = 60 - failed.len();
    eprintln!("{prepared} prepared, {} failed, e.g. {:?}", failed.len(), failed.first());
    assert!(prepared >= 10, "claims within the rate limit are prepared: {prepared}");
    assert!(!failed.is_empty(), "60 reads at 2 per second do not fit in one call");
    for error in failed {
        assert!(!error.contains("no answer from the API server"), "blames the server: {error}");
        assert!(
            error.contains("edra's own client-side rate limit") || error.contains("ran out before its turn"),
            "does not say what happened: {error}"
        );
    }
    agent.stop().await;
}
