//! Authentication, transport, discovery, kubeconfig and authorization self-tests.

use anyhow::{Result, anyhow};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::{Method, StatusCode};
use serde_json::Value;

use super::{Alpn, Client, Creds, SLICES, slice, start};
use crate::support::apiserver::{ApiVersion, ClaimBuilder, Identity, Options, TestApiServer};

#[tokio::test]
async fn unknown_client_cert_and_bad_token_get_401_with_status() -> Result<()> {
    let (server, admin) = start(Options::default()).await?;
    server.add_token("good-token", "driver", &["drivers"]);
    let (cert, key) = server.issue_foreign_client_cert("admin", &["system:masters"])?;
    let foreign = Client::new(&server, Creds::Cert(&cert, &key), Alpn::H2)?;
    let bad_token = Client::new(&server, Creds::Token("bad-token"), Alpn::H2)?;
    let anonymous = Client::new(&server, Creds::None, Alpn::Http11)?;
    for client in [&foreign, &bad_token, &anonymous] {
        let (status, body) = client.get(SLICES).await?;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(body["kind"], "Status");
        assert_eq!(body["reason"], "Unauthorized");
        assert_eq!(body["code"], 401);
    }
    let good_token = Client::new(&server, Creds::Token("good-token"), Alpn::Http11)?;
    assert_eq!(good_token.get(SLICES).await?.0, StatusCode::OK);
    assert_eq!(admin.get(SLICES).await?.0, StatusCode::OK);
    let users: Vec<Option<String>> = server.requests().into_iter().map(|r| r.user).collect();
    assert_eq!(users[..3], [None, None, None]);
    assert_eq!(users[3].as_deref(), Some("driver"));
    assert_eq!(users[4].as_deref(), Some("admin"));
    Ok(())
}

#[tokio::test]
async fn serves_http2_and_http11_over_alpn() -> Result<()> {
    let server = TestApiServer::start(Options::default()).await?;
    let (cert, key) = server.issue_client_cert("admin", &[])?;
    for (alpn, expected) in [(Alpn::H2, b"h2".as_slice()), (Alpn::Http11, b"http/1.1".as_slice())] {
        let client = Client::new(&server, Creds::Cert(&cert, &key), alpn)?;
        let (response, negotiated) = client.send(Method::GET, "/version", None).await?;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(negotiated.as_deref(), Some(expected));
    }
    Ok(())
}

#[tokio::test]
async fn discovery_reports_configured_versions() -> Result<()> {
    let opts = Options {
        git_version: "v1.34.1".to_owned(),
        versions: vec![ApiVersion::V1beta1, ApiVersion::V1],
        ..Options::default()
    };
    let (_server, client) = start(opts).await?;
    let (_, version) = client.get("/version").await?;
    assert_eq!(version["gitVersion"], "v1.34.1");
    assert_eq!(version["minor"], "34");
    let (status, group) = client.get("/apis/resource.k8s.io").await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(group["kind"], "APIGroup");
    assert_eq!(group["preferredVersion"]["version"], "v1");
    let versions: Vec<&str> =
        group["versions"].as_array().into_iter().flatten().filter_map(|v| v["version"].as_str()).collect();
    assert_eq!(versions, ["v1", "v1beta1"]);
    let (_, apis) = client.get("/apis").await?;
    assert_eq!(apis["groups"][0]["name"], "resource.k8s.io");
    let (status, body) = client.get("/apis/resource.k8s.io/v1beta2/resourceslices").await?;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["reason"], "NotFound");
    assert_eq!(client.get("/apis/resource.k8s.io/v1beta1/resourceslices").await?.0, StatusCode::OK);
    Ok(())
}

/// Reads a kubeconfig the server wrote and connects with exactly what it contains.
#[tokio::test]
async fn kubeconfig_carries_working_credentials() -> Result<()> {
    let server = TestApiServer::start(Options::default()).await?;
    let dir = tempfile::tempdir()?;
    for identity in [Identity::node("node-a"), Identity::token("secret-token", "driver", &["drivers"])] {
        let path = server.write_kubeconfig(dir.path(), &identity)?;
        let config: Value = yaml_serde::from_str(&std::fs::read_to_string(&path)?)?;
        assert_eq!(config["clusters"][0]["cluster"]["server"], server.url());
        let ca = STANDARD
            .decode(config["clusters"][0]["cluster"]["certificate-authority-data"].as_str().unwrap_or_default())?;
        assert_eq!(String::from_utf8(ca)?, server.ca_pem());
        let user = &config["users"][0]["user"];
        let client = if let Some(token) = user["token"].as_str() {
            Client::new(&server, Creds::Token(token), Alpn::H2)?
        } else {
            let decode = |key: &str| -> Result<String> {
                let data = user[key].as_str().ok_or_else(|| anyhow!("{key} missing"))?;
                Ok(String::from_utf8(STANDARD.decode(data)?)?)
            };
            Client::new(
                &server,
                Creds::Cert(&decode("client-certificate-data")?, &decode("client-key-data")?),
                Alpn::H2,
            )?
        };
        assert_eq!(client.get("/version").await?.0, StatusCode::OK);
    }
    let users: Vec<Option<String>> = server.requests().into_iter().map(|r| r.user).collect();
    assert_eq!(users, [Some("system:node:node-a".to_owned()), Some("driver".to_owned())]);

    let files = tempfile::tempdir()?;
    let path = server.write_kubeconfig_files(files.path(), &Identity::cert("admin", &["system:masters"]))?;
    let config: Value = yaml_serde::from_str(&std::fs::read_to_string(&path)?)?;
    let read = |v: &Value| -> Result<String> {
        Ok(std::fs::read_to_string(v.as_str().ok_or_else(|| anyhow!("path missing"))?)?)
    };
    assert_eq!(read(&config["clusters"][0]["cluster"]["certificate-authority"])?, server.ca_pem());
    let user = &config["users"][0]["user"];
    let client =
        Client::new(&server, Creds::Cert(&read(&user["client-certificate"])?, &read(&user["client-key"])?), Alpn::H2)?;
    assert_eq!(client.get("/version").await?.0, StatusCode::OK);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&path)?.permissions().mode() & 0o777, 0o600);
    Ok(())
}

