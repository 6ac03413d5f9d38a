//! The metrics endpoint of a whole agent: `edra::app::run` with the mock backend against the
//! test API server, registered through the kubelet's client, scraped over real HTTP.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use edra::app::AppError;
use edra::config::{BackendKind, Config, LoadContext, Overrides, Paths};
use edra::plugin::proto::dra_v1 as v1;
use edra::plugin::proto::registration::{InfoRequest, RegistrationStatus};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};

use crate::support::apiserver::{Identity, Options, TestApiServer};
use crate::support::kubelet;

const DEADLINE: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(20);

/// A configuration for node `n1` with the mock backend and every path under `dir`.
fn config(dir: &Path, kubeconfig: &Path, metrics: SocketAddr) -> Config {
    let ctx = LoadContext {
        explicit_file: None,
        default_file: dir.join("absent.toml"),
        env: Vec::new(),
        overrides: Overrides::default(),
        hostname: Some("n1".into()),
    };
    let mut cfg = Config::load(&ctx).expect("default configuration");
    cfg.backend = BackendKind::Mock;
    cfg.kube.kubeconfig = Some(kubeconfig.to_path_buf());
    cfg.paths = Paths::under(dir);
    cfg.metrics.address = Some(metrics);
    cfg
}

/// A loopback port that was free a moment ago (the agent binds it right after).
pub(crate) fn free_port() -> SocketAddr {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a probe");
    probe.local_addr().expect("probe address")
}

/// `GET path`: status and body, or `None` while nothing answers.
pub(crate) async fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let stream = TcpStream::connect(addr).await.ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.ok()?;
    tokio::spawn(conn);
    let req = http::Request::get(path).header(http::header::HOST, "localhost").body(Empty::<Bytes>::new()).ok()?;
    let res = sender.send_request(req).await.ok()?;
    let status = res.status().as_u16();
    let body = res.into_body().collect().await.ok()?.to_bytes();
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Polls `path` until it answers with `status`; fails with the last answer at the deadline.
async fn wait_for_status(addr: SocketAddr, path: &str, status: u16) -> String {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let answer = get(addr, path).await;
        match answer {
            Some((s, body)) if s == status => return body,
            _ if tokio::time::Instant::now() >= deadline => {
                panic!("{path} did not answer {status} within {DEADLINE:?}; last answer: {answer:?}")
            }
            _ => tokio::time::sleep(POLL).await,
        }
    }
}

pub(crate) fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

