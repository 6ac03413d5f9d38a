//! Watcher tests against the scripted HTTPS server: list → Restarted, events split across
//! frames, bookmarks, resume from the last version, 410 (as an event and as a status) →
//! relist, errors → Event::Error with growing backoff, and recovery from a server restart.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::json;
use tokio::sync::mpsc;

use super::testserver::{Handler, Pki, Reply, Seen, TestServer};
use super::transport::{fast, slice};
use crate::kube::*;

type Queue = Arc<Mutex<VecDeque<Reply>>>;

/// LISTs and WATCHes answered from separate queues (404 when a queue is empty).
fn routes() -> (Queue, Queue, Handler) {
    let (lists, watches): (Queue, Queue) = Default::default();
    let (l, w) = (lists.clone(), watches.clone());
    let h: Handler = Arc::new(move |s: &Seen| {
        let q = if s.param("watch") == Some("true") { &w } else { &l };
        q.lock().unwrap().pop_front().unwrap_or_else(|| Reply::status(404, "NotFound", "no scripted reply"))
    });
    (lists, watches, h)
}

fn list(rv: &str, names: &[&str]) -> Reply {
    let items: Vec<_> = names.iter().map(|n| slice(n, rv)).collect();
    Reply::json(200, json!({"kind": "ResourceSliceList", "metadata": {"resourceVersion": rv}, "items": items}))
}

fn stream() -> (mpsc::UnboundedSender<Bytes>, Reply) {
    let (tx, rx) = mpsc::unbounded_channel();
    (tx, Reply::Stream { status: 200, rx })
}

fn line(kind: &str, object: serde_json::Value) -> Bytes {
    Bytes::from(format!("{}\n", json!({"type": kind, "object": object})))
}

async fn next(s: &mut (impl futures_util::Stream<Item = Event> + Unpin)) -> Event {
    tokio::time::timeout(Duration::from_secs(10), s.next())
        .await
        .expect("watch event in time")
        .expect("stream never ends")
}

fn name(s: &k8s_openapi::api::resource::v1::ResourceSlice) -> &str {
    s.metadata.name.as_deref().unwrap_or("")
}

