//! The prefetch cache against a claim source in memory whose reads can be held open: one
//! read per claim whichever side starts it, the UID check, what is kept, the bound, and the
//! pod bookkeeping of the watch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;
use tokio::sync::Semaphore;

use super::watching::{Changes, Pods};
use super::*;
use crate::kube::pods::PodClaims;

/// Claims by name (namespace `ns`), counting reads; while `gate` has no permits, reads wait.
struct Source {
    claims: Mutex<HashMap<String, ResourceClaim>>,
    reads: AtomicUsize,
    early: AtomicUsize,
    /// Early reads fail (after the gate), as a throttled or refused read would.
    fail_early: std::sync::atomic::AtomicBool,
    /// This many early reads are refused with HTTP 403 first.
    forbid_early: AtomicUsize,
    gate: Semaphore,
}

impl Source {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            claims: Mutex::default(),
            reads: AtomicUsize::new(0),
            early: AtomicUsize::new(0),
            fail_early: Default::default(),
            forbid_early: AtomicUsize::new(0),
            gate: Semaphore::new(Semaphore::MAX_PERMITS),
        })
    }

    fn put(&self, name: &str, uid: &str, allocated: bool) {
        let mut status = json!({"reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}]});
        if allocated {
            status["allocation"] = json!({"devices": {"results": [
                {"request": "gpu", "driver": "gpu.edra.dev", "pool": "n1", "device": "gpu-0"}]}});
        }
        let claim = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": name, "uid": uid},
            "spec": {"devices": {"requests": []}},
            "status": status,
        }))
        .unwrap();
        self.claims.lock().unwrap().insert(name.to_string(), claim);
    }

    /// Holds every read until [`Self::open`].
    fn hold(&self) {
        self.gate.forget_permits(Semaphore::MAX_PERMITS);
    }

    fn open(&self) {
        self.gate.add_permits(Semaphore::MAX_PERMITS);
    }

    fn total(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }

    /// Waits until a read has started.
    async fn until_read(&self) {
        while self.total() == 0 {
            tokio::task::yield_now().await;
        }
    }
}

impl ClaimSource for Source {
    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
        _: Instant,
    ) -> BoxFuture<'_, Result<ResourceClaim, ClaimFetchError>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let (namespace, name) = (namespace.to_string(), name.to_string());
        Box::pin(async move {
            drop(self.gate.acquire().await);
            let got = self.claims.lock().unwrap().get(&name).cloned();
            got.ok_or(ClaimFetchError::NotFound { namespace, name })
        })
    }

    fn get_claim_early(
        &self,
        namespace: &str,
        name: &str,
        deadline: Instant,
    ) -> BoxFuture<'_, Result<ResourceClaim, ClaimFetchError>> {
        self.early.fetch_add(1, Ordering::SeqCst);
        if self.fail_early.load(Ordering::SeqCst) {
            self.reads.fetch_add(1, Ordering::SeqCst);
            let (namespace, name) = (namespace.to_string(), name.to_string());
            return Box::pin(async move {
                drop(self.gate.acquire().await);
                Err(ClaimFetchError::Api { namespace, name, source: "refused".into() })
            });
        }
        if self.forbid_early.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            self.reads.fetch_add(1, Ordering::SeqCst);
            let (namespace, name) = (namespace.to_string(), name.to_string());
            let refusal = crate::kube::Error::from_status("GET resourceclaims".into(), 403, b"{}", None);
            return Box::pin(async move { Err(ClaimFetchError::Api { namespace, name, source: Box::new(refusal) }) });
        }
        self.get_claim(namespace, name, deadline)
    }
}

const UID1: &str = "7d3a2b1c-0f4e-4d5a-9b8c-1e2f3a4b5c6d";
const UID2: &str = "1b2c3d4e-5f60-4718-8293-a4b5c6d7e8f9";

fn cref(name: &str, uid: &str) -> ClaimRef {
    ClaimRef { namespace: "ns".into(), name: name.into(), uid: uid.into() }
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(20)
}

fn uid_of(c: &ResourceClaim) -> &str {
    c.metadata.uid.as_deref().unwrap_or_default()
}

#[tokio::test]
async fn a_claim_read_early_is_prepared_without_a_read_then_dropped() {
    let source = Source::new();
    source.put("c1", UID1, true);
    let p = Prefetcher::new(source.clone());
    assert!(p.fetch_early("ns", "c1").await.sent());
    assert!(!p.fetch_early("ns", "c1").await.sent(), "kept: not read twice");
    assert_eq!(source.total(), 1);
    let got = ClaimSource::claim_for(&p, &cref("c1", UID1), soon()).await.unwrap();
    assert_eq!(uid_of(&got), UID1);
    assert_eq!(source.total(), 1, "the prepare read nothing");
    ClaimSource::prepared(&p, &cref("c1", UID1));
    assert_eq!(p.kept(), 0, "dropped after a successful prepare");
    assert!(!p.fetch_early("ns", "c1").await.sent(), "an early read coming after the prepare is not sent");
    ClaimSource::claim_for(&p, &cref("c1", UID1), soon()).await.unwrap();
    assert_eq!(source.total(), 2, "asked again, the prepare reads it itself");
}

