//! The budget of response bodies held at once: sixteen large objects read together (half
//! with a Content-Length, half streamed without one) all arrive, yet the bytes in body
//! buffers never exceed the budget; and a body that grows past its room while the large
//! pool is busy is read again rather than waited for mid-stream.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;

use super::testserver::{Pki, Reply, Seen, TestServer};
use super::transport::fast;
use crate::kube::body::{BODY_BUDGET, BodyBudget, SMALL_BODY};
use crate::kube::*;

/// A Node whose JSON is about `size` bytes.
fn node(name: &str, size: usize) -> String {
    format!(
        "{{\"kind\":\"Node\",\"apiVersion\":\"v1\",\"metadata\":{{\"name\":\"{name}\",\"annotations\":{{\"a\":\"{}\"}}}}}}",
        "x".repeat(size)
    )
}

#[tokio::test]
async fn large_bodies_read_at_once_hold_no_more_than_the_budget() {
    const SIZE: usize = 6 << 20;
    let pki = Pki::new("test-ca");
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    let srv = TestServer::start(
        &pki,
        Arc::new(move |seen: &Seen| {
            count.fetch_add(1, Ordering::SeqCst);
            let name = seen.path.rsplit('/').next().unwrap_or_default().to_string();
            let body = node(&name, SIZE);
            if name.ends_with(|c: char| c.to_digit(10).is_some_and(|d| d % 2 == 0)) {
                return Reply::Json { status: 200, headers: Vec::new(), body };
            }
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            for chunk in body.as_bytes().chunks(64 << 10) {
                tx.send(Bytes::copy_from_slice(chunk)).unwrap();
            }
            Reply::Stream { status: 200, rx }
        }),
    )
    .await;
    let client = Client::new(srv.token_credentials(&pki, "tok-1"), fast()).unwrap();
    let reads = (0..16).map(|i| {
        let client = client.clone();
        tokio::spawn(async move {
            client.get_node(&format!("n{i}")).await.map(|n| n.metadata.annotations.unwrap()["a"].len())
        })
    });
    for read in futures_util::future::join_all(reads).await {
        assert_eq!(read.unwrap().unwrap(), SIZE);
    }
    let budget = client.body_budget();
    assert!(
        budget.peak() <= BODY_BUDGET,
        "at most {} MiB held at once, not {} bytes",
        BODY_BUDGET >> 20,
        budget.peak()
    );
    assert!(budget.peak() > SIZE, "the bodies were counted: {}", budget.peak());
    assert_eq!(budget.held(), 0, "every body's bytes are given back");
    assert!(served.load(Ordering::SeqCst) >= 16);
}

#[tokio::test]
async fn a_budget_smaller_than_the_largest_body_still_admits_one() {
    let budget = BodyBudget::new(1 << 20, 16 << 20);
    let wait = std::time::Duration::from_secs(5);
    let room = tokio::time::timeout(wait, budget.room(16 << 20, true)).await.expect("room for one 16 MiB body");
    drop(room);
    let again = tokio::time::timeout(wait, budget.room(16 << 20, true)).await;
    assert!(again.is_ok(), "the room came back when the first body went");
    const { assert!(SMALL_BODY < BODY_BUDGET) };
}
