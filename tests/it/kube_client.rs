//! edra's Kubernetes client (`edra::kube`) against the in-process test API server over real
//! HTTPS: credentials from real kubeconfig files, TLS verification, authentication and
//! authorization errors, optimistic concurrency, delete preconditions, generateName,
//! retries on injected faults, discovery, v1beta1 conversion and the watcher's recovery from
//! compaction (410) and server restarts.

use std::time::{Duration, Instant};

use edra::kube::{self, Auth, Client, ClientSettings, Credentials, Error, Event, Pem, ResourceApi, Secret};
use futures_util::{Stream, StreamExt};
use http::Method;
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::json;

use crate::support::apiserver::{ApiVersion, Fault, FaultAction, Identity, Options, TestApiServer};

const DRIVER: &str = "gpu.edra.dev";

fn settings() -> ClientSettings {
    ClientSettings {
        request_timeout: Duration::from_secs(10),
        retry_base_delay: Duration::from_millis(10),
        retry_max_delay: Duration::from_millis(50),
        watch_backoff_base: Duration::from_millis(20),
        watch_backoff_max: Duration::from_millis(200),
        ..ClientSettings::default()
    }
}

struct Env {
    server: TestApiServer,
    _dir: tempfile::TempDir,
    creds: Credentials,
}

/// A server with `opts` and credentials for `identity`, read from a real kubeconfig file.
async fn start(opts: Options, identity: Identity) -> Env {
    let server = TestApiServer::start(opts).await.expect("test API server starts");
    let dir = tempfile::tempdir().expect("temp dir");
    let path = server.write_kubeconfig(dir.path(), &identity).expect("kubeconfig written");
    let creds = kube::kubeconfig::load(&[path], None).expect("kubeconfig loads");
    Env { server, _dir: dir, creds }
}

async fn admin(opts: Options) -> (Env, Client) {
    let env = start(opts, Identity::token("admin-token", "admin", &["system:masters"])).await;
    let client = Client::new(env.creds.clone(), settings()).expect("client");
    (env, client)
}

fn slice(name: &str, node: &str) -> ResourceSlice {
    let mut v = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"index": {"int": 0}, "model": {"string": "A100"}},
                "capacity": {"memory": {"value": "40Gi"}}}]}
    });
    if name.is_empty() {
        v["metadata"] = json!({"generateName": format!("{node}-gpu-")});
    }
    serde_json::from_value(v).expect("valid slice")
}

async fn next(w: &mut (impl Stream<Item = Event> + Unpin)) -> Event {
    tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("watch event in time")
        .expect("stream never ends")
}

/// The next event that is not an `Error` (errors while the server is away are expected).
async fn next_ok(w: &mut (impl Stream<Item = Event> + Unpin)) -> Event {
    loop {
        match next(w).await {
            Event::Error(_) => continue,
            ev => return ev,
        }
    }
}

fn name(s: &ResourceSlice) -> &str {
    s.metadata.name.as_deref().unwrap_or_default()
}

#[tokio::test]
async fn untrusted_server_certificate_is_a_tls_error() {
    let (env, _) = admin(Options::default()).await;
    let mut creds = env.creds.clone();
    creds.ca = Some(Pem::Data(env.server.client_ca_pem().into_bytes()));
    let err = Client::new(creds, settings()).unwrap().server_version().await.unwrap_err();
    assert!(err.is_tls(), "{err:?}");
    assert!(env.server.requests().is_empty());
}

#[tokio::test]
async fn unknown_token_is_unauthorized() {
    let (env, _) = admin(Options::default()).await;
    let mut creds = env.creds.clone();
    creds.auth = Auth::Token(Secret::new("not-a-registered-token"));
    let err = Client::new(creds, settings()).unwrap().get_node("n1").await.unwrap_err();
    assert!(err.is_unauthorized(), "{err:?}");
    assert_eq!(env.server.requests().len(), 1, "401 is not retried");
}

#[tokio::test]
async fn crud_with_generate_name_conflicts_and_preconditions() {
    let (env, client) = admin(Options::default()).await;
    let api = client.discover_resource_api().await.unwrap();
    assert_eq!(api, ResourceApi::V1);

    let created = client.create_slice(api, &slice("", "n1")).await.unwrap();
    let created_name = name(&created).to_string();
    assert!(created_name.starts_with("n1-gpu-") && created_name.len() > "n1-gpu-".len(), "{created_name}");
    assert_eq!(env.server.slices().len(), 1);

    let mut updated = created.clone();
    updated.spec.pool.generation = 2;
    let updated = client.update_slice(api, &updated).await.unwrap();
    assert_eq!(updated.spec.pool.generation, 2);
    let mut stale = created.clone();
    stale.spec.pool.generation = 3;
    assert!(client.update_slice(api, &stale).await.unwrap_err().is_conflict(), "old resourceVersion → 409");

    let uid = updated.metadata.uid.clone().unwrap_or_default();
    let rv = updated.metadata.resource_version.clone().unwrap_or_default();
    let old_rv = created.metadata.resource_version.clone().unwrap_or_default();
    assert!(client.delete_slice(api, &created_name, "other-uid", &rv).await.unwrap_err().is_conflict());
    assert!(client.delete_slice(api, &created_name, &uid, &old_rv).await.unwrap_err().is_conflict());
    client.delete_slice(api, &created_name, &uid, &rv).await.unwrap();
    assert!(env.server.slices().is_empty());
    assert!(client.get_slice(api, &created_name).await.unwrap_err().is_not_found());

    let stats = client.stats();
    assert_eq!(stats.count("POST", 201), 1);
    assert_eq!(stats.count("PUT", 409), 1);
    assert_eq!(stats.count("DELETE", 409), 2);
    assert!(stats.bytes_sent > 0 && stats.bytes_received > 0);
}

