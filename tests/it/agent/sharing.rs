//! TimeSlicing through the kubelet's gRPC API: compute mode through NVML (the stand-in
//! library, whose modes outlive the process like a GPU's) and the interval through the
//! stand-in `nvidia-smi` under the driver root; bad input fails only its claim.

use std::path::Path;

use serde_json::{Value, json};

use crate::support::agent::{Agent, Cluster, DRIVER, NODE, prepare, prepare_ok, unprepare_ok};
use crate::support::apiserver::{AllocatedDevice, ClaimBuilder};
use crate::support::nvml::{StubNvml, a100};

const GPU0: &str = "GPU-00000000-0000-0000-0000-000000000000";

fn gpu_config(sharing: Value) -> Value {
    json!({"apiVersion": format!("{DRIVER}/v1alpha1"), "kind": "GpuConfig", "sharing": sharing})
}

fn time_slicing(interval: &str) -> Value {
    gpu_config(json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}}))
}

/// The stand-in's compute-mode log in `dir`: `(uuid, mode)` per set, in order.
fn mode_sets(dir: &Path) -> Vec<(String, u32)> {
    std::fs::read_to_string(dir.join("nvml_stub.modes"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(u, m)| (u.to_string(), m.parse().expect("a mode number"))))
        .collect()
}

fn mode_of(dir: &Path, uuid: &str) -> u32 {
    mode_sets(dir).into_iter().rev().find(|(u, _)| u == uuid).map_or(0, |(_, m)| m)
}

#[tokio::test]
async fn a_time_slicing_claim_sets_compute_mode_and_interval_and_unprepare_restores_them() {
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let stub =
        StubNvml::new(&format!("{}{}", a100(0, 0, "00000000:3B:00.0", false), a100(1, 1, "00000000:5E:00.0", false)));
    // The library is a path under the driver root, beside its configuration.
    let dir = fs.root.join("driver/nvml");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&stub.library, dir.join("libnvidia-ml.so.1")).unwrap();
    std::fs::copy(stub.dir.path().join("nvml_stub.conf"), dir.join("nvml_stub.conf")).unwrap();
    // The GPU was in EXCLUSIVE_PROCESS (3) before edra touched it.
    std::fs::write(dir.join("nvml_stub.modes"), format!("{GPU0} 3\n")).unwrap();
    let mut config = cluster.config(NODE);
    config.backend = edra::config::BackendKind::Nvml;
    config.nvml.library = "/nvml/libnvidia-ml.so.1".into();
    let agent = Agent::start(fs.clone(), config).await;
    let claim = cluster.put_claim(
        ClaimBuilder::new("default", "shared")
            .allocated(AllocatedDevice::new("gpu", DRIVER, NODE, "gpu-0"))
            .opaque_config("FromClaim", &[], DRIVER, time_slicing("Long")),
    );
    let mut v1 = agent.v1().await;
    prepare_ok(&mut v1, &claim).await;
    assert_eq!(mode_of(&dir, GPU0), 0, "compute mode DEFAULT: {:?}", mode_sets(&dir));
    let smi = fs.nvidia_smi();
    assert_eq!(smi.calls(), [format!("compute-policy -i {GPU0} --set-timeslice=3")]);
    assert!(fs.spec_file(&claim.uid).exists());

    unprepare_ok(&mut v1, &claim).await;
    assert_eq!(mode_of(&dir, GPU0), 3, "the previous compute mode is back: {:?}", mode_sets(&dir));
    assert_eq!(smi.calls().last().unwrap(), &format!("compute-policy -i {GPU0} --set-timeslice=0"));
    assert!(mode_sets(&dir).iter().all(|(u, _)| u == GPU0), "only GPU 0 was touched");
    agent.stop().await;
}

#[tokio::test]
async fn bad_sharing_input_fails_only_its_claim_and_leaves_the_gpus_alone() {
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let mock = "gpus = 2\n[[mock.mig]]\ngpu = 1\nprofiles = [\"1g.10gb\"]";
    let config = cluster.config_with(NODE, mock);
    let backend = edra::inventory::mock::MockBackend::new(&config);
    let inventory = edra::inventory::DeviceBackend::discover(&backend).unwrap();
    let mig = inventory.devices.iter().find(|d| d.name.starts_with("gpu-1-mig")).expect("a MIG device").name.clone();
    let agent = Agent::start(fs.clone(), config).await;

    let mps_block = cluster.put_claim(
        ClaimBuilder::new("default", "mps-block")
            .allocated(AllocatedDevice::new("gpu", DRIVER, NODE, "gpu-0"))
            .opaque_config("FromClaim", &[], DRIVER, gpu_config(json!({"strategy": "TimeSlicing", "mps": {}}))),
    );
    let on_mig = cluster.put_claim(
        ClaimBuilder::new("default", "on-mig")
            .allocated(AllocatedDevice::new("gpu", DRIVER, NODE, &mig))
            .opaque_config("FromClaim", &[], DRIVER, time_slicing("Short")),
    );
    let disagree = cluster.put_claim(
        ClaimBuilder::new("default", "disagree")
            .allocated(AllocatedDevice::new("a", DRIVER, NODE, "gpu-0"))
            .allocated(AllocatedDevice::new("b", DRIVER, NODE, "gpu-0"))
            .opaque_config("FromClaim", &["b"], DRIVER, time_slicing("Short")),
    );
    let fine = cluster.allocated_claim("fine", "gpu-0");
    let mut v1 = agent.v1().await;
    let answer = prepare(&mut v1, &[mps_block.clone(), on_mig.clone(), disagree.clone(), fine.clone()])
        .await
        .expect("NodePrepareResources");
    let error = |c: &edra::plugin::ClaimRef| answer[&c.uid].error.clone();
    assert!(error(&mps_block).contains("sharing.mps is set but sharing.strategy is not MPS"), "{}", error(&mps_block));
    assert!(error(&on_mig).contains(&format!("cannot apply to MIG device {mig}")), "{}", error(&on_mig));
    // Without admin access a device is allocated once per claim: refused before its configs
    // are compared (with admin access they are, src/prepare/tests/sharing.rs).
    assert!(
        error(&disagree).contains("device gpu-0 is allocated twice in the claim (requests a and b)"),
        "{}",
        error(&disagree)
    );
    assert_eq!(error(&fine), "");
    assert_eq!(fs.spec_files(), [fs.spec_file(&fine.uid)]);
    unprepare_ok(&mut v1, &fine).await;

    // Without nvidia-smi the claim fails naming the path looked at and the key to set.
    std::fs::remove_file(fs.nvidia_smi_path()).unwrap();
    let ts =
        cluster.put_claim(
            ClaimBuilder::new("default", "ts")
                .allocated(AllocatedDevice::new("gpu", DRIVER, NODE, "gpu-0"))
                .opaque_config("FromClaim", &[], DRIVER, time_slicing("Long")),
        );
    let answer = prepare(&mut v1, std::slice::from_ref(&ts)).await.expect("NodePrepareResources");
    let e = &answer[&ts.uid].error;
    assert!(e.contains(&fs.nvidia_smi_path().display().to_string()) && e.contains("paths.nvidia_smi"), "{e}");
    assert!(fs.spec_files().is_empty());
    assert!(fs.nvidia_smi().calls().is_empty(), "nvidia-smi never ran: {:?}", fs.nvidia_smi().calls());
    agent.stop().await;
}