#[tokio::test]
async fn list_watch_bookmark_resume_and_relist_on_gone() {
    let pki = Pki::new("ca");
    let (lists, watches, h) = routes();
    let srv = TestServer::start(&pki, h).await;
    let client = Client::new(srv.token_credentials(&pki, "t"), fast()).unwrap();
    let (tx1, r1) = stream();
    let (tx2, r2) = stream();
    lists.lock().unwrap().extend([list("5", &["a"]), list("20", &["a", "b"])]);
    watches.lock().unwrap().extend([r1, r2, Reply::status(500, "InternalError", "boom")]);
    let (tx3, r3) = stream();
    watches.lock().unwrap().push_back(r3);

    let mut w = Box::pin(client.watch_slices(ResourceApi::V1, "spec.nodeName=n1"));
    assert!(matches!(next(&mut w).await, Event::Restarted(v) if v.len() == 1));
    // One event split across three frames.
    let added = line("ADDED", slice("b", "6"));
    tx1.send(added.slice(..10)).unwrap();
    tx1.send(added.slice(10..30)).unwrap();
    tx1.send(added.slice(30..)).unwrap();
    assert!(matches!(next(&mut w).await, Event::Applied(s) if name(&s) == "b"));
    tx1.send(line("BOOKMARK", json!({"kind": "ResourceSlice", "metadata": {"resourceVersion": "9"}}))).unwrap();
    drop(tx1); // the server ends the watch (timeoutSeconds)
    tx2.send(line("MODIFIED", slice("a", "10"))).unwrap();
    assert!(matches!(next(&mut w).await, Event::Applied(s) if name(&s) == "a"));
    tx2.send(line(
        "ERROR",
        json!({"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}),
    ))
    .unwrap();
    assert!(matches!(next(&mut w).await, Event::Restarted(v) if v.len() == 2), "410 → relist");
    assert!(matches!(next(&mut w).await, Event::Error(e) if matches!(e, Error::ServerError(_))));
    tx3.send(line("DELETED", slice("b", "21"))).unwrap();
    assert!(matches!(next(&mut w).await, Event::Deleted(s) if name(&s) == "b"));

    let reqs = srv.requests();
    let watch_rvs: Vec<_> =
        reqs.iter().filter(|r| r.param("watch").is_some()).map(|r| r.param("resourceVersion").unwrap_or("")).collect();
    assert_eq!(watch_rvs, ["5", "9", "20", "20"], "resume from the list, then the bookmark, then the relist");
    let first_watch = reqs.iter().find(|r| r.param("watch").is_some()).unwrap();
    assert_eq!(first_watch.param("allowWatchBookmarks"), Some("true"));
    assert_eq!(first_watch.param("timeoutSeconds"), Some("290"));
    assert_eq!(first_watch.param("fieldSelector"), Some("spec.nodeName%3Dn1"));
    assert_eq!(reqs.iter().filter(|r| r.param("watch").is_none()).count(), 2);
    assert_eq!(client.stats().count("WATCH", 200), 3);
}

#[tokio::test]
async fn gone_status_on_watch_start_relists() {
    let pki = Pki::new("ca");
    let (lists, watches, h) = routes();
    let srv = TestServer::start(&pki, h).await;
    let client = Client::new(srv.token_credentials(&pki, "t"), fast()).unwrap();
    lists.lock().unwrap().extend([list("1", &["a"]), list("30", &["x"])]);
    let (_tx, r) = stream();
    watches.lock().unwrap().extend([Reply::status(410, "Expired", "gone"), r]);
    let mut w = Box::pin(client.watch_slices(ResourceApi::V1, ""));
    assert!(matches!(next(&mut w).await, Event::Restarted(_)));
    assert!(matches!(next(&mut w).await, Event::Restarted(v) if name(&v[0]) == "x"), "no Error event for 410");
}

#[tokio::test]
async fn errors_back_off_with_growing_delays() {
    let pki = Pki::new("ca");
    let srv = TestServer::start(&pki, Arc::new(|_: &Seen| Reply::status(403, "Forbidden", "no"))).await;
    let settings = ClientSettings {
        watch_backoff_base: Duration::from_millis(40),
        watch_backoff_max: Duration::from_millis(400),
        ..fast()
    };
    let client = Client::new(srv.token_credentials(&pki, "t"), settings).unwrap();
    let mut w = Box::pin(client.watch_slices(ResourceApi::V1, ""));
    let start = Instant::now();
    for _ in 0..5 {
        assert!(matches!(next(&mut w).await, Event::Error(e) if e.is_forbidden()));
    }
    // Delays before attempts 2..5 are at least 20, 40, 80, 160 ms (half of 40·2ⁿ).
    assert!(start.elapsed() >= Duration::from_millis(300), "{:?}", start.elapsed());
    assert_eq!(srv.requests().len(), 5, "one request per error, no hot loop");
}

#[tokio::test]
async fn watch_recovers_from_a_server_restart() {
    let pki = Pki::new("ca");
    let (lists, watches, h) = routes();
    let srv = TestServer::start(&pki, h).await;
    let addr = srv.addr;
    let client = Client::new(srv.token_credentials(&pki, "t"), fast()).unwrap();
    lists.lock().unwrap().push_back(list("1", &["a"]));
    let (tx, r) = stream();
    watches.lock().unwrap().push_back(r);
    let mut w = Box::pin(client.watch_slices(ResourceApi::V1, ""));
    assert!(matches!(next(&mut w).await, Event::Restarted(_)));
    tx.send(line("ADDED", slice("b", "2"))).unwrap();
    assert!(matches!(next(&mut w).await, Event::Applied(_)));
    srv.stop().await;

    // The restarted server lost its watch cache: the old version is gone.
    let (lists, watches, h) = routes();
    lists.lock().unwrap().push_back(list("100", &["a", "b", "c"]));
    let (tx2, r2) = stream();
    watches.lock().unwrap().extend([Reply::status(410, "Expired", "too old"), r2]);
    let srv2 = TestServer::start_on(&pki, addr, h).await;
    loop {
        match next(&mut w).await {
            Event::Error(_) => continue, // connection errors while it was down
            Event::Restarted(v) => {
                assert_eq!(v.len(), 3);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    tx2.send(line("ADDED", slice("d", "101"))).unwrap();
    assert!(matches!(next(&mut w).await, Event::Applied(s) if name(&s) == "d"));
    assert_eq!(srv2.requests().iter().filter(|r| r.param("watch").is_some()).count(), 2);
}

#[tokio::test]
async fn a_silent_watch_connection_is_abandoned() {
    let pki = Pki::new("ca");
    let (lists, watches, h) = routes();
    let srv = TestServer::start(&pki, h).await;
    let settings = ClientSettings { watch_timeout_seconds: 1, request_timeout: Duration::from_millis(200), ..fast() };
    let client = Client::new(srv.token_credentials(&pki, "t"), settings).unwrap();
    lists.lock().unwrap().push_back(list("1", &[]));
    let (_silent, r1) = stream();
    let (tx2, r2) = stream();
    watches.lock().unwrap().extend([r1, r2]);
    let mut w = Box::pin(client.watch_slices(ResourceApi::V1, ""));
    assert!(matches!(next(&mut w).await, Event::Restarted(_)));
    let start = Instant::now();
    assert!(matches!(next(&mut w).await, Event::Error(e) if e.is_timeout()));
    assert!(start.elapsed() >= Duration::from_millis(1200), "{:?}", start.elapsed());
    tx2.send(line("ADDED", slice("a", "2"))).unwrap();
    assert!(matches!(next(&mut w).await, Event::Applied(_)), "reconnected after the dead connection");
}

/// Paused time: a failure before any I/O (the token file is missing) makes each step fail
/// at once, so the measured gaps between Error events are exactly the backoff delays.
#[tokio::test(start_paused = true)]
async fn watch_backoff_grows_and_is_capped_in_paused_time() {
    let pki = Pki::new("ca");
    let dir = tempfile::tempdir().unwrap();
    let creds = Credentials {
        server: "https://127.0.0.1:1".into(),
        ca: Some(Pem::Data(pki.ca_pem.clone().into_bytes())),
        insecure_skip_tls_verify: false,
        tls_server_name: None,
        auth: Auth::TokenFile(dir.path().join("missing-token")),
        identity: "test".into(),
    };
    let settings = ClientSettings {
        watch_backoff_base: Duration::from_millis(500),
        watch_backoff_max: Duration::from_secs(30),
        ..ClientSettings::default()
    };
    let client = Client::new(creds, settings).unwrap();
    let mut w = Box::pin(client.watch_slices(ResourceApi::V1, ""));
    let mut last = tokio::time::Instant::now();
    for n in 0..10u32 {
        let ev = tokio::time::timeout(Duration::from_secs(60), w.next()).await.unwrap().unwrap();
        assert!(matches!(ev, Event::Error(Error::CredentialFile { .. })), "{ev:?}");
        let gap = last.elapsed();
        last = tokio::time::Instant::now();
        if n == 0 {
            assert_eq!(gap, Duration::ZERO, "the first attempt is immediate");
            continue;
        }
        let exp = Duration::from_millis(500).saturating_mul(1 << (n - 1)).min(Duration::from_secs(30));
        assert!(gap >= exp / 2 && gap <= exp, "gap {n}: {gap:?} not in [{:?}, {exp:?}]", exp / 2);
    }
}

#[tokio::test]
async fn pods_are_listed_and_watched_as_the_claims_they_use_resuming_after_a_bad_event() {
    let pki = Pki::new("ca");
    let (lists, watches, h) = routes();
    let srv = TestServer::start(&pki, h).await;
    let client = Client::new(srv.token_credentials(&pki, "t"), fast()).unwrap();
    let pod = |name: &str, rv: &str, claim: &str| {
        json!({"metadata": {"namespace": "ns", "name": name, "resourceVersion": rv},
            "spec": {"nodeName": "n1", "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]},
            "status": {"phase": "Pending"}})
    };
    lists.lock().unwrap().push_back(Reply::json(
        200,
        json!({"kind": "PodList", "metadata": {"resourceVersion": "5"}, "items": [pod("p1", "4", "c1")]}),
    ));
    let (tx, r) = stream();
    let (tx2, r2) = stream();
    watches.lock().unwrap().extend([r, r2]);
    let mut w = Box::pin(client.watch_pods("spec.nodeName=n1"));
    let first = tokio::time::timeout(Duration::from_secs(10), w.next()).await.unwrap().unwrap();
    assert!(matches!(&first, Event::Restarted(v) if v.len() == 1 && v[0].claims == ["c1"]), "{first:?}");
    tx.send(line("ADDED", json!({"metadata": {"name": "bad"}, "spec": {"resourceClaims": 7}}))).unwrap();
    let bad = tokio::time::timeout(Duration::from_secs(10), w.next()).await.unwrap().unwrap();
    assert!(matches!(&bad, Event::Error(Error::Decode { operation, .. }) if operation == "WATCH pods"), "{bad:?}");
    // The watch resumes from the last good version on a new stream.
    tx2.send(line("DELETED", pod("p1", "7", "c1"))).unwrap();
    let gone = tokio::time::timeout(Duration::from_secs(10), w.next()).await.unwrap().unwrap();
    assert!(matches!(&gone, Event::Deleted(p) if p.name == "p1"), "{gone:?}");
    let reqs = srv.requests();
    assert!(reqs.iter().all(|r| r.path == "/api/v1/pods" && r.param("fieldSelector") == Some("spec.nodeName%3Dn1")));
    let rvs: Vec<_> = reqs.iter().filter_map(|r| r.param("watch").and(r.param("resourceVersion"))).collect();
    assert_eq!(rvs, ["5", "5"]);
    assert_eq!(client.stats().count("LIST", 200), 1, "a pod list counts as LIST");
}
