//! Claims read before the kubelet asks (`claims.prefetch`): the agent watches the pods
//! bound to its node on the test API server (with the node authorizer's rules), reads the
//! claims of a pod as soon as it is bound, and the kubelet's prepare then sends no GET;
//! a claim created again under another UID is read afresh; a prepare arriving while the
//! early read is in flight waits for it (one GET in total); with prefetch off nothing of
//! this happens. Requests are counted in the server's request log.

use std::time::Duration;

use edra::plugin::ClaimRef;
use futures_util::StreamExt;

use crate::support::agent::{
    Agent, CapturedLogs, Cluster, DRIVER, GPUS, NODE, WAIT, prepare, prepare_ok, unprepare_ok, wait_until,
};
use crate::support::apiserver::{AllocatedDevice, ClaimBuilder, Fault, FaultAction, Identity, State, bound_pod};

const NS: &str = "default";

/// An allocated claim for `device`, reserved for pod `pod`, as the scheduler leaves it.
fn scheduled_claim(cluster: &Cluster, name: &str, device: &str, pod: &str) -> ClaimRef {
    cluster.put_claim(
        ClaimBuilder::new(NS, name)
            .allocated(AllocatedDevice::new("gpu", DRIVER, NODE, device))
            .reserved_for_pod(pod, "0b7c2f4e-3a1d-4e5f-8a9b-0c1d2e3f4a5b"),
    )
}

/// The pod `pod`, bound to n1, using claim `claim` (generated from a template).
fn bind_pod(cluster: &Cluster, pod: &str, claim: &str) {
    cluster.server.put_pod(bound_pod(NS, pod, NODE, &[("gpu", claim)]));
}

fn claim_path(name: &str) -> String {
    format!("/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{name}")
}

/// The agent's configuration with `claims.prepare_early` off: claims read early wait for
/// the kubelet.
fn without_prepare_early(cluster: &Cluster) -> edra::config::Config {
    cluster.config_with(NODE, &format!("gpus = {GPUS}\n[claims]\nprepare_early = false\n"))
}

/// GETs of claim `name` logged from `mark` on.
fn gets_of(s: &State, name: &str, mark: usize) -> usize {
    let path = claim_path(name);
    s.requests().iter().skip(mark).filter(|r| r.verb == "get" && r.path == path).count()
}

/// Waits until the agent watches n1's pods.
async fn wait_watching_pods(cluster: &Cluster) {
    cluster
        .server
        .wait_for("the agent watching its pods", WAIT, |s| {
            s.requests().iter().any(|r| r.verb == "watch" && r.path == "/api/v1/pods" && r.status == 200)
        })
        .await
        .expect("the agent watches the pods of its node");
}

#[tokio::test]
async fn a_bound_pods_claim_is_read_before_the_kubelet_asks_and_prepared_without_a_get() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    wait_watching_pods(&cluster).await;
    let watches = cluster.server.with_state(|s| {
        s.requests()
            .iter()
            .filter(|r| r.path == "/api/v1/pods")
            .map(|r| r.query.clone().unwrap_or_default())
            .collect::<Vec<_>>()
    });
    assert!(watches.iter().all(|q| q.contains("fieldSelector=spec.nodeName%3Dn1")), "{watches:?}");
    assert_eq!(watches.len(), 2, "one list and one watch of the node's pods: {watches:?}");

    let claim = scheduled_claim(&cluster, "early", "gpu-0", "pod-early");
    bind_pod(&cluster, "pod-early", "early");
    cluster
        .server
        .wait_for("the claim read early", WAIT, |s| gets_of(s, "early", 0) == 1)
        .await
        .expect("the claim of a newly bound pod is read at once");
    let mark = cluster.server.request_mark();
    let mut v1 = agent.v1().await;
    let ids = prepare_ok(&mut v1, &claim).await;
    assert_eq!(ids.len(), 1);
    assert_eq!(cluster.server.with_state(|s| gets_of(s, "early", mark)), 0, "the kubelet's prepare sent no GET");
    assert!(cluster.fs().spec_file(&claim.uid).exists());

    // A pod without claims, and one that already runs, cost nothing.
    cluster.server.put_pod(bound_pod(NS, "plain", NODE, &[]));
    let running = scheduled_claim(&cluster, "running", "gpu-1", "pod-running");
    let mut pod = bound_pod(NS, "pod-running", NODE, &[("gpu", "running")]);
    pod["status"]["phase"] = "Running".into();
    cluster.server.put_pod(pod);
    // Then a pod that is: its read shows the watch has seen the two before it.
    scheduled_claim(&cluster, "last", "gpu-2", "pod-last");
    bind_pod(&cluster, "pod-last", "last");
    cluster.server.wait_for("the last claim read", WAIT, |s| gets_of(s, "last", 0) == 1).await.expect("read");
    assert_eq!(
        cluster.server.with_state(|s| gets_of(s, "running", 0)),
        0,
        "{running:?}: a running pod's claim is not read"
    );
    agent.stop().await;
}

