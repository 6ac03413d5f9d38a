//! GPU health end to end: events injected through the mock backend's events file become
//! device taints in the test API server, clear again after the quiet period, survive a
//! restart with their `timeAdded`, reach the kubelet's health stream, and are written only
//! once to a server that drops them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use edra::plugin::proto::health_v1alpha1 as health;
use edra::plugin::proto::registration::InfoRequest;
use serde_json::Value;

use crate::support::agent::{Agent, CapturedLogs, ChildAgent, Cluster, DRIVER, GPUS, NODE, WAIT};
use crate::support::apiserver::{ApiVersion, Options};
use crate::support::kubelet;

const XID_KEY: &str = "gpu.edra.dev/xid";
const LOST_KEY: &str = "gpu.edra.dev/gpu-lost";

/// The `[mock]` body (plus a `[health]` section) for 4 GPUs whose events come from `events`.
fn mock(events: &Path, quiet: &str, extra_mock: &str) -> String {
    format!(
        "gpus = {GPUS}\nevents_file = \"{}\"\n{extra_mock}\n[health]\nprobe_interval = \"100ms\"\nquiet_period = \"{quiet}\"\n",
        events.display()
    )
}

fn events_file(cluster: &Cluster) -> PathBuf {
    let path = cluster.dir.path().join("gpu-events");
    std::fs::write(&path, "").expect("create the events file");
    path
}

fn inject(path: &Path, line: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(path).expect("open the events file");
    writeln!(f, "{line}").expect("append an event");
}