#[tokio::test]
async fn too_many_requests_honours_retry_after() {
    let (env, client) = admin(Options::default()).await;
    env.server
        .inject(Fault::next(1, FaultAction::TooManyRequests { retry_after_secs: 1 }).path_contains("/resourceslices"));
    let start = Instant::now();
    let list = client.list_slices(ResourceApi::V1, "spec.nodeName=n1").await.unwrap();
    assert!(list.items.is_empty());
    assert!(start.elapsed() >= Duration::from_secs(1), "retried after {:?}", start.elapsed());
    let statuses: Vec<u16> = env.server.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [429, 200]);
}

#[tokio::test]
async fn internal_errors_are_retried_but_not_for_create() {
    let (env, client) = admin(Options::default()).await;
    env.server.add_node("n1");
    env.server.inject(Fault::next(2, FaultAction::InternalError).method(Method::GET));
    let node = client.get_node("n1").await.unwrap();
    assert_eq!(node.metadata.name.as_deref(), Some("n1"));
    assert_eq!(env.server.requests().len(), 3);

    env.server.inject(Fault::next(1, FaultAction::InternalError).method(Method::POST));
    let err = client.create_slice(ResourceApi::V1, &slice("", "n1")).await.unwrap_err();
    assert!(matches!(err, Error::ServerError(_)), "{err:?}");
    let posts = env.server.requests().iter().filter(|r| r.method == Method::POST).count();
    assert_eq!(posts, 1, "an ambiguous create is not replayed");
}

#[tokio::test]
async fn node_identity_forbidden_carries_the_server_message() {
    let opts = Options { node_authorizer: true, ..Options::default() };
    let env = start(opts, Identity::node("n1")).await;
    assert!(matches!(env.creds.auth, Auth::ClientCert { .. }));
    let client = Client::new(env.creds.clone(), settings()).unwrap();
    client.create_slice(ResourceApi::V1, &slice("n1-gpu", "n1")).await.expect("own node's slice");
    let err = client.create_slice(ResourceApi::V1, &slice("n2-gpu", "n2")).await.unwrap_err();
    assert!(err.is_forbidden(), "{err:?}");
    let msg = err.api().map(|a| a.message.clone()).unwrap_or_default();
    assert!(msg.contains("same NodeName as the requesting node"), "the server's message is kept: {msg}");
    assert!(err.to_string().contains(&msg));
}

#[tokio::test]
async fn discovery_follows_the_served_versions_and_v1beta1_round_trips() {
    let opts = Options { git_version: "v1.32.5".into(), versions: vec![ApiVersion::V1beta1], ..Options::default() };
    let (env, client) = admin(opts).await;
    let api = client.discover_resource_api().await.unwrap();
    assert_eq!(api, ResourceApi::V1beta1);
    let want = slice("n1-gpu", "n1");
    let created = client.create_slice(api, &want).await.unwrap();
    assert_eq!(created.spec.devices, want.spec.devices, "devices survive the v1beta1 `basic` nesting");
    let stored = env.server.slice("n1-gpu").expect("stored");
    assert_eq!(stored["spec"]["devices"][0]["attributes"]["model"]["string"], "A100");
    assert_eq!(client.list_slices(api, "").await.unwrap().items[0].spec.devices, want.spec.devices);

    let opts = Options { versions: vec![ApiVersion::V1beta2, ApiVersion::V1beta1], ..Options::default() };
    let (_env, client) = admin(opts).await;
    assert_eq!(client.discover_resource_api().await.unwrap(), ResourceApi::V1beta2);

    let opts = Options { git_version: "v1.31.9".into(), versions: vec![], ..Options::default() };
    let (_env, client) = admin(opts).await;
    let err = client.discover_resource_api().await.unwrap_err();
    assert!(matches!(err, Error::NoResourceApi { .. }) && err.to_string().contains("v1.31.9"), "{err}");
}

