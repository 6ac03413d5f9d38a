//! Transport tests against the scripted HTTPS server in `testserver`: TLS verification,
//! client certificates, headers, error typing, retry policy (429 + Retry-After, 5xx, POST),
//! timeouts, discovery, version conversion on the wire and statistics.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::json;

use super::testserver::{Handler, Pki, Reply, Seen, TestServer};
use crate::kube::*;

pub(crate) fn fast() -> ClientSettings {
    ClientSettings {
        request_timeout: Duration::from_secs(5),
        retry_base_delay: Duration::from_millis(5),
        retry_max_delay: Duration::from_millis(20),
        watch_backoff_base: Duration::from_millis(5),
        watch_backoff_max: Duration::from_millis(20),
        ..ClientSettings::default()
    }
}

/// Answers with the replies in order; afterwards 404.
pub(crate) fn script(replies: Vec<Reply>) -> Handler {
    let q = Mutex::new(VecDeque::from(replies));
    Arc::new(move |_: &Seen| {
        q.lock().unwrap().pop_front().unwrap_or_else(|| Reply::status(404, "NotFound", "script exhausted"))
    })
}

async fn setup(replies: Vec<Reply>) -> (Pki, TestServer, Client) {
    let pki = Pki::new("test-ca");
    let srv = TestServer::start(&pki, script(replies)).await;
    let client = Client::new(srv.token_credentials(&pki, "tok-1"), fast()).unwrap();
    (pki, srv, client)
}

pub(crate) fn slice(name: &str, rv: &str) -> serde_json::Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name, "resourceVersion": rv, "uid": format!("uid-{name}")},
        "spec": {"driver": "gpu.edra.dev", "nodeName": "n1", "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"index": {"int": 0}}}]}})
}

#[tokio::test]
async fn wrong_ca_is_a_tls_error() {
    let pki = Pki::new("real-ca");
    let srv = TestServer::start(&pki, script(vec![])).await;
    let other = Pki::new("other-ca");
    let client = Client::new(srv.token_credentials(&other, "t"), fast()).unwrap();
    let err = client.server_version().await.unwrap_err();
    assert!(err.is_tls(), "{err:?}");
    assert!(err.to_string().contains("certificate authority"), "{err}");
    assert!(srv.requests().is_empty(), "nothing may be sent to an unverified server");
}

#[tokio::test]
async fn token_user_agent_and_client_certificate_are_sent() {
    let (pki, srv, client) = setup(vec![Reply::json(200, json!({"gitVersion": "v1.34.1+k3s1"}))]).await;
    assert_eq!(client.server_version().await.unwrap(), "v1.34.1+k3s1");
    let r = &srv.requests()[0];
    assert_eq!(r.headers["authorization"], "Bearer tok-1");
    assert_eq!(r.headers["user-agent"], format!("edra/{}", crate::util::VERSION).as_str());
    assert_eq!(r.version, http::Version::HTTP_2, "HTTP/2 is negotiated by ALPN");
    assert!(!r.client_cert);
    client.server_version().await.unwrap_err(); // script exhausted: 404, on the same connection
    assert_eq!(srv.connections.load(std::sync::atomic::Ordering::SeqCst), 1, "HTTP/2 connection reused");

    let (cert, key) = pki.leaf(&[], "system:node:n1");
    let mut creds = srv.token_credentials(&pki, "unused");
    creds.auth = Auth::ClientCert { cert: Pem::Data(cert.into_bytes()), key: Pem::Data(key.into_bytes()) };
    let srv2 = TestServer::start(&pki, script(vec![Reply::json(200, json!({"gitVersion": "v1"}))])).await;
    creds.server = srv2.url();
    Client::new(creds, fast()).unwrap().server_version().await.unwrap();
    let r = &srv2.requests()[0];
    assert!(r.client_cert, "the client certificate must be presented");
    assert!(r.headers.get("authorization").is_none());
}