#[tokio::test]
async fn a_claim_created_again_under_a_new_uid_is_read_afresh() {
    let cluster = Cluster::start().await;
    // Not prepared early: the kept claim is what is tested.
    let agent = Agent::start(cluster.fs(), without_prepare_early(&cluster)).await;
    wait_watching_pods(&cluster).await;
    let old = scheduled_claim(&cluster, "again", "gpu-0", "pod-again");
    bind_pod(&cluster, "pod-again", "again");
    cluster.server.wait_for("the claim read early", WAIT, |s| gets_of(s, "again", 0) == 1).await.expect("read");
    cluster.server.delete_claim(NS, "again").expect("the claim existed");
    let new = scheduled_claim(&cluster, "again", "gpu-1", "pod-again");
    assert_ne!(old.uid, new.uid);
    let mark = cluster.server.request_mark();
    let mut v1 = agent.v1().await;
    prepare_ok(&mut v1, &new).await;
    assert_eq!(
        cluster.server.with_state(|s| gets_of(s, "again", mark)),
        1,
        "the kept claim has the old UID: read again"
    );
    let record = cluster.fs().spec_file(&new.uid);
    assert!(record.exists());
    // The kubelet asking for the old UID is told the claim was replaced, not served the new one.
    let answer = prepare(&mut v1, std::slice::from_ref(&old)).await.expect("NodePrepareResources");
    assert!(answer[&old.uid].error.contains("was replaced"), "{:?}", answer[&old.uid].error);
    agent.stop().await;
}

#[tokio::test]
async fn a_prepare_arriving_while_the_early_read_is_in_flight_makes_one_get_in_total() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    wait_watching_pods(&cluster).await;
    let claim = scheduled_claim(&cluster, "racing", "gpu-0", "pod-racing");
    let slow = Duration::from_millis(700);
    cluster.server.inject(
        Fault::next(1, FaultAction::Delay(slow)).method(http::Method::GET).path_contains(&claim_path("racing")),
    );
    bind_pod(&cluster, "pod-racing", "racing");
    // The early read has arrived and is held by the delay.
    cluster.server.wait_for("the early read held", WAIT, |s| s.faults.is_empty()).await.expect("the early read");
    let mut v1 = agent.v1().await;
    let started = std::time::Instant::now();
    prepare_ok(&mut v1, &claim).await;
    assert!(started.elapsed() < slow + WAIT, "answered once the early read was");
    assert_eq!(cluster.server.with_state(|s| gets_of(s, "racing", 0)), 1, "one GET in total");
    agent.stop().await;
}

#[tokio::test]
async fn with_prefetch_off_pods_are_not_watched_and_the_kubelets_prepare_reads_the_claim() {
    let cluster = Cluster::start().await;
    let config = cluster.config_with(NODE, &format!("gpus = {GPUS}\n[claims]\nprefetch = false\n"));
    assert!(!config.prefetch_claims);
    let agent = Agent::start(cluster.fs(), config).await;
    cluster.wait_published(NODE, GPUS).await;
    let claim = scheduled_claim(&cluster, "late", "gpu-0", "pod-late");
    bind_pod(&cluster, "pod-late", "late");
    let mut v1 = agent.v1().await;
    prepare_ok(&mut v1, &claim).await;
    cluster.server.with_state(|s| {
        assert_eq!(gets_of(s, "late", 0), 1, "read by the prepare itself");
        assert!(s.requests().iter().all(|r| r.path != "/api/v1/pods"), "no pod list or watch");
    });
    agent.stop().await;
}

