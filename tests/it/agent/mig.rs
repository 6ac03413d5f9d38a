//! Dynamic MIG through the kubelet's gRPC API: the mock backend in MIG mode (an A100
//! 80GB whose MIG instances live in the mock's state file under the runtime directory),
//! two 3g.40gb devices at placements 0 and 4 prepared in one call and unprepared; the
//! instances exist exactly while their claims are prepared.

use edra::gpu::mig_control::Placement;
use edra::inventory::mock::MockBackend;

use crate::support::agent::{Agent, Cluster, DRIVER, NODE, prepare, unprepare};
use crate::support::apiserver::{AllocatedDevice, ClaimBuilder};

/// The `[mock]` body: one A100 80GB in MIG mode, selected for dynamic MIG.
pub const MIG_MOCK: &str = "gpus = 1\nmig_mode = true\n[mig]\ndynamic = [\"*\"]";

/// The placements of the MIG instances on the mock's gpu-0 now, as its state file says.
pub fn placements(cluster: &Cluster) -> Vec<Placement> {
    let backend = MockBackend::new(&cluster.config_with(NODE, MIG_MOCK));
    let control = backend.mig_control().expect("the mock is in MIG mode");
    let uuid = edra::inventory::mock::gpu_uuid(NODE, 0);
    let mut out: Vec<Placement> = edra::gpu::mig_control::MigControl::mig_instances(control, &uuid)
        .expect("read the mock's MIG state")
        .into_iter()
        .map(|i| i.placement)
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn two_3g40gb_devices_at_placements_0_and_4_are_created_and_destroyed() {
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let agent = Agent::start(fs.clone(), cluster.config_with(NODE, MIG_MOCK)).await;
    let claims: Vec<_> = ["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4"]
        .iter()
        .enumerate()
        .map(|(i, device)| {
            cluster.put_claim(
                ClaimBuilder::new("default", &format!("slice-{i}"))
                    .allocated(AllocatedDevice::new("gpu", DRIVER, NODE, device)),
            )
        })
        .collect();
    let mut v1 = agent.v1().await;
    let answer = prepare(&mut v1, &claims).await.expect("NodePrepareResources");
    for (c, device) in claims.iter().zip(["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4"]) {
        let a = &answer[&c.uid];
        assert_eq!(a.error, "", "{}", c.name);
        assert_eq!(a.devices.len(), 1);
        assert_eq!(a.devices[0].device_name, device);
        assert_eq!(a.devices[0].cdi_device_ids, [format!("k8s.{DRIVER}/claim={}-{device}", c.uid)]);
        let spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fs.spec_file(&c.uid)).expect("the claim's spec")).unwrap();
        let nodes: Vec<&str> = spec["devices"][0]["containerEdits"]["deviceNodes"]
            .as_array()
            .expect("device nodes")
            .iter()
            .filter_map(|n| n["path"].as_str())
            .collect();
        assert_eq!(nodes.len(), 3, "/dev/nvidia0 and two capability nodes: {nodes:?}");
        assert_eq!(nodes[0], "/dev/nvidia0");
        assert!(nodes[1..].iter().all(|n| n.starts_with("/dev/nvidia-caps/nvidia-cap")), "{nodes:?}");
        let env = spec["devices"][0]["containerEdits"]["env"][0].as_str().unwrap_or_default();
        assert!(env.contains("_UUID=MIG-"), "{env}");
    }
    assert_eq!(placements(&cluster), [Placement { start: 0, size: 4 }, Placement { start: 4, size: 4 }]);

    let released = unprepare(&mut v1, &claims).await.expect("NodeUnprepareResources");
    assert!(released.values().all(String::is_empty), "{released:?}");
    assert_eq!(placements(&cluster), []);
    assert!(fs.spec_files().is_empty());
    agent.stop().await;
}

/// The MIG instances on the stand-in's GPU 0, as NVML reports them to a fresh backend.
fn nvml_instances(config: &edra::config::Config) -> Vec<edra::gpu::mig_control::MigInstance> {
    let backend = edra::inventory::nvml::NvmlBackend::load(config).expect("load the stand-in");
    edra::gpu::mig_control::MigControl::mig_instances(&backend, "GPU-00000000-0000-0000-0000-000000000000")
        .expect("list the instances")
}

#[tokio::test]
async fn through_nvml_the_stand_in_gets_the_instances_and_a_foreign_one_is_left_alone() {
    use crate::support::nvml::{StubNvml, a100};
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let stub = StubNvml::new(&a100(0, 0, "00000000:3B:00.0", true));
    let dir = fs.root.join("driver/nvml");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&stub.library, dir.join("libnvidia-ml.so.1")).unwrap();
    std::fs::copy(stub.dir.path().join("nvml_stub.conf"), dir.join("nvml_stub.conf")).unwrap();
    let mut config = cluster.config(NODE);
    config.backend = edra::config::BackendKind::Nvml;
    config.nvml.library = "/nvml/libnvidia-ml.so.1".into();
    config.mig.dynamic = edra::sharing::GpuSelection::All;
    // Someone made a 1g.10gb at memory slice 6 before edra started.
    {
        let backend = edra::inventory::nvml::NvmlBackend::load(&config).expect("load the stand-in");
        let inv = edra::inventory::DeviceBackend::discover(&backend).expect("discover");
        let gpu = inv.mig_gpus.first().expect("GPU 0 in MIG mode");
        let small = gpu.capability.profiles.iter().find(|p| p.name == "1g.10gb").expect("1g.10gb").clone();
        edra::gpu::mig_control::MigControl::create_mig(&backend, &gpu.uuid, &small, Placement { start: 6, size: 1 })
            .expect("a foreign instance");
    }
    let agent = Agent::start(fs.clone(), config.clone()).await;
    let claim = |name: &str, device: &str| {
        cluster
            .put_claim(ClaimBuilder::new("default", name).allocated(AllocatedDevice::new("gpu", DRIVER, NODE, device)))
    };
    let low = claim("low", "gpu-0-mig-3g40gb-9-0");
    let high = claim("high", "gpu-0-mig-3g40gb-9-4");
    let mut v1 = agent.v1().await;
    let answer = prepare(&mut v1, &[low.clone(), high.clone()]).await.expect("NodePrepareResources");
    assert_eq!(answer[&low.uid].error, "", "placement 0 is free");
    let error = &answer[&high.uid].error;
    assert!(error.contains("3g.40gb") && error.contains("4+4"), "the foreign instance is in the way: {error}");
    let placements: Vec<Placement> = nvml_instances(&config).into_iter().map(|i| i.placement).collect();
    assert_eq!(placements, [Placement { start: 6, size: 1 }, Placement { start: 0, size: 4 }]);
    assert!(fs.spec_file(&low.uid).exists() && !fs.spec_file(&high.uid).exists());

    let released = unprepare(&mut v1, &[low.clone(), high.clone()]).await.expect("NodeUnprepareResources");
    assert!(released.values().all(String::is_empty), "{released:?}");
    let left: Vec<Placement> = nvml_instances(&config).into_iter().map(|i| i.placement).collect();
    assert_eq!(left, [Placement { start: 6, size: 1 }], "edra destroyed its own instance only");
    agent.stop().await;
}
