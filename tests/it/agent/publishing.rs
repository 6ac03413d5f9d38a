//! Publishing: the first publish, adoption after a restart, repair of a kubelet wipe and of
//! foreign edits, inventory changes, an unreachable API server, conflicts, and the node
//! authorizer refusing another node's pool.

use std::sync::Arc;
use std::time::{Duration, Instant};

use edra::inventory::{DeviceBackend, mock::MockBackend};
use edra::kube::Client;
use edra::publish::desired::NodeIdentity;
use edra::publish::reconcile::Publisher;
use edra::publish::status::PublishStatus;
use http::Method;
use serde_json::Value;
use tokio::sync::watch;

use crate::support::agent::{
    Agent, CapturedLogs, Cluster, DRIVER, GPUS, NODE, WAIT, device_names, register, slice_names,
};
use crate::support::apiserver::{Fault, FaultAction, RequestRecord, State};

/// How long "no writes" must hold to count as converged: ten debounce periods of the
/// publisher (100 ms) after its watch is open.
const QUIET: Duration = Duration::from_secs(1);
/// A shorter quiet period: the publisher has finished its post-write re-plan.
const SETTLE: Duration = Duration::from_millis(300);

fn expected_devices() -> Vec<String> {
    (0..GPUS).map(|i| format!("gpu-{i}")).collect()
}

fn requests_since(server_log: Vec<RequestRecord>, mark: usize) -> Vec<RequestRecord> {
    server_log.into_iter().skip(mark).collect()
}

/// Waits until `user` opened a slice watch after `mark`, then asserts that no write
/// follows within [`QUIET`].
async fn assert_no_writes_after_watch(cluster: &Cluster, mark: usize) {
    cluster
        .server
        .wait_for("the agent's slice watch", WAIT, |s| {
            s.requests()[mark..].iter().any(|r| r.verb == "watch" && r.status == 200)
        })
        .await
        .expect("the agent watches its slices");
    let quiet = cluster.server.wait_for("a write", QUIET, |s| s.writes_since(mark) > 0).await;
    let writes: Vec<String> = requests_since(cluster.server.requests(), mark)
        .iter()
        .filter(|r| r.is_write())
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(quiet.is_err(), "expected no writes after convergence, got {writes:?}");
}

#[tokio::test]
async fn first_publish_creates_the_pool_owned_by_the_node() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    cluster.wait_published(NODE, GPUS).await;
    let slices = cluster.slices_on(NODE);
    assert_eq!(device_names(&slices), expected_devices());
    for s in &slices {
        assert_eq!(s["spec"]["driver"], DRIVER);
        assert_eq!(s["spec"]["nodeName"], NODE);
        assert_eq!(s["spec"]["pool"]["name"], NODE);
        assert_eq!(s["spec"]["pool"]["resourceSliceCount"], slices.len());
        assert!(s["spec"]["pool"]["generation"].as_i64().is_some_and(|g| g >= 0), "{s}");
        let owners = s["metadata"]["ownerReferences"].as_array().expect("owner references");
        assert_eq!(owners.len(), 1, "{owners:?}");
        assert_eq!(owners[0]["apiVersion"], "v1");
        assert_eq!(owners[0]["kind"], "Node");
        assert_eq!(owners[0]["name"], NODE);
        assert_eq!(owners[0]["uid"], cluster.node_uid.as_str());
    }
    let generations: Vec<&Value> = slices.iter().map(|s| &s["spec"]["pool"]["generation"]).collect();
    assert!(generations.windows(2).all(|w| w[0] == w[1]), "one generation across the pool: {generations:?}");
    let mine: Vec<RequestRecord> = cluster.server.requests().into_iter().filter(|r| r.is_write()).collect();
    assert!(mine.iter().all(|r| r.user.as_deref() == Some("system:node:n1") && r.status < 300), "{mine:?}");
    assert_eq!(mine.iter().filter(|r| r.verb == "create").count(), slices.len(), "one POST per slice");
    agent.stop().await;
    assert_eq!(cluster.slices_on(NODE).len(), slices.len(), "shutting down leaves the slices published");
}

#[tokio::test]
async fn restart_adopts_the_published_slices_without_writes() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    cluster.wait_published(NODE, GPUS).await;
    let before = cluster.slices_on(NODE);
    agent.stop().await;

    let mark = cluster.server.request_mark();
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    assert_no_writes_after_watch(&cluster, mark).await;
    assert_eq!(slice_names(&cluster.slices_on(NODE)), slice_names(&before), "same slices adopted");
    assert_eq!(cluster.slices_on(NODE), before, "slices untouched");
    agent.stop().await;
}