#[tokio::test]
async fn a_node_may_list_and_watch_only_its_own_pods() {
    let cluster = Cluster::start().await;
    cluster.server.add_node("n2");
    let kubeconfig = cluster.server.write_kubeconfig(cluster.dir.path(), &Identity::node("n2")).expect("kubeconfig");
    let mut config = cluster.config(NODE);
    config.kube.kubeconfig = Some(kubeconfig);
    let client = edra::kube::Client::from_config(&config).expect("client");
    for (selector, allowed) in [("spec.nodeName=n2", true), ("spec.nodeName=n1", false), ("", false)] {
        let mut events = Box::pin(client.watch_pods(selector));
        let first = tokio::time::timeout(WAIT, events.next()).await.expect("an event").expect("a stream");
        match first {
            edra::kube::Event::Restarted(pods) => assert!(allowed && pods.is_empty(), "{selector:?}"),
            edra::kube::Event::Error(e) => {
                assert!(!allowed && e.is_forbidden(), "{selector:?}: {e}");
                let text = edra::util::error_chain(&e);
                assert!(text.contains("can only list/watch pods with spec.nodeName field selector"), "{text}");
            }
            other => panic!("{selector:?}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn without_leave_to_watch_pods_edra_says_so_once_and_prepares_as_before() {
    let cluster = Cluster::start().await;
    let node_user = format!("system:node:{NODE}");
    cluster.server.forbid(&node_user, "list", "pods");
    let (logs, _guard) = CapturedLogs::start();
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    // The first list and two retries refused.
    cluster
        .server
        .wait_for("three refused lists of pods", WAIT, |s| {
            s.requests().iter().filter(|r| r.path == "/api/v1/pods" && r.status == 403).count() >= 3
        })
        .await
        .expect("the list is retried");
    let claim = scheduled_claim(&cluster, "plain", "gpu-0", "pod-plain");
    bind_pod(&cluster, "pod-plain", "plain");
    let mut v1 = agent.v1().await;
    prepare_ok(&mut v1, &claim).await;
    assert_eq!(cluster.server.with_state(|s| gets_of(s, "plain", 0)), 1, "read by the prepare");
    let text = logs.text();
    let warned = text.lines().filter(|l| l.contains("cannot watch this node's pods")).collect::<Vec<_>>();
    assert_eq!(warned.len(), 1, "{text}");
    assert!(warned[0].contains("WARN edra::prepare::prefetch::watching: cannot watch this node's pods; claims are read when the kubelet asks; with a service account, allow it to list and watch pods (config/rbac.yaml); retrying"), "{}", warned[0]);
    agent.stop().await;
}

#[tokio::test]
async fn a_bound_pods_claim_is_prepared_before_the_kubelet_asks_and_released_if_the_pod_goes_first() {
    let cluster = Cluster::start().await;
    let (logs, _guard) = CapturedLogs::start_at("info");
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    wait_watching_pods(&cluster).await;
    let fs = cluster.fs();

    // Bound: prepared at once, before any call; the kubelet's call then reads nothing.
    let asked = scheduled_claim(&cluster, "asked", "gpu-0", "pod-asked");
    bind_pod(&cluster, "pod-asked", "asked");
    wait_until("the claim prepared early", || fs.spec_file(&asked.uid).exists()).await;
    let mark = cluster.server.request_mark();
    let mut v1 = agent.v1().await;
    let ids = prepare_ok(&mut v1, &asked).await;
    assert_eq!(ids, [format!("k8s.{DRIVER}/claim={}-gpu-0", asked.uid)]);
    assert_eq!(cluster.server.with_state(|s| gets_of(s, "asked", mark)), 0, "no GET");
    let handed = "the kubelet asked for a claim prepared early; answered from state";
    assert_eq!(logs.text().lines().filter(|l| l.contains(handed) && l.contains(&asked.uid)).count(), 1);

    // Bound, prepared early, then deleted before the kubelet asked: released, GPU free.
    let gone = scheduled_claim(&cluster, "gone", "gpu-1", "pod-gone");
    bind_pod(&cluster, "pod-gone", "gone");
    wait_until("the second claim prepared early", || fs.spec_file(&gone.uid).exists()).await;
    cluster.server.delete_pod(NS, "pod-gone").expect("the pod existed");
    wait_until("the unasked claim released", || !fs.spec_file(&gone.uid).exists()).await;
    wait_until("the release logged", || {
        logs.text().contains("released claim default/gone, prepared before the kubelet asked")
    })
    .await;
    // Its GPU goes to the next pod's claim, prepared early too.
    let next = scheduled_claim(&cluster, "next", "gpu-1", "pod-next");
    bind_pod(&cluster, "pod-next", "next");
    wait_until("the next claim prepared early", || fs.spec_file(&next.uid).exists()).await;
    prepare_ok(&mut v1, &next).await;

    // A claim the kubelet asked for stays when its pod goes: the kubelet's unprepare releases it.
    cluster.server.delete_pod(NS, "pod-asked").expect("the pod existed");
    let last = scheduled_claim(&cluster, "last", "gpu-2", "pod-last");
    bind_pod(&cluster, "pod-last", "last");
    wait_until("the last claim prepared early", || fs.spec_file(&last.uid).exists()).await;
    assert!(fs.spec_file(&asked.uid).exists(), "the kubelet's claim is kept");
    unprepare_ok(&mut v1, &asked).await;
    assert!(!fs.spec_file(&asked.uid).exists());
    agent.stop().await;
}

#[tokio::test]
async fn a_claim_whose_pod_goes_while_it_is_read_early_is_released_once_prepared() {
    let cluster = Cluster::start().await;
    let (logs, _guard) = CapturedLogs::start_at("info");
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    wait_watching_pods(&cluster).await;
    let fs = cluster.fs();
    let brief = scheduled_claim(&cluster, "brief", "gpu-0", "pod-brief");
    cluster.server.inject(
        Fault::next(1, FaultAction::Delay(Duration::from_millis(500)))
            .method(http::Method::GET)
            .path_contains(&claim_path("brief")),
    );
    bind_pod(&cluster, "pod-brief", "brief");
    cluster.server.wait_for("the early read held", WAIT, |s| s.faults.is_empty()).await.expect("the early read");
    // The pod goes while its claim is being read; the read then prepares the claim.
    cluster.server.delete_pod(NS, "pod-brief").expect("the pod existed");
    wait_until("the claim prepared early and released", || {
        logs.text().contains("released claim default/brief, prepared before the kubelet asked")
    })
    .await;
    assert!(!fs.spec_file(&brief.uid).exists());
    // gpu-0 is free for the next pod's claim.
    let next = scheduled_claim(&cluster, "next", "gpu-0", "pod-next");
    bind_pod(&cluster, "pod-next", "next");
    wait_until("the next claim prepared early", || fs.spec_file(&next.uid).exists()).await;
    let mut v1 = agent.v1().await;
    prepare_ok(&mut v1, &next).await;
    agent.stop().await;
}

#[tokio::test]
async fn with_prepare_early_off_a_read_claim_waits_for_the_kubelet() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), without_prepare_early(&cluster)).await;
    wait_watching_pods(&cluster).await;
    let claim = scheduled_claim(&cluster, "later", "gpu-0", "pod-later");
    bind_pod(&cluster, "pod-later", "later");
    cluster.server.wait_for("the claim read early", WAIT, |s| gets_of(s, "later", 0) == 1).await.expect("read");
    // A second pod read after it shows the first read has been handled.
    scheduled_claim(&cluster, "after", "gpu-1", "pod-after");
    bind_pod(&cluster, "pod-after", "after");
    cluster.server.wait_for("the second claim read early", WAIT, |s| gets_of(s, "after", 0) == 1).await.expect("read");
    assert!(!cluster.fs().spec_file(&claim.uid).exists(), "nothing prepared before the kubelet asks");
    let mut v1 = agent.v1().await;
    prepare_ok(&mut v1, &claim).await;
    assert!(cluster.fs().spec_file(&claim.uid).exists());
    agent.stop().await;
}
