//! Prepare and unprepare latency through the kubelet's gRPC API on the real Unix socket,
//! with the agent (`edra::app::run`) in-process on its own two-thread runtime and the test
//! API server on loopback HTTPS. Prints tables; `cargo bench --bench prepare`.

#[allow(dead_code, unused_imports)]
#[path = "../tests/it/support/mod.rs"]
mod support;

mod common;

use std::time::{Duration, Instant};

use common::{InProcessAgent, Samples, Site, SiteSettings, latency_header, ms};
use edra::plugin::proto::dra_v1 as v1;
use edra::plugin::proto::dra_v1::dra_plugin_client::DraPluginClient;
use support::apiserver::Options;
use tonic::transport::Channel;

/// Claims measured one per call (each a distinct claim, prepared then unprepared).
const SINGLE: usize = 1000;
/// Claims per call in the batch measurement, and how many such calls.
const BATCH: usize = 32;
const BATCH_CALLS: usize = 50;
const WARMUP: usize = 40;

#[tokio::main]
async fn main() {
    println!("# edra prepare benchmark (agent in-process, gRPC over a Unix socket, API server on loopback HTTPS)\n");
    single(8).await;
    batch().await;
}

async fn prepare(client: &mut DraPluginClient<Channel>, claims: Vec<v1::Claim>) -> Duration {
    let n = claims.len();
    let start = Instant::now();
    let answer = client
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims })
        .await
        .expect("NodePrepareResources")
        .into_inner();
    let took = start.elapsed();
    assert_eq!(answer.claims.len(), n, "one answer per claim");
    for (uid, r) in &answer.claims {
        assert!(r.error.is_empty(), "prepare of {uid} failed: {}", r.error);
        assert!(!r.devices.is_empty(), "prepare of {uid} returned no devices");
    }
    took
}

async fn unprepare(client: &mut DraPluginClient<Channel>, claims: Vec<v1::Claim>) -> Duration {
    let start = Instant::now();
    let answer = client
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims })
        .await
        .expect("NodeUnprepareResources")
        .into_inner();
    let took = start.elapsed();
    for (uid, r) in &answer.claims {
        assert!(r.error.is_empty(), "unprepare of {uid} failed: {}", r.error);
    }
    took
}

async fn ready_site(gpus: u32) -> (Site, InProcessAgent, DraPluginClient<Channel>) {
    let site = Site::new(Options::default(), SiteSettings { gpus, ..SiteSettings::default() }).await;
    let agent = InProcessAgent::start(site.config.clone());
    site.wait_published(gpus as usize, Duration::from_secs(30)).await;
    common::register(&site.registration_socket()).await;
    let client = support::kubelet::dra_v1(&site.dra_socket()).await;
    (site, agent, client)
}

/// One claim per call: prepare (API GET + sled + CDI), repeated prepare (sled only), unprepare.
async fn single(gpus: u32) {
    let (site, agent, mut client) = ready_site(gpus).await;
    let (mut first, mut again, mut release) = (Samples::default(), Samples::default(), Samples::default());
    let mut gets = 0usize;
    let mut server_get = Samples::default();
    let total = WARMUP + SINGLE;
    let mut i = 0;
    while i < total {
        let wave: Vec<v1::Claim> = (i..(i + gpus as usize).min(total))
            .map(|k| site.claim(&format!("c{k}"), &[format!("gpu-{}", k % gpus as usize)]))
            .collect();
        let measured = i >= WARMUP;
        let mark = site.server.request_mark();
        for c in &wave {
            let d = prepare(&mut client, vec![c.clone()]).await;
            if measured {
                first.push(d);
            }
        }
        if measured {
            let log = site.server.requests();
            for r in log.iter().skip(mark) {
                gets += 1;
                assert_eq!(r.verb, "get", "only claim GETs expected while preparing: {} {}", r.method, r.path);
                server_get.push(r.duration);
            }
        }
        let mark = site.server.request_mark();
        for c in &wave {
            let d = prepare(&mut client, vec![c.clone()]).await;
            if measured {
                again.push(d);
            }
        }
        assert_eq!(site.server.request_mark(), mark, "a repeated prepare must not ask the API server");
        for c in &wave {
            let d = unprepare(&mut client, vec![c.clone()]).await;
            if measured {
                release.push(d);
            }
        }
        i += wave.len();
    }
    println!("## One claim per call ({SINGLE} distinct claims, mock GPUs = {gpus}, after {WARMUP} warm-up claims)\n");
    println!("{}", latency_header());
    println!("{}", first.row("prepare (API GET + sled + CDI spec)"));
    println!("{}", again.row("repeated prepare of a prepared claim (sled)"));
    println!("{}", release.row("unprepare"));
    println!("{}", server_get.row("  of which: server time to answer the GET"));
    println!();
    println!(
        "API requests per prepare: {:.2} (GET of the claim); per repeated prepare and unprepare: 0\n",
        gets as f64 / SINGLE as f64
    );
    agent.stop();
}

/// One call with 32 claims (mock GPUs = 32), prepared then unprepared.
async fn batch() {
    let (site, agent, mut client) = ready_site(BATCH as u32).await;
    let (mut prep, mut again, mut release) = (Samples::default(), Samples::default(), Samples::default());
    for call in 0..(BATCH_CALLS + 2) {
        let claims: Vec<v1::Claim> =
            (0..BATCH).map(|k| site.claim(&format!("b{call}-{k}"), &[format!("gpu-{k}")])).collect();
        let p = prepare(&mut client, claims.clone()).await;
        let a = prepare(&mut client, claims.clone()).await;
        let u = unprepare(&mut client, claims).await;
        if call >= 2 {
            prep.push(p);
            again.push(a);
            release.push(u);
        }
    }
    println!("## {BATCH} claims per call ({BATCH_CALLS} calls, mock GPUs = {BATCH}, after 2 warm-up calls)\n");
    println!("{}", latency_header());
    println!("{}", prep.row("prepare, 32 claims"));
    println!("{}", again.row("repeated prepare, 32 claims"));
    println!("{}", release.row("unprepare, 32 claims"));
    println!();
    println!("per claim in a 32-claim call: prepare p50 {:.3} ms", ms(prep.percentile(50.0)) / BATCH as f64);
    agent.stop();
}
