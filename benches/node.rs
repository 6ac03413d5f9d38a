//! The agent as a process (`edra run`, the release binary) on this machine's own GPUs
//! (`BENCH_BACKEND=nvml`) or on the mock (the default), against the test API server on
//! loopback HTTPS, with the kubelet's calls over the real Unix sockets: start-up and
//! publication, first-time prepare and unprepare of whole-GPU claims, two memory shares of
//! one GPU at once (each CDI spec checked for the GPU's UUID and its device node), and the
//! agent's memory. Prints tables; `cargo bench --bench node` (docs/benchmarks.md), or on a
//! GPU host: `BENCH_BACKEND=nvml BENCH_BINARY=<release edra> <bench binary>`.

#[allow(unused_imports)]
#[path = "../tests/it/support/mod.rs"]
mod support;

mod common;

use std::time::{Duration, Instant};

use common::{Samples, Site, SiteSettings, latency_header, release_binary};
use edra::plugin::proto::dra_v1 as v1;
use serde_json::Value;
use support::apiserver::Options;

/// Whole-GPU claims prepared and unprepared, one per call.
const ROUNDS: usize = 200;

fn published(site: &Site) -> Vec<Value> {
    site.server.with_state(|s| {
        s.slices_on(common::NODE)
            .iter()
            .flat_map(|sl| sl["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .collect()
    })
}

fn vm(pid: u32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find(|l| l.starts_with(key)).map_or("?".into(), |l| l[key.len() + 1..].trim().to_string())
}

#[tokio::main]
async fn main() {
    let backend: &'static str = match std::env::var("BENCH_BACKEND").as_deref() {
        Ok("nvml") => "nvml",
        _ => "mock",
    };
    let bin = release_binary();
    println!("# edra on this node's devices ({backend} backend, {} as a child process)\n", bin.display());
    let settings = SiteSettings { gpus: 2, backend, log_level: "info", ..SiteSettings::default() };
    let site = Site::new(Options::default(), settings).await;
    println!("Layout: {}\n", site.layout_note);
    let start = Instant::now();
    let mut child = common::spawn_release(&site);
    let pid = child.id();
    let log = || std::fs::read_to_string(site.dir.path().join("edra.log")).unwrap_or_default();
    while !site.registration_socket().exists() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("edra exited ({status}) before serving the kubelet:\n{}", log());
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no registration socket after 30 s:\n{}", log());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let socket_at = start.elapsed();
    common::register(&site.registration_socket()).await;
    site.server
        .wait_for("slices published", Duration::from_secs(30), |s| !s.slices_on(common::NODE).is_empty())
        .await
        .unwrap_or_else(|e| panic!("no slices: {e}\n{}", log()));
    let published_at = start.elapsed();
    let devices = published(&site);
    println!("| milestone | ms |\n|---|---:|");
    println!("| registration socket exists | {:.1} |", socket_at.as_secs_f64() * 1e3);
    println!("| slices published | {:.1} |\n", published_at.as_secs_f64() * 1e3);
    println!("Published devices:\n");
    for d in &devices {
        let a = &d["attributes"];
        println!(
            "- {}: {} {} memory {} (shareable: {})",
            d["name"].as_str().unwrap_or("?"),
            a["productName"]["string"].as_str().unwrap_or("?"),
            a["uuid"]["string"].as_str().unwrap_or("?"),
            d["capacity"]["memory"]["value"].as_str().unwrap_or("?"),
            d["allowMultipleAllocations"].as_bool().unwrap_or(false)
        );
    }
    let gpu = devices.first().and_then(|d| d["name"].as_str()).expect("a published device").to_string();
    let uuid = devices[0]["attributes"]["uuid"]["string"].as_str().unwrap_or_default().to_string();

    let mut client = support::kubelet::dra_v1(&site.dra_socket()).await;
    let (mut prep, mut release) = (Samples::default(), Samples::default());
    for i in 0..ROUNDS {
        let claim = site.claim(&format!("c{i}"), std::slice::from_ref(&gpu));
        let t = Instant::now();
        let answer = client
            .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![claim.clone()] })
            .await
            .expect("NodePrepareResources")
            .into_inner();
        prep.push(t.elapsed());
        let r = answer.claims.get(&claim.uid).expect("an answer");
        assert!(r.error.is_empty(), "prepare failed: {}\n{}", r.error, log());
        if i == 0 {
            check_spec(&site, &claim.uid, &uuid);
        }
        let t = Instant::now();
        let answer = client
            .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: vec![claim.clone()] })
            .await
            .expect("NodeUnprepareResources")
            .into_inner();
        release.push(t.elapsed());
        assert!(answer.claims.get(&claim.uid).is_some_and(|r| r.error.is_empty()), "unprepare failed\n{}", log());
        site.server.delete_claim(common::NAMESPACE, &format!("c{i}"));
    }
    println!("\n## Whole-GPU claims of {gpu}, {ROUNDS} rounds (ms)\n");
    println!("{}", latency_header());
    println!("{}", prep.row("first-time prepare"));
    println!("{}", release.row("unprepare"));

    let (a, b) = (site.claim_share("share-a", &gpu, "1Gi"), site.claim_share("share-b", &gpu, "2Gi"));
    let t = Instant::now();
    let answer = client
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![a.clone(), b.clone()] })
        .await
        .expect("NodePrepareResources")
        .into_inner();
    let took = t.elapsed();
    let ids: Vec<Vec<String>> = [&a, &b]
        .iter()
        .map(|c| {
            let r = answer.claims.get(&c.uid).expect("an answer");
            assert!(r.error.is_empty(), "share prepare failed: {}\n{}", r.error, log());
            r.devices.iter().flat_map(|d| d.cdi_device_ids.clone()).collect()
        })
        .collect();
    assert_ne!(ids[0], ids[1], "two shares got the same CDI device");
    check_spec(&site, &a.uid, &uuid);
    println!("\n## Two memory shares of {gpu} (1Gi, 2Gi) in one call: {:.2} ms\n", took.as_secs_f64() * 1e3);
    println!("- {}\n- {}", ids[0].join(", "), ids[1].join(", "));
    let answer = client
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: vec![a.clone(), b.clone()] })
        .await
        .expect("NodeUnprepareResources")
        .into_inner();
    assert!(answer.claims.values().all(|r| r.error.is_empty()), "share unprepare failed\n{}", log());

    println!(
        "\n## Memory of the agent\n\nVmRSS {}, VmHWM {}, threads {}",
        vm(pid, "VmRSS"),
        vm(pid, "VmHWM"),
        vm(pid, "Threads")
    );
    // SAFETY: a plain signal to our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let status = child.wait().expect("wait for edra");
    println!("edra stopped: {status}");
    let warnings: Vec<String> =
        log().lines().filter(|l| l.contains(" WARN ") || l.contains(" ERROR ")).map(str::to_string).collect();
    println!("\nWARN/ERROR lines in edra's log: {}", warnings.len());
    for w in warnings.iter().take(10) {
        println!("  {w}");
    }
}

/// The claim's CDI spec names the GPU's UUID and a device node that exists here.
fn check_spec(site: &Site, uid: &str, uuid: &str) {
    let path = site.cdi_dir.join(edra::prepare::cdi::spec_file_name(&edra::prepare::cdi::vendor(common::DRIVER), uid));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(text.contains(uuid), "the spec does not name {uuid}: {text}");
    let spec: Value = serde_json::from_str(&text).expect("the spec is JSON");
    let nodes: Vec<String> = spec["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|d| d["containerEdits"]["deviceNodes"].as_array().cloned().unwrap_or_default())
        .filter_map(|n| n["path"].as_str().map(str::to_string))
        .collect();
    let mounts = spec["containerEdits"]["mounts"].as_array().map_or(0, Vec::len);
    println!("\nCDI spec {}: device nodes {nodes:?}, {mounts} driver mounts", path.display());
}
