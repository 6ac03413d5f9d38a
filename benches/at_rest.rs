//! API load at rest: what edra sends the API server while nothing changes, with 0, 10 and
//! 100 prepared claims, each used by a running pod of the node. The agent runs in-process
//! against the test API server on loopback HTTPS (node credentials, the pod watch on, as by
//! default), with `claims.check_interval` shortened to 1 s so a short window holds many
//! stale-claim checks. Prints requests by verb in the window and per hour: claim GETs
//! scaled to the default 5-minute check, the rest (watch re-opens, bookmarks are not
//! requests) by real time. `cargo bench --bench at_rest` (the counts do not depend on the
//! build: `cargo bench --profile dev --bench at_rest` gives the same figures).

#[allow(unused_imports)]
#[path = "../tests/it/support/mod.rs"]
mod support;

mod common;

use std::time::Duration;

use common::{InProcessAgent, NAMESPACE, NODE, Site, SiteSettings, verb_table};
use edra::plugin::proto::dra_v1 as v1;
use support::apiserver::{Options, bound_pod};

const GPUS: usize = 8;
/// The shortened stale-claim check interval.
const CHECK: Duration = Duration::from_secs(1);
/// edra's default `claims.check_interval`.
const DEFAULT_CHECK: Duration = Duration::from_secs(300);
/// Real time measured at rest.
const WINDOW: Duration = Duration::from_secs(20);

#[tokio::main]
async fn main() {
    println!("# edra at rest: API requests with prepared claims in use\n");
    println!(
        "claims.check_interval = {}s, window {}s (= {} checks, {:.0} minutes of checks at the default {}s)\n",
        CHECK.as_secs(),
        WINDOW.as_secs(),
        WINDOW.as_secs() / CHECK.as_secs(),
        (WINDOW.as_secs_f64() / CHECK.as_secs_f64()) * DEFAULT_CHECK.as_secs_f64() / 60.0,
        DEFAULT_CHECK.as_secs()
    );
    println!(
        "| prepared claims | requests in the window | claim GETs | claim GETs per hour (5 min check) | other requests per hour |"
    );
    println!("|---:|---:|---:|---:|---:|");
    let mut tables = Vec::new();
    for claims in [0, 10, 100] {
        let (row, table) = at_rest(claims).await;
        println!("{row}");
        tables.push((claims, table));
    }
    for (claims, table) in tables {
        println!("\n## {claims} prepared claims: requests in the window by verb\n\n{table}");
    }
}

/// Prepares `n` shares, each used by a running pod, then counts requests at rest.
async fn at_rest(n: usize) -> (String, String) {
    let settings = SiteSettings { gpus: GPUS as u32, check_interval: Some("1s"), ..SiteSettings::default() };
    let site = Site::new(Options::default(), settings).await;
    let agent = InProcessAgent::start(site.config.clone()).await;
    common::register(&site.registration_socket()).await;
    site.wait_published(GPUS, Duration::from_secs(30)).await;
    let mut client = support::kubelet::dra_v1(&site.dra_socket()).await;
    let claims: Vec<v1::Claim> =
        (0..n).map(|k| site.claim_share(&format!("c{k}"), &format!("gpu-{}", k % GPUS), "1Gi")).collect();
    for c in &claims {
        let mut pod = bound_pod(NAMESPACE, &c.name, NODE, &[("gpu", &c.name)]);
        pod["status"]["phase"] = serde_json::json!("Running");
        site.server.put_pod(pod);
    }
    for chunk in claims.chunks(16) {
        let answer = client
            .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: chunk.to_vec() })
            .await
            .expect("NodePrepareResources")
            .into_inner();
        for (uid, r) in &answer.claims {
            assert!(r.error.is_empty(), "prepare of {uid} failed: {}", r.error);
        }
    }
    // Settle: the pod watch has seen the pods, the publisher is quiet.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mark = site.server.request_mark();
    tokio::time::sleep(WINDOW).await;
    let log = site.server.requests();
    let window = &log[mark..];
    let claim_gets = window.iter().filter(|r| r.verb == "get" && r.path.contains("/resourceclaims/")).count();
    let others = window.len() - claim_gets;
    let checks = WINDOW.as_secs_f64() / CHECK.as_secs_f64();
    let claim_gets_per_hour = claim_gets as f64 / checks * (3600.0 / DEFAULT_CHECK.as_secs_f64());
    let others_per_hour = others as f64 / WINDOW.as_secs_f64() * 3600.0;
    agent.stop();
    let row = format!("| {n} | {} | {claim_gets} | {claim_gets_per_hour:.0} | {others_per_hour:.0} |", window.len());
    (row, verb_table(&log, mark))
}
