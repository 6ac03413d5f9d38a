use super::*;
use crate::config::MockMig;
use crate::inventory::{AttributeValue, DeviceKind};

fn config(node: &str) -> Config {
    let mut cfg = crate::config::Config::defaults_for(node);
    cfg.paths.dev_root = "/tdev".into();
    cfg
}

#[test]
fn defaults_give_two_80gib_gpus() {
    let inv = MockBackend::new(&config("n1")).discover().expect("discover");
    assert_eq!(inv.devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["gpu-0", "gpu-1"]);
    for d in &inv.devices {
        assert_eq!(d.capacity["memory"], 80 << 30);
        assert!(d.uuid.starts_with("GPU-") && d.uuid.len() == 40, "{}", d.uuid);
        assert_eq!(d.device_nodes, vec![PathBuf::from(format!("/tdev/nvidia{}", d.minor))]);
        assert_eq!(d.attributes["productName"], AttributeValue::String("NVIDIA A100-SXM4-80GB".into()));
    }
    assert_ne!(inv.devices[0].uuid, inv.devices[1].uuid);
}

#[test]
fn drm_nodes_come_from_a_fake_sysfs_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config("n1");
    cfg.paths.dev_root = dir.path().join("dev");
    cfg.paths.sys_root = dir.path().join("sys");
    assert_eq!(MockBackend::new(&cfg).discover().expect("discover").devices[0].device_nodes.len(), 1);
    std::fs::create_dir_all(cfg.paths.sys_root.join("bus/pci/devices/0000:10:00.0/drm/card1")).expect("mkdir");
    std::fs::create_dir_all(cfg.paths.sys_root.join("bus/pci/devices/0000:10:00.0/drm/renderD128")).expect("mkdir");
    std::fs::create_dir_all(cfg.paths.dev_root.join("dri")).expect("mkdir");
    std::fs::write(cfg.paths.dev_root.join("dri/card1"), b"").expect("write");
    std::fs::write(cfg.paths.dev_root.join("dri/renderD128"), b"").expect("write");
    let inv = MockBackend::new(&cfg).discover().expect("discover");
    let dev = &cfg.paths.dev_root;
    assert_eq!(inv.devices[0].device_nodes, [dev.join("nvidia0"), dev.join("dri/card1"), dev.join("dri/renderD128")]);
    assert_eq!(inv.devices[1].device_nodes, [dev.join("nvidia1")], "GPU 1 is at 0000:11:00.0");
}

#[test]
fn backend_from_config_picks_the_mock() {
    let mut cfg = config("n1");
    cfg.backend = crate::config::BackendKind::Mock;
    let backend = crate::inventory::backend_from_config(&cfg).expect("mock needs nothing");
    assert_eq!(backend.name(), "mock");
    assert_eq!(backend.discover().expect("discover").devices.len(), 2);
}

#[test]
fn uuids_are_stable_per_node() {
    let a = MockBackend::new(&config("n1")).discover().expect("discover");
    let b = MockBackend::new(&config("n1")).discover().expect("discover");
    let c = MockBackend::new(&config("n2")).discover().expect("discover");
    assert_eq!(a, b);
    assert_ne!(a.devices[0].uuid, c.devices[0].uuid);
}

#[test]
fn mig_layout_replaces_the_parent() {
    let mut cfg = config("n1");
    cfg.mock.mig = vec![MockMig { gpu: 1, profiles: vec!["3g.40gb".into(), "1c.3g.40gb".into()] }];
    let inv = MockBackend::new(&cfg).discover().expect("discover");
    let names: Vec<&str> = inv.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["gpu-0", "gpu-1-mig-1-0", "gpu-1-mig-2-0"]);
    let m = &inv.devices[2];
    assert!(m.uuid.starts_with("MIG-"));
    assert_eq!(m.capacity["memory"], 40 << 30);
    assert_eq!(m.capacity["multiprocessors"], 15);
    assert!(matches!(&m.kind, DeviceKind::Mig(i)
            if i.profile == "1c.3g.40gb" && i.parent_minor == 1 && i.gi == 2 && i.parent_uuid.starts_with("GPU-")));
    assert_eq!(
        m.device_nodes,
        vec![
            PathBuf::from("/tdev/nvidia1"),
            PathBuf::from("/tdev/nvidia-caps/nvidia-cap156"),
            PathBuf::from("/tdev/nvidia-caps/nvidia-cap157"),
        ]
    );
}

#[test]
fn impossible_layouts_are_refused() {
    let mut cfg = config("n1");
    cfg.mock.mig = vec![MockMig { gpu: 0, profiles: vec!["4g.40gb".into(), "4g.40gb".into()] }];
    let err = MockBackend::new(&cfg).discover().expect_err("8 slices");
    assert!(err.to_string().contains("mock.mig"), "{err}");
}

#[test]
fn overflowing_profile_numbers_are_refused_not_wrapped() {
    let mut cfg = config("n1");
    // 1 + 4294967295 slices wraps a u32 to 0; 17179869184 GiB wraps a u64 shift to 0 bytes.
    for profiles in [["1g.10gb", "4294967295g.1gb"], ["1g.10gb", "1g.17179869184gb"]] {
        cfg.mock.mig = vec![MockMig { gpu: 0, profiles: profiles.iter().map(|p| p.to_string()).collect() }];
        let err = MockBackend::new(&cfg).discover().expect_err("more than the GPU has");
        assert!(err.to_string().contains("need more than the GPU has"), "{profiles:?}: {err}");
    }
}

#[test]
fn compute_modes_are_kept_per_gpu_and_unknown_gpus_refused() {
    use crate::gpu::{ComputeMode, ComputeModes, GpuError};
    let backend = MockBackend::new(&config("node-a"));
    let inv = backend.discover().unwrap();
    let (a, b) = (&inv.devices[0].uuid, &inv.devices[1].uuid);
    assert_eq!(backend.compute_mode(a).unwrap(), ComputeMode::Default, "as after a boot");
    backend.set_compute_mode(a, ComputeMode::ExclusiveProcess).unwrap();
    assert_eq!(backend.compute_mode(a).unwrap(), ComputeMode::ExclusiveProcess);
    assert_eq!(backend.compute_mode(b).unwrap(), ComputeMode::Default);
    // Clones share the modes, as handles of one machine do.
    assert_eq!(backend.clone().compute_mode(a).unwrap(), ComputeMode::ExclusiveProcess);
    assert!(matches!(backend.set_compute_mode("GPU-nope", ComputeMode::Default), Err(GpuError::UnknownGpu { .. })));
}

#[test]
fn profiles_parse() {
    assert_eq!(parse_profile("1g.10gb"), Some((1, 1, 10)));
    assert_eq!(parse_profile("1c.3g.40gb"), Some((3, 1, 40)));
    assert_eq!(parse_profile("4c.3g.40gb"), None);
    assert_eq!(parse_profile("3g"), None);
    assert_eq!(gi_cap_minor(0, 0), 3);
    assert_eq!(ci_cap_minor(0, 1, 0), 13);
}