#[tokio::test]
async fn kubelet_wipe_is_repaired() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    cluster.wait_published(NODE, GPUS).await;
    let old = slice_names(&cluster.slices_on(NODE));
    // Measure from a quiet pool, not while the agent still re-plans after its creates.
    let mark = cluster.server.request_mark();
    let quiet = cluster.server.wait_for("a write", SETTLE, |s| s.writes_since(mark) > 0).await;
    assert!(quiet.is_err(), "the pool keeps being written after the first publish");

    let started = Instant::now();
    let wiped = cluster.server.delete_slices_where(NODE, Some(DRIVER));
    assert_eq!(wiped, old.len());
    cluster.wait_published(NODE, GPUS).await;
    let took = started.elapsed();
    eprintln!("kubelet wipe of {wiped} slice(s) repaired in {took:?}");
    assert!(took < Duration::from_secs(5), "repair took {took:?}");
    let new = cluster.slices_on(NODE);
    assert_eq!(device_names(&new), expected_devices());
    assert!(slice_names(&new).iter().all(|n| !old.contains(n)), "new slices, not resurrected names");
    agent.stop().await;
}

#[tokio::test]
async fn foreign_edits_are_reverted() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    cluster.wait_published(NODE, GPUS).await;
    let original = cluster.slices_on(NODE);
    let name = slice_names(&original)[0].clone();
    let spec_of = |name: &str| cluster.server.slice(name).map(|s| s["spec"].clone());
    let want = spec_of(&name).expect("slice exists");

    // A device removed.
    let mark = cluster.server.request_mark();
    let edited = cluster.server.edit_slice(&name, |s| {
        s["spec"]["devices"].as_array_mut().expect("devices").pop();
    });
    let edited_rv = edited.expect("slice exists")["metadata"]["resourceVersion"].clone();
    cluster
        .server
        .wait_for("the removed device restored", WAIT, |s| s.slice(&name).is_some_and(|x| x["spec"] == want))
        .await
        .expect("edit reverted");
    let restored = cluster.server.slice(&name).expect("slice exists");
    assert_ne!(restored["metadata"]["resourceVersion"], edited_rv);
    let writes: Vec<RequestRecord> =
        requests_since(cluster.server.requests(), mark).into_iter().filter(RequestRecord::is_write).collect();
    assert!(writes.iter().all(|w| w.verb == "update" && w.path.ends_with(&name)), "only a PUT of {name}: {writes:?}");

    // An attribute changed.
    cluster.server.edit_slice(&name, |s| {
        let attrs = &mut s["spec"]["devices"][0]["attributes"];
        let key = attrs.as_object().and_then(|o| o.keys().next().cloned()).expect("an attribute");
        attrs[key.as_str()] = serde_json::json!({"string": "tampered"});
    });
    cluster
        .server
        .wait_for("the attribute restored", WAIT, |s| s.slice(&name).is_some_and(|x| x["spec"] == want))
        .await
        .expect("edit reverted");
    assert_eq!(slice_names(&cluster.slices_on(NODE)), slice_names(&original), "repaired in place");
    agent.stop().await;
}

#[tokio::test]
async fn inventory_change_updates_the_pool_with_one_put() {
    let cluster = Cluster::start().await;
    let config = cluster.config(NODE);
    let client = Client::from_config(&config).expect("client");
    let api = client.discover_resource_api().await.expect("discovery");
    let backend = MockBackend::new(&config);
    let inventory = backend.discover().expect("mock inventory");
    let (inventory_tx, inventory_rx) = watch::channel(Arc::new(inventory.clone()));
    let (status_tx, mut status_rx) = watch::channel(PublishStatus::default());
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let node = NodeIdentity { name: NODE.into(), uid: Some(cluster.node_uid.clone()) };
    let publisher = Publisher::new(client, api, DRIVER.into(), node, inventory_rx, status_tx);
    let task = tokio::spawn(publisher.run(shutdown_rx));
    cluster.wait_published(NODE, GPUS).await;
    tokio::time::timeout(WAIT, status_rx.wait_for(|s| s.in_sync)).await.expect("in sync").expect("status");
    let before = cluster.slices_on(NODE);
    assert_eq!(before.len(), 1, "{GPUS} devices fit one slice");
    let generation = before[0]["spec"]["pool"]["generation"].as_i64().expect("generation");

    let mark = cluster.server.request_mark();
    let mut changed = inventory.clone();
    let removed = changed.devices.pop().expect("a device").name;
    inventory_tx.send_replace(Arc::new(changed));
    cluster.wait_published(NODE, GPUS - 1).await;
    let status = tokio::time::timeout(WAIT, status_rx.wait_for(|s| s.in_sync && s.devices == GPUS - 1))
        .await
        .expect("status reports the new pool")
        .expect("status")
        .clone();
    assert_eq!(status.last_error, None);
    let writes: Vec<RequestRecord> =
        requests_since(cluster.server.requests(), mark).into_iter().filter(RequestRecord::is_write).collect();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!((writes[0].method.clone(), writes[0].status), (Method::PUT, 200));
    let after = cluster.slices_on(NODE);
    assert_eq!(slice_names(&after), slice_names(&before), "updated in place");
    assert!(!device_names(&after).contains(&removed));
    // Like the upstream controller: one changed slice and no new ones keep the generation.
    assert_eq!(after[0]["spec"]["pool"]["generation"].as_i64(), Some(generation), "{after:?}");
    assert_eq!(after[0]["spec"]["pool"]["resourceSliceCount"], 1);
    shutdown_tx.send_replace(true);
    tokio::time::timeout(WAIT, task).await.expect("publisher stops").expect("publisher task");
}

