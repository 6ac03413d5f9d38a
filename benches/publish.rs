//! ResourceSlice publishing: API traffic of the first publish, writes at an accelerated
//! steady state, how fast a wiped pool is repaired, and how fast an injected fatal XID
//! becomes a device taint in the API server. The agent (`edra::app::run`) runs
//! in-process on its own two-thread runtime against the test API server on loopback HTTPS.
//! Prints tables; `cargo bench --bench publish`.

#[allow(unused_imports)]
#[path = "../tests/it/support/mod.rs"]
mod support;

mod common;

use std::time::{Duration, Instant};

use common::{DRIVER, InProcessAgent, NODE, Samples, Site, SiteSettings, latency_header, verb_table};
use support::apiserver::Options;

const GPUS: usize = 8;
/// Real time the accelerated steady state runs.
const STEADY: Duration = Duration::from_secs(30);
/// Forced watch reconnects (`close_watches`) during the steady state: one per second.
const RECONNECT_EVERY: Duration = Duration::from_secs(1);
const WIPES: usize = 30;
/// Rounds of XID injections, one per GPU each.
const XID_ROUNDS: usize = 4;

#[tokio::main]
async fn main() {
    println!("# edra publish benchmark (agent in-process, API server on loopback HTTPS, node credentials)\n");
    let opts = Options { bookmark_interval: Duration::from_millis(100), ..Options::default() };
    let settings =
        SiteSettings { gpus: GPUS as u32, rediscovery: "1s", health_events: true, ..SiteSettings::default() };
    let site = Site::new(opts, settings).await;

    // (a) First publish: from agent start to all devices published.
    let start = Instant::now();
    let agent = InProcessAgent::start(site.config.clone()).await;
    site.wait_published(GPUS, Duration::from_secs(30)).await;
    let took = start.elapsed();
    // Let the post-write re-plan and the watch echo finish before reading the log.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = site.server.requests();
    let slices = site.server.with_state(|s| s.slices_on(NODE).len());
    println!("## (a) First publish of {GPUS} mock GPUs ({slices} ResourceSlice), agent start → published\n");
    println!("time to published: {:.1} ms\n", took.as_secs_f64() * 1000.0);
    println!("{}\n", verb_table(&log, 0));
    println!(
        "watch stream bytes so far: {}; TCP connections: {}\n",
        site.server.with_state(|s| s.watch_bytes()),
        site.server.with_state(|s| s.connections_accepted())
    );

    // (b) Accelerated steady state.
    let mark = site.server.request_mark();
    let watch_bytes = site.server.with_state(|s| s.watch_bytes());
    let rv = site.server.with_state(|s| s.resource_version());
    let steady_start = Instant::now();
    let mut reconnects = 0;
    while steady_start.elapsed() < STEADY {
        tokio::time::sleep(RECONNECT_EVERY).await;
        site.server.close_watches();
        reconnects += 1;
    }
    let log = site.server.requests();
    let writes = site.server.writes_since(mark);
    println!(
        "## (b) Steady state, accelerated: {}s real time, rediscovery every second (the shortest publish.rediscovery_interval, ~{} runs), bookmarks every 100 ms, {reconnects} forced watch reconnects\n",
        STEADY.as_secs(),
        STEADY.as_secs()
    );
    println!("{}\n", verb_table(&log, mark));
    println!(
        "writes: {writes} (target 0); resourceVersion unchanged: {}; watch stream bytes: {}\n",
        site.server.with_state(|s| s.resource_version()) == rv,
        site.server.with_state(|s| s.watch_bytes()) - watch_bytes
    );

    // (c) Kubelet-style wipe → repaired.
    let mut repair = Samples::default();
    let mut repair_writes = Vec::new();
    for _ in 0..WIPES {
        let mark = site.server.request_mark();
        let wiped = site.server.delete_slices_where(NODE, Some(DRIVER));
        assert!(wiped > 0, "nothing to wipe");
        let t = Instant::now();
        site.wait_published(GPUS, Duration::from_secs(10)).await;
        repair.push(t.elapsed());
        // Space the wipes out so each repair (and its re-plan) is complete.
        tokio::time::sleep(Duration::from_millis(300)).await;
        repair_writes.push(site.server.writes_since(mark));
    }
    println!("## (c) Repair after a kubelet-style wipe of the pool ({WIPES} wipes)\n");
    println!("{}", latency_header());
    println!("{}", repair.row("wipe → all devices published again"));
    println!();
    println!(
        "writes per repair: min {} max {} (the publisher debounces events for 100 ms before planning)\n",
        repair_writes.iter().min().copied().unwrap_or(0),
        repair_writes.iter().max().copied().unwrap_or(0)
    );

    // (d) Injected XID 79 → the GPU's taint in the API server.
    let tainted = |s: &support::apiserver::State, device: &str| {
        s.slices_on(NODE).iter().flat_map(|sl| sl["spec"]["devices"].as_array().cloned().unwrap_or_default()).any(|d| {
            d["name"] == device
                && d["taints"].as_array().is_some_and(|t| t.iter().any(|t| t["key"] == "gpu.edra.dev/xid"))
        })
    };
    let mut taint = Samples::default();
    let mut clear = Samples::default();
    for _ in 0..XID_ROUNDS {
        for gpu in 0..GPUS {
            let device = format!("gpu-{gpu}");
            let t = Instant::now();
            site.inject(&format!("xid {gpu} 79"));
            site.server.wait_for("the taint", Duration::from_secs(10), |s| tainted(s, &device)).await.expect("tainted");
            taint.push(t.elapsed());
        }
        let t = Instant::now();
        site.server
            .wait_for("recovery", Duration::from_secs(20), |s| (0..GPUS).all(|g| !tainted(s, &format!("gpu-{g}"))))
            .await
            .expect("recovered");
        clear.push(t.elapsed());
    }
    println!(
        "## (d) GPU health: injected XID 79 (mock events file) → taint in the API server ({} injections)\n",
        taint.0.len()
    );
    println!("{}", latency_header());
    println!("{}", taint.row("XID 79 appended → NoSchedule taint visible"));
    println!("{}", clear.row("last taint visible → all gone (quiet 1 s)"));
    println!();
    agent.stop();
}
