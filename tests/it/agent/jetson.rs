//! A Jetson served end to end without hardware: a fake AGX Orin (device tree, SoC family,
//! L4T release, CSV lists naming files of the fake root; device nodes made with mknod when
//! the test is root) found by the tegra backend, its integrated GPU published to the test
//! API server (which validates slices), prepared over the kubelet's gRPC API into a CDI
//! spec built from the CSV lists, reported unmonitored, and an MPS claim refused with the
//! reason; `edra inventory`, `edra selftest` and `edra status` (the real binary) show the
//! integrated GPU.

use std::process::Command;

use serde_json::{Value, json};

use crate::support::agent::{
    Agent, ChildAgent, Cluster, DRIVER, NODE, WAIT, device_names, prepare, prepare_ok, unprepare_ok,
};
use crate::support::apiserver::{AllocatedDevice, ClaimBuilder};
use crate::support::tegra;

/// A cluster whose node n1 is a fake Orin, with the agent's configuration for it.
fn jetson(cluster: &Cluster) -> (edra::config::Config, tegra::FakeJetson) {
    let fs = cluster.fs();
    // A Jetson has none of a discrete driver's control nodes.
    for node in ["nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1", "nvidia2", "nvidia3"] {
        std::fs::remove_file(fs.root.join("dev").join(node)).expect("rm a discrete node");
    }
    let fake = tegra::make(&fs.root, &[("libcuda.so.1.1", b"cuda"), ("libnvrm_gpu.so", b"nvrm")]);
    let mut config = cluster.config(NODE);
    config.backend = edra::config::BackendKind::Auto;
    config.nvml.library = "libnvidia-ml-absent-for-tests.so.1".into();
    (config, fake)
}

fn device(slices: &[Value], name: &str) -> Value {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .find(|d| d["name"] == name)
        .expect("the device is published")
}

fn gpu_config(sharing: Value) -> Value {
    json!({"apiVersion": format!("{DRIVER}/v1alpha1"), "kind": "GpuConfig", "sharing": sharing})
}

#[tokio::test]
async fn a_fake_orin_is_published_prepared_from_its_csv_lists_and_reported_unmonitored() {
    let cluster = Cluster::start().await;
    let (config, fake) = jetson(&cluster);
    let fs = cluster.fs();
    let agent = Agent::start(fs.clone(), config).await;
    cluster.wait_published(NODE, 1).await;
    let slices = cluster.slices_on(NODE);
    assert_eq!(device_names(&slices), ["gpu-0"]);
    let gpu = device(&slices, "gpu-0");
    let attrs = &gpu["attributes"];
    assert_eq!(attrs["integrated"], json!({"bool": true}));
    assert_eq!(attrs["type"], json!({"string": "gpu"}));
    assert_eq!(attrs["model"], json!({"string": tegra::MODEL}));
    assert_eq!(attrs["soc"], json!({"string": "tegra234"}));
    assert_eq!(attrs["architecture"], json!({"string": "Ampere"}));
    assert_eq!(attrs["cudaComputeCapability"], json!({"version": "8.7.0"}));
    assert_eq!(attrs["l4tRelease"], json!({"version": "36.4.3"}));
    assert_eq!(attrs["jetpackMajor"], json!({"int": 6}));
    assert_eq!(gpu["capacity"]["memory"]["value"], json!(edra::util::quantity(tegra::MEM_KB * 1024)));
    // No XID source: the device is tainted unmonitored (effect None), never called healthy.
    cluster
        .server
        .wait_for("gpu-0 tainted unmonitored", WAIT, |s| {
            let d = device(&s.slices_on(NODE), "gpu-0");
            d["taints"].as_array().is_some_and(|t| t.iter().any(|t| t["key"] == format!("{DRIVER}/unmonitored")))
        })
        .await
        .expect("the unmonitored taint");

    let claim = cluster.allocated_claim("jetson", "gpu-0");
    let mut v1 = agent.v1().await;
    prepare_ok(&mut v1, &claim).await;
    let spec: Value =
        serde_json::from_slice(&std::fs::read(fs.spec_file(&claim.uid)).expect("the spec")).expect("JSON");
    let edits = &spec["containerEdits"];
    let nodes: Vec<&str> =
        edits["deviceNodes"].as_array().into_iter().flatten().filter_map(|n| n["path"].as_str()).collect();
    if fake.nodes {
        assert_eq!(nodes, ["/dev/nvmap", "/dev/nvhost-ctrl-gpu", "/dev/nvgpu/igpu0/ctrl"]);
    } else {
        assert!(nodes.is_empty(), "{nodes:?}");
        eprintln!("skipped the device-node part: mknod needs root");
    }
    let mounts: Vec<&str> =
        edits["mounts"].as_array().expect("mounts").iter().filter_map(|m| m["containerPath"].as_str()).collect();
    let lib = format!("/{}", tegra::LIB_DIR);
    assert_eq!(mounts, [format!("{lib}/libcuda.so.1.1"), format!("{lib}/libnvrm_gpu.so"), "/usr/share/nvidia".into()]);
    let hooks: Vec<&str> =
        edits["hooks"].as_array().expect("hooks").iter().filter_map(|h| h["args"][2].as_str()).collect();
    assert_eq!(hooks, ["create-symlinks", "update-ldcache"]);
    unprepare_ok(&mut v1, &claim).await;
    assert!(!fs.spec_file(&claim.uid).exists());
    agent.stop().await;
}