#[tokio::test]
async fn a_claim_created_again_under_another_uid_is_read_afresh() {
    let source = Source::new();
    source.put("c1", UID1, true);
    let p = Prefetcher::new(source.clone());
    p.fetch_early("ns", "c1").await;
    source.put("c1", UID2, true);
    let got = ClaimSource::claim_for(&p, &cref("c1", UID2), soon()).await.unwrap();
    assert_eq!(uid_of(&got), UID2);
    assert_eq!(source.total(), 2, "the cached claim has the old UID: read again");
}

#[tokio::test]
async fn claims_not_allocated_or_not_reserved_are_not_kept() {
    let source = Source::new();
    source.put("c1", UID1, false);
    let p = Prefetcher::new(source.clone());
    p.fetch_early("ns", "c1").await;
    assert!(p.is_empty());
    let mut unreserved = source.claims.lock().unwrap()["c1"].clone();
    unreserved.status = Some(serde_json::from_value(json!({"allocation": {"devices": {"results": []}}})).unwrap());
    assert!(!cacheable(&unreserved));
    p.fetch_early("ns", "missing").await;
    assert!(p.is_empty(), "a failed read keeps nothing");
}

#[tokio::test]
async fn a_prepare_during_the_early_read_waits_for_it() {
    let source = Source::new();
    source.put("c1", UID1, true);
    source.hold();
    let p = Arc::new(Prefetcher::new(source.clone()));
    let early = tokio::spawn({
        let p = p.clone();
        async move { p.fetch_early("ns", "c1").await }
    });
    source.until_read().await;
    let c = cref("c1", UID1);
    let prepare = ClaimSource::claim_for(&*p, &c, soon());
    let mut prepare = std::pin::pin!(prepare);
    assert!(futures_util::FutureExt::now_or_never(prepare.as_mut()).is_none(), "waits for the read in flight");
    source.open();
    let got = prepare.await.unwrap();
    assert_eq!(uid_of(&got), UID1);
    assert!(early.await.unwrap().sent());
    assert_eq!(source.total(), 1, "one read in total");
}

#[tokio::test]
async fn an_early_read_during_the_prepares_own_read_is_not_sent() {
    let source = Source::new();
    source.put("c1", UID1, true);
    source.hold();
    let p = Arc::new(Prefetcher::new(source.clone()));
    let prepare = tokio::spawn({
        let p = p.clone();
        async move { ClaimSource::claim_for(&*p, &cref("c1", UID1), soon()).await }
    });
    source.until_read().await;
    assert!(!p.fetch_early("ns", "c1").await.sent(), "not sent while the prepare reads it");
    source.open();
    prepare.await.unwrap().unwrap();
    assert_eq!(source.total(), 1);
    assert!(!p.fetch_early("ns", "c1").await.sent(), "nor after it");
    assert_eq!(source.early.load(Ordering::SeqCst), 0);
    assert_eq!(p.kept(), 0, "the prepare's own read is not kept");
}

#[tokio::test]
async fn a_failed_early_read_leaves_the_prepare_its_own() {
    let source = Source::new();
    source.put("c1", UID1, true);
    source.fail_early.store(true, Ordering::SeqCst);
    source.hold();
    let p = Arc::new(Prefetcher::new(source.clone()));
    let early = tokio::spawn({
        let p = p.clone();
        async move { p.fetch_early("ns", "c1").await }
    });
    source.until_read().await;
    let c = cref("c1", UID1);
    let prepare = ClaimSource::claim_for(&*p, &c, soon());
    let mut prepare = std::pin::pin!(prepare);
    assert!(futures_util::FutureExt::now_or_never(prepare.as_mut()).is_none());
    source.open();
    early.await.unwrap();
    let got = prepare.await.unwrap();
    assert_eq!(uid_of(&got), UID1);
    assert_eq!(source.total(), 2, "the failed early read, then the prepare's own");
    assert_eq!(p.kept(), 0);
}

#[tokio::test]
async fn the_cache_holds_at_most_its_capacity_oldest_out_first() {
    let source = Source::new();
    for k in 0..CAPACITY + 10 {
        source.put(&format!("c{k}"), UID1, true);
    }
    let p = Prefetcher::new(source.clone());
    for k in 0..CAPACITY + 10 {
        p.fetch_early("ns", &format!("c{k}")).await;
    }
    assert_eq!(p.len(), CAPACITY);
    assert!(!p.holds("ns", "c0") && !p.holds("ns", "c9"), "the oldest went");
    assert!(p.holds("ns", "c10") && p.holds("ns", &format!("c{}", CAPACITY + 9)));
}

