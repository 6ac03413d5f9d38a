//! Claim preparation through the kubelet's gRPC API (v1 and v1beta1) with claims from the
//! test API server: CDI specs written and removed, per-claim errors that name the problem,
//! and exclusive devices.

use std::collections::BTreeMap;

use edra::plugin::ClaimRef;
use edra::plugin::proto::dra_v1beta1 as v1beta1;
use serde_json::{Value, json};

use crate::support::agent::{Agent, CapturedLogs, Cluster, DRIVER, NODE, prepare, prepare_ok, unprepare_ok};
use crate::support::apiserver::{AllocatedDevice, ClaimBuilder};
use crate::support::kubelet;

fn read_spec(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn assert_spec(path: &std::path::Path, claim: &ClaimRef, device: &str, ids: &[String]) {
    let spec = read_spec(path);
    assert_eq!(spec["kind"], format!("k8s.{DRIVER}/claim"), "{spec}");
    assert!(spec["cdiVersion"].as_str().is_some_and(|v| !v.is_empty()), "{spec}");
    let names: Vec<&str> =
        spec["devices"].as_array().expect("devices").iter().filter_map(|d| d["name"].as_str()).collect();
    assert_eq!(names, [format!("{}-{device}", claim.uid)], "{spec}");
    assert_eq!(ids, [format!("k8s.{DRIVER}/claim={}-{device}", claim.uid)]);
    let nodes = spec["devices"][0]["containerEdits"]["deviceNodes"].to_string();
    let index = device.trim_start_matches("gpu-");
    assert!(nodes.contains(&format!("nvidia{index}")), "device node of {device} in {nodes}");
}

#[tokio::test]
async fn prepare_and_unprepare_over_v1_and_v1beta1() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    let fs = cluster.fs();

    let a = cluster.allocated_claim("a", "gpu-0");
    let mut v1 = agent.v1().await;
    let ids = prepare_ok(&mut v1, &a).await;
    assert_spec(&fs.spec_file(&a.uid), &a, "gpu-0", &ids);
    assert_eq!(fs.spec_files(), [fs.spec_file(&a.uid)]);
    // Idempotent: the same answer again.
    assert_eq!(prepare_ok(&mut v1, &a).await, ids);
    unprepare_ok(&mut v1, &a).await;
    assert!(fs.spec_files().is_empty());

    let b = cluster.allocated_claim("b", "gpu-1");
    let mut beta = kubelet::dra_v1beta1(&fs.dra_socket()).await;
    let claim = v1beta1::Claim { namespace: b.namespace.clone(), uid: b.uid.clone(), name: b.name.clone() };
    let answer = beta
        .node_prepare_resources(v1beta1::NodePrepareResourcesRequest { claims: vec![claim.clone()] })
        .await
        .expect("v1beta1 prepare")
        .into_inner();
    let one = &answer.claims[&b.uid];
    assert_eq!(one.error, "");
    assert_eq!(one.devices.len(), 1);
    assert_eq!((one.devices[0].pool_name.as_str(), one.devices[0].device_name.as_str()), (NODE, "gpu-1"));
    assert_spec(&fs.spec_file(&b.uid), &b, "gpu-1", &one.devices[0].cdi_device_ids);
    let answer = beta
        .node_unprepare_resources(v1beta1::NodeUnprepareResourcesRequest { claims: vec![claim] })
        .await
        .expect("v1beta1 unprepare")
        .into_inner();
    assert_eq!(answer.claims[&b.uid].error, "");
    assert!(fs.spec_files().is_empty());
    agent.stop().await;
}

