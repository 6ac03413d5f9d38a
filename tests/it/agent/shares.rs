//! Many claims on one GPU: shareable GPUs published with their memory policy on every
//! resource.k8s.io version, a server that drops consumable capacity gets the fallback
//! (warned once, no write loop), replicas, and shares prepared through the kubelet socket.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::agent::{Agent, CapturedLogs, Cluster, DRIVER, GPUS, NODE, WAIT, device_names, prepare};
use crate::support::apiserver::{AllocatedDevice, ApiVersion, ClaimBuilder, Options};

/// The `[mock]` body plus a `[sharing]` section.
fn with_sharing(sharing: &str) -> String {
    format!("gpus = {GPUS}\n[sharing]\n{sharing}")
}

fn device<'a>(slices: &'a [Value], name: &str) -> &'a Value {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("device {name} published: {slices:?}"))
}

#[tokio::test]
async fn shareable_gpus_carry_their_memory_policy_on_every_api_version_without_rewrites() {
    for (version, git) in
        [(ApiVersion::V1, "v1.36.2"), (ApiVersion::V1beta2, "v1.34.3"), (ApiVersion::V1beta1, "v1.34.3")]
    {
        let options = Options { git_version: git.into(), versions: vec![version], ..Options::default() };
        let cluster = Cluster::start_with(options).await;
        let mark = cluster.server.with_state(|s| s.request_mark());
        let agent =
            Agent::start(cluster.fs(), cluster.config_with(NODE, &with_sharing("memory_step = \"512Mi\""))).await;
        cluster.wait_published(NODE, GPUS).await;
        let slices = cluster.slices_on(NODE);
        let gpu = device(&slices, "gpu-0");
        assert_eq!(gpu["allowMultipleAllocations"], json!(true), "{version:?}: {gpu}");
        assert_eq!(
            gpu["capacity"]["memory"],
            json!({"value": "80Gi", "requestPolicy": {"default": "80Gi", "validRange": {"min": "512Mi", "step": "512Mi"}}}),
            "{version:?}"
        );
        assert_eq!(
            cluster.writes_until_quiet(mark).await,
            slices.len(),
            "{version:?}: one create per slice, then none"
        );
        agent.stop().await;
    }
}

#[tokio::test]
async fn a_server_that_drops_consumable_capacity_gets_the_fallback_once_with_one_warning() {
    for (fallback, expected) in [
        ("exclusive", (0..GPUS).map(|i| format!("gpu-{i}")).collect::<Vec<_>>()),
        ("replicas", (0..GPUS).flat_map(|i| (0..3).map(move |k| format!("gpu-{i}-replica-{k}"))).collect()),
    ] {
        let cluster = Cluster::start_with(Options { git_version: "v1.33.5".into(), ..Options::default() }).await;
        cluster.server.set_consumable_capacity(false);
        let (logs, _guard) = CapturedLogs::start();
        let mark = cluster.server.with_state(|s| s.request_mark());
        let sharing = with_sharing(&format!("fallback = \"{fallback}\"\nreplicas = 3"));
        let agent = Agent::start(cluster.fs(), cluster.config_with(NODE, &sharing)).await;
        cluster.wait_published(NODE, expected.len()).await;
        cluster
            .server
            .wait_for("the fallback published", WAIT, |s| device_names(&s.slices_on(NODE)) == expected)
            .await
            .expect("the fallback replaces the shareable GPUs");
        let writes = cluster.writes_until_quiet(mark).await;
        assert!(writes <= 3, "{fallback}: the first write, the fallback, at most one delete: {writes}");
        let slices = cluster.slices_on(NODE);
        assert!(device_names(&slices).iter().all(|n| device(&slices, n).get("allowMultipleAllocations").is_none()));
        let text = logs.text();
        assert_eq!(text.matches("dropped consumable capacity").count(), 1, "{text}");
        assert!(text.contains("DRAConsumableCapacity"), "{text}");
        agent.stop().await;
    }
}

