//! The assembled agent against an API server that misbehaves: absurd `Retry-After` delays
//! (header or Status details) on publishing and on claim fetches must neither abort the
//! agent nor stall it.

use std::time::{Duration, Instant};

use http::Method;

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