#[tokio::test]
async fn watcher_relists_after_compaction() {
    for gone_as_http_status in [false, true] {
        let opts = Options { gone_as_http_status, ..Options::default() };
        let (env, client) = admin(opts).await;
        env.server.create_slice(serde_json::to_value(slice("a", "n1")).unwrap());
        let mut w = Box::pin(client.watch_slices(ResourceApi::V1, "spec.nodeName=n1"));
        assert!(matches!(next(&mut w).await, Event::Restarted(v) if v.len() == 1));
        env.server.create_slice(serde_json::to_value(slice("b", "n1")).unwrap());
        assert!(matches!(next(&mut w).await, Event::Applied(s) if name(&s) == "b"));
        env.server.create_slice(serde_json::to_value(slice("c", "n2")).unwrap());
        env.server.compact();
        env.server.close_watches();
        // Resuming from a compacted version is 410 → a fresh list, without an Error event.
        match next(&mut w).await {
            Event::Restarted(v) => {
                let mut names: Vec<_> = v.iter().map(|s| name(s).to_string()).collect();
                names.sort();
                assert_eq!(names, ["a", "b"], "only n1's slices (field selector)");
            }
            other => panic!("expected Restarted (gone_as_http_status={gone_as_http_status}), got {other:?}"),
        }
        assert!(env.server.delete_slice_as_kubelet("a"));
        assert!(matches!(next(&mut w).await, Event::Deleted(s) if name(&s) == "a"));
    }
}

#[tokio::test]
async fn watcher_recovers_from_a_server_restart() {
    let (env, client) = admin(Options::default()).await;
    let mut w = Box::pin(client.watch_slices(ResourceApi::V1, "spec.nodeName=n1"));
    assert!(matches!(next(&mut w).await, Event::Restarted(v) if v.is_empty()));
    env.server.create_slice(serde_json::to_value(slice("a", "n1")).unwrap());
    assert!(matches!(next(&mut w).await, Event::Applied(_)));
    env.server.stop().await;
    env.server.create_slice(serde_json::to_value(slice("b", "n1")).unwrap());
    // `stop` aborts the accept task; its listener closes when the runtime next polls it.
    let mut restarted = env.server.restart();
    for _ in 0..1000 {
        if restarted.is_ok() {
            break;
        }
        tokio::task::yield_now().await;
        restarted = env.server.restart();
    }
    restarted.expect("the server listens again on its port");
    // The missed creation arrives either as an event (resume) or in a relist.
    match next_ok(&mut w).await {
        Event::Applied(s) => assert_eq!(name(&s), "b"),
        Event::Restarted(v) => assert_eq!(v.len(), 2),
        other => panic!("unexpected {other:?}"),
    }
    env.server.create_slice(serde_json::to_value(slice("c", "n1")).unwrap());
    assert!(matches!(next_ok(&mut w).await, Event::Applied(s) if name(&s) == "c"));
}

#[tokio::test]
async fn claims_are_read_in_the_served_version() {
    use crate::support::apiserver::{AllocatedDevice, ClaimBuilder};
    for (versions, api) in [(vec![ApiVersion::V1], ResourceApi::V1), (vec![ApiVersion::V1beta1], ResourceApi::V1beta1)]
    {
        let (env, client) = admin(Options { versions, ..Options::default() }).await;
        env.server.put_claim(
            ClaimBuilder::new("ns", "c1")
                .request("gpu", DRIVER)
                .allocated(AllocatedDevice::new("gpu", DRIVER, "n1", "gpu-0"))
                .on_node("n1")
                .build(),
        );
        let claim = client.get_claim(api, "ns", "c1").await.unwrap();
        let req = claim.spec.as_ref().and_then(|s| s.devices.as_ref()).and_then(|d| d.requests.as_ref()).unwrap();
        assert_eq!(req[0].exactly.as_ref().map(|e| e.device_class_name.as_str()), Some(DRIVER), "{api}");
        let results = claim.status.and_then(|s| s.allocation).and_then(|a| a.devices).and_then(|d| d.results).unwrap();
        assert_eq!(results[0].device, "gpu-0");
        assert!(client.get_claim(api, "ns", "missing").await.unwrap_err().is_not_found());
    }
}

#[tokio::test]
async fn from_config_uses_the_configured_kubeconfig_and_node_identity() {
    use edra::config::{Config, LoadContext, Overrides};
    let server = TestApiServer::start(Options::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = server.write_kubeconfig(dir.path(), &Identity::node("n1")).unwrap();
    let mut overrides = Overrides::default();
    overrides.push("kubernetes.kubeconfig", path.display().to_string(), "--kubeconfig");
    let ctx = LoadContext {
        explicit_file: None,
        default_file: dir.path().join("absent.toml"),
        env: Vec::new(),
        overrides,
        hostname: Some("n1".into()),
    };
    let cfg = Config::load(&ctx).expect("config loads");
    let client = Client::from_config(&cfg).unwrap();
    assert_eq!(client.server_url(), server.url());
    assert!(
        client.identity().contains("client certificate") && client.identity().contains(&path.display().to_string())
    );
    assert_eq!(client.server_version().await.unwrap(), "v1.36.2");
    let users: Vec<_> = server.requests().iter().map(|r| r.user.clone().unwrap_or_default()).collect();
    assert_eq!(users, ["system:node:n1"]);
}
