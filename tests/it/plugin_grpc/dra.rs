//! DRAPlugin v1 and v1beta1: round trips, many claims, concurrency, request checks.

use std::time::Duration;

use edra::plugin::ClaimRef;
use edra::plugin::proto::{dra_v1 as v1, dra_v1beta1 as v1beta1};
use tonic::Code;

use super::{Call, Dirs, TestHandler, claim};
use crate::support::kubelet;

const GRACE: Duration = Duration::from_secs(5);

fn v1_claims(claims: &[ClaimRef]) -> Vec<v1::Claim> {
    claims
        .iter()
        .map(|c| v1::Claim { namespace: c.namespace.clone(), uid: c.uid.clone(), name: c.name.clone() })
        .collect()
}

fn v1beta1_claims(claims: &[ClaimRef]) -> Vec<v1beta1::Claim> {
    claims
        .iter()
        .map(|c| v1beta1::Claim { namespace: c.namespace.clone(), uid: c.uid.clone(), name: c.name.clone() })
        .collect()
}

#[tokio::test]
async fn v1_prepare_and_unprepare_round_trip_with_share_id() {
    let dirs = Dirs::new();
    let handler = TestHandler::new();
    let server = dirs.start(handler.clone());
    let mut client = kubelet::dra_v1(&dirs.dra_socket()).await;
    let claims = vec![claim(1), claim(2)];
    let request = v1::NodePrepareResourcesRequest { claims: v1_claims(&claims) };
    let answer = client.node_prepare_resources(request).await.unwrap().into_inner();
    assert_eq!(answer.claims.len(), 2);
    let one = &answer.claims["uid-1"];
    assert_eq!(one.error, "");
    assert_eq!(
        one.devices,
        vec![v1::Device {
            request_names: vec!["gpu".into()],
            pool_name: "node-a".into(),
            device_name: "gpu-0".into(),
            cdi_device_ids: vec!["k8s.gpu.edra.dev/gpu=uid-1-gpu-0".into()],
            share_id: Some("share-uid-1".into()),
        }]
    );
    let request = v1::NodeUnprepareResourcesRequest { claims: v1_claims(&claims) };
    let answer = client.node_unprepare_resources(request).await.unwrap().into_inner();
    assert_eq!(answer.claims.len(), 2);
    assert!(answer.claims.values().all(|c| c.error.is_empty()));
    assert_eq!(handler.calls(), vec![Call::Prepare(claims.clone()), Call::Unprepare(claims)]);
    assert!(handler.prepared.lock().unwrap().is_empty());
    server.shutdown(GRACE).await;
}

#[tokio::test]
async fn v1beta1_prepare_and_unprepare_round_trip_without_share_id() {
    let dirs = Dirs::new();
    let handler = TestHandler::new();
    let server = dirs.start(handler.clone());
    let mut client = kubelet::dra_v1beta1(&dirs.dra_socket()).await;
    let claims = vec![claim(7)];
    let request = v1beta1::NodePrepareResourcesRequest { claims: v1beta1_claims(&claims) };
    let answer = client.node_prepare_resources(request).await.unwrap().into_inner();
    let devices = &answer.claims["uid-7"].devices;
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].cdi_device_ids, vec!["k8s.gpu.edra.dev/gpu=uid-7-gpu-0".to_string()]);
    // The v1beta1 wire message has no field 5: decoding it as v1 shows share_id absent.
    let wire = prost::Message::encode_to_vec(&devices[0]);
    let as_v1: v1::Device = prost::Message::decode(wire.as_slice()).unwrap();
    assert_eq!(as_v1.share_id, None);
    let request = v1beta1::NodeUnprepareResourcesRequest { claims: v1beta1_claims(&claims) };
    let answer = client.node_unprepare_resources(request).await.unwrap().into_inner();
    assert_eq!(answer.claims["uid-7"].error, "");
    assert_eq!(handler.calls(), vec![Call::Prepare(claims.clone()), Call::Unprepare(claims)]);
    server.shutdown(GRACE).await;
}

