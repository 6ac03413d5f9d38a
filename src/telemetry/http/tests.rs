//! The metrics endpoint over real HTTP on loopback: scrape, health, readiness, errors.

use std::collections::BTreeMap;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};

use super::*;
use crate::kube::RequestStats;
use crate::plugin::{CallObserver, CallOutcome, CallReport, DraMethod};
use crate::telemetry::metrics::{CallMetrics, StateSources};

struct Running {
    addr: SocketAddr,
    registration: watch::Sender<RegistrationState>,
    publish: watch::Sender<PublishStatus>,
    state: watch::Sender<Option<String>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

fn stats() -> RequestStats {
    let mut requests = BTreeMap::new();
    requests.insert(("GET".to_string(), 200), 4);
    requests.insert(("POST".to_string(), 201), 2);
    requests.insert(("WATCH".to_string(), 0), 1);
    RequestStats { requests, bytes_sent: 300, bytes_received: 7000 }
}

fn start(calls: &CallMetrics) -> Running {
    let (registration, registration_rx) = watch::channel(RegistrationState::Unknown);
    let (publish, publish_rx) = watch::channel(PublishStatus::default());
    let (stop, stop_rx) = watch::channel(false);
    let sources =
        StateSources { registration: registration_rx.clone(), publish: publish_rx.clone(), api_stats: Arc::new(stats) };
    let (state, state_rx) = watch::channel(None);
    let readiness = Readiness { registration: registration_rx, publish: publish_rx, state: state_rx };
    let listener = MetricsListener::bind("127.0.0.1:0".parse().unwrap()).expect("bind loopback");
    let addr = listener.local_addr();
    assert_ne!(addr.port(), 0);
    let task = listener.serve(Endpoints { metrics: Metrics::new(calls, sources), readiness }, stop_rx);
    Running { addr, registration, publish, state, stop, task }
}

struct Answer {
    status: StatusCode,
    content_type: String,
    body: String,
}

async fn try_request(addr: SocketAddr, method: Method, path: &str) -> Option<Answer> {
    let stream = TcpStream::connect(addr).await.ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.ok()?;
    tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, "localhost")
        .body(Empty::<Bytes>::new())
        .ok()?;
    let res = sender.send_request(req).await.ok()?;
    let status = res.status();
    let content_type =
        res.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let body = res.into_body().collect().await.ok()?.to_bytes();
    Some(Answer { status, content_type, body: String::from_utf8(body.to_vec()).ok()? })
}

async fn request(addr: SocketAddr, method: Method, path: &str) -> Answer {
    try_request(addr, method, path).await.unwrap_or_else(|| panic!("no answer to {path}"))
}

async fn get(addr: SocketAddr, path: &str) -> Answer {
    request(addr, Method::GET, path).await
}

/// Sample lines of an OpenMetrics text as `name{labels}` → value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("malformed line {l:?}"));
            (series.to_string(), value.parse().unwrap_or_else(|_| panic!("malformed value in {l:?}")))
        })
        .collect()
}

fn report(method: DraMethod, version: &'static str, outcome: CallOutcome, ok: u64, failed: u64, ms: u64) -> CallReport {
    CallReport { method, version, outcome, claims_ok: ok, claims_failed: failed, duration: Duration::from_millis(ms) }
}

