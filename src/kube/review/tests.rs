//! Tests of the self-review requests against the scripted HTTPS server: request paths and
//! bodies as the API server expects them, decoding of allowed/denied answers and of the
//! user info, and discovery of served resource.k8s.io versions.

use serde_json::json;

use super::*;
use crate::kube::tests::testserver::{Pki, Reply, TestServer};
use crate::kube::tests::transport::{fast, script};

async fn setup(replies: Vec<Reply>) -> (Pki, TestServer, Client) {
    let pki = Pki::new("test-ca");
    let srv = TestServer::start(&pki, script(replies)).await;
    let client = Client::new(srv.token_credentials(&pki, "tok-1"), fast()).unwrap();
    (pki, srv, client)
}

#[tokio::test]
async fn access_review_sends_the_attributes_and_decodes_the_decision() {
    let (_pki, srv, client) = setup(vec![
        Reply::json(
            201,
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": {},
                "status": {"allowed": true}}),
        ),
        Reply::json(
            201,
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": {},
                "status": {"allowed": false, "denied": true, "reason": "no RBAC rule"}}),
        ),
    ])
    .await;
    let check = AccessCheck::new("list", "resource.k8s.io", "resourceslices").with_field_selector("spec.nodeName=n1");
    assert_eq!(check.describe(), "list resourceslices.resource.k8s.io (spec.nodeName=n1)");
    let yes = client.self_subject_access_review(&check).await.unwrap();
    assert_eq!(yes, AccessDecision { allowed: true, ..Default::default() });
    let no = client.self_subject_access_review(&AccessCheck::new("get", "", "nodes").named("n1")).await.unwrap();
    assert!(!no.allowed && no.denied);
    assert_eq!(no.reason, "no RBAC rule");
    let seen = srv.requests();
    assert_eq!(seen[0].method, "POST");
    assert_eq!(seen[0].path, ACCESS_REVIEW_PATH);
    let body = seen[0].json();
    assert_eq!(body["kind"], "SelfSubjectAccessReview");
    assert_eq!(body["apiVersion"], "authorization.k8s.io/v1");
    let attrs = &body["spec"]["resourceAttributes"];
    assert_eq!(attrs["verb"], "list");
    assert_eq!(attrs["resource"], "resourceslices");
    assert_eq!(attrs["group"], "resource.k8s.io");
    assert_eq!(attrs["fieldSelector"]["rawSelector"], "spec.nodeName=n1");
    assert!(attrs.get("name").is_none() && attrs.get("namespace").is_none(), "{attrs}");
    let attrs = &seen[1].json()["spec"]["resourceAttributes"];
    assert_eq!(
        (attrs["verb"].as_str(), attrs["name"].as_str(), attrs["group"].as_str()),
        (Some("get"), Some("n1"), Some(""))
    );
}

#[tokio::test]
async fn self_review_returns_the_user_and_node_identities_are_recognised() {
    let (_pki, srv, client) = setup(vec![Reply::json(
        201,
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
            "status": {"userInfo": {"username": "system:node:n1", "groups": ["system:nodes", "system:authenticated"]}}}),
    )])
    .await;
    let who = client.self_subject_review().await.unwrap();
    assert_eq!(who.username, "system:node:n1");
    assert_eq!(who.node_name(), Some("n1"));
    assert_eq!(srv.requests()[0].path, SELF_REVIEW_PATH);
    assert_eq!(srv.requests()[0].json()["kind"], "SelfSubjectReview");
    let not_node = SubjectInfo { username: "system:node:n1".into(), groups: vec!["other".into()] };
    assert_eq!(not_node.node_name(), None);
}

#[tokio::test]
async fn review_errors_are_typed() {
    let (_pki, _srv, client) = setup(vec![Reply::status(403, "Forbidden", "selfsubjectreviews is forbidden")]).await;
    let err = client.self_subject_review().await.unwrap_err();
    assert!(err.is_forbidden(), "{err}");
}

#[tokio::test]
async fn served_versions_or_none_when_the_group_is_missing() {
    let (_pki, _srv, client) = setup(vec![
        Reply::json(200, json!({"kind": "APIGroup", "versions": [{"version": "v1"}, {"version": "v1beta2"}]})),
        Reply::status(404, "NotFound", "the server could not find the requested resource"),
    ])
    .await;
    assert_eq!(client.resource_api_versions().await.unwrap(), ["v1", "v1beta2"]);
    assert!(client.resource_api_versions().await.unwrap().is_empty());
}