#[tokio::test]
async fn per_claim_errors_and_missing_answers_are_reported_per_uid() {
    let dirs = Dirs::new();
    let handler = TestHandler::new();
    handler.fail.lock().unwrap().insert("uid-2".into());
    handler.skip.lock().unwrap().insert("uid-3".into());
    let server = dirs.start(handler.clone());
    let mut client = kubelet::dra_v1(&dirs.dra_socket()).await;
    let request = v1::NodePrepareResourcesRequest { claims: v1_claims(&[claim(1), claim(2), claim(3)]) };
    let answer = client.node_prepare_resources(request).await.unwrap().into_inner();
    assert_eq!(answer.claims.len(), 3, "every requested UID is answered");
    assert_eq!(answer.claims["uid-1"].error, "");
    assert_eq!(answer.claims["uid-2"].error, "no GPU left for claim uid-2");
    assert!(answer.claims["uid-2"].devices.is_empty());
    assert!(answer.claims["uid-3"].error.contains("no result"), "{}", answer.claims["uid-3"].error);
    server.shutdown(GRACE).await;
}

#[tokio::test]
async fn many_claims_in_one_call() {
    let dirs = Dirs::new();
    let handler = TestHandler::new();
    let server = dirs.start(handler.clone());
    let mut client = kubelet::dra_v1(&dirs.dra_socket()).await;
    let claims: Vec<_> = (0..500).map(claim).collect();
    let request = v1::NodePrepareResourcesRequest { claims: v1_claims(&claims) };
    let answer = client.node_prepare_resources(request).await.unwrap().into_inner();
    assert_eq!(answer.claims.len(), 500);
    for c in &claims {
        assert_eq!(answer.claims[&c.uid].devices[0].cdi_device_ids[0], format!("k8s.gpu.edra.dev/gpu={}-gpu-0", c.uid));
    }
    assert_eq!(handler.calls().len(), 1);
    server.shutdown(GRACE).await;
}