#[tokio::test]
async fn a_scrape_shows_calls_state_and_api_requests() {
    let calls = CallMetrics::new();
    calls.call_finished(&report(DraMethod::Prepare, "v1", CallOutcome::ClaimErrors, 1, 1, 3));
    calls.call_finished(&report(DraMethod::Prepare, "v1", CallOutcome::Ok, 2, 0, 40));
    calls.call_finished(&report(DraMethod::Unprepare, "v1beta1", CallOutcome::Failed, 0, 0, 1));
    calls.registration_status(false);
    calls.registration_status(true);
    let env = start(&calls);
    env.registration.send_replace(RegistrationState::Registered);
    env.publish.send_replace(PublishStatus { in_sync: true, devices: 3, writes: 5, last_error: None });

    let answer = get(env.addr, "/metrics").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.content_type, OPENMETRICS_CONTENT_TYPE);
    assert!(answer.body.ends_with("# EOF\n"), "{}", answer.body);
    let s = samples(&answer.body);
    let build = format!("edra_build_info{{version=\"{}\"}}", crate::util::VERSION);
    let expect = [
        (build.as_str(), 1.0),
        ("edra_prepare_requests_total{version=\"v1\",outcome=\"claim_error\"}", 1.0),
        ("edra_prepare_requests_total{version=\"v1\",outcome=\"ok\"}", 1.0),
        ("edra_prepare_requests_total{version=\"v1beta1\",outcome=\"failed\"}", 0.0),
        ("edra_unprepare_requests_total{version=\"v1beta1\",outcome=\"failed\"}", 1.0),
        ("edra_claims_prepared_total{outcome=\"ok\"}", 3.0),
        ("edra_claims_prepared_total{outcome=\"error\"}", 1.0),
        ("edra_claims_unprepared_total{outcome=\"ok\"}", 0.0),
        ("edra_prepare_duration_seconds_count", 2.0),
        ("edra_prepare_duration_seconds_bucket{le=\"0.005\"}", 1.0),
        ("edra_prepare_duration_seconds_bucket{le=\"0.05\"}", 2.0),
        ("edra_prepare_duration_seconds_bucket{le=\"+Inf\"}", 2.0),
        ("edra_unprepare_duration_seconds_count", 1.0),
        ("edra_registration_refusals_total", 1.0),
        ("edra_published_devices", 3.0),
        ("edra_slices_in_sync", 1.0),
        ("edra_publish_writes_total", 5.0),
        ("edra_kubelet_registered", 1.0),
        ("edra_api_requests_total{verb=\"GET\",code=\"200\"}", 4.0),
        ("edra_api_requests_total{verb=\"POST\",code=\"201\"}", 2.0),
        ("edra_api_requests_total{verb=\"WATCH\",code=\"0\"}", 1.0),
        ("edra_api_sent_bytes_total", 300.0),
        ("edra_api_received_bytes_total", 7000.0),
    ];
    for (series, value) in expect {
        assert_eq!(s.get(series), Some(&value), "{series} in\n{}", answer.body);
    }
    let sum = s["edra_prepare_duration_seconds_sum"];
    assert!((sum - 0.043).abs() < 1e-9, "{sum}");
    assert!(answer.body.contains("# UNIT edra_prepare_duration_seconds seconds"), "{}", answer.body);
    assert!(answer.body.contains("# HELP edra_published_devices "), "{}", answer.body);
    let _ = env.stop.send(true);
}

#[tokio::test]
async fn readyz_needs_registration_and_slices_in_sync() {
    let env = start(&CallMetrics::new());
    let answer = get(env.addr, "/readyz").await;
    assert_eq!(
        (answer.status, answer.body.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "not registered with the kubelet\n")
    );
    assert_eq!(answer.content_type, TEXT);

    env.registration.send_replace(RegistrationState::Refused("version not supported".into()));
    let answer = get(env.addr, "/readyz").await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.body, "not registered with the kubelet: refused: version not supported\n");

    env.registration.send_replace(RegistrationState::Registered);
    let answer = get(env.addr, "/readyz").await;
    assert_eq!((answer.status, answer.body.as_str()), (StatusCode::SERVICE_UNAVAILABLE, "slices not published yet\n"));

    let failed = PublishStatus { last_error: Some("403 Forbidden".into()), ..PublishStatus::default() };
    env.publish.send_replace(failed);
    let answer = get(env.addr, "/readyz").await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.body, "slices not published: 403 Forbidden\n");

    env.publish.send_replace(PublishStatus { in_sync: true, devices: 2, writes: 1, last_error: None });
    let answer = get(env.addr, "/readyz").await;
    assert_eq!((answer.status, answer.body.as_str()), (StatusCode::OK, "ok\n"));

    let scrape = samples(&get(env.addr, "/metrics").await.body);
    assert_eq!(scrape.get("edra_kubelet_registered"), Some(&1.0));
    assert_eq!(scrape.get("edra_slices_in_sync"), Some(&1.0));
    let _ = env.stop.send(true);
}

#[tokio::test]
async fn a_poisoned_state_store_fails_healthz_and_readyz_with_the_reason() {
    let env = start(&CallMetrics::new());
    env.registration.send_replace(RegistrationState::Registered);
    env.publish.send_replace(PublishStatus { in_sync: true, devices: 2, writes: 1, last_error: None });
    assert_eq!(get(env.addr, "/healthz").await.status, StatusCode::OK);
    assert_eq!(get(env.addr, "/readyz").await.status, StatusCode::OK);

    env.state.send_replace(Some("No space left on device (os error 28)".into()));
    for path in ["/healthz", "/readyz"] {
        let answer = get(env.addr, path).await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{path}");
        assert!(
            answer.body.starts_with("state store unusable since a change could not be made durable: No space left")
                && answer.body.contains("free space or fix the disk"),
            "{path}: {}",
            answer.body
        );
    }

    env.state.send_replace(None);
    assert_eq!(get(env.addr, "/healthz").await.status, StatusCode::OK);
    assert_eq!(get(env.addr, "/readyz").await.status, StatusCode::OK);
    let _ = env.stop.send(true);
}

#[tokio::test]
async fn healthz_is_ok_and_other_requests_are_refused() {
    let env = start(&CallMetrics::new());
    let answer = get(env.addr, "/healthz").await;
    assert_eq!((answer.status, answer.body.as_str()), (StatusCode::OK, "ok\n"));
    let answer = get(env.addr, "/healthz?verbose=1").await;
    assert_eq!(answer.status, StatusCode::OK);
    for path in ["/", "/metrics/", "/debug/pprof", "/readyz/x"] {
        assert_eq!(get(env.addr, path).await.status, StatusCode::NOT_FOUND, "{path}");
    }
    let answer = request(env.addr, Method::POST, "/metrics").await;
    assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED);
    let answer = request(env.addr, Method::HEAD, "/metrics").await;
    assert_eq!((answer.status, answer.body.as_str()), (StatusCode::OK, ""));
    let _ = env.stop.send(true);
}

