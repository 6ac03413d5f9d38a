//! `edra inventory` as a process: the ResourceSlices it prints for the mock backend, and
//! the error (exit code 1) when NVML is not available.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// Runs `edra --config <dir>/edra.toml inventory <args>` with `config` as the file and an
/// empty environment (no EDRA_* or NODE_NAME leaks in).
fn edra(dir: &Path, config: &str, args: &[&str]) -> Output {
    let file = dir.join("edra.toml");
    std::fs::write(&file, config).expect("write config");
    Command::new(env!("CARGO_BIN_EXE_edra"))
        .env_clear()
        .arg("--config")
        .arg(&file)
        .arg("inventory")
        .args(args)
        .output()
        .expect("run edra")
}

fn json_list(out: &Output) -> Value {
    assert!(out.status.success(), "edra failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

fn device_names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .filter_map(|d| d["name"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn mock_inventory_prints_a_list_of_v1_resource_slices() {
    let dir = tempfile::tempdir().expect("tempdir");
    let list = json_list(&edra(dir.path(), "", &["--backend", "mock", "--output", "json", "--node-name", "n1"]));
    assert_eq!(list["apiVersion"], "v1");
    assert_eq!(list["kind"], "List");
    let items = list["items"].as_array().expect("items");
    assert_eq!(items.len(), 1);
    let slice = &items[0];
    assert_eq!(slice["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(slice["kind"], "ResourceSlice");
    let name = slice["metadata"]["name"].as_str().expect("metadata.name for kubectl apply");
    assert!(name.starts_with("00000-gpu.edra.dev-n1-") && name.len() == 27, "{name}");
    assert!(slice["metadata"].get("generateName").is_none());
    assert!(slice["metadata"].get("ownerReferences").is_none(), "node UID unknown offline");
    let spec = &slice["spec"];
    assert_eq!(spec["driver"], "gpu.edra.dev");
    assert_eq!(spec["nodeName"], "n1");
    assert_eq!(spec["pool"], serde_json::json!({"name": "n1", "generation": 1, "resourceSliceCount": 1}));
    let devices = spec["devices"].as_array().expect("devices");
    assert_eq!(device_names(&list), ["gpu-0", "gpu-1"]);
    for d in devices {
        let a = &d["attributes"];
        assert!(a["uuid"]["string"].as_str().is_some_and(|u| u.starts_with("GPU-")), "{d}");
        assert_eq!(a["productName"]["string"], "NVIDIA A100-SXM4-80GB");
        assert_eq!(a["type"]["string"], "gpu");
        assert_eq!(d["capacity"]["memory"]["value"], "80Gi");
    }
}

#[test]
fn mock_mig_devices_replace_their_parent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = "[mock]\ngpus = 2\nmig = [{ gpu = 0, profiles = [\"1g.10gb\", \"3g.40gb\"] }]\n";
    let list = json_list(&edra(dir.path(), config, &["--backend", "mock", "-o", "json", "--node-name", "n1"]));
    assert_eq!(device_names(&list), ["gpu-0-mig-1-0", "gpu-0-mig-2-0", "gpu-1"]);
    let devices = list["items"][0]["spec"]["devices"].as_array().expect("devices").clone();
    assert_eq!(devices[0]["attributes"]["type"]["string"], "mig");
    assert_eq!(devices[0]["attributes"]["profile"]["string"], "1g.10gb");
    assert_eq!(devices[1]["capacity"]["memory"]["value"], "40Gi");
    assert_eq!(devices[0]["attributes"]["parentUUID"], devices[1]["attributes"]["parentUUID"]);
}

#[test]
fn yaml_and_table_outputs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = edra(dir.path(), "", &["--backend", "mock", "-o", "yaml", "--node-name", "n1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let yaml: Value = yaml_serde::from_slice(&out.stdout).expect("stdout is YAML");
    assert_eq!(yaml["items"][0]["spec"]["driver"], "gpu.edra.dev");

    // Not a terminal and no --output: JSON.
    let default = edra(dir.path(), "", &["--backend", "mock", "--node-name", "n1"]);
    assert!(serde_json::from_slice::<Value>(&default.stdout).is_ok());

    let out = edra(dir.path(), "", &["--backend", "mock", "-o", "table", "--node-name", "n1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("NAME") && lines[0].contains("MEMORY"), "{text}");
    assert!(lines[1].starts_with("gpu-0") && lines[1].contains("80Gi") && lines[1].contains("GPU-"), "{text}");
    assert!(text.contains("2 devices in 1 ResourceSlice"), "{text}");
}

#[test]
fn without_nvml_it_fails_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!("[nvml]\nlibrary = \"{}\"\n", dir.path().join("absent/libnvidia-ml.so.1").display());
    let out = edra(dir.path(), &config, &["--backend", "nvml", "--node-name", "n1"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot load the NVML library") && err.contains("--backend mock"), "{err}");
    assert!(out.stdout.is_empty());

    let out = edra(dir.path(), &config, &["--node-name", "n1"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    // "auto" is the default here, and the error says so (no --backend auto was given).
    assert!(err.contains("backend = \"auto\" (the default)") && err.contains("--backend mock"), "{err}");
}

#[test]
fn out_of_range_durations_and_rates_exit_64_naming_each_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = "backend = \"mock\"\nnode_name = \"n1\"\n\
        [kubernetes]\nrequest_timeout = \"18446744073709551615\"\nqps = 1e-300\nburst = 1\n\
        [publish]\nrediscovery_interval = \"18446744073709551615\"\n\
        [plugin]\nshutdown_grace = 9223372036854775807\n\
        [mock]\ngpus = 2\nmig = [{ gpu = 4294967296, profiles = [\"1g.10gb\"] }]\n";
    let out = edra(dir.path(), config, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    for expected in [
        "kubernetes.request_timeout: must be from 1s to 5m, found \"18446744073709551615\"",
        "kubernetes.qps: must be from 0.1 to 10000, found 1e-300",
        "publish.rediscovery_interval: must be from 1s to 24h",
        "plugin.shutdown_grace: must be from 0s to 10m, found 9223372036854775807",
        "mock.mig: entry 0: gpu must be a GPU index from 0 to 1",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
    assert!(out.stdout.is_empty());
}