#[tokio::test]
async fn api_server_down_at_start_then_back() {
    let cluster = Cluster::start().await;
    cluster.server.stop().await;
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    // Agent::start registered: GetInfo and NotifyRegistrationStatus answered offline.
    register(&agent.fs).await;
    assert!(cluster.slices_on(NODE).is_empty());
    cluster.server.restart().expect("restart the API server");
    cluster.wait_published(NODE, GPUS).await;
    assert_eq!(device_names(&cluster.slices_on(NODE)), expected_devices());

    // Down while running, and the pool wiped meanwhile: repaired once the server is back.
    cluster.server.stop().await;
    assert_eq!(cluster.server.delete_slices_where(NODE, Some(DRIVER)), 1);
    register(&agent.fs).await;
    cluster.server.restart().expect("restart the API server");
    cluster.wait_published(NODE, GPUS).await;
    agent.stop().await;
}

#[tokio::test]
async fn conflict_during_update_converges() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    cluster.wait_published(NODE, GPUS).await;
    let name = slice_names(&cluster.slices_on(NODE))[0].clone();
    let want = cluster.server.slice(&name).expect("slice")["spec"].clone();

    // The agent's next PUT is held at the server; a second edit lands meanwhile, so the
    // PUT carries a stale resourceVersion and gets 409.
    cluster.server.inject(
        Fault::next(1, FaultAction::Delay(Duration::from_millis(300)))
            .method(Method::PUT)
            .path_contains("/resourceslices/"),
    );
    let mark = cluster.server.request_mark();
    cluster.server.edit_slice(&name, |s| {
        s["spec"]["devices"].as_array_mut().expect("devices").pop();
    });
    cluster
        .server
        .wait_for("the agent's PUT held", WAIT, |s: &State| s.faults_applied() > 0)
        .await
        .expect("a PUT is held");
    cluster.server.edit_slice(&name, |s| {
        s["spec"]["devices"].as_array_mut().expect("devices").pop();
    });
    cluster
        .server
        .wait_for("the slice restored after the conflict", WAIT, |s| s.slice(&name).is_some_and(|x| x["spec"] == want))
        .await
        .expect("converged");
    let puts: Vec<u16> = requests_since(cluster.server.requests(), mark)
        .iter()
        .filter(|r| r.method == Method::PUT)
        .map(|r| r.status)
        .collect();
    assert_eq!(puts.first(), Some(&409), "the held PUT conflicted: {puts:?}");
    assert_eq!(puts.last(), Some(&200), "{puts:?}");
    agent.stop().await;
}

#[tokio::test]
async fn node_authorizer_refuses_another_nodes_pool() {
    let (logs, _guard) = CapturedLogs::start();
    let cluster = Cluster::start().await;
    cluster.server.add_node("n2");
    // Credentials of n1, node_name n2.
    let agent = Agent::start(cluster.fs(), cluster.config("n2")).await;
    cluster
        .server
        .wait_for("two refused requests", WAIT, |s| s.requests().iter().filter(|r| r.status == 403).count() >= 2)
        .await
        .expect("the agent keeps trying and is refused");
    let log = cluster.server.requests();
    assert!(log.iter().filter(|r| r.status == 403).all(|r| r.user.as_deref() == Some("system:node:n1")), "{log:?}");
    assert!(log.iter().all(|r| !r.is_write() || r.status == 403), "no write succeeds: {log:?}");
    assert!(cluster.slices_on("n2").is_empty());
    assert!(cluster.server.slices().is_empty());
    assert!(agent.is_running(), "the agent keeps running");
    register(&agent.fs).await;
    let text = logs.text();
    assert!(text.contains("refused to let edra read Node n2"), "the agent reports the refusal: {text}");
    assert!(text.contains("system:node:"), "the answer names the identity: {text}");
    agent.stop().await;
}

