//! Registration: GetInfo, the kubelet's verdict, and the kubelet's path-shaped
//! `:authority`, which a stock tonic server rejects.

use std::path::Path;

use edra::plugin::RegistrationState;
use edra::plugin::proto::registration::registration_server::{Registration, RegistrationServer};
use edra::plugin::proto::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use tonic::{Request, Response, Status};

use super::{DRIVER, Dirs, TestHandler};
use crate::support::kubelet::{self, RawH2, RawOutcome};

const PROTOCOL_ERROR: u32 = 0x1;

fn accepted() -> RegistrationStatus {
    RegistrationStatus { plugin_registered: true, error: String::new() }
}

#[tokio::test]
async fn get_info_describes_the_dra_endpoint() {
    let dirs = Dirs::new();
    let server = dirs.start(TestHandler::new());
    let info = kubelet::registration(&dirs.registration_socket()).await.get_info(InfoRequest {}).await.unwrap();
    let info = info.into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(Path::new(&info.endpoint), dirs.dra_socket());
    assert!(Path::new(&info.endpoint).is_absolute());
    assert_eq!(info.supported_versions, vec!["v1.DRAPlugin", "v1beta1.DRAPlugin"]);
    assert_eq!(server.dra_socket(), dirs.dra_socket());
    assert_eq!(server.registration_socket(), dirs.registration_socket());
    assert!(server.is_serving());
    server.shutdown(std::time::Duration::from_secs(5)).await;
}

#[tokio::test]
async fn the_kubelet_accepting_the_plugin_makes_it_registered() {
    let dirs = Dirs::new();
    let server = dirs.start(TestHandler::new());
    let mut state = server.registration();
    assert_eq!(*state.borrow(), RegistrationState::Unknown);
    let mut client = kubelet::registration(&dirs.registration_socket()).await;
    client.get_info(InfoRequest {}).await.unwrap();
    client.notify_registration_status(accepted()).await.unwrap();
    state.wait_for(RegistrationState::is_registered).await.unwrap();
    server.shutdown(std::time::Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_refusal_is_recorded_with_the_kubelets_reason_and_answered_with_an_error() {
    let dirs = Dirs::new();
    let server = dirs.start(TestHandler::new());
    let mut state = server.registration();
    let mut client = kubelet::registration(&dirs.registration_socket()).await;
    client.notify_registration_status(accepted()).await.unwrap();
    let reason = "none of the supported versions [v9.DRAPlugin] are supported";
    let refused = RegistrationStatus { plugin_registered: false, error: reason.into() };
    let status = client.notify_registration_status(refused).await.unwrap_err();
    assert!(status.message().contains(reason), "{}", status.message());
    let now = state.wait_for(|s| matches!(s, RegistrationState::Refused(_))).await.unwrap().clone();
    assert_eq!(now, RegistrationState::Refused(reason.into()));
    assert!(!now.is_registered());
    server.shutdown(std::time::Duration::from_secs(5)).await;
}

#[tokio::test]
async fn the_kubelets_registration_dial_is_accepted() {
    let dirs = Dirs::new();
    let server = dirs.start(TestHandler::new());
    let reg = dirs.registration_socket();
    let mut state = server.registration();
    for authority in [kubelet::percent_encoded(&reg), reg.to_string_lossy().into_owned()] {
        let mut raw = RawH2::connect(&reg).await.unwrap();
        let info = raw.get_info(&authority).await.unwrap();
        assert_eq!(info.name, DRIVER, "authority {authority}");
        assert_eq!(Path::new(&info.endpoint), dirs.dra_socket());
        raw.notify(&authority, accepted()).await.unwrap();
        state.wait_for(RegistrationState::is_registered).await.unwrap();
        let refused = RegistrationStatus { plugin_registered: false, error: "test".into() };
        match raw.notify(&authority, refused).await {
            Err(RawOutcome::Answer { grpc_status: Some(code), .. }) => assert_ne!(code, "0"),
            other => panic!("a refusal must be answered with a gRPC error, got {other:?}"),
        }
        assert_eq!(*state.borrow(), RegistrationState::Refused("test".into()));
    }
    server.shutdown(std::time::Duration::from_secs(5)).await;
}

#[tokio::test]
async fn many_kubelet_style_calls_share_one_connection() {
    let dirs = Dirs::new();
    let server = dirs.start(TestHandler::new());
    let reg = dirs.registration_socket();
    let authority = kubelet::percent_encoded(&reg);
    let mut raw = RawH2::connect(&reg).await.unwrap();
    for i in 0..200 {
        let info: PluginInfo = raw.get_info(&authority).await.unwrap_or_else(|e| panic!("call {i}: {e:?}"));
        assert_eq!(info.r#type, "DRAPlugin");
    }
    // A header block near the server's 16 KiB limit, sent in CONTINUATION frames.
    let large = "x".repeat(15_000);
    let method = "/pluginregistration.Registration/GetInfo";
    let outcome = raw.unary_with(&authority, method, &[], &[("x-large", &large)], 4096).await.unwrap();
    assert!(matches!(&outcome, RawOutcome::Answer { grpc_status: Some(code), .. } if code == "0"), "{outcome:?}");
    drop(raw);
    // The DRA socket goes through the same fix.
    let mut raw = RawH2::connect(&dirs.dra_socket()).await.unwrap();
    let method = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
    match raw.unary(&kubelet::percent_encoded(&dirs.dra_socket()), method, &[]).await.unwrap() {
        RawOutcome::Answer { grpc_status: Some(code), .. } => assert_eq!(code, "0"),
        other => panic!("unexpected {other:?}"),
    }
    // These clients never answer the server's shutdown PING, so they are closed first.
    drop(raw);
    let started = std::time::Instant::now();
    server.shutdown(std::time::Duration::from_secs(30)).await;
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "took {:?}", started.elapsed());
}

/// A Registration service without the fix, to show what the kubelet would get.
struct Plain;

#[tonic::async_trait]
impl Registration for Plain {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo::default()))
    }
    async fn notify_registration_status(
        &self,
        _: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

#[tokio::test]
async fn a_stock_tonic_server_resets_the_kubelets_registration_dial() {
    let dirs = Dirs::new();
    let path = dirs.tmp.path().join("plain.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let incoming = futures_util::stream::unfold(listener, |l| async move {
        let next = l.accept().await.map(|(stream, _)| stream);
        Some((next, l))
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(
        tonic::transport::Server::builder().add_service(RegistrationServer::new(Plain)).serve_with_incoming_shutdown(
            incoming,
            async {
                let _ = stopped.await;
            },
        ),
    );
    let mut raw = RawH2::connect(&path).await.unwrap();
    for authority in [kubelet::percent_encoded(&path), path.to_string_lossy().into_owned()] {
        match raw.get_info(&authority).await {
            Err(RawOutcome::Reset(code)) => assert_eq!(code, PROTOCOL_ERROR, "authority {authority}"),
            other => panic!("expected RST_STREAM PROTOCOL_ERROR for {authority}, got {other:?}"),
        }
    }
    // The same server answers a well-formed authority, so the reset is about the authority.
    assert!(raw.get_info("localhost").await.is_ok());
    stop.send(()).unwrap();
    drop(raw);
    task.await.unwrap().unwrap();
}
