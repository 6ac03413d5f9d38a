//! Watch self-tests: event delivery, bookmarks, selectors, 410 for compacted history and
//! closing watches.

use std::time::Duration;

use anyhow::Result;
use http::{Method, StatusCode};
use serde_json::json;

use super::{Alpn, Client, Creds, SLICES, rv, slice, start};
use crate::support::apiserver::Options;

#[tokio::test]
async fn watch_delivers_events_and_bookmarks() -> Result<()> {
    let opts = Options { bookmark_interval: Duration::from_millis(50), ..Options::default() };
    let (server, client) = start(opts).await?;
    client.json(Method::POST, SLICES, Some(&slice("before", "node-a", "gpu.example.com", 1))).await?;
    let (_, list) = client.get(&format!("{SLICES}?fieldSelector=spec.nodeName%3Dnode-a")).await?;
    let start_rv = rv(&list)?;
    let query = format!(
        "{SLICES}?watch=true&resourceVersion={start_rv}&allowWatchBookmarks=true&fieldSelector=spec.nodeName%3Dnode-a"
    );
    let (status, mut events) = client.watch(&query).await?;
    assert_eq!(status, StatusCode::OK);

    let (_, created) = client.json(Method::POST, SLICES, Some(&slice("s", "node-a", "gpu.example.com", 1))).await?;
    client.json(Method::POST, SLICES, Some(&slice("other", "node-b", "gpu.example.com", 1))).await?;
    let added = events.next_change().await?;
    assert_eq!(added["type"], "ADDED");
    assert_eq!(added["object"]["metadata"]["name"], "s");
    assert_eq!(added["object"]["kind"], "ResourceSlice");
    assert_eq!(added["object"]["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"]);

    server.edit_slice("s", |s| s["spec"]["pool"]["generation"] = json!(7));
    let modified = events.next_change().await?;
    assert_eq!(modified["type"], "MODIFIED");
    assert_eq!(modified["object"]["spec"]["pool"]["generation"], 7);
    assert!(rv(&modified["object"])? > rv(&added["object"])?);

    assert!(server.delete_slice_as_kubelet("s"));
    let deleted = events.next_change().await?;
    assert_eq!(deleted["type"], "DELETED");
    assert_eq!(deleted["object"]["metadata"]["name"], "s");

    let current = server.with_state(|s| s.resource_version());
    loop {
        let event = events.next().await?.unwrap_or_default();
        assert_eq!(event["type"], "BOOKMARK", "no events of node-b may arrive: {event}");
        if rv(&event["object"])? == current {
            break;
        }
    }
    Ok(())
}

#[tokio::test]
async fn watch_without_resource_version_starts_with_added_and_times_out() -> Result<()> {
    let (_server, client) = start(Options::default()).await?;
    client.json(Method::POST, SLICES, Some(&slice("a", "node-a", "gpu.example.com", 1))).await?;
    client.json(Method::POST, SLICES, Some(&slice("b", "node-a", "gpu.example.com", 1))).await?;
    let (_, mut events) = client.watch(&format!("{SLICES}?watch=1&timeoutSeconds=1")).await?;
    let first = events.next_change().await?;
    let second = events.next_change().await?;
    assert_eq!((first["type"].as_str(), second["type"].as_str()), (Some("ADDED"), Some("ADDED")));
    assert_eq!(
        (first["object"]["metadata"]["name"].as_str(), second["object"]["metadata"]["name"].as_str()),
        (Some("a"), Some("b"))
    );
    assert!(events.next().await?.is_none(), "the watch ends after timeoutSeconds");
    Ok(())
}