#[tokio::test]
async fn concurrent_calls_over_several_connections() {
    let dirs = Dirs::new();
    let handler = TestHandler::new();
    let server = dirs.start(handler.clone());
    let mut tasks = Vec::new();
    for conn in 0..4 {
        let client = kubelet::dra_v1(&dirs.dra_socket()).await;
        for i in 0..16 {
            let mut client = client.clone();
            let c = claim(conn * 100 + i);
            tasks.push(tokio::spawn(async move {
                let request = v1::NodePrepareResourcesRequest { claims: v1_claims(std::slice::from_ref(&c)) };
                let answer = client.node_prepare_resources(request).await.unwrap().into_inner();
                assert_eq!(answer.claims[&c.uid].error, "");
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(handler.calls().len(), 64);
    assert_eq!(handler.prepared.lock().unwrap().len(), 64);
    server.shutdown(GRACE).await;
}

#[tokio::test]
async fn bad_requests_get_clear_errors() {
    let dirs = Dirs::new();
    let handler = TestHandler::new();
    let server = dirs.start(handler.clone());
    let mut client = kubelet::dra_v1(&dirs.dra_socket()).await;
    let mut beta = kubelet::dra_v1beta1(&dirs.dra_socket()).await;

    let empty = client.node_prepare_resources(v1::NodePrepareResourcesRequest::default()).await.unwrap();
    assert!(empty.into_inner().claims.is_empty());
    let empty = beta.node_unprepare_resources(v1beta1::NodeUnprepareResourcesRequest::default()).await.unwrap();
    assert!(empty.into_inner().claims.is_empty());

    let duplicate = v1_claims(&[claim(1), claim(2), claim(1)]);
    let status =
        client.node_prepare_resources(v1::NodePrepareResourcesRequest { claims: duplicate }).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("uid-1"), "{}", status.message());

    let mut no_uid = claim(5);
    no_uid.uid.clear();
    let request = v1::NodeUnprepareResourcesRequest { claims: v1_claims(&[claim(4), no_uid]) };
    let status = client.node_unprepare_resources(request).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("index 1"), "{}", status.message());

    let mut no_namespace = claim(6);
    no_namespace.namespace.clear();
    let request = v1beta1::NodePrepareResourcesRequest { claims: v1beta1_claims(&[claim(7), no_namespace]) };
    let answer = beta.node_prepare_resources(request).await.unwrap().into_inner();
    assert_eq!(answer.claims["uid-7"].error, "");
    assert!(answer.claims["uid-6"].error.contains("no namespace"), "{}", answer.claims["uid-6"].error);

    // Only the well-formed claim reached the handler; rejected calls never did.
    assert_eq!(handler.calls(), vec![Call::Prepare(vec![claim(7)])]);
    server.shutdown(GRACE).await;
}

#[tokio::test]
async fn a_malformed_request_is_invalid_argument_and_reaches_no_handler() {
    use crate::support::kubelet::{RawH2, RawOutcome};
    let dirs = Dirs::new();
    let handler = TestHandler::new();
    let server = dirs.start(handler.clone());
    let authority = kubelet::percent_encoded(&dirs.dra_socket());
    // Field 1 (claims) as a length-delimited value 100 bytes long, with 3 bytes following.
    let truncated = [0x0a, 100, 1, 2, 3];
    let mut raw = RawH2::connect(&dirs.dra_socket()).await.expect("connect");
    for method in [
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
    ] {
        match raw.unary(&authority, method, &truncated).await.expect("call") {
            RawOutcome::Answer { grpc_status: Some(code), grpc_message, .. } => {
                assert_eq!(code, "3", "{method}: INVALID_ARGUMENT, got {code} {grpc_message:?}");
                let message = grpc_message.unwrap_or_default();
                assert!(
                    message.contains("not%20a%20valid%20protobuf") || message.contains("not a valid protobuf"),
                    "{message}"
                );
            }
            other => panic!("{method}: unexpected {other:?}"),
        }
    }
    assert!(handler.calls.lock().unwrap().is_empty(), "the handler never saw the request");
    drop(raw);
    server.shutdown(GRACE).await;
}

/// A connection the server accepted just before it stopped, still in its HTTP/2 handshake
/// (the kubelet's preface not read yet), gets its call answered: the server stops accepting
/// first and stops the connections gracefully only once they have sent their first call.
#[tokio::test]
async fn a_call_on_a_connection_accepted_just_before_shutdown_is_answered() {
    use prost::Message;
    let dirs = Dirs::new();
    let handler = TestHandler::new();
    let server = dirs.start(handler.clone());
    let mut raw = kubelet::RawH2::connect_silent(&dirs.dra_socket()).await.expect("connect");
    raw.wait_server_settings().await.expect("the server accepted the connection");
    // On this single-threaded runtime the stop is sent before the yield returns.
    let stopping = tokio::spawn(server.shutdown(GRACE));
    tokio::task::yield_now().await;
    raw.send_preface().await.expect("the preface");
    let request = v1::NodePrepareResourcesRequest { claims: v1_claims(&[claim(1)]) };
    let outcome = raw
        .unary("localhost", "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources", &request.encode_to_vec())
        .await
        .expect("the call");
    match outcome {
        kubelet::RawOutcome::Answer { grpc_status, body, .. } => {
            assert_eq!(grpc_status.as_deref(), Some("0"), "{body:?}");
            let answer = v1::NodePrepareResourcesResponse::decode(body.as_slice()).expect("an answer");
            assert_eq!(answer.claims["uid-1"].error, "");
        }
        other => panic!("the call on the connection accepted before the stop was not answered: {other:?}"),
    }
    drop(raw);
    assert_eq!(stopping.await.expect("shutdown"), 0, "no call aborted");
}
