//! Larger pools and older API servers: a pool split over several slices (MIG devices) is
//! published consistently, a single slice deleted by someone is re-created, a restart
//! adopts the whole pool; against a Kubernetes 1.32 server that serves only
//! resource.k8s.io/v1beta1 the agent publishes and prepares just the same.

use std::time::Duration;

use serde_json::Value;

use crate::support::agent::{
    Agent, Cluster, DRIVER, GPUS, NODE, WAIT, device_names, prepare_ok, slice_names, unprepare_ok,
};
use crate::support::apiserver::{ApiVersion, Options};

/// 20 A100s, each split into seven 1g.10gb MIG devices: 140 devices, more than one slice holds.
fn mig_mock() -> String {
    let mut mock = String::from("gpus = 20\nmig = [\n");
    for gpu in 0..20 {
        mock.push_str(&format!("  {{ gpu = {gpu}, profiles = [{}] }},\n", ["\"1g.10gb\""; 7].join(", ")));
    }
    mock.push_str("]\n");
    mock
}

fn pool_fields(slices: &[Value]) -> Vec<(i64, i64)> {
    slices
        .iter()
        .map(|s| {
            let pool = &s["spec"]["pool"];
            (pool["generation"].as_i64().unwrap_or(-1), pool["resourceSliceCount"].as_i64().unwrap_or(-1))
        })
        .collect()
}

#[tokio::test]
async fn a_pool_of_several_slices_is_published_repaired_and_adopted() {
    let cluster = Cluster::start().await;
    let mock = mig_mock();
    let agent = Agent::start(cluster.fs(), cluster.config_with(NODE, &mock)).await;
    cluster.wait_published(NODE, 140).await;
    let slices = cluster.slices_on(NODE);
    assert!(slices.len() >= 2, "140 devices need more than one slice, got {}", slices.len());
    let fields = pool_fields(&slices);
    assert!(fields.iter().all(|f| *f == (fields[0].0, slices.len() as i64)), "one generation and count: {fields:?}");

    // One slice deleted by someone: re-created, the others untouched.
    let names = slice_names(&slices);
    assert!(cluster.server.delete_slice_as_kubelet(&names[1]));
    cluster.wait_published(NODE, 140).await;
    let repaired = cluster.slices_on(NODE);
    assert_eq!(repaired.len(), slices.len());
    assert!(slice_names(&repaired).contains(&names[0]), "the intact slice stays");
    let fields = pool_fields(&repaired);
    assert!(fields.iter().all(|f| *f == (fields[0].0, repaired.len() as i64)), "consistent again: {fields:?}");
    agent.stop().await;

    // A restart adopts the whole pool.
    let before = cluster.slices_on(NODE);
    let mark = cluster.server.request_mark();
    let agent = Agent::start(cluster.fs(), cluster.config_with(NODE, &mock)).await;
    cluster
        .server
        .wait_for("the agent's slice watch", WAIT, |s| s.requests()[mark..].iter().any(|r| r.verb == "watch"))
        .await
        .expect("the agent watches its slices");
    let quiet = cluster.server.wait_for("a write", Duration::from_secs(1), |s| s.writes_since(mark) > 0).await;
    assert!(quiet.is_err(), "a restart rewrote the pool: {:?}", cluster.server.requests()[mark..].to_vec());
    assert_eq!(cluster.slices_on(NODE), before);
    agent.stop().await;
}

#[tokio::test]
async fn a_v1beta1_only_server_is_served_the_same() {
    let options = Options { git_version: "v1.32.5".into(), versions: vec![ApiVersion::V1beta1], ..Options::default() };
    let cluster = Cluster::start_with(options).await;
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    cluster.wait_published(NODE, GPUS).await;
    let slices = cluster.slices_on(NODE);
    assert_eq!(device_names(&slices).len(), GPUS);
    assert!(slices.iter().all(|s| s["spec"]["driver"] == DRIVER));
    let log = cluster.server.requests();
    let slice_paths: Vec<&str> =
        log.iter().filter(|r| r.path.contains("resourceslices")).map(|r| r.path.as_str()).collect();
    assert!(slice_paths.iter().all(|p| p.starts_with("/apis/resource.k8s.io/v1beta1/")), "{slice_paths:?}");

    let claim = cluster.allocated_claim("old", "gpu-1");
    let mut v1 = agent.v1().await;
    let ids = prepare_ok(&mut v1, &claim).await;
    assert_eq!(ids, [format!("k8s.{DRIVER}/claim={}-gpu-1", claim.uid)]);
    assert!(
        cluster
            .server
            .requests()
            .iter()
            .any(|r| r.path.starts_with("/apis/resource.k8s.io/v1beta1/namespaces/default/resourceclaims/"))
    );
    unprepare_ok(&mut v1, &claim).await;
    agent.stop().await;
}
