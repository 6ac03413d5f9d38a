//! Dynamic MIG as published to a real (test) API server that validates partitionable
//! devices like Kubernetes 1.36: counter sets in slices of their own and devices consuming
//! them, accepted for 1, 2 and 8 GPUs without rewrites; a server that drops the counters,
//! an older one and a v1beta2 one get static publishing with one warning and no write loop.

use std::sync::Arc;
use std::time::Duration;

use edra::dynamic_mig::{MigSettings, OwnedInstances};
use edra::gpu::mig_control::profiles;
use edra::inventory::Inventory;
use edra::inventory::MigGpu;
use edra::inventory::attributes::{GpuFacts, gpu_device};
use edra::kube::Client;
use edra::publish::desired::NodeIdentity;
use edra::publish::reconcile::{Publisher, accepts_partitions};
use edra::publish::status::PublishStatus;
use edra::sharing::GpuSelection;
use serde_json::Value;
use tokio::sync::watch;

use crate::support::agent::{CapturedLogs, Cluster, DRIVER, NODE, WAIT, device_names};
use crate::support::apiserver::{ApiVersion, Options};

/// `n` A100 80GB GPUs in MIG mode with nothing carved, as a backend discovers them.
fn inventory(n: u32) -> Inventory {
    let mig_gpus: Vec<MigGpu> = (0..n)
        .map(|i| {
            let facts = GpuFacts {
                index: i,
                minor: i,
                uuid: format!("GPU-{i:08x}-1111-2222-3333-444444444444"),
                product_name: "NVIDIA A100-SXM4-80GB".into(),
                brand: Some("Nvidia".into()),
                architecture: Some("Ampere".into()),
                cuda_compute_capability: Some("8.0".into()),
                driver_version: Some("550.54.15".into()),
                cuda_driver_version: Some("12.4.0".into()),
                pci_bus_id: Some(format!("0000:{:02x}:00.0", 0x10 + i)),
                pcie_root: None,
                numa_node: None,
                memory: 80 << 30,
                multiprocessors: Some(108),
            };
            MigGpu {
                uuid: facts.uuid.clone(),
                device: gpu_device(&facts, std::path::Path::new("/dev")),
                capability: profiles::for_model(&facts.product_name, facts.memory).expect("A100 80GB"),
                instances: Vec::new(),
            }
        })
        .collect();
    Inventory { devices: mig_gpus.iter().map(|g| g.device.clone()).collect(), mig_gpus, ..Inventory::default() }
}

struct Running {
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    _owned: watch::Sender<Arc<OwnedInstances>>,
}

/// Publishes `gpus` dynamic-MIG GPUs to `cluster` as the agent does.
async fn publish(cluster: &Cluster, gpus: u32) -> Running {
    let config = cluster.config(NODE);
    let client = Client::from_config(&config).expect("client");
    let api = client.discover_resource_api().await.expect("discovery");
    let version = client.server_version().await.ok();
    let (_inventory_tx, inventory_rx) = watch::channel(Arc::new(inventory(gpus)));
    let (status_tx, _status_rx) = watch::channel(PublishStatus::default());
    let (shutdown, shutdown_rx) = watch::channel(false);
    let (owned_tx, owned_rx) = watch::channel(Arc::new(OwnedInstances::new()));
    let node = NodeIdentity { name: NODE.into(), uid: Some(cluster.node_uid.clone()) };
    let mig = MigSettings { dynamic: GpuSelection::All };
    let publisher = Publisher::new(client, api, DRIVER.into(), node, inventory_rx, status_tx).with_mig(
        mig,
        accepts_partitions(api, version.as_deref()),
        owned_rx,
    );
    std::mem::forget(_inventory_tx);
    let task = tokio::spawn(publisher.run(shutdown_rx));
    Running { shutdown, task, _owned: owned_tx }
}

impl Running {
    async fn stop(self) {
        self.shutdown.send_replace(true);
        tokio::time::timeout(WAIT, self.task).await.expect("publisher stops").expect("publisher task");
    }
}

