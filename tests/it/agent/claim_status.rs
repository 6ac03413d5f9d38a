//! ResourceClaim `status.devices` written by the real binary: edra's entries (Ready, a
//! Healthy condition that follows the GPU, data naming the GPU and the share) after a
//! prepare, beside another driver's entries that stay, turned by an XID, removed at
//! unprepare; a server that refuses or drops the field gets one warning and no more writes,
//! and prepares never wait for it.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::agent::{ChildAgent, Cluster, DRIVER, GPUS, NODE, WAIT, prepare_ok, unprepare_ok};
use crate::support::apiserver::{AllocatedDevice, ClaimBuilder};

const SHARE: &str = "6de5d941-c79d-4a8a-ba10-668351620525";

fn mock(events: &Path) -> String {
    format!(
        "gpus = {GPUS}\nevents_file = \"{}\"\n[health]\nprobe_interval = \"100ms\"\nquiet_period = \"1h\"\n",
        events.display()
    )
}

/// edra's entries in claim `name`'s status.
fn entries(cluster: &Cluster, name: &str) -> Vec<Value> {
    let claim = cluster.server.with_state(|s| s.claim("default", name)).expect("the claim");
    claim["status"]["devices"].as_array().into_iter().flatten().filter(|e| e["driver"] == DRIVER).cloned().collect()
}

async fn until(what: &str, ready: impl Fn() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < WAIT, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn condition<'a>(entry: &'a Value, kind: &str) -> &'a Value {
    entry["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == kind).expect("the condition")
}

fn status_patches(cluster: &Cluster) -> usize {
    cluster
        .server
        .with_state(|s| s.requests().iter().filter(|r| r.verb == "patch" && r.path.ends_with("/status")).count())
}

#[tokio::test]
async fn edras_entries_follow_prepare_health_and_unprepare_and_leave_other_drivers_alone() {
    let cluster = Cluster::start().await;
    cluster.server.grant_claim_status();
    let events = cluster.dir.path().join("gpu-events");
    std::fs::write(&events, "").unwrap();
    let config = cluster.config_file_with(NODE, &mock(&events));
    let agent = ChildAgent::start_configured(&cluster, &config, "", &[]).await;
    let mut v1 = agent.v1().await;
    let claim = cluster.put_claim(
        ClaimBuilder::new("default", "mixed")
            .allocated(AllocatedDevice::new("whole", DRIVER, NODE, "gpu-2"))
            .allocated(AllocatedDevice::new("share", DRIVER, NODE, "gpu-0").share(SHARE, "10Gi"))
            .allocated(AllocatedDevice::new("nic", "net.example.com", NODE, "eth1"))
            .reserved_for_pod("p", "uid-of-p"),
    );
    let other = json!({"driver": "net.example.com", "pool": NODE, "device": "eth1",
                       "conditions": [{"type": "Ready", "status": "True", "reason": "Up", "message": "",
                                       "lastTransitionTime": "2026-12-04T00:00:00Z"}]});
    cluster.server.put_device_status("default", "mixed", "net-driver", other.clone());
    let started = Instant::now();
    prepare_ok(&mut v1, &claim).await;
    assert!(started.elapsed() < Duration::from_secs(1), "the prepare does not wait for the status write");
    until("edra's two entries", || entries(&cluster, "mixed").len() == 2).await;
    let all = entries(&cluster, "mixed");
    let whole = all.iter().find(|e| e["device"] == "gpu-2").unwrap();
    assert_eq!(condition(whole, "Ready")["status"], "True");
    assert_eq!(condition(whole, "Healthy")["status"], "True");
    assert!(whole["data"]["gpuUUID"].as_str().is_some_and(|u| u.starts_with("GPU-")), "{whole}");
    assert_eq!(whole["data"]["sharingStrategy"], "Exclusive");
    let share = all.iter().find(|e| e["device"] == "gpu-0").unwrap();
    assert_eq!((share["shareID"].as_str(), share["data"]["memory"].as_str()), (Some(SHARE), Some("10Gi")));
    let stored = cluster.server.with_state(|s| s.claim("default", "mixed")).unwrap();
    assert!(stored["status"]["devices"].as_array().unwrap().contains(&other), "the other driver's entry stays");

    // An XID on gpu-2 turns its Healthy condition; the share's stays.
    std::fs::write(&events, "xid 2 79\n").unwrap();
    until("gpu-2 unhealthy in the claim", || {
        entries(&cluster, "mixed")
            .iter()
            .any(|e| e["device"] == "gpu-2" && condition(e, "Healthy")["status"] == "False")
    })
    .await;
    let all = entries(&cluster, "mixed");
    let sick = condition(all.iter().find(|e| e["device"] == "gpu-2").unwrap(), "Healthy");
    assert_eq!(sick["reason"], "Xid");
    assert_eq!(sick["message"], "NVML reported critical XID 79 (GPU has fallen off the bus)");
    assert_eq!(condition(all.iter().find(|e| e["device"] == "gpu-0").unwrap(), "Healthy")["status"], "True");

    unprepare_ok(&mut v1, &claim).await;
    until("edra's entries removed", || entries(&cluster, "mixed").is_empty()).await;
    let stored = cluster.server.with_state(|s| s.claim("default", "mixed")).unwrap();
    assert_eq!(stored["status"]["devices"], json!([other]), "only the other driver's entry is left");
    // Quiet at rest: nothing more is written.
    let patches = status_patches(&cluster);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(status_patches(&cluster), patches);
    drop(agent);
}

#[tokio::test]
async fn without_permission_one_warning_and_prepares_are_unaffected() {
    let cluster = Cluster::start().await;
    let agent = ChildAgent::start(&cluster, "").await;
    let mut v1 = agent.v1().await;
    for (name, device) in [("a", "gpu-0"), ("b", "gpu-1"), ("c", "gpu-2")] {
        prepare_ok(&mut v1, &cluster.reserved_claim(name, device)).await;
    }
    until("a status write tried", || status_patches(&cluster) > 0).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(status_patches(&cluster), 1, "one refused write, then none: no retry storm");
    let log = agent.stderr();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("edra may not write ResourceClaim status")).collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(warnings[0].contains("config/rbac.yaml") && warnings[0].contains("arbitrary-node:patch"), "{log}");
    prepare_ok(&mut v1, &cluster.reserved_claim("d", "gpu-3")).await;
    drop(agent);
}

#[tokio::test]
async fn a_server_that_drops_the_field_gets_one_warning_and_no_more_writes() {
    let cluster = Cluster::start().await;
    cluster.server.grant_claim_status();
    cluster.server.drop_device_status();
    let agent = ChildAgent::start(&cluster, "").await;
    let mut v1 = agent.v1().await;
    prepare_ok(&mut v1, &cluster.reserved_claim("a", "gpu-0")).await;
    until("a status write tried", || status_patches(&cluster) > 0).await;
    prepare_ok(&mut v1, &cluster.reserved_claim("b", "gpu-1")).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(status_patches(&cluster), 1);
    let log = agent.stderr();
    assert_eq!(log.matches("drops ResourceClaim status.devices").count(), 1, "{log}");
    drop(agent);
}