#[tokio::test]
async fn unauthorized_and_forbidden_are_typed_and_not_retried() {
    let (_pki, srv, client) = setup(vec![
        Reply::status(401, "Unauthorized", "Unauthorized"),
        Reply::status(403, "Forbidden", "node 'n2' cannot modify resourceslices of node 'n1'"),
    ])
    .await;
    assert!(client.get_node("n1").await.unwrap_err().is_unauthorized());
    let e = client.get_slice(ResourceApi::V1, "s").await.unwrap_err();
    assert!(e.is_forbidden() && e.to_string().contains("cannot modify resourceslices of node 'n1'"), "{e}");
    assert_eq!(srv.requests().len(), 2, "4xx is never retried");
}

#[tokio::test]
async fn too_many_requests_waits_for_retry_after() {
    let (_pki, srv, client) = setup(vec![
        Reply::status(429, "TooManyRequests", "slow down").with_header("retry-after", "1"),
        Reply::json(200, json!({"gitVersion": "v1"})),
    ])
    .await;
    let start = Instant::now();
    client.server_version().await.unwrap();
    assert!(start.elapsed() >= Duration::from_secs(1), "Retry-After: 1 was not honoured: {:?}", start.elapsed());
    assert_eq!(srv.requests().len(), 2);
    let stats = client.stats();
    assert_eq!((stats.count("GET", 429), stats.count("GET", 200)), (1, 1));
}

#[tokio::test]
async fn server_errors_are_retried_for_reads_with_bounded_attempts() {
    let (_pki, srv, client) = setup(vec![
        Reply::status(500, "InternalError", "etcd hiccup"),
        Reply::status(502, "", "bad gateway"),
        Reply::json(200, json!({"gitVersion": "v1"})),
    ])
    .await;
    client.server_version().await.unwrap();
    assert_eq!(srv.requests().len(), 3);

    let (_pki, srv, client) = setup((0..10).map(|_| Reply::status(500, "InternalError", "down")).collect()).await;
    let e = client.server_version().await.unwrap_err();
    assert!(matches!(e, Error::ServerError(_)), "{e:?}");
    assert_eq!(srv.requests().len(), 5, "attempts are bounded");
}

#[tokio::test]
async fn create_is_not_replayed_after_an_ambiguous_server_error() {
    let s: ResourceSlice = serde_json::from_value(slice("", "")).unwrap();
    let mut s = s;
    s.metadata.name = None;
    s.metadata.generate_name = Some("n1-gpu-".into());
    let (_pki, srv, client) = setup(vec![Reply::status(500, "InternalError", "maybe created")]).await;
    assert!(matches!(client.create_slice(ResourceApi::V1, &s).await, Err(Error::ServerError(_))));
    assert_eq!(srv.requests().len(), 1, "a POST with generateName must not be retried after a 500");

    let (_pki, srv, client) = setup(vec![
        Reply::status(503, "ServiceUnavailable", "not ready").with_header("retry-after", "0"),
        Reply::status(429, "TooManyRequests", "throttled"),
        Reply::json(201, slice("n1-gpu-abcde", "10")),
    ])
    .await;
    let created = client.create_slice(ResourceApi::V1, &s).await.unwrap();
    assert_eq!(created.metadata.name.as_deref(), Some("n1-gpu-abcde"));
    let reqs = srv.requests();
    assert_eq!(reqs.len(), 3, "503 + Retry-After and 429 are safe to retry");
    assert_eq!(reqs[0].json()["metadata"]["generateName"], "n1-gpu-");
}

#[tokio::test]
async fn request_timeout_applies() {
    let pki = Pki::new("ca");
    let srv = TestServer::start(&pki, Arc::new(|_: &Seen| Reply::Hang)).await;
    let settings = ClientSettings { request_timeout: Duration::from_millis(200), max_attempts: 2, ..fast() };
    let client = Client::new(srv.token_credentials(&pki, "t"), settings).unwrap();
    let e = client.get_node("n1").await.unwrap_err();
    assert!(e.is_timeout(), "{e:?}");
    assert_eq!(srv.requests().len(), 2, "reads are retried after a timeout, up to max_attempts");
}