#[tokio::test]
async fn the_log_tells_a_claims_story_once_and_calls_answered_from_state_write_nothing() {
    let cluster = Cluster::start().await;
    let (logs, _guard) = CapturedLogs::start_at("info,edra::plugin::dra=debug");
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    let a = cluster.allocated_claim("a", "gpu-0");
    let mut v1 = agent.v1().await;
    // The lines about claims and calls, from INFO up.
    let told = || -> Vec<String> {
        logs.text()
            .lines()
            .filter(|l| !l.contains(" DEBUG ") && (l.contains("edra::prepare") || l.contains("edra::plugin")))
            .map(str::to_string)
            .collect()
    };
    let ids = prepare_ok(&mut v1, &a).await;
    let prepared = told();
    for _ in 0..3 {
        assert_eq!(prepare_ok(&mut v1, &a).await, ids);
    }
    assert_eq!(told(), prepared, "a prepare answered from state adds nothing from INFO up");
    unprepare_ok(&mut v1, &a).await;
    let text = logs.text();
    let story: Vec<&str> = text.lines().filter(|l| l.contains(&a.uid) && l.contains(" INFO ")).collect();
    assert_eq!(story.len(), 2, "{text}");
    assert!(story[0].contains("edra::prepare::claim: claim prepared"), "{}", story[0]);
    assert!(story[1].contains("edra::prepare::release: claim unprepared"), "{}", story[1]);
    // Each call is still there for whoever follows the kubelet's calls at debug level.
    let calls: Vec<&str> = text.lines().filter(|l| l.contains("DRA call finished")).collect();
    assert_eq!(calls.len(), 5, "{text}");
    assert!(calls.iter().all(|l| l.contains(" DEBUG ") && l.contains("latency_ms=")), "{calls:?}");
    agent.stop().await;
}

#[tokio::test]
async fn bad_claims_get_errors_naming_the_problem_and_good_ones_succeed() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    let server = &cluster.server;
    let on_n1 = |d: &str| AllocatedDevice::new("gpu", DRIVER, NODE, d);

    // A claim that does not exist (a pod on n1 refers to it, so the node may ask).
    server.mark_claim_on_node("default", "missing", NODE);
    let missing = ClaimRef {
        namespace: "default".into(),
        name: "missing".into(),
        uid: "0b9c4a4e-3d2a-4f7e-9a51-6f4c3d2b1a00".into(),
    };
    let mut replaced = cluster.allocated_claim("replaced", "gpu-0");
    replaced.uid = "1c9c4a4e-3d2a-4f7e-9a51-6f4c3d2b1a01".into();
    let unallocated = cluster.put_claim(ClaimBuilder::new("default", "unallocated").request("gpu", "gpu.edra.dev"));
    let foreign_driver =
        cluster.put_claim(ClaimBuilder::new("default", "foreign-driver").allocated(AllocatedDevice::new(
            "gpu",
            "gpu.other.dev",
            NODE,
            "gpu-0",
        )));
    let other_pool = cluster.put_claim(
        ClaimBuilder::new("default", "other-pool").allocated(AllocatedDevice::new("gpu", DRIVER, "n2", "gpu-0")),
    );
    let unknown_device = cluster.allocated_claim("unknown-device", "gpu-9");
    let bad_config =
        cluster.put_claim(ClaimBuilder::new("default", "bad-config").allocated(on_n1("gpu-0")).opaque_config(
            "FromClaim",
            &["gpu"],
            DRIVER,
            json!({"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig", "sharingg": {}}),
        ));
    // The API server accepts opaque parameters nested this deep; edra's decoder does not.
    let mut deep = json!("leaf");
    for _ in 0..200 {
        deep = json!({ "nested": deep });
    }
    let too_deep = cluster.put_claim(ClaimBuilder::new("default", "too-deep").allocated(on_n1("gpu-1")).opaque_config(
        "FromClaim",
        &["gpu"],
        DRIVER,
        deep,
    ));
    let good_a = cluster.allocated_claim("good-a", "gpu-2");
    let good_b = cluster.allocated_claim("good-b", "gpu-3");

    let expected: BTreeMap<&str, &str> = [
        (missing.uid.as_str(), "was not found"),
        (replaced.uid.as_str(), "the claim was replaced"),
        (unallocated.uid.as_str(), "is not allocated"),
        (foreign_driver.uid.as_str(), "no devices allocated by driver gpu.edra.dev in pool n1"),
        (other_pool.uid.as_str(), "no devices allocated by driver gpu.edra.dev in pool n1"),
        (unknown_device.uid.as_str(), "device gpu-9 is not on this node"),
        (bad_config.uid.as_str(), "sharingg"),
        (too_deep.uid.as_str(), "nests deeper than edra reads (128 levels)"),
    ]
    .into();
    let all = [
        &missing,
        &replaced,
        &unallocated,
        &foreign_driver,
        &other_pool,
        &unknown_device,
        &bad_config,
        &too_deep,
        &good_a,
        &good_b,
    ]
    .map(Clone::clone);
    let mut v1 = agent.v1().await;
    let answer = prepare(&mut v1, &all).await.expect("NodePrepareResources");
    assert_eq!(answer.len(), all.len(), "every claim answered");
    for (uid, needle) in &expected {
        let error = &answer[*uid].error;
        assert!(error.contains(needle), "claim {uid}: expected an error containing {needle:?}, got {error:?}");
        assert!(answer[*uid].devices.is_empty());
    }
    for good in [&good_a, &good_b] {
        assert_eq!(answer[&good.uid].error, "", "{}", good.name);
        assert_eq!(answer[&good.uid].devices.len(), 1);
    }
    let fs = cluster.fs();
    let mut want = vec![fs.spec_file(&good_a.uid), fs.spec_file(&good_b.uid)];
    want.sort();
    assert_eq!(fs.spec_files(), want, "specs only for the good claims");
    // A failed claim took no device: gpu-0 is free for a correct claim.
    let fine = cluster.allocated_claim("fine", "gpu-0");
    prepare_ok(&mut v1, &fine).await;
    for c in [&good_a, &good_b, &fine] {
        unprepare_ok(&mut v1, c).await;
    }
    assert!(fs.spec_files().is_empty());
    agent.stop().await;
}