#[tokio::test]
async fn a_registered_agent_is_ready_and_its_metrics_show_devices_and_api_requests() {
    let server = TestApiServer::start(Options::default()).await.expect("test API server");
    server.add_node("n1");
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = server.write_kubeconfig(dir.path(), &Identity::node("n1")).expect("kubeconfig");
    let addr = free_port();
    let mut cfg = config(dir.path(), &kubeconfig, addr);
    let events = dir.path().join("gpu-events");
    std::fs::write(&events, "").expect("create the events file");
    cfg.mock.events_file = Some(events.clone());
    let gpus = cfg.mock.gpus;
    let registration_socket = cfg.paths.registration_socket(&cfg.driver_name);
    let dra_socket = cfg.paths.dra_socket(&cfg.driver_name);
    let (stop, stop_rx) = watch::channel(false);
    let (ready, serving) = oneshot::channel();
    let agent = tokio::spawn(edra::app::run_signalling(cfg, stop_rx, Some(ready)));

    let serving = tokio::time::timeout(DEADLINE, serving).await.expect("serves in time").expect("serves");
    assert_eq!(
        (serving.registration_socket.as_path(), serving.dra_socket.as_path()),
        (&*registration_socket, &*dra_socket)
    );
    assert_eq!(get(addr, "/healthz").await, Some((200, "ok\n".to_string())), "the metrics address is bound before");
    let not_ready = get(addr, "/readyz").await.expect("readyz answers");
    assert_eq!(not_ready, (503, "not registered with the kubelet\n".to_string()));

    let mut registration = kubelet::registration(&registration_socket).await;
    registration.get_info(InfoRequest {}).await.expect("plugin info");
    let accepted = RegistrationStatus { plugin_registered: true, error: String::new() };
    registration.notify_registration_status(accepted).await.expect("status accepted");
    assert_eq!(wait_for_status(addr, "/readyz", 200).await, "ok\n");

    let unknown = v1::Claim { namespace: "ns".into(), name: "gone".into(), uid: "uid-gone".into() };
    let request = v1::NodeUnprepareResourcesRequest { claims: vec![unknown] };
    let answer = kubelet::dra_v1(&dra_socket).await.node_unprepare_resources(request).await.expect("unprepare");
    assert_eq!(answer.into_inner().claims["uid-gone"].error, "");

    let (status, body) = get(addr, "/metrics").await.expect("metrics answer");
    assert_eq!(status, 200);
    let s = samples(&body);
    assert_eq!(s.get("edra_published_devices"), Some(&f64::from(gpus)), "{body}");
    assert_eq!(s.get("edra_slices_in_sync"), Some(&1.0), "{body}");
    assert_eq!(s.get("edra_kubelet_registered"), Some(&1.0), "{body}");
    assert!(s.get("edra_publish_writes_total").is_some_and(|n| *n >= 1.0), "{body}");
    assert_eq!(s.get("edra_unprepare_requests_total{version=\"v1\",outcome=\"ok\"}"), Some(&1.0), "{body}");
    assert_eq!(s.get("edra_claims_unprepared_total{outcome=\"ok\"}"), Some(&1.0), "{body}");
    assert_eq!(s.get("edra_unprepare_duration_seconds_count"), Some(&1.0), "{body}");
    assert_eq!(s.get("edra_registration_refusals_total"), Some(&0.0), "{body}");
    let api = |verb: &str| -> f64 {
        s.iter()
            .filter(|(k, _)| k.starts_with(&format!("edra_api_requests_total{{verb=\"{verb}\"")))
            .map(|(_, v)| v)
            .sum()
    };
    assert!(api("GET") > 0.0 && api("POST") > 0.0, "{body}");
    assert!(s.get("edra_api_received_bytes_total").is_some_and(|n| *n > 0.0), "{body}");
    let health = |device: &str, state: &str| {
        s.get(&format!("edra_device_health{{device=\"{device}\",state=\"{state}\"}}")).copied()
    };
    assert_eq!(health("gpu-0", "healthy"), Some(1.0), "{body}");
    assert_eq!(health("gpu-0", "unhealthy"), Some(0.0), "{body}");
    assert_eq!(s.get("edra_device_tainted_seconds{device=\"gpu-0\"}"), Some(&0.0), "{body}");

    // GPU health: an ignored and a fatal XID on GPU 1.
    std::fs::write(&events, "xid 1 13\nxid 1 79\n").expect("inject XIDs");
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let s = loop {
        let (_, body) = get(addr, "/metrics").await.expect("metrics answer");
        let s = samples(&body);
        if s.get("edra_device_health{device=\"gpu-1\",state=\"unhealthy\"}") == Some(&1.0) {
            break s;
        }
        assert!(tokio::time::Instant::now() < deadline, "gpu-1 never turned unhealthy: {body}");
        tokio::time::sleep(POLL).await;
    };
    let uuid = edra::inventory::mock::gpu_uuid("n1", 1);
    for xid in [13, 79] {
        let series = format!("edra_gpu_xids_total{{gpu=\"{uuid}\",xid=\"{xid}\"}}");
        assert_eq!(s.get(&series), Some(&1.0), "{series}: {s:?}");
    }
    assert!(s.get("edra_device_tainted_seconds{device=\"gpu-1\"}").is_some_and(|t| *t >= 0.0));

    stop.send_replace(true);
    let stopped = tokio::time::timeout(DEADLINE, agent).await.expect("the agent stops").expect("no panic");
    assert!(stopped.is_ok(), "{stopped:?}");
    assert!(get(addr, "/healthz").await.is_none(), "the endpoint closed with the agent");
}

#[tokio::test]
async fn an_address_that_cannot_be_bound_at_all_stops_the_agent_at_start_as_a_configuration_error() {
    let server = TestApiServer::start(Options::default()).await.expect("test API server");
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = server.write_kubeconfig(dir.path(), &Identity::node("n1")).expect("kubeconfig");
    // TEST-NET-1: no interface of this host has it. (An address another process holds
    // stops nothing: agent/node_user.rs.)
    let not_local: SocketAddr = "192.0.2.1:9464".parse().expect("address");
    let cfg = config(dir.path(), &kubeconfig, not_local);
    let registration_socket = cfg.paths.registration_socket(&cfg.driver_name);
    let (_stop, stop_rx) = watch::channel(false);

    let result = tokio::time::timeout(DEADLINE, edra::app::run(cfg, stop_rx)).await.expect("run returns");
    let Err(AppError::Config(msg)) = result else { panic!("expected a configuration error, got {result:?}") };
    assert!(msg.contains("cannot serve metrics on 192.0.2.1:9464") && msg.contains("metrics.address"), "{msg}");
    assert!(!registration_socket.exists(), "nothing was served");
    assert!(server.requests().is_empty(), "the API server was not contacted");
}