#[tokio::test]
async fn replicas_are_published_with_the_gpus_uuid_and_prepared_on_their_gpu() {
    let cluster = Cluster::start().await;
    let agent =
        Agent::start(cluster.fs(), cluster.config_with(NODE, &with_sharing("mode = \"replicas\"\nreplicas = 2"))).await;
    cluster.wait_published(NODE, GPUS * 2).await;
    let slices = cluster.slices_on(NODE);
    let (r0, r1) = (device(&slices, "gpu-1-replica-0"), device(&slices, "gpu-1-replica-1"));
    assert_eq!(r0["attributes"]["uuid"], r1["attributes"]["uuid"]);
    assert_eq!(r1["attributes"]["replica"], json!({"int": 1}));
    assert_eq!(r1["capacity"]["memory"]["value"], "40Gi");
    let a = cluster.allocated_claim("a", "gpu-1-replica-0");
    let b = cluster.allocated_claim("b", "gpu-1-replica-1");
    let mut client = agent.v1().await;
    let answers = prepare(&mut client, &[a.clone(), b.clone()]).await.expect("prepare");
    for claim in [&a, &b] {
        let answer = &answers[&claim.uid];
        assert!(answer.error.is_empty(), "{}", answer.error);
        assert_eq!(answer.devices[0].device_name, format!("gpu-1-replica-{}", if claim == &a { 0 } else { 1 }));
    }
    let spec: Value = serde_json::from_slice(&std::fs::read(cluster.fs().spec_file(&a.uid)).unwrap()).unwrap();
    let nodes = &spec["devices"][0]["containerEdits"]["deviceNodes"];
    assert!(nodes[0]["path"].as_str().is_some_and(|p| p.ends_with("/nvidia1")), "{nodes}");
    agent.stop().await;
}

#[tokio::test]
async fn shares_are_prepared_through_the_kubelet_socket_with_share_ids_and_accounted() {
    let cluster = Cluster::start().await;
    let agent = Agent::start(cluster.fs(), cluster.config(NODE)).await;
    cluster.wait_published(NODE, GPUS).await;
    let share = |name: &str, id: &str, memory: &str| {
        cluster.put_claim(
            ClaimBuilder::new("default", name)
                .allocated(AllocatedDevice::new("gpu", DRIVER, NODE, "gpu-2").share(id, memory))
                .reserved_for_pod(&format!("pod-{name}"), &format!("uid-of-pod-{name}")),
        )
    };
    let a = share("a", "6de5d941-c79d-4a8a-ba10-668351620525", "30Gi");
    let b = share("b", "1b4e28ba-2fa1-41d2-883f-0016d3cca427", "30Gi");
    let c = share("c", "f47ac10b-58cc-4372-a567-0e02b2c3d479", "30Gi");
    let mut client = agent.v1().await;
    let answers = prepare(&mut client, &[a.clone(), b.clone()]).await.expect("prepare");
    let (da, db) = (&answers[&a.uid].devices[0], &answers[&b.uid].devices[0]);
    assert_eq!(da.share_id.as_deref(), Some("6de5d941-c79d-4a8a-ba10-668351620525"));
    assert_eq!(db.share_id.as_deref(), Some("1b4e28ba-2fa1-41d2-883f-0016d3cca427"));
    assert_ne!(da.cdi_device_ids, db.cdi_device_ids);
    let answers = prepare(&mut client, std::slice::from_ref(&c)).await.expect("prepare");
    let e = &answers[&c.uid].error;
    assert!(e.contains("GPU gpu-2 has 20Gi of memory left for shares and this claim asks for 30Gi"), "{e}");
    assert!(e.contains("default/a (30Gi)") && e.contains("default/b (30Gi)"), "{e}");
    agent.stop().await;
}