#[tokio::test]
async fn a_device_is_prepared_for_one_claim_at_a_time() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    let first = cluster.reserved_claim("first", "gpu-1");
    let second = cluster.reserved_claim("second", "gpu-1");
    let mut v1 = agent.v1().await;
    prepare_ok(&mut v1, &first).await;
    let answer = prepare(&mut v1, std::slice::from_ref(&second)).await.expect("NodePrepareResources");
    let error = &answer[&second.uid].error;
    let holder = format!("claim default/first, UID {}", first.uid);
    assert!(error.contains(&holder) && error.contains("gpu-1"), "the error names the holder: {error:?}");
    assert_eq!(cluster.fs().spec_files(), [cluster.fs().spec_file(&first.uid)]);
    unprepare_ok(&mut v1, &first).await;
    prepare_ok(&mut v1, &second).await;
    unprepare_ok(&mut v1, &second).await;

    // Two claims for one device in the same call: exactly one gets it.
    let third = cluster.reserved_claim("third", "gpu-2");
    let fourth = cluster.reserved_claim("fourth", "gpu-2");
    let answer = prepare(&mut v1, &[third.clone(), fourth.clone()]).await.expect("NodePrepareResources");
    let (winner, loser) = if answer[&third.uid].error.is_empty() { (&third, &fourth) } else { (&fourth, &third) };
    assert_eq!(answer[&winner.uid].error, "");
    let error = &answer[&loser.uid].error;
    assert!(error.contains(&winner.uid), "the loser's error names the winner: {error:?}");
    assert_eq!(cluster.fs().spec_files(), [cluster.fs().spec_file(&winner.uid)]);
    unprepare_ok(&mut v1, winner).await;
    agent.stop().await;
}

#[tokio::test]
async fn a_claim_with_several_devices_and_another_drivers_results() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    let claim = cluster.put_claim(
        ClaimBuilder::new("default", "pair")
            .allocated(AllocatedDevice::new("a", DRIVER, NODE, "gpu-0"))
            .allocated(AllocatedDevice::new("nic", "nic.example.com", NODE, "eth-0"))
            .allocated(AllocatedDevice::new("b", DRIVER, NODE, "gpu-3")),
    );
    let mut v1 = agent.v1().await;
    let answer = prepare(&mut v1, std::slice::from_ref(&claim)).await.expect("NodePrepareResources");
    let one = &answer[&claim.uid];
    assert_eq!(one.error, "");
    let mut got: Vec<(Vec<String>, String)> =
        one.devices.iter().map(|d| (d.request_names.clone(), d.device_name.clone())).collect();
    got.sort();
    assert_eq!(got, [(vec!["a".to_string()], "gpu-0".to_string()), (vec!["b".to_string()], "gpu-3".to_string())]);
    let spec = read_spec(&cluster.fs().spec_file(&claim.uid));
    let mut names: Vec<&str> =
        spec["devices"].as_array().expect("devices").iter().filter_map(|d| d["name"].as_str()).collect();
    names.sort();
    assert_eq!(names, [format!("{}-gpu-0", claim.uid), format!("{}-gpu-3", claim.uid)]);
    unprepare_ok(&mut v1, &claim).await;
    assert!(cluster.fs().spec_files().is_empty());
    agent.stop().await;
}