#[tokio::test]
async fn a_taken_address_names_the_key_to_change() {
    let first = MetricsListener::bind("127.0.0.1:0".parse().unwrap()).expect("bind");
    let err = MetricsListener::bind(first.local_addr()).expect_err("address in use");
    assert!(matches!(err, HttpError::AddressInUse { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&first.local_addr().to_string()) && msg.contains("metrics.address"), "{msg}");
}

#[tokio::test]
async fn shutdown_ends_the_server_with_a_connection_still_open() {
    let env = start(&CallMetrics::new());
    let stream = TcpStream::connect(env.addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.expect("handshake");
    let conn = tokio::spawn(conn);
    let req = Request::get("/healthz").header(header::HOST, "localhost").body(Empty::<Bytes>::new()).unwrap();
    assert_eq!(sender.send_request(req).await.expect("response").status(), StatusCode::OK);

    env.stop.send_replace(true);
    tokio::time::timeout(Duration::from_secs(5), env.task).await.expect("server stopped").expect("no panic");
    tokio::time::timeout(Duration::from_secs(5), conn).await.expect("connection closed").expect("no panic").ok();
    assert!(TcpStream::connect(env.addr).await.is_err(), "the address is no longer served");
}

/// A connection that sent the start of a request and then stalls.
async fn stalled(addr: SocketAddr) -> TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /healthz HTTP/1.1\r\nHo").await.expect("write");
    s
}

#[tokio::test]
async fn stalled_connections_cannot_keep_health_checks_out() {
    let env = start(&CallMetrics::new());
    let mut slow = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        slow.push(stalled(env.addr).await);
    }
    // Every slot is held by a client that will not finish its headers for seconds.
    let answer = try_request(env.addr, Method::GET, "/healthz").await;
    assert!(matches!(&answer, Some(a) if a.status == StatusCode::OK), "healthz behind 64 stalled clients");
    // A client that keeps opening stalled connections does not keep probes out either.
    for round in 0..5 {
        for _ in 0..MAX_CONNECTIONS / 2 {
            slow.push(stalled(env.addr).await);
        }
        let answer = try_request(env.addr, Method::GET, "/healthz").await;
        assert!(matches!(&answer, Some(a) if a.status == StatusCode::OK), "round {round}");
    }
    let _ = env.stop.send(true);
}

#[tokio::test]
async fn silent_and_stalled_connections_are_closed_after_the_header_timeout() {
    use tokio::io::AsyncReadExt;
    let env = start(&CallMetrics::new());
    // One sends nothing at all (hyper cannot even tell its HTTP version), one half a request.
    let mut silent = TcpStream::connect(env.addr).await.expect("connect");
    let mut half = stalled(env.addr).await;
    for (what, s) in [("silent", &mut silent), ("stalled", &mut half)] {
        let mut buf = [0u8; 256];
        // Generous: the point is that it ends, not exactly when.
        let read = tokio::time::timeout(HEADER_TIMEOUT * 10, s.read(&mut buf)).await;
        assert!(read.is_ok(), "the {what} connection is still open after {:?}", HEADER_TIMEOUT * 10);
    }
    let _ = env.stop.send(true);
}

#[test]
fn gpu_setting_changes_are_counted_by_setting_and_outcome() {
    use crate::gpu::{ChangeCounts, Setting};
    let (_registration, registration) = watch::channel(RegistrationState::Unknown);
    let (_publish, publish) = watch::channel(PublishStatus::default());
    let mut metrics =
        Metrics::new(&CallMetrics::new(), StateSources { registration, publish, api_stats: Arc::new(stats) });
    let counts = Arc::new(ChangeCounts::default());
    metrics.register_gpu_changes(counts.clone());
    counts.record(Setting::ComputeMode, true);
    counts.record(Setting::ComputeMode, true);
    counts.record(Setting::Timeslice, false);
    let s = samples(&metrics.encode().unwrap());
    for (series, value) in [
        ("edra_gpu_setting_changes_total{setting=\"compute_mode\",outcome=\"ok\"}", 2.0),
        ("edra_gpu_setting_changes_total{setting=\"compute_mode\",outcome=\"failed\"}", 0.0),
        ("edra_gpu_setting_changes_total{setting=\"timeslice\",outcome=\"ok\"}", 0.0),
        ("edra_gpu_setting_changes_total{setting=\"timeslice\",outcome=\"failed\"}", 1.0),
    ] {
        assert_eq!(s.get(series), Some(&value), "{series}");
    }
}