/// The taints of device `name` across `slices`.
fn taints_of(slices: &[Value], name: &str) -> Vec<Value> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .filter(|d| d["name"] == name)
        .flat_map(|d| d["taints"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn has_taint(slices: &[Value], device: &str, key: &str) -> bool {
    taints_of(slices, device).iter().any(|t| t["key"] == key)
}

async fn wait_taint(cluster: &Cluster, device: &str, key: &str, present: bool) {
    let what = format!("{device} {} {key}", if present { "tainted with" } else { "free of" });
    cluster
        .server
        .wait_for(&what, WAIT, |s| has_taint(&s.slices_on(NODE), device, key) == present)
        .await
        .expect("the taint changes");
}

#[tokio::test]
async fn a_fatal_xid_taints_the_gpu_within_a_second_and_an_ignored_one_does_not() {
    let cluster = Cluster::start().await;
    let events = events_file(&cluster);
    let agent = Agent::start(cluster.fs(), cluster.config_with(NODE, &mock(&events, "5m", ""))).await;
    cluster.wait_published(NODE, GPUS).await;

    inject(&events, "xid 0 13");
    let injected = Instant::now();
    inject(&events, "xid 1 79");
    wait_taint(&cluster, "gpu-1", XID_KEY, true).await;
    let elapsed = injected.elapsed();
    println!("injected XID 79 -> taint visible in the API server after {} ms", elapsed.as_millis());
    assert!(elapsed < Duration::from_secs(1), "the taint took {elapsed:?}");

    let slices = cluster.slices_on(NODE);
    let taint = &taints_of(&slices, "gpu-1")[0];
    assert_eq!(taint["value"], "79");
    assert_eq!(taint["effect"], "NoSchedule");
    assert!(taint["timeAdded"].as_str().is_some_and(|t| t.ends_with('Z')), "{taint}");
    assert!(taints_of(&slices, "gpu-0").is_empty(), "XID 13 is an application error: {slices:?}");
    assert!(taints_of(&slices, "gpu-2").is_empty());
    let generations: Vec<&Value> = slices.iter().map(|s| &s["spec"]["pool"]["generation"]).collect();
    assert!(generations.windows(2).all(|w| w[0] == w[1]));
    agent.stop().await;
}

#[tokio::test]
async fn a_lost_gpu_taints_every_device_of_it_until_it_is_back_for_the_quiet_period() {
    let cluster = Cluster::start().await;
    let events = events_file(&cluster);
    let mig = "mig = [{ gpu = 0, profiles = [\"1g.10gb\", \"1g.10gb\"] }]";
    let agent = Agent::start(cluster.fs(), cluster.config_with(NODE, &mock(&events, "1s", mig))).await;
    cluster
        .server
        .wait_for("the pool", WAIT, |s| crate::support::agent::device_names(&s.slices_on(NODE)).len() == GPUS + 1)
        .await
        .expect("published");
    let names = crate::support::agent::device_names(&cluster.slices_on(NODE));
    let mig_devices: Vec<&String> = names.iter().filter(|n| n.starts_with("gpu-0-mig-")).collect();
    assert_eq!(mig_devices.len(), 2, "{names:?}");

    let lost = Instant::now();
    inject(&events, "lost 0");
    cluster
        .server
        .wait_for("every device of GPU 0 lost", WAIT, |s| {
            let slices = s.slices_on(NODE);
            mig_devices.iter().all(|d| has_taint(&slices, d, LOST_KEY))
        })
        .await
        .expect("tainted");
    let slices = cluster.slices_on(NODE);
    for other in ["gpu-1", "gpu-2", "gpu-3"] {
        assert!(taints_of(&slices, other).is_empty(), "{other} is healthy");
    }

    // Back: the probe answers again, and the taint goes once no critical event (the loss, a
    // failed probe) came for the quiet second. The last failed probe came before "back" was
    // read, on a busy machine by more than a probe interval: the clear comes at least a
    // second after the loss.
    inject(&events, "back 0");
    cluster
        .server
        .wait_for("GPU 0 recovered", WAIT, |s| {
            let slices = s.slices_on(NODE);
            mig_devices.iter().all(|d| taints_of(&slices, d).is_empty())
        })
        .await
        .expect("recovered");
    assert!(lost.elapsed() >= Duration::from_secs(1), "recovered before the quiet period: {:?}", lost.elapsed());

    // An XID clears the same way.
    inject(&events, "xid 1 79");
    wait_taint(&cluster, "gpu-1", XID_KEY, true).await;
    wait_taint(&cluster, "gpu-1", XID_KEY, false).await;
    agent.stop().await;
}

#[tokio::test]
async fn nvml_saying_no_recovery_is_needed_removes_an_xid_taint_before_the_quiet_period() {
    let cluster = Cluster::start().await;
    let events = events_file(&cluster);
    let agent = Agent::start(cluster.fs(), cluster.config_with(NODE, &mock(&events, "1h", ""))).await;
    cluster.wait_published(NODE, GPUS).await;
    inject(&events, "recovery 0 1");
    inject(&events, "xid 0 79");
    wait_taint(&cluster, "gpu-0", XID_KEY, true).await;
    inject(&events, "recovery 0 0");
    wait_taint(&cluster, "gpu-0", XID_KEY, false).await;
    agent.stop().await;
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

#[tokio::test]
async fn a_restart_keeps_the_taint_and_its_time_added() {
    let cluster = Cluster::start().await;
    let events = events_file(&cluster);
    let config = cluster.config_with(NODE, &mock(&events, "5m", ""));
    let agent = Agent::start(cluster.fs(), config.clone()).await;
    cluster.wait_published(NODE, GPUS).await;
    inject(&events, "xid 2 79");
    wait_taint(&cluster, "gpu-2", XID_KEY, true).await;
    let before = taints_of(&cluster.slices_on(NODE), "gpu-2")[0]["timeAdded"].clone();
    agent.stop().await;
    assert!(cluster.fs().state_dir().join("health.json").exists());

    // A later second, so a reset time would differ; then the kubelet wipes the pool and
    // the new agent publishes it again from nothing but its own state.
    let started = unix_now();
    while unix_now() == started {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let removed = cluster.server.delete_slices_where(NODE, Some(DRIVER));
    assert!(removed > 0);
    let agent = Agent::start(cluster.fs(), config).await;
    cluster.wait_published(NODE, GPUS).await;
    wait_taint(&cluster, "gpu-2", XID_KEY, true).await;
    let after = taints_of(&cluster.slices_on(NODE), "gpu-2")[0]["timeAdded"].clone();
    assert_eq!(after, before, "timeAdded survives the restart");
    agent.stop().await;
}

#[tokio::test]
async fn the_kubelet_health_stream_reports_unhealthy_then_healthy() {
    let cluster = Cluster::start().await;
    let events = events_file(&cluster);
    let agent = Agent::start(cluster.fs(), cluster.config_with(NODE, &mock(&events, "1s", ""))).await;
    let info = kubelet::registration(&cluster.fs().registration_socket())
        .await
        .get_info(InfoRequest {})
        .await
        .expect("GetInfo")
        .into_inner();
    assert!(info.supported_versions.iter().any(|v| v == "v1alpha1.DRAResourceHealth"), "{info:?}");

    let mut client = kubelet::health_v1alpha1(&cluster.fs().dra_socket()).await;
    let mut stream =
        client.node_watch_resources(health::NodeWatchResourcesRequest {}).await.expect("open the stream").into_inner();
    let state = |m: &health::NodeWatchResourcesResponse, device: &str| {
        m.devices
            .iter()
            .find(|d| d.device.as_ref().is_some_and(|i| i.device_name == device && i.pool_name == NODE))
            .map(|d| (d.health, d.message.clone()))
    };
    let first = next_message(&mut stream).await;
    assert_eq!(first.devices.len(), GPUS, "the complete list");
    assert_eq!(state(&first, "gpu-3").map(|s| s.0), Some(health::HealthStatus::Healthy as i32));

    inject(&events, "xid 3 79");
    let unhealthy = loop {
        let m = next_message(&mut stream).await;
        if state(&m, "gpu-3").is_some_and(|s| s.0 == health::HealthStatus::Unhealthy as i32) {
            break m;
        }
    };
    let (_, message) = state(&unhealthy, "gpu-3").expect("gpu-3");
    assert_eq!(message, "NVML reported critical XID 79 (GPU has fallen off the bus)");
    // Three times the 10 s resend period (the probe interval here is shorter).
    assert!(unhealthy.devices.iter().all(|d| d.health_check_timeout_seconds == 30), "{unhealthy:?}");
    assert_eq!(state(&unhealthy, "gpu-0").map(|s| s.0), Some(health::HealthStatus::Healthy as i32));
    loop {
        let m = next_message(&mut stream).await;
        if state(&m, "gpu-3").is_some_and(|s| s.0 == health::HealthStatus::Healthy as i32) {
            break;
        }
    }
    agent.stop().await;
}

#[tokio::test]
async fn a_server_that_drops_taints_is_written_once() {
    let options = Options { git_version: "v1.32.4".into(), versions: vec![ApiVersion::V1beta1], ..Options::default() };
    let cluster = Cluster::start_with(options).await;
    cluster.server.set_device_taints(false);
    let (logs, _guard) = CapturedLogs::start();
    let events = events_file(&cluster);
    let agent = Agent::start(cluster.fs(), cluster.config_with(NODE, &mock(&events, "5m", ""))).await;
    cluster.wait_published(NODE, GPUS).await;
    let mark = cluster.server.with_state(|s| s.request_mark());

    inject(&events, "xid 0 79");
    cluster.server.wait_for("a write of the taint", WAIT, |s| s.writes_since(mark) > 0).await.expect("one write");
    let more = cluster.server.wait_for("a second write", Duration::from_secs(1), |s| s.writes_since(mark) > 1).await;
    assert!(more.is_err(), "the dropped taint is not written again");
    assert!(taints_of(&cluster.slices_on(NODE), "gpu-0").is_empty());
    let text = logs.text();
    assert_eq!(text.matches("dropped the device taints").count(), 1, "{text}");
    agent.stop().await;
}

#[tokio::test]
async fn informational_taints_go_only_to_servers_that_know_the_none_effect() {
    for (git_version, expected) in [("v1.36.2", true), ("v1.34.3", false)] {
        let cluster = Cluster::start_with(Options { git_version: git_version.into(), ..Options::default() }).await;
        let events = events_file(&cluster);
        let agent = Agent::start(cluster.fs(), cluster.config_with(NODE, &mock(&events, "5m", ""))).await;
        cluster.wait_published(NODE, GPUS).await;
        // GPU 0 unmonitored (informational), then GPU 1's fatal XID as the marker that
        // both were published.
        inject(&events, "unmonitored 0");
        inject(&events, "xid 1 79");
        wait_taint(&cluster, "gpu-1", XID_KEY, true).await;
        let slices = cluster.slices_on(NODE);
        let unmonitored = taints_of(&slices, "gpu-0");
        assert_eq!(!unmonitored.is_empty(), expected, "{git_version}: {unmonitored:?}");
        if expected {
            assert_eq!(
                (&unmonitored[0]["key"], &unmonitored[0]["effect"]),
                (&"gpu.edra.dev/unmonitored".into(), &"None".into())
            );
        }
        let failed =
            cluster.server.with_state(|s| s.requests().iter().filter(|r| r.is_write() && r.status >= 400).count());
        assert_eq!(failed, 0, "{git_version}: no write was refused");
        agent.stop().await;
    }
}

#[tokio::test]
async fn the_real_binary_is_driven_sick_survives_kill_9_with_its_taint_and_recovers() {
    let cluster = Cluster::start().await;
    let events = events_file(&cluster);
    let config = cluster.config_file_with(NODE, &mock(&events, "1h", ""));
    let mut agent = ChildAgent::start_configured(&cluster, &config, "", &[]).await;
    cluster.wait_published(NODE, GPUS).await;
    inject(&events, "xid 3 94");
    wait_taint(&cluster, "gpu-3", XID_KEY, true).await;
    let before = taints_of(&cluster.slices_on(NODE), "gpu-3")[0].clone();
    agent.kill().await;

    let started = unix_now();
    while unix_now() == started {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.server.delete_slices_where(NODE, Some(DRIVER));
    let agent = ChildAgent::start_configured(&cluster, &config, "", &[]).await;
    wait_taint(&cluster, "gpu-3", XID_KEY, true).await;
    assert_eq!(taints_of(&cluster.slices_on(NODE), "gpu-3")[0], before, "the same taint, timeAdded included");
    assert!(agent.stderr().contains("GPU condition kept from before the restart"), "{}", agent.stderr());

    inject(&events, "recovery 3 0");
    wait_taint(&cluster, "gpu-3", XID_KEY, false).await;
    agent.terminate().await;
}

/// The next message of a health stream, within [`WAIT`].
async fn next_message(
    stream: &mut tonic::Streaming<health::NodeWatchResourcesResponse>,
) -> health::NodeWatchResourcesResponse {
    match tokio::time::timeout(WAIT, stream.message()).await {
        Ok(Ok(Some(m))) => m,
        other => panic!("no health message: {other:?}"),
    }
}
