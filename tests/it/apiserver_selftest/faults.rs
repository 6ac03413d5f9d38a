//! Fault-injection, connection-control, request-log and `wait_for` self-tests.

use std::time::{Duration, Instant};

use anyhow::Result;
use http::{Method, StatusCode, header};

use super::{Client, SLICES, slice, start};
use crate::support::apiserver::{Fault, FaultAction, Options};

#[tokio::test]
async fn injected_errors_hit_only_matching_requests() -> Result<()> {
    let (server, client) = start(Options::default()).await?;
    server.inject(
        Fault::next(2, FaultAction::TooManyRequests { retry_after_secs: 3 })
            .method(Method::POST)
            .path_contains("/resourceslices"),
    );
    server.inject(Fault::next(1, FaultAction::InternalError).method(Method::GET).path_contains("/version"));

    assert_eq!(client.get(SLICES).await?.0, StatusCode::OK, "GETs of slices are not affected");
    for _ in 0..2 {
        let (response, _) = client.send(Method::POST, SLICES, Some(&slice("s", "n", "gpu.example.com", 1))).await?;
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers().get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()), Some("3"));
    }
    assert_eq!(
        client.json(Method::POST, SLICES, Some(&slice("s", "n", "gpu.example.com", 1))).await?.0,
        StatusCode::CREATED
    );
    let (status, body) = client.get("/version").await?;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body["reason"], "InternalError");
    assert_eq!(client.get("/version").await?.0, StatusCode::OK);

    let log = server.requests();
    let statuses: Vec<u16> = log.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 429, 429, 201, 500, 200]);
    assert_eq!(server.with_state(|s| (s.count_verb("create"), s.writes_since(3))), (3, 1));
    assert_eq!(server.with_state(|s| s.faults_applied()), 3, "two 429s and a 500");
    assert!(log[3].request_bytes > 0 && log[3].response_bytes > 0);
    Ok(())
}

#[tokio::test]
async fn injected_delay_holds_the_answer() -> Result<()> {
    let (server, client) = start(Options::default()).await?;
    // Long enough that an undelayed request on a loaded machine stays well below it.
    const DELAY: Duration = Duration::from_secs(2);
    server.inject(Fault::next(1, FaultAction::Delay(DELAY)).path_contains("/version"));
    let started = Instant::now();
    assert_eq!(client.get("/version").await?.0, StatusCode::OK);
    assert!(started.elapsed() >= DELAY);
    let started = Instant::now();
    assert_eq!(client.get("/version").await?.0, StatusCode::OK);
    assert!(started.elapsed() < DELAY, "only the next request is delayed");
    Ok(())
}

#[tokio::test]
async fn restart_on_the_same_port_keeps_state() -> Result<()> {
    let (server, client) = start(Options::default()).await?;
    let addr = server.addr();
    client.json(Method::POST, SLICES, Some(&slice("kept", "n", "gpu.example.com", 1))).await?;
    let (_, mut watch) = client.watch(&format!("{SLICES}?watch=true&resourceVersion=1")).await?;
    assert_eq!(watch.next_change().await?["type"], "ADDED");

    server.stop().await;
    assert_eq!(server.with_state(|s| s.open_connections()), 0);
    let after_stop = watch.next().await;
    assert!(!matches!(after_stop, Ok(Some(_))), "open connections are dropped: {after_stop:?}");
    assert!(client.get("/version").await.is_err(), "connections are refused while stopped");

    server.restart()?;
    assert_eq!(server.addr(), addr);
    let (status, kept) = client.get(&format!("{SLICES}/kept")).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(kept["metadata"]["name"], "kept");
    Ok(())
}

#[tokio::test]
async fn refused_connections_keep_open_ones() -> Result<()> {
    let (server, client) = start(Options::default()).await?;
    let (_, mut watch) = client.watch(&format!("{SLICES}?watch=true")).await?;
    server.wait_for("the watch", Duration::from_secs(5), |s| s.count_verb("watch") == 1).await?;
    server.refuse_connections().await;
    assert!(client.get("/version").await.is_err());
    server.create_slice(slice("late", "n", "gpu.example.com", 1));
    assert_eq!(watch.next_change().await?["object"]["metadata"]["name"], "late");
    server.accept_connections()?;
    assert_eq!(client.get("/version").await?.0, StatusCode::OK);
    Ok(())
}

#[tokio::test]
async fn wait_for_wakes_on_changes_and_times_out() -> Result<()> {
    let (server, client) = start(Options::default()).await?;
    let waiter = server.wait_for("two slices", Duration::from_secs(5), |s| s.slices().len() == 2);
    let writer = async {
        for name in ["a", "b"] {
            client.json(Method::POST, SLICES, Some(&slice(name, "n", "gpu.example.com", 1))).await?;
        }
        anyhow::Ok(())
    };
    let (waited, written) = tokio::join!(waiter, writer);
    written?;
    waited?;
    let started = Instant::now();
    let never = server.wait_for("three slices", Duration::from_millis(100), |s| s.slices().len() == 3).await;
    assert!(never.is_err());
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert_eq!(server.delete_slices_where("n", Some("gpu.example.com")), 2);
    let other = Client::as_user(&server, "viewer", &[])?;
    assert_eq!(other.get(SLICES).await?.1["items"].as_array().map(Vec::len), Some(0));
    Ok(())
}

#[tokio::test]
async fn graceful_stop_finishes_in_flight_requests_and_ends_watches() -> Result<()> {
    let (server, client) = start(Options::default()).await?;
    let (_, mut watch) = client.watch(&format!("{SLICES}?watch=true")).await?;
    server.inject(Fault::next(1, FaultAction::Delay(Duration::from_millis(200))).path_contains("/version"));
    let in_flight = tokio::spawn({
        let client = Client::as_user(&server, "admin", &[])?;
        async move { client.get("/version").await }
    });
    server.wait_for("the delayed request to arrive", Duration::from_secs(5), |s| s.in_flight() == 1).await?;
    server.stop_gracefully().await;
    assert_eq!(in_flight.await??.0, StatusCode::OK, "in-flight requests complete");
    assert!(watch.next().await?.is_none(), "watches end cleanly");
    assert_eq!(server.with_state(|s| s.open_connections()), 0);
    assert!(client.get("/version").await.is_err());
    server.restart()?;
    assert_eq!(client.get("/version").await?.0, StatusCode::OK);
    Ok(())
}