#[tokio::test]
async fn shares_with_mps_enforcement_share_one_daemon_that_outlives_a_kill_of_edra_as_root() {
    use crate::support::agent::{ChildAgent, prepare_ok, unprepare_ok};
    use crate::support::mps::{FakeMpsControl, is_root, start_time};
    if !is_root() {
        eprintln!("skipped: an MPS daemon's own mount namespace needs root");
        return;
    }
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let config = cluster.config_file_with(NODE, &with_sharing("enforcement = \"mps\""));
    let share = |name: &str, id: &str, memory: &str| {
        cluster.put_claim(
            ClaimBuilder::new("default", name)
                .allocated(AllocatedDevice::new("gpu", DRIVER, NODE, "gpu-2").share(id, memory))
                .reserved_for_pod(&format!("pod-{name}"), &format!("uid-of-pod-{name}")),
        )
    };
    let a = share("a", "6de5d941-c79d-4a8a-ba10-668351620525", "30Gi");
    let b = share("b", "1b4e28ba-2fa1-41d2-883f-0016d3cca427", "20Gi");
    let mut child = ChildAgent::start_configured(&cluster, &config, "", &[]).await;
    let mut v1 = child.v1().await;
    prepare_ok(&mut v1, &a).await;
    prepare_ok(&mut v1, &b).await;
    let mps = fs.mps_control();
    let calls = mps.calls();
    assert_eq!(calls.iter().filter(|c| c.starts_with("-d")).count(), 1, "one daemon for gpu-2: {calls:?}");
    assert!(calls[0].starts_with("-d CUDA_VISIBLE_DEVICES=GPU-") && !calls[0].contains(','), "{calls:?}");
    let dir = fs.paths().runtime_dir.join("mps/shared-gpu-2");
    let pid = FakeMpsControl::pid_in(&dir).expect("the GPU's daemon has a pid file");
    let started = start_time(pid).expect("the daemon runs");
    assert_eq!(mps.running_daemons(), [pid]);
    for (claim, mib) in [(&a, 30720), (&b, 20480)] {
        let spec: Value = serde_json::from_slice(&std::fs::read(fs.spec_file(&claim.uid)).unwrap()).unwrap();
        let edits = &spec["devices"][0]["containerEdits"];
        let env = edits["env"].as_array().unwrap();
        assert!(env.contains(&json!("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps")), "{edits}");
        assert!(env.contains(&json!(format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={mib}M"))), "{edits}");
        let mounts: Vec<(&str, &str)> = edits["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["hostPath"].as_str().unwrap(), m["containerPath"].as_str().unwrap()))
            .collect();
        let (pipe, shm) = (dir.join("pipe").display().to_string(), dir.join("shm").display().to_string());
        assert_eq!(mounts, [(pipe.as_str(), "/tmp/nvidia-mps"), (shm.as_str(), "/dev/shm")]);
    }

    // kill -9 of edra: the daemon keeps running, and the restarted edra adopts it.
    child.kill().await;
    assert_eq!(start_time(pid), Some(started), "the daemon outlives edra");
    let child = ChildAgent::start_configured(&cluster, &config, "", &[]).await;
    let mut v1 = child.v1().await;
    unprepare_ok(&mut v1, &a).await;
    assert_eq!(start_time(pid), Some(started), "adopted, and kept for the share that is left");
    assert_eq!(mps.calls().iter().filter(|c| c.starts_with("-d")).count(), 1, "not started again");

    // The daemon dies: supervision starts it again in the same directories.
    // SAFETY: kill(2) on the stand-in daemon this test's agent started (checked alive above).
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let restarted = async {
        loop {
            let again = FakeMpsControl::pid_in(&dir).filter(|p| *p != pid && start_time(*p).is_some());
            if let Some(again) = again
                && child.stderr().contains("the shared GPU's MPS control daemon was not running; started it again")
            {
                return again;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let again = tokio::time::timeout(WAIT, restarted).await.expect("supervision starts the GPU's daemon again");
    assert_eq!(mps.running_daemons(), [again]);

    unprepare_ok(&mut v1, &b).await;
    assert_eq!(start_time(again), None, "the last share's release stops it");
    assert_eq!(mps.calls().last().map(String::as_str), Some("quit"));
    assert!(!dir.exists() && mps.running_daemons().is_empty());
    child.terminate().await;
}