#[tokio::test]
async fn node_authorizer_allows_own_node_and_forbids_others() -> Result<()> {
    let opts = Options { node_authorizer: true, ..Options::default() };
    let (server, admin) = start(opts).await?;
    server.add_node("node-a");
    server.add_node("node-b");
    assert_eq!(
        admin.json(Method::POST, SLICES, Some(&slice("b-gpus", "node-b", "gpu.example.com", 1))).await?.0,
        StatusCode::CREATED
    );
    let node = Client::as_user(&server, "system:node:node-a", &["system:nodes"])?;

    let (status, _) = node.json(Method::POST, SLICES, Some(&slice("a-gpus", "node-a", "gpu.example.com", 1))).await?;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) =
        node.json(Method::POST, SLICES, Some(&slice("x-gpus", "node-b", "gpu.example.com", 1))).await?;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body["reason"], "Forbidden");

    assert_eq!(node.get(&format!("{SLICES}/a-gpus")).await?.0, StatusCode::OK);
    assert_eq!(node.get(&format!("{SLICES}/b-gpus")).await?.0, StatusCode::FORBIDDEN);
    assert_eq!(node.json(Method::DELETE, &format!("{SLICES}/b-gpus"), None).await?.0, StatusCode::FORBIDDEN);

    let (status, body) = node.get(SLICES).await?;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        body["message"],
        "resourceslices.resource.k8s.io is forbidden: User \"system:node:node-a\" cannot list resource \"resourceslices\" \
         in API group \"resource.k8s.io\" at the cluster scope: can only list/watch resourceslices with nodeName field selector"
    );
    let (status, list) = node.get(&format!("{SLICES}?fieldSelector=spec.nodeName%3Dnode-a")).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(node.get(&format!("{SLICES}?fieldSelector=spec.nodeName%3Dnode-b")).await?.0, StatusCode::FORBIDDEN);

    server.put_claim(ClaimBuilder::new("default", "mine").build());
    server.put_claim(ClaimBuilder::new("default", "theirs").build());
    server.mark_claim_on_node("default", "mine", "node-a");
    server.mark_claim_on_node("default", "theirs", "node-b");
    let claims = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims";
    assert_eq!(node.get(&format!("{claims}/mine")).await?.0, StatusCode::OK);
    assert_eq!(node.get(&format!("{claims}/theirs")).await?.0, StatusCode::FORBIDDEN);

    assert_eq!(node.get("/api/v1/nodes/node-a").await?.0, StatusCode::OK);
    assert_eq!(node.get("/api/v1/nodes/node-b").await?.0, StatusCode::FORBIDDEN);
    // Other identities are not restricted.
    assert_eq!(admin.get(&format!("{claims}/theirs")).await?.0, StatusCode::OK);
    assert_eq!(server.slices().len(), 2);
    Ok(())
}

#[tokio::test]
async fn forbidden_combination_is_denied_only_for_that_user_and_verb() -> Result<()> {
    let (server, admin) = start(Options::default()).await?;
    server.forbid("driver", "delete", "resourceslices");
    admin.json(Method::POST, SLICES, Some(&slice("s", "n", "gpu.example.com", 1))).await?;
    let driver = Client::as_user(&server, "driver", &[])?;
    assert_eq!(driver.get(&format!("{SLICES}/s")).await?.0, StatusCode::OK);
    let (status, body) = driver.json(Method::DELETE, &format!("{SLICES}/s"), None).await?;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        body["message"],
        "resourceslices.resource.k8s.io \"s\" is forbidden: User \"driver\" cannot delete resource \"resourceslices\" \
         in API group \"resource.k8s.io\" at the cluster scope"
    );
    assert_eq!(admin.json(Method::DELETE, &format!("{SLICES}/s"), None).await?.0, StatusCode::OK);
    Ok(())
}