#[tokio::test]
async fn watch_from_compacted_resource_version_gets_410() -> Result<()> {
    let (server, client) = start(Options::default()).await?;
    let (_, created) = client.json(Method::POST, SLICES, Some(&slice("a", "node-a", "gpu.example.com", 1))).await?;
    let old = rv(&created)?;
    server.edit_slice("a", |s| s["spec"]["pool"]["generation"] = json!(2));
    server.compact();

    let (status, mut events) = client.watch(&format!("{SLICES}?watch=true&resourceVersion={old}")).await?;
    assert_eq!(status, StatusCode::OK);
    let error = events.next().await?.unwrap_or_default();
    assert_eq!(error["type"], "ERROR");
    assert_eq!(error["object"]["code"], 410);
    assert_eq!(error["object"]["reason"], "Expired");
    assert!(events.next().await?.is_none());

    server.set_gone_as_http_status(true);
    let (status, body) = client.get(&format!("{SLICES}?watch=true&resourceVersion={old}")).await?;
    assert_eq!(status, StatusCode::GONE);
    assert_eq!(body["code"], 410);

    // The current resourceVersion is still watchable.
    let now = server.with_state(|s| s.resource_version());
    let (_, mut events) = client.watch(&format!("{SLICES}?watch=true&resourceVersion={now}")).await?;
    server.edit_slice("a", |s| s["spec"]["pool"]["generation"] = json!(3));
    assert_eq!(events.next_change().await?["type"], "MODIFIED");
    Ok(())
}

#[tokio::test]
async fn history_window_overflow_expires_old_resource_versions() -> Result<()> {
    let (server, client) = start(Options { history_limit: 2, ..Options::default() }).await?;
    let (_, created) = client.json(Method::POST, SLICES, Some(&slice("a", "node-a", "gpu.example.com", 1))).await?;
    for generation in 2..5 {
        server.edit_slice("a", |s| s["spec"]["pool"]["generation"] = json!(generation));
    }
    let (_, mut events) = client.watch(&format!("{SLICES}?watch=true&resourceVersion={}", rv(&created)?)).await?;
    assert_eq!(events.next().await?.unwrap_or_default()["object"]["code"], 410);
    Ok(())
}

#[tokio::test]
async fn close_watches_ends_open_streams() -> Result<()> {
    let (server, client) = start(Options::default()).await?;
    let (_, mut events) = client.watch(&format!("{SLICES}?watch=true")).await?;
    server.wait_for("the watch to be logged", Duration::from_secs(5), |s| s.count_verb("watch") == 1).await?;
    server.close_watches();
    assert!(events.next().await?.is_none());
    Ok(())
}

#[tokio::test]
async fn streaming_list_sends_initial_events_then_an_end_bookmark() -> Result<()> {
    let (server, client) = start(Options::default()).await?;
    client.json(Method::POST, SLICES, Some(&slice("a", "node-a", "gpu.example.com", 1))).await?;
    let (status, body) = client.get(&format!("{SLICES}?watch=true&sendInitialEvents=true")).await?;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["reason"], "Invalid");

    let query = format!(
        "{SLICES}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
    );
    let (_, mut events) = client.watch(&query).await?;
    let added = events.next().await?.unwrap_or_default();
    assert_eq!((added["type"].as_str(), added["object"]["metadata"]["name"].as_str()), (Some("ADDED"), Some("a")));
    let end = events.next().await?.unwrap_or_default();
    assert_eq!(end["type"], "BOOKMARK");
    assert_eq!(end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
    assert_eq!(rv(&end["object"])?, server.with_state(|s| s.resource_version()));
    assert_eq!(server.with_state(|s| s.open_watches()), 1);
    drop(events);
    server.wait_for("the watch to close", Duration::from_secs(5), |s| s.open_watches() == 0).await?;
    assert!(server.with_state(|s| s.watch_bytes()) > 0);
    Ok(())
}

#[tokio::test]
async fn watch_streams_over_http11_and_is_authorized_like_list() -> Result<()> {
    let (server, _) = start(Options { node_authorizer: true, ..Options::default() }).await?;
    let (cert, key) = server.issue_client_cert("system:node:node-a", &["system:nodes"])?;
    let node = Client::new(&server, Creds::Cert(&cert, &key), Alpn::Http11)?;
    let (status, _) = node.watch(&format!("{SLICES}?watch=true")).await?;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, mut events) = node.watch(&format!("{SLICES}?watch=true&fieldSelector=spec.nodeName%3Dnode-a")).await?;
    assert_eq!(status, StatusCode::OK);
    server.create_slice(slice("other", "node-b", "gpu.example.com", 1));
    server.create_slice(slice("mine", "node-a", "gpu.example.com", 1));
    let event = events.next_change().await?;
    assert_eq!((event["type"].as_str(), event["object"]["metadata"]["name"].as_str()), (Some("ADDED"), Some("mine")));
    Ok(())
}
