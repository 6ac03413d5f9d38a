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
    assert!(
        error(&disagree).contains("device gpu-0 is allocated to requests a and b with different GpuConfigs"),
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