fn counter_sets(slices: &[Value]) -> Vec<String> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["sharedCounters"].as_array().cloned().unwrap_or_default())
        .map(|c| c["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn dynamic_gpus_are_published_as_counter_sets_and_mig_devices_within_every_limit() {
    for gpus in [1, 2, 8] {
        let cluster = Cluster::start_with(Options { git_version: "v1.36.2".into(), ..Options::default() }).await;
        let mark = cluster.server.with_state(|s| s.request_mark());
        let running = publish(&cluster, gpus).await;
        let devices = 26 * gpus as usize;
        cluster.wait_published(NODE, devices).await;
        let slices = cluster.slices_on(NODE);
        let sets = counter_sets(&slices);
        assert_eq!(sets, (0..gpus).map(|i| format!("gpu-{i}-counters")).collect::<Vec<_>>());
        let device_slices = slices.iter().filter(|s| s["spec"]["devices"].as_array().is_some_and(|d| !d.is_empty()));
        assert_eq!(device_slices.count(), devices.div_ceil(64), "{gpus} GPUs: 64 devices per slice");
        for s in &slices {
            assert_eq!(s["spec"]["pool"]["resourceSliceCount"], slices.len(), "{s}");
        }
        let names = device_names(&slices);
        assert!(names.contains(&"gpu-0-mig-3g40gb-9-4".to_string()) && names.contains(&"gpu-0".to_string()));
        let seven = slices
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .find(|d| d["name"] == "gpu-0-mig-7g80gb-0-0")
            .expect("7g.80gb published");
        assert_eq!(seven["consumesCounters"][0]["counterSet"], "gpu-0-counters");
        assert_eq!(seven["consumesCounters"][0]["counters"]["memory"]["value"], "80640Mi");
        assert_eq!(seven["consumesCounters"][0]["counters"]["memory-slice-7"]["value"], "1");
        assert_eq!(cluster.writes_until_quiet(mark).await, slices.len(), "{gpus} GPUs: one create per slice");
        running.stop().await;
    }
}

#[tokio::test]
async fn servers_without_partitionable_devices_get_static_mig_once_with_one_warning() {
    let cases = [
        ("gate off", Options { git_version: "v1.35.1".into(), ..Options::default() }, true),
        ("1.34", Options { git_version: "v1.34.3".into(), ..Options::default() }, false),
        (
            "v1beta2",
            Options { git_version: "v1.36.2".into(), versions: vec![ApiVersion::V1beta2], ..Options::default() },
            false,
        ),
    ];
    for (case, options, drop) in cases {
        let cluster = Cluster::start_with(options).await;
        if drop {
            cluster.server.set_partitionable_devices(false);
        }
        let (logs, _guard) = CapturedLogs::start();
        let mark = cluster.server.with_state(|s| s.request_mark());
        let running = publish(&cluster, 2).await;
        cluster
            .server
            .wait_for("the static pool", WAIT, |s| device_names(&s.slices_on(NODE)) == ["gpu-0", "gpu-1"])
            .await
            .unwrap_or_else(|_| panic!("{case}: static publishing"));
        let writes = cluster.writes_until_quiet(mark).await;
        let slices = cluster.slices_on(NODE);
        assert!(counter_sets(&slices).is_empty(), "{case}: {slices:?}");
        if drop {
            assert!(writes <= 4, "{case}: the carved pool, the static one, a delete or two: {writes}");
        } else {
            assert_eq!(writes, 1, "{case}: static from the first write");
        }
        let text = logs.text();
        let warnings =
            text.matches("dropped the counters").count() + text.matches("needs partitionable devices").count();
        assert_eq!(warnings, 1, "{case}: {text}");
        assert!(text.contains("DRAPartitionableDevices"), "{case}: {text}");
        running.stop().await;
    }
}

#[tokio::test]
async fn instances_edra_created_are_not_foreign_when_devices_are_rediscovered() {
    let cluster = Cluster::start_with(Options { git_version: "v1.36.2".into(), ..Options::default() }).await;
    let (logs, _guard) = CapturedLogs::start();
    let mut config = cluster.config_with(NODE, crate::agent::mig::MIG_MOCK);
    config.rediscovery_interval = Duration::from_millis(300);
    let agent = crate::support::agent::Agent::start(cluster.fs(), config).await;
    cluster.wait_published(NODE, 26).await;
    let claim = cluster.put_claim(
        crate::support::apiserver::ClaimBuilder::new("default", "half")
            .allocated(crate::support::apiserver::AllocatedDevice::new("gpu", DRIVER, NODE, "gpu-0-mig-3g40gb-9-4")),
    );
    let mut v1 = agent.v1().await;
    crate::support::agent::prepare_ok(&mut v1, &claim).await;
    assert_eq!(crate::agent::mig::placements(&cluster).len(), 1, "the instance exists");
    // Several discoveries see the instance; it is edra's, so the pool stays as it is.
    let mark = cluster.server.with_state(|s| s.request_mark());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let slice_writes = cluster.server.with_state(|s| {
        s.requests()[mark..].iter().filter(|r| r.is_write() && r.path.contains("/resourceslices")).count()
    });
    assert_eq!(slice_writes, 0, "nothing rewritten");
    assert!(device_names(&cluster.slices_on(NODE)).contains(&"gpu-0".to_string()));
    let text = logs.text();
    assert!(!text.contains("did not create"), "{text}");
    crate::support::agent::unprepare_ok(&mut v1, &claim).await;
    assert!(crate::agent::mig::placements(&cluster).is_empty());
    agent.stop().await;
}