#[tokio::test]
async fn discovery_prefers_v1_then_v1beta2_then_v1beta1() {
    let group = |versions: &[&str]| {
        let vs: Vec<_> =
            versions.iter().map(|v| json!({"groupVersion": format!("resource.k8s.io/{v}"), "version": v})).collect();
        Reply::json(200, json!({"kind": "APIGroup", "name": "resource.k8s.io", "versions": vs}))
    };
    let cases = [
        (vec!["v1", "v1beta2", "v1beta1"], ResourceApi::V1),
        (vec!["v1beta1", "v1beta2", "v1alpha3"], ResourceApi::V1beta2),
        (vec!["v1beta1", "v1alpha3"], ResourceApi::V1beta1),
    ];
    for (served, want) in cases {
        let (_pki, srv, client) = setup(vec![group(&served)]).await;
        assert_eq!(client.discover_resource_api().await.unwrap(), want, "{served:?}");
        assert_eq!(srv.requests()[0].path, "/apis/resource.k8s.io");
    }
    let (_pki, _srv, client) = setup(vec![
        Reply::status(404, "NotFound", "404 page not found"),
        Reply::json(200, json!({"gitVersion": "v1.31.4"})),
    ])
    .await;
    let e = client.discover_resource_api().await.unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, Error::NoResourceApi { .. }) && msg.contains("v1.31.4") && msg.contains("runtime-config"),
        "{msg}"
    );
}

#[tokio::test]
async fn v1beta1_slices_are_converted_on_the_wire() {
    let mut wire = slice("s1", "3");
    wire["apiVersion"] = "resource.k8s.io/v1beta1".into();
    wire["spec"]["devices"] = json!([{"name": "gpu-0", "basic": {"attributes": {"index": {"int": 0}}}}]);
    let (_pki, srv, client) = setup(vec![Reply::json(200, wire.clone()), Reply::json(200, wire)]).await;
    let s: ResourceSlice = serde_json::from_value(slice("s1", "3")).unwrap();
    let updated = client.update_slice(ResourceApi::V1beta1, &s).await.unwrap();
    assert_eq!(updated, s, "the reply is converted back to v1");
    let r = &srv.requests()[0];
    assert_eq!((r.method.as_str(), r.path.as_str()), ("PUT", "/apis/resource.k8s.io/v1beta1/resourceslices/s1"));
    let body = r.json();
    assert_eq!(body["apiVersion"], "resource.k8s.io/v1beta1");
    assert_eq!(body["metadata"]["resourceVersion"], "3");
    assert_eq!(body["spec"]["devices"][0]["basic"]["attributes"]["index"]["int"], 0);
    assert_eq!(client.get_slice(ResourceApi::V1beta1, "s1").await.unwrap(), s);
}

#[tokio::test]
async fn stale_update_is_a_conflict_and_delete_sends_preconditions() {
    let (_pki, srv, client) = setup(vec![
        Reply::status(409, "Conflict", "the object has been modified; please apply your changes to the latest version"),
        Reply::json(200, json!({"kind": "Status", "status": "Success"})),
        Reply::status(409, "Conflict", "Precondition failed: UID in precondition: uid-x, UID in object meta: uid-y"),
    ])
    .await;
    let s: ResourceSlice = serde_json::from_value(slice("s1", "1")).unwrap();
    assert!(client.update_slice(ResourceApi::V1, &s).await.unwrap_err().is_conflict());
    client.delete_slice(ResourceApi::V1, "s1", "uid-s1", "7").await.unwrap();
    assert!(client.delete_slice(ResourceApi::V1, "s1", "uid-x", "7").await.unwrap_err().is_conflict());
    let reqs = srv.requests();
    assert_eq!(reqs.len(), 3, "409 is not retried");
    assert_eq!(reqs[1].method, "DELETE");
    assert_eq!(reqs[1].json()["preconditions"], json!({"uid": "uid-s1", "resourceVersion": "7"}));
}

