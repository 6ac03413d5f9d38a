//! SelfSubjectReview and SelfSubjectAccessReview self-tests: the answers agree with what
//! real requests get (forbid rules, node authorizer per object and per selector), and
//! reviews store nothing.

use anyhow::Result;
use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::{Client, start};
use crate::support::apiserver::{ClaimBuilder, Options};

const SSAR: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";

async fn may(client: &Client, attrs: Value) -> Result<(bool, String)> {
    let body = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attrs}});
    let (status, answer) = client.json(Method::POST, SSAR, Some(&body)).await?;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    assert_eq!(answer["kind"], "SelfSubjectAccessReview");
    assert_eq!(answer["spec"]["resourceAttributes"], attrs, "the spec is echoed");
    Ok((answer["status"]["allowed"] == true, answer["status"]["reason"].as_str().unwrap_or_default().to_owned()))
}

fn slices(verb: &str) -> Value {
    json!({"verb": verb, "group": "resource.k8s.io", "resource": "resourceslices"})
}

#[tokio::test]
async fn self_review_names_the_user_and_groups() -> Result<()> {
    let (server, _admin) = start(Options::default()).await?;
    let node = Client::as_user(&server, "system:node:n1", &["system:nodes"])?;
    let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let (status, answer) =
        node.json(Method::POST, "/apis/authentication.k8s.io/v1/selfsubjectreviews", Some(&body)).await?;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(answer["status"]["userInfo"]["username"], "system:node:n1");
    assert_eq!(answer["status"]["userInfo"]["groups"], json!(["system:nodes", "system:authenticated"]));
    assert_eq!(server.writes_since(0), 0, "reviews store nothing");
    Ok(())
}

#[tokio::test]
async fn access_reviews_follow_forbid_rules() -> Result<()> {
    let (server, _admin) = start(Options::default()).await?;
    let driver = Client::as_user(&server, "driver", &[])?;
    server.forbid("driver", "delete", "resourceslices");
    assert!(may(&driver, slices("create")).await?.0);
    let (allowed, reason) = may(&driver, slices("delete")).await?;
    assert!(!allowed);
    assert!(reason.contains("cannot delete resource \"resourceslices\""), "{reason}");
    // The real request agrees.
    let (status, _) = driver.json(Method::DELETE, &format!("{}/x", super::SLICES), None).await?;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body) = driver.json(Method::POST, SSAR, Some(&json!({"spec": {}}))).await?;
    assert_eq!((status, body["reason"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("Invalid")));
    Ok(())
}

#[tokio::test]
async fn access_reviews_of_a_node_follow_the_node_authorizer() -> Result<()> {
    let (server, admin) = start(Options { node_authorizer: true, ..Options::default() }).await?;
    let node = Client::as_user(&server, "system:node:n1", &["system:nodes"])?;
    let (status, _) =
        admin.json(Method::POST, super::SLICES, Some(&super::slice("own", "n1", "gpu.edra.dev", 1))).await?;
    assert_eq!(status, StatusCode::CREATED);
    admin.json(Method::POST, super::SLICES, Some(&super::slice("other", "n2", "gpu.edra.dev", 1))).await?;
    server.put_claim(ClaimBuilder::new("default", "mine").build());
    server.mark_claim_on_node("default", "mine", "n1");

    // Create is the authorizer's to allow (NodeRestriction is admission, not asked).
    assert!(may(&node, slices("create")).await?.0);
    // List and watch only with the node's own selector.
    assert!(!may(&node, slices("list")).await?.0);
    let mut list = slices("watch");
    list["fieldSelector"] = json!({"rawSelector": "spec.nodeName=n1,spec.driver=gpu.edra.dev"});
    assert!(may(&node, list).await?.0);
    // Per object: its own slice yes, another node's or an unnamed one no.
    let named = |verb: &str, name: &str| {
        let mut a = slices(verb);
        a["name"] = json!(name);
        a
    };
    assert!(may(&node, named("delete", "own")).await?.0);
    let (allowed, reason) = may(&node, named("update", "other")).await?;
    assert!(!allowed && reason.contains("no relationship"), "{reason}");
    assert!(!may(&node, slices("get")).await?.0);
    // Claims of pods on the node; its own Node object only.
    let claim = |name: &str| {
        json!({"verb": "get", "group": "resource.k8s.io", "resource": "resourceclaims",
        "namespace": "default", "name": name})
    };
    assert!(may(&node, claim("mine")).await?.0);
    assert!(!may(&node, claim("theirs")).await?.0);
    assert!(may(&node, json!({"verb": "get", "resource": "nodes", "name": "n1"})).await?.0);
    assert!(!may(&node, json!({"verb": "get", "resource": "nodes", "name": "n2"})).await?.0);
    assert!(!may(&node, json!({"verb": "list", "resource": "pods"})).await?.0);
    Ok(())
}