#[tokio::test]
async fn recreated_node_gets_slices_owned_by_its_new_uid() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    cluster.wait_published(NODE, GPUS).await;
    // `kubectl delete node n1`: the garbage collector takes the slices with it; the kubelet
    // then registers the Node again under a new uid.
    assert_eq!(cluster.server.delete_node(NODE), Some(1));
    let new_uid = cluster.server.add_node(NODE);
    assert_ne!(new_uid, cluster.node_uid);
    cluster
        .server
        .wait_for("slices owned by the new Node", WAIT, |s| {
            let slices = s.slices_on(NODE);
            device_names(&slices).len() == GPUS
                && slices.iter().all(|x| x["metadata"]["ownerReferences"][0]["uid"] == new_uid.as_str())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}: {:?}", cluster.slices_on(NODE)));
    agent.stop().await;
}

#[tokio::test]
async fn transient_write_errors_are_retried() {
    let cluster = Cluster::start().await;
    cluster
        .server
        .inject(Fault::next(2, FaultAction::InternalError).method(Method::POST).path_contains("/resourceslices"));
    cluster.server.inject(
        Fault::next(1, FaultAction::TooManyRequests { retry_after_secs: 1 })
            .method(Method::POST)
            .path_contains("/resourceslices"),
    );
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    cluster.wait_published(NODE, GPUS).await;
    let posts: Vec<u16> =
        cluster.server.requests().iter().filter(|r| r.method == Method::POST).map(|r| r.status).collect();
    assert_eq!(posts.iter().filter(|s| **s >= 500).count(), 2, "{posts:?}");
    assert!(posts.contains(&429), "{posts:?}");
    assert_eq!(posts.last(), Some(&201), "{posts:?}");
    assert_eq!(cluster.slices_on(NODE).len(), 1, "no duplicate slices from retried creates");
    agent.stop().await;
}

#[tokio::test]
async fn shutdown_is_not_held_up_by_a_hanging_write() {
    let cluster = Cluster::start().await;
    cluster.server.inject(
        Fault::next(usize::MAX, FaultAction::Delay(Duration::from_secs(120)))
            .method(Method::POST)
            .path_contains("/resourceslices"),
    );
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    cluster
        .server
        .wait_for("the agent's create held", WAIT, |s: &State| s.faults_applied() > 0)
        .await
        .expect("a create is held");
    let started = Instant::now();
    agent.stop().await;
    let took = started.elapsed();
    eprintln!("stopped in {took:?} with a create hanging");
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
}

#[tokio::test]
async fn an_expired_watch_relists_without_writes() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    cluster.wait_published(NODE, GPUS).await;
    let settle = cluster.server.request_mark();
    let quiet = cluster.server.wait_for("a write", SETTLE, |s| s.writes_since(settle) > 0).await;
    assert!(quiet.is_err(), "the pool keeps being written after the first publish");
    let before = cluster.slices_on(NODE);
    // History compacted and the watch ended: the agent must list again (410 on resume).
    cluster.server.compact();
    let mark = cluster.server.request_mark();
    cluster.server.close_watches();
    cluster
        .server
        .wait_for("a fresh list or watch", WAIT, |s| {
            s.requests()[mark..].iter().filter(|r| matches!(r.verb, "list" | "watch") && r.status == 200).count() >= 1
        })
        .await
        .expect("the agent watches again");
    assert_no_writes_after_watch(&cluster, mark).await;
    assert_eq!(cluster.slices_on(NODE), before);
    agent.stop().await;
}

#[tokio::test]
async fn a_node_registered_after_the_agent_started_gets_its_pool() {
    let (logs, _guard) = CapturedLogs::start();
    let cluster = Cluster::start().await;
    // On k3s edra may start before the kubelet has registered the Node.
    assert_eq!(cluster.server.delete_node(NODE), Some(0));
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    cluster
        .server
        .wait_for("the Node looked up", WAIT, |s| {
            s.requests().iter().any(|r| r.path == "/api/v1/nodes/n1" && r.status == 404)
        })
        .await
        .expect("the agent asks for its Node");
    let uid = cluster.server.add_node(NODE);
    cluster.wait_published(NODE, GPUS).await;
    assert!(cluster.slices_on(NODE).iter().all(|s| s["metadata"]["ownerReferences"][0]["uid"] == uid.as_str()));
    let text = logs.text();
    assert!(text.contains("Node n1 does not exist"), "the agent says why it waits: {text}");
    agent.stop().await;
}