#[tokio::test]
async fn list_uses_the_field_selector_and_returns_the_version() {
    let list = json!({"kind": "ResourceSliceList", "metadata": {"resourceVersion": "55"}, "items": [slice("a", "50"), slice("b", "51")]});
    let (_pki, srv, client) = setup(vec![Reply::json(200, list)]).await;
    let got = client.list_slices(ResourceApi::V1, "spec.nodeName=n1,spec.driver=gpu.edra.dev").await.unwrap();
    assert_eq!(got.resource_version, "55");
    assert_eq!(got.items.len(), 2);
    assert_eq!(srv.requests()[0].param("fieldSelector"), Some("spec.nodeName%3Dn1%2Cspec.driver%3Dgpu.edra.dev"));
    let stats = client.stats();
    assert_eq!(stats.count("LIST", 200), 1);
    assert!(stats.bytes_received > 100);
}

#[tokio::test]
async fn claims_are_fetched_and_converted() {
    let claim = json!({"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
        "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.edra.dev", "count": 1}]}}});
    let (_pki, srv, client) = setup(vec![Reply::json(200, claim)]).await;
    let c = client.get_claim(ResourceApi::V1beta1, "ns", "c").await.unwrap();
    let spec = c.spec.and_then(|s| s.devices).unwrap();
    let exactly = spec.requests.unwrap()[0].exactly.clone().unwrap();
    assert_eq!(exactly.device_class_name, "gpu.edra.dev");
    assert_eq!(srv.requests()[0].path, "/apis/resource.k8s.io/v1beta1/namespaces/ns/resourceclaims/c");
}

#[tokio::test]
async fn tls_failures_are_not_retried_but_connect_failures_are() {
    let pki = Pki::new("real-ca");
    let srv = TestServer::start(&pki, script(vec![])).await;
    let client = Client::new(srv.token_credentials(&Pki::new("other"), "t"), fast()).unwrap();
    assert!(client.get_node("n").await.unwrap_err().is_tls());
    assert_eq!(client.stats().count("GET", 0), 1, "an untrusted server is not retried");

    let creds = srv.token_credentials(&pki, "t");
    srv.stop().await;
    let client = Client::new(creds, fast()).unwrap();
    let e = client.get_node("n").await.unwrap_err();
    assert!(matches!(e, Error::Transport { .. }), "{e:?}");
    assert_eq!(client.stats().count("GET", 0), 5, "connection refused is retried up to max_attempts");
}

#[tokio::test]
async fn insecure_skip_verify_and_tls_server_name() {
    let pki = Pki::new("real-ca");
    let srv = TestServer::start(&pki, Arc::new(|_: &Seen| Reply::json(200, json!({"gitVersion": "v1"})))).await;
    let mut creds = srv.token_credentials(&Pki::new("other"), "t");
    creds.insecure_skip_tls_verify = true;
    Client::new(creds, fast()).unwrap().server_version().await.expect("verification explicitly skipped");

    let mut creds = srv.token_credentials(&pki, "t");
    creds.tls_server_name = Some("localhost".into());
    Client::new(creds.clone(), fast()).unwrap().server_version().await.expect("the certificate names localhost");
    creds.tls_server_name = Some("elsewhere.example".into());
    let e = Client::new(creds, fast()).unwrap().server_version().await.unwrap_err();
    assert!(e.is_tls(), "{e:?}");
}

#[tokio::test]
async fn token_file_is_reread_when_it_rotates() {
    let pki = Pki::new("ca");
    let srv = TestServer::start(&pki, Arc::new(|_: &Seen| Reply::json(200, json!({"gitVersion": "v1"})))).await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "first-token\n").unwrap();
    let mut creds = srv.token_credentials(&pki, "unused");
    creds.auth = Auth::TokenFile(token.clone());
    let client = Client::new(creds, fast()).unwrap();
    client.server_version().await.unwrap();
    client.server_version().await.unwrap();
    std::fs::write(&token, "second-token\n").unwrap();
    let later = std::time::SystemTime::now() + Duration::from_secs(5);
    std::fs::File::options().write(true).open(&token).unwrap().set_modified(later).unwrap();
    client.server_version().await.unwrap();
    let auth: Vec<_> =
        srv.requests().iter().map(|r| r.headers["authorization"].to_str().unwrap().to_string()).collect();
    assert_eq!(auth, ["Bearer first-token", "Bearer first-token", "Bearer second-token"]);
    std::fs::remove_file(&token).unwrap();
    let e = client.server_version().await.unwrap_err();
    assert!(matches!(e, Error::CredentialFile { .. }) && e.to_string().contains("token"), "{e}");
}