#[tokio::test]
async fn mps_is_refused_on_a_jetson_with_the_reason_and_time_slicing_changes_nothing() {
    let cluster = Cluster::start().await;
    let (config, _fake) = jetson(&cluster);
    let agent = Agent::start(cluster.fs(), config).await;
    cluster.wait_published(NODE, 1).await;
    let mps = cluster.put_claim(
        ClaimBuilder::new("default", "mps")
            .allocated(AllocatedDevice::new("gpu", DRIVER, NODE, "gpu-0"))
            .opaque_config("FromClaim", &[], DRIVER, gpu_config(json!({"strategy": "MPS"}))),
    );
    let mut v1 = agent.v1().await;
    let answer = prepare(&mut v1, std::slice::from_ref(&mps)).await.expect("NodePrepareResources");
    let error = &answer[&mps.uid].error;
    assert!(error.contains("asks for MPS on gpu-0, a Jetson's integrated GPU"), "{error}");
    assert!(error.contains("EXCLUSIVE_PROCESS") && error.contains("CUDA 12.5"), "{error}");
    assert!(!cluster.fs().spec_file(&mps.uid).exists());

    let sliced = cluster.put_claim(
        ClaimBuilder::new("default", "sliced")
            .allocated(AllocatedDevice::new("gpu", DRIVER, NODE, "gpu-0"))
            .opaque_config("FromClaim", &[], DRIVER, gpu_config(json!({"strategy": "TimeSlicing"}))),
    );
    prepare_ok(&mut v1, &sliced).await;
    assert!(cluster.fs().nvidia_smi().calls().is_empty(), "nothing to set on a Jetson");
    let long = cluster.put_claim(
        ClaimBuilder::new("default", "long")
            .allocated(AllocatedDevice::new("gpu", DRIVER, NODE, "gpu-0"))
            .opaque_config(
                "FromClaim",
                &[],
                DRIVER,
                gpu_config(json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}})),
            ),
    );
    let answer = prepare(&mut v1, std::slice::from_ref(&long)).await.expect("NodePrepareResources");
    assert!(answer[&long.uid].error.contains("no compute policy"), "{}", answer[&long.uid].error);
    agent.stop().await;
}

#[tokio::test]
async fn edra_inventory_selftest_and_status_show_the_integrated_gpu() {
    let cluster = Cluster::start().await;
    let (_config, _fake) = jetson(&cluster);
    let file = cluster.config_file(NODE);
    let text = std::fs::read_to_string(&file).expect("the configuration");
    let text = text
        .replace("backend = \"mock\"", "backend = \"auto\"\n[nvml]\nlibrary = \"libnvidia-ml-absent-for-tests.so.1\"");
    std::fs::write(&file, text).expect("write the configuration");
    let out = Command::new(env!("CARGO_BIN_EXE_edra"))
        .env_clear()
        .args(["--config".as_ref(), file.as_os_str(), "inventory".as_ref()])
        .output()
        .expect("run edra inventory");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(shown.contains("tegra234") && shown.contains("integrated"), "{shown}");
    let out = Command::new(env!("CARGO_BIN_EXE_edra"))
        .env_clear()
        .args(["--config".as_ref(), file.as_os_str(), "selftest".as_ref(), "-o".as_ref(), "json".as_ref()])
        .output()
        .expect("run edra selftest");
    let report: Value = serde_json::from_slice(&out.stdout).expect("the selftest report is JSON");
    let check = |name: &str| {
        report["checks"].as_array().into_iter().flatten().find(|c| c["name"] == name).cloned().unwrap_or(Value::Null)
    };
    assert_eq!(report["backend"], "tegra", "{report:#}");
    assert_eq!(check("driver-files")["status"], "pass", "{report:#}");
    assert_eq!(check("health-events")["status"], "warn", "{report:#}");
    assert_eq!(check("prepare-gpu")["status"], "pass", "{report:#}");
    assert_eq!(check("mps")["status"], "skip", "{report:#}");
    assert!(check("mps")["detail"].as_str().is_some_and(|d| d.contains("EXCLUSIVE_PROCESS")), "{report:#}");
    // An integrated GPU: no PCI slot, persistence mode or MIG claimed for it.
    let discovery = check("discovery")["detail"].as_str().unwrap_or_default().to_string();
    assert!(discovery.contains("no PCI slot") && discovery.contains("MIG not capable"), "{discovery}");
    assert!(discovery.contains("persistence unknown"), "{discovery}");
    let agent = ChildAgent::start_configured(&cluster, &file, "", &[]).await;
    let started = std::time::Instant::now();
    let gpu = loop {
        let out = Command::new(env!("CARGO_BIN_EXE_edra"))
            .env_clear()
            .args(["--config".as_ref(), file.as_os_str(), "status".as_ref(), "-o".as_ref(), "json".as_ref()])
            .output()
            .expect("run edra status");
        let view: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let gpu = view["gpus"].as_array().and_then(|g| g.first().cloned()).unwrap_or(Value::Null);
        if gpu["health"] == "unknown" {
            break gpu;
        }
        assert!(started.elapsed() < WAIT, "status never showed the GPU unmonitored: {view:#}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(gpu["compute_mode"], "integrated", "{gpu:#}");
    assert_eq!(gpu["product"], format!("Orin (integrated, {})", tegra::MODEL), "{gpu:#}");
    let condition = &gpu["conditions"][0];
    assert_eq!(condition["kind"], "unmonitored", "{gpu:#}");
    assert!(condition["message"].as_str().is_some_and(|m| m.contains("no XID event source")), "{gpu:#}");
    agent.terminate().await;
}
