//! Dynamic MIG through the kubelet's gRPC API: the mock backend in MIG mode (an A100
//! 80GB whose MIG instances live in the mock's state file under the runtime directory),
//! two 3g.40gb devices at placements 0 and 4 prepared in one call and unprepared; the
//! instances exist exactly while their claims are prepared.

use edra::gpu::mig::Placement;
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
    let mut out: Vec<Placement> = edra::gpu::mig::MigControl::mig_instances(control, &uuid)
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