#[tokio::test(start_paused = true)]
async fn kept_claims_expire() {
    let source = Source::new();
    source.put("c1", UID1, true);
    let p = Prefetcher::new(source.clone());
    p.fetch_early("ns", "c1").await;
    tokio::time::advance(EXPIRY).await;
    assert!(!p.holds("ns", "c1"));
    ClaimSource::claim_for(&p, &cref("c1", UID1), soon()).await.unwrap();
    assert_eq!(source.total(), 2, "an expired claim is read again");
}

fn pod(name: &str, phase: &str, claims: &[&str]) -> PodClaims {
    PodClaims {
        namespace: "ns".into(),
        name: name.into(),
        starting: phase == "Pending",
        ended: phase == "Succeeded" || phase == "Failed",
        claims: claims.iter().map(|c| c.to_string()).collect(),
    }
}

fn keys(names: &[&str]) -> Vec<(String, String)> {
    names.iter().map(|n| ("ns".to_string(), n.to_string())).collect()
}

#[test]
fn pods_ask_for_new_claims_and_drop_those_of_pods_that_started_or_went() {
    let mut pods = Pods::default();
    let mut out = Changes::default();
    pods.applied(pod("p1", "Pending", &["a"]), &mut out);
    pods.applied(pod("p0", "Pending", &[]), &mut out);
    assert_eq!(out, Changes { fetch: keys(&["a"]), forget: vec![] });
    assert_eq!(pods.len(), 1, "pods without claims are not kept");

    let mut out = Changes::default();
    pods.applied(pod("p1", "Pending", &["a", "b"]), &mut out);
    assert_eq!(out, Changes { fetch: keys(&["b"]), forget: vec![] }, "a generated claim's name arrived");

    let mut out = Changes::default();
    pods.applied(pod("p1", "Running", &["a", "b"]), &mut out);
    assert_eq!(out, Changes { fetch: vec![], forget: keys(&["a", "b"]) });

    let mut out = Changes::default();
    pods.applied(pod("p2", "Pending", &["c"]), &mut out);
    pods.applied(pod("p3", "Pending", &["d"]), &mut out);
    pods.gone(&("ns".into(), "p2".into()), &mut out);
    assert_eq!(out, Changes { fetch: keys(&["c", "d"]), forget: keys(&["c"]) });

    let mut out = Changes::default();
    pods.restarted(vec![pod("p4", "Pending", &["e"])], &mut out);
    assert_eq!(out, Changes { fetch: keys(&["e"]), forget: keys(&["d"]) }, "p3 vanished while the watch was down");
    assert_eq!(pods.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn expired_claims_nobody_asks_for_go_at_the_next_read() {
    let source = Source::new();
    source.put("c1", UID1, true);
    source.put("c2", UID1, true);
    let p = Prefetcher::new(source.clone());
    p.fetch_early("ns", "c1").await;
    tokio::time::advance(EXPIRY).await;
    p.fetch_early("ns", "c2").await;
    assert_eq!(p.len(), 1, "c1 expired and went");
    assert_eq!(p.kept(), 1);
}

#[tokio::test]
async fn a_prepare_cancelled_during_its_own_read_leaves_no_flight_behind() {
    let source = Source::new();
    source.put("c1", UID1, true);
    source.hold();
    let p = Prefetcher::new(source.clone());
    let c = cref("c1", UID1);
    {
        let prepare = ClaimSource::claim_for(&p, &c, soon());
        let mut prepare = std::pin::pin!(prepare);
        assert!(futures_util::FutureExt::now_or_never(prepare.as_mut()).is_none());
        // The kubelet gives up: the future is dropped mid-read.
    }
    source.open();
    assert!(!p.holds("ns", "c1"), "the abandoned flight is not live");
    assert!(p.fetch_early("ns", "c1").await.sent(), "so an early read may go");
    assert_eq!(p.kept(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_early_read_refused_while_the_node_authorizer_catches_up_is_tried_again() {
    let source = Source::new();
    source.put("c1", UID1, true);
    source.forbid_early.store(2, Ordering::SeqCst);
    let p = Prefetcher::new(source.clone());
    assert!(matches!(p.fetch_early("ns", "c1").await, Early::Kept(_)), "kept after two refusals");
    assert_eq!(source.early.load(Ordering::SeqCst), 3);
    // Refused every time: given up after the retries, nothing kept, the kubelet reads itself.
    source.forbid_early.store(usize::MAX, Ordering::SeqCst);
    let p = Prefetcher::new(source.clone());
    assert!(matches!(p.fetch_early("ns", "c1").await, Early::Read));
    assert_eq!(source.early.load(Ordering::SeqCst), 3 + 1 + FORBIDDEN_RETRIES.len());
    assert_eq!(p.kept(), 0);
    // Another failure is not retried.
    source.forbid_early.store(0, Ordering::SeqCst);
    source.fail_early.store(true, Ordering::SeqCst);
    let p = Prefetcher::new(source.clone());
    let before = source.early.load(Ordering::SeqCst);
    p.fetch_early("ns", "c1").await;
    assert_eq!(source.early.load(Ordering::SeqCst), before + 1);
}