#[tokio::test]
async fn falls_back_to_http1_and_reuses_the_connection() {
    let pki = Pki::new("ca");
    let h: Handler = Arc::new(|_: &Seen| Reply::json(200, json!({"gitVersion": "v1"})));
    let srv = TestServer::start_with_alpn(&pki, "127.0.0.1:0".parse().unwrap(), h, &[b"http/1.1"]).await;
    let client = Client::new(srv.token_credentials(&pki, "t"), fast()).unwrap();
    for _ in 0..3 {
        client.server_version().await.unwrap();
    }
    let reqs = srv.requests();
    assert!(reqs.iter().all(|r| r.version == http::Version::HTTP_11), "HTTP/1.1 when the server offers no h2");
    assert_eq!(client.stats().count("GET", 200), 3);
    assert_eq!(srv.connections.load(std::sync::atomic::Ordering::SeqCst), 1, "one pooled connection for all requests");
}

#[tokio::test]
async fn absurd_retry_after_is_capped_and_returns_at_once() {
    let huge = u64::MAX.to_string();
    let signed = i64::MAX.to_string();
    let details = |code: u16, secs: &str| {
        let body = format!(
            r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","message":"later","code":{code},"details":{{"retryAfterSeconds":{secs}}}}}"#
        );
        Reply::Json { status: code, headers: Vec::new(), body }
    };
    let replies = vec![
        Reply::status(429, "TooManyRequests", "slow down").with_header("retry-after", &huge),
        Reply::status(503, "ServiceUnavailable", "later").with_header("retry-after", &signed),
        details(429, &huge),
        details(503, &signed),
    ];
    let (_pki, srv, client) = setup(replies).await;
    for n in 1..=4 {
        let started = Instant::now();
        let e = client.server_version().await.unwrap_err();
        let api = e.api().unwrap_or_else(|| panic!("an API error: {e:?}"));
        assert_eq!(api.retry_after, Some(MAX_RETRY_AFTER.as_secs()), "reply {n}: the server's delay is capped");
        assert!(started.elapsed() < Duration::from_secs(5), "reply {n} waited {:?}", started.elapsed());
        assert_eq!(srv.requests().len(), n, "a delay beyond the retry budget is not waited for");
    }
}

#[tokio::test]
async fn a_retry_after_that_is_no_delay_leaves_the_retries_to_the_clients_backoff() {
    for header in ["-1", "NaN", "soon"] {
        let replies = (0..10).map(|_| Reply::status(429, "TooManyRequests", "x").with_header("retry-after", header));
        let (_pki, srv, client) = setup(replies.collect()).await;
        let e = client.server_version().await.unwrap_err();
        assert_eq!(e.api().and_then(|a| a.retry_after), None, "Retry-After: {header}");
        assert_eq!(srv.requests().len(), 5, "Retry-After: {header}: every attempt, on the client's backoff");
    }
    let body = r#"{"kind":"Status","message":"later","code":429,"details":{"retryAfterSeconds":-5}}"#;
    let replies = (0..10).map(|_| Reply::Json { status: 429, headers: Vec::new(), body: body.into() });
    let (_pki, srv, client) = setup(replies.collect()).await;
    client.server_version().await.unwrap_err();
    assert_eq!(srv.requests().len(), 5, "retryAfterSeconds: -5 is no delay");
    // A huge number is a delay, capped at the retry budget: the error comes back at once.
    let replies = vec![Reply::status(429, "TooManyRequests", "x").with_header("retry-after", "1e308")];
    let (_pki, srv, client) = setup(replies).await;
    let e = client.server_version().await.unwrap_err();
    assert_eq!(e.api().and_then(|a| a.retry_after), Some(MAX_RETRY_AFTER.as_secs()));
    assert_eq!(srv.requests().len(), 1);
    // A fraction is rounded up.
    let replies = vec![
        Reply::status(429, "TooManyRequests", "x").with_header("retry-after", "0.5"),
        Reply::json(200, json!({"gitVersion": "v1"})),
    ];
    let (_pki, _srv, client) = setup(replies).await;
    let started = Instant::now();
    client.server_version().await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1), "Retry-After: 0.5 waited {:?}", started.elapsed());
}