/// Waits (bounded) until `f` holds.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..1500 {
        if f() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("timed out waiting until {what}");
}

#[tokio::test]
async fn an_mps_claims_daemon_outlives_a_kill_of_edra_is_restarted_when_it_dies_and_stops_at_unprepare_as_root() {
    use crate::support::mps::{FakeMpsControl, is_root, start_time};
    if !is_root() {
        eprintln!("skipped: an MPS daemon's own mount namespace needs root");
        return;
    }
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let claim = cluster.put_claim(
        ClaimBuilder::new("default", "mps")
            .allocated(AllocatedDevice::new("gpu", DRIVER, NODE, "gpu-0"))
            .opaque_config(
                "FromClaim",
                &[],
                DRIVER,
                gpu_config(json!({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 30}})),
            ),
    );
    let mut child = crate::support::agent::ChildAgent::start(&cluster, "").await;
    prepare_ok(&mut child.v1().await, &claim).await;
    let mps = fs.mps_control();
    let calls = mps.calls();
    assert!(calls[0].starts_with("-d CUDA_VISIBLE_DEVICES=GPU-"), "{calls:?}");
    assert_eq!(calls[1..], ["get_server_list", "set_default_active_thread_percentage 30"]);
    let dir = fs.mps_dir(&claim.uid);
    let pid = FakeMpsControl::pid_in(&dir).expect("the daemon's pid file");
    let started = start_time(pid).expect("the daemon runs");
    assert!(dir.join(format!("shm/edra-mps-stand-in.{pid}")).exists(), "its /dev/shm is the claim's");
    let spec = std::fs::read_to_string(fs.spec_file(&claim.uid)).unwrap();
    let spec: Value = serde_json::from_str(&spec).unwrap();
    let edits = &spec["devices"][0]["containerEdits"];
    assert!(edits["env"].as_array().unwrap().contains(&json!("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps")), "{edits}");
    let mounts: Vec<(&str, &str)> = edits["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["hostPath"].as_str().unwrap(), m["containerPath"].as_str().unwrap()))
        .collect();
    let (pipe, shm) = (dir.join("pipe").display().to_string(), dir.join("shm").display().to_string());
    assert_eq!(mounts, [(pipe.as_str(), "/tmp/nvidia-mps"), (shm.as_str(), "/dev/shm")]);

    // kill -9 of edra: the daemon keeps running, and the restarted edra adopts it.
    child.kill().await;
    assert_eq!(start_time(pid), Some(started), "the daemon outlives edra");
    let child = crate::support::agent::ChildAgent::start(&cluster, "").await;
    let mut v1 = child.v1().await;
    prepare_ok(&mut v1, &claim).await;
    assert_eq!(FakeMpsControl::pid_in(&dir), Some(pid), "adopted");
    assert_eq!(start_time(pid), Some(started));
    assert_eq!(mps.calls().iter().filter(|c| c.starts_with("-d")).count(), 1, "not started twice");

    // The daemon dies: edra starts it again (same directories, limits again).
    // SAFETY: kill(2) on the stand-in daemon this test's agent started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    eventually("the daemon runs again and has its limits", || {
        let calls = mps.calls();
        calls.iter().filter(|c| c.starts_with("-d")).count() == 2
            && calls.last().is_some_and(|c| c == "set_default_active_thread_percentage 30")
    })
    .await;
    let again = FakeMpsControl::pid_in(&dir).unwrap();
    assert!(again != pid && start_time(again).is_some());
    eventually("edra says it started the daemon again", || {
        child.stderr().contains("the claim's MPS control daemon was not running; started it again")
    })
    .await;

    unprepare_ok(&mut v1, &claim).await;
    eventually("the daemon is gone", || start_time(again).is_none()).await;
    assert!(!dir.exists(), "the daemon's directories are removed");
    assert_eq!(mps.calls().last().unwrap(), "quit");
    child.terminate().await;
}
