//! Self-tests of what the real server does to stored objects that clients must expect:
//! canonical quantities and server-set taint times.

use anyhow::Result;
use http::{Method, StatusCode};
use serde_json::json;

use super::{SLICES, rv, slice, start};
use crate::support::apiserver::{Options, canonical_quantity};

#[test]
fn quantities_serialize_canonically() {
    let table = [
        ("16384Mi", Some("16Gi")),
        ("1536Mi", Some("1536Mi")),
        ("16Gi", Some("16Gi")),
        ("1024", Some("1024")),
        ("2000", Some("2k")),
        ("100", Some("100")),
        ("1000m", Some("1")),
        ("1500m", Some("1500m")),
        ("0.5", Some("500m")),
        ("1.5Gi", Some("1536Mi")),
        ("0.5Ki", Some("512")),
        ("1e3", Some("1e3")),
        ("1E", Some("1E")),
        ("-1Gi", Some("-1Gi")),
        ("+7", Some("7")),
        ("0Gi", Some("0")),
        ("0.0000000001", Some("1n")),
        ("12abc", None),
        ("", None),
        ("Gi", None),
    ];
    for (input, expected) in table {
        assert_eq!(canonical_quantity(input).as_deref(), expected, "{input}");
    }
}

#[tokio::test]
async fn stored_quantities_are_canonical_and_invalid_ones_rejected() -> Result<()> {
    let (server, client) = start(Options::default()).await?;
    let mut body = slice("s", "n", "gpu.example.com", 1);
    body["spec"]["devices"][0]["capacity"]["memory"]["value"] = json!("16384Mi");
    let (status, created) = client.json(Method::POST, SLICES, Some(&body)).await?;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(created["spec"]["devices"][0]["capacity"]["memory"]["value"], "16Gi");
    assert_eq!(server.slice("s").unwrap_or_default()["spec"]["devices"][0]["capacity"]["memory"]["value"], "16Gi");

    // Writing back the non-canonical form is a no-op, as on the real server.
    let mut again = body.clone();
    again["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"].clone();
    let (_, same) = client.json(Method::PUT, &format!("{SLICES}/s"), Some(&again)).await?;
    assert_eq!(rv(&same)?, rv(&created)?);

    let mut bad = slice("bad", "n", "gpu.example.com", 1);
    bad["spec"]["devices"][0]["capacity"]["memory"]["value"] = json!("lots");
    let (status, body) = client.json(Method::POST, SLICES, Some(&bad)).await?;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["details"]["causes"][0]["field"], "spec.devices[0].capacity[memory].value");
    Ok(())
}

#[tokio::test]
async fn taints_without_time_added_get_the_current_time_on_every_write() -> Result<()> {
    let (_server, client) = start(Options::default()).await?;
    let mut body = slice("s", "n", "gpu.example.com", 1);
    body["spec"]["devices"][0]["taints"] =
        json!([{"key": "gpu.example.com/xid", "value": "79", "effect": "NoSchedule"}]);
    let (_, created) = client.json(Method::POST, SLICES, Some(&body)).await?;
    let time = created["spec"]["devices"][0]["taints"][0]["timeAdded"].clone();
    assert!(time.as_str().is_some_and(|t| t.ends_with('Z')), "{time}");

    // An update that repeats the taint with its time keeps it: no write.
    body["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"].clone();
    body["spec"]["devices"][0]["taints"][0]["timeAdded"] = time.clone();
    let (status, updated) = client.json(Method::PUT, &format!("{SLICES}/s"), Some(&body)).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(updated["spec"]["devices"][0]["taints"][0]["timeAdded"], time);
    assert_eq!(rv(&updated)?, rv(&created)?);

    // One that leaves the time out gets the current time, as the real server's defaulting
    // does on every update: an old time proves it.
    let old = "2020-01-01T00:00:00Z";
    body["spec"]["devices"][0]["taints"][0]["timeAdded"] = json!(old);
    let (_, updated) = client.json(Method::PUT, &format!("{SLICES}/s"), Some(&body)).await?;
    assert_eq!(updated["spec"]["devices"][0]["taints"][0]["timeAdded"], old);
    body["metadata"]["resourceVersion"] = updated["metadata"]["resourceVersion"].clone();
    body["spec"]["devices"][0]["taints"][0].as_object_mut().expect("taint").remove("timeAdded");
    let (_, reset) = client.json(Method::PUT, &format!("{SLICES}/s"), Some(&body)).await?;
    let reset_time = reset["spec"]["devices"][0]["taints"][0]["timeAdded"].clone();
    assert!(reset_time.as_str().is_some_and(|t| t.ends_with('Z') && t != old), "{reset_time}");
    Ok(())
}

#[tokio::test]
async fn taints_are_dropped_when_the_server_does_not_serve_them() -> Result<()> {
    let (server, client) = start(Options::default()).await?;
    server.set_device_taints(false);
    let mut body = slice("s", "n", "gpu.example.com", 1);
    body["spec"]["devices"][0]["taints"] =
        json!([{"key": "gpu.example.com/xid", "value": "79", "effect": "NoSchedule"}]);
    let (status, created) = client.json(Method::POST, SLICES, Some(&body)).await?;
    assert_eq!(status, StatusCode::CREATED);
    assert!(created["spec"]["devices"][0].get("taints").is_none(), "{created}");

    server.set_device_taints(true);
    body["spec"]["devices"][0]["taints"][0]["effect"] = json!("PreferNoSchedule");
    body["metadata"]["name"] = json!("t");
    let (status, _) = client.json(Method::POST, SLICES, Some(&body)).await?;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    Ok(())
}