#[tokio::test]
async fn an_oversized_discovery_reply_is_refused_not_buffered() {
    // 4 MiB streamed without a Content-Length (what a broken proxy's endless reply looks
    // like); the client stops at 1 MiB and does not ask again.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let chunk = bytes::Bytes::from(vec![b' '; 64 << 10]);
    for _ in 0..64 {
        tx.send(chunk.clone()).unwrap();
    }
    let (_pki, srv, client) = setup(vec![Reply::Stream { status: 200, rx }]).await;
    let e = client.discover_resource_api().await.unwrap_err();
    assert!(e.is_too_large(), "{e:?}");
    let text = e.to_string();
    assert!(text.starts_with("GET /apis/resource.k8s.io: the response is larger than 1 MiB"), "{text}");
    assert!(text.contains("a discovery document"), "{text}");
    assert_eq!(srv.requests().len(), 1, "an oversized reply is not retried");
    drop(tx);

    // With a Content-Length, the answer is refused before its body is read.
    let huge = format!(
        "{{\"kind\":\"Node\",\"metadata\":{{\"name\":\"n1\",\"annotations\":{{\"a\":\"{}\"}}}}}}",
        "x".repeat(17 << 20)
    );
    let (_pki, srv, client) = setup(vec![Reply::Json { status: 200, headers: Vec::new(), body: huge }]).await;
    let e = client.get_node("n1").await.unwrap_err();
    assert!(
        e.to_string().contains("GET /api/v1/nodes/n1: the response is larger than 16 MiB, the most one object can be"),
        "{e}"
    );
    assert_eq!(srv.requests().len(), 1);
}

#[test]
fn body_limits_follow_what_is_asked_for() {
    let limit = |req: http::Request<bytes::Bytes>| client::body_limit(&req).bytes;
    assert_eq!(limit(request::get("/version")), client::DISCOVERY_BODY_LIMIT);
    assert_eq!(limit(request::get("/apis/resource.k8s.io")), client::DISCOVERY_BODY_LIMIT);
    assert_eq!(limit(request::get("/apis/resource.k8s.io/v1")), client::DISCOVERY_BODY_LIMIT);
    assert_eq!(limit(request::get_node("n1")), client::OBJECT_BODY_LIMIT);
    assert_eq!(limit(request::get_claim(ResourceApi::V1, "ns", "c")), client::OBJECT_BODY_LIMIT);
    assert_eq!(limit(request::list_slices(ResourceApi::V1, "spec.nodeName=n1")), client::LIST_BODY_LIMIT);
}

#[tokio::test]
async fn a_read_the_rate_limit_would_hold_past_its_deadline_is_not_sent() {
    let pki = Pki::new("ca");
    let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u"}, "spec": {}});
    let srv = TestServer::start(&pki, Arc::new(move |_: &Seen| Reply::json(200, claim.clone()))).await;
    let settings = ClientSettings { qps: 0.5, burst: 1, ..fast() };
    let client = Client::new(srv.token_credentials(&pki, "t"), settings).unwrap();
    let soon = || tokio::time::Instant::now() + Duration::from_secs(10);
    client.get_claim_by(ResourceApi::V1, "ns", "c", soon()).await.expect("the burst token");
    // The next token is 2 s away, but the server must also get a second to answer: fine.
    client.get_claim_by(ResourceApi::V1, "ns", "c", soon()).await.expect("in time");
    // Now the next is 2 s away and only 2.5 s are left: not sent, and said so.
    let until = tokio::time::Instant::now() + Duration::from_millis(2500);
    let e = client.get_claim_by(ResourceApi::V1, "ns", "c", until).await.unwrap_err();
    assert!(e.is_throttled(), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("not sent: edra's own client-side rate limit (kubernetes.qps = 0.5, kubernetes.burst = 1)"),
        "{text}"
    );
    assert_eq!(srv.requests().len(), 2, "the throttled read never reached the server");
}
