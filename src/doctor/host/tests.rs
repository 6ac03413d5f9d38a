//! Unit tests of the host checks on temp dirs: backend (mock, unloadable NVML), device
//! nodes (mock and as-if-NVML, char devices via links to /dev/null), kubelet dirs, CDI
//! dirs and the registration sockets.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;

use super::*;
use crate::doctor::test_config;

fn mkdirs(root: &Path, dirs: &[&str]) {
    for d in dirs {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
}

/// Tests run as root in some environments, where access(2) allows everything.
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn mock_backend_warns_and_counts_its_devices() {
    let d = tempfile::tempdir().unwrap();
    let cfg = test_config(d.path(), &[("mock.gpus", "3")]);
    let (r, found) = backend(&cfg);
    assert_eq!(r.status, Status::Warn, "{r:?}");
    assert!(r.detail.contains("mock backend in use: 3 mock devices"), "{}", r.detail);
    assert_eq!(found.unwrap().inventory.devices.len(), 3);
}

#[test]
fn unloadable_nvml_fails_with_the_fix() {
    let d = tempfile::tempdir().unwrap();
    let lib = d.path().join("libnvidia-ml.so.1");
    std::fs::write(&lib, b"not a library").unwrap();
    let cfg = test_config(d.path(), &[("backend", "nvml"), ("nvml.library", lib.to_str().unwrap())]);
    let (r, found) = backend(&cfg);
    assert_eq!(r.status, Status::Fail);
    assert!(found.is_none());
    assert!(r.detail.contains("NVML"), "{}", r.detail);
    assert!(r.fix.contains("--backend mock") && r.fix.contains("nvml.library"), "{}", r.fix);
    assert_eq!(device_nodes(&cfg, None).status, Status::Skip);
}

#[test]
fn device_nodes_missing_are_expected_with_the_mock_backend() {
    let d = tempfile::tempdir().unwrap();
    let cfg = test_config(d.path(), &[]);
    let (_, found) = backend(&cfg);
    let r = device_nodes(&cfg, found.as_ref());
    assert_eq!(r.status, Status::Warn);
    assert!(r.detail.contains("2 of 2") && r.detail.contains("expected with the mock backend"), "{}", r.detail);
}

#[test]
fn device_nodes_of_real_gpus_must_be_character_devices() {
    let d = tempfile::tempdir().unwrap();
    mkdirs(d.path(), &["dev"]);
    let cfg = test_config(d.path(), &[]);
    let (_, found) = backend(&cfg);
    let mut found = found.unwrap();
    found.backend = "nvml";
    let dev = d.path().join("dev");
    let r = device_nodes(&cfg, Some(&found));
    assert_eq!(r.status, Status::Fail);
    assert!(r.detail.contains("missing") && r.detail.contains("nvidia0"), "{}", r.detail);
    assert!(r.fix.contains("nvidia-modprobe"), "{}", r.fix);
    // A regular file is not a device node.
    std::fs::write(dev.join("nvidia0"), b"").unwrap();
    std::os::unix::fs::symlink("/dev/null", dev.join("nvidia1")).unwrap();
    let r = device_nodes(&cfg, Some(&found));
    assert_eq!(r.status, Status::Fail);
    assert!(r.detail.contains("not character devices") && r.detail.contains("nvidia0"), "{}", r.detail);
    assert!(!r.detail.contains("nvidia1"), "{}", r.detail);
    // GPUs fine, control nodes missing: a warning with the modprobe hint.
    std::fs::remove_file(dev.join("nvidia0")).unwrap();
    std::os::unix::fs::symlink("/dev/null", dev.join("nvidia0")).unwrap();
    let r = device_nodes(&cfg, Some(&found));
    assert_eq!(r.status, Status::Warn);
    assert!(r.detail.contains("nvidiactl") && r.fix.contains("nvidia-modprobe -u -c=0"), "{r:?}");
    for n in ["nvidiactl", "nvidia-uvm"] {
        std::os::unix::fs::symlink("/dev/null", dev.join(n)).unwrap();
    }
    assert_eq!(device_nodes(&cfg, Some(&found)).status, Status::Pass);
}

#[test]
fn kubelet_registry_dir_missing_asks_whether_the_kubelet_runs() {
    let d = tempfile::tempdir().unwrap();
    let cfg = test_config(d.path(), &[]);
    let r = kubelet_dirs(&cfg.paths);
    assert_eq!(r.status, Status::Fail);
    assert!(r.detail.contains("plugins_registry") && r.fix.contains("kubelet running"), "{r:?}");
    assert!(r.fix.contains("kubelet.root_dir"), "{}", r.fix);
    mkdirs(d.path(), &["kubelet/plugins_registry"]);
    let r = kubelet_dirs(&cfg.paths);
    assert_eq!(r.status, Status::Warn, "plugins dir missing but creatable: {r:?}");
    mkdirs(d.path(), &["kubelet/plugins"]);
    let r = kubelet_dirs(&cfg.paths);
    assert_eq!(r.status, Status::Pass, "{r:?}");
    if !is_root() {
        let reg = d.path().join("kubelet/plugins_registry");
        std::fs::set_permissions(&reg, std::fs::Permissions::from_mode(0o555)).unwrap();
        let r = kubelet_dirs(&cfg.paths);
        assert_eq!(r.status, Status::Fail);
        assert!(r.detail.contains("not writable") && r.fix.contains("root"), "{r:?}");
        std::fs::set_permissions(&reg, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

#[test]
fn cdi_dynamic_dir_may_be_created_and_missing_spec_dirs_warn() {
    let d = tempfile::tempdir().unwrap();
    let cfg = test_config(d.path(), &[]);
    let r = cdi_dirs(&cfg.paths, "gpu.edra.dev");
    assert_eq!(r.status, Status::Warn, "{r:?}");
    assert!(r.detail.contains("will be created") && r.detail.contains("etc/cdi"), "{}", r.detail);
    mkdirs(d.path(), &["etc/cdi", "run/cdi"]);
    let r = cdi_dirs(&cfg.paths, "gpu.edra.dev");
    assert_eq!(r.status, Status::Pass, "{r:?}");
    assert!(r.detail.contains("edra can write") && r.detail.contains("(0 edra claim specs)"), "{}", r.detail);
    let uid = "0b4f3a1e-8d2c-4e5f-9a6b-7c8d9e0f1a2b";
    std::fs::write(d.path().join(format!("run/cdi/k8s.gpu.edra.dev-claim_{uid}.json")), b"{}").unwrap();
    std::fs::write(d.path().join("run/cdi/nvidia.json"), b"{}").unwrap();
    assert_eq!(edra_spec_uids(&d.path().join("run/cdi"), "gpu.edra.dev"), [uid]);
    assert!(cdi_dirs(&cfg.paths, "gpu.edra.dev").detail.contains("(1 edra claim specs)"));
    std::fs::remove_dir_all(d.path().join("run/cdi")).unwrap();
    std::fs::write(d.path().join("run/cdi"), b"").unwrap();
    assert_eq!(cdi_dirs(&cfg.paths, "gpu.edra.dev").status, Status::Fail);
    if !is_root() {
        std::fs::remove_file(d.path().join("run/cdi")).unwrap();
        mkdirs(d.path(), &["run/cdi"]);
        std::fs::set_permissions(d.path().join("run/cdi"), std::fs::Permissions::from_mode(0o555)).unwrap();
        let r = cdi_dirs(&cfg.paths, "gpu.edra.dev");
        assert_eq!(r.status, Status::Fail);
        assert!(r.detail.contains("not writable"), "{}", r.detail);
    }
}

#[test]
fn registration_sockets() {
    let d = tempfile::tempdir().unwrap();
    let cfg = test_config(d.path(), &[]);
    assert_eq!(registration(&cfg, None).status, Status::Warn);
    let dra = cfg.paths.dra_socket(&cfg.driver_name);
    std::fs::create_dir_all(dra.parent().unwrap()).unwrap();
    let _dra = UnixListener::bind(&dra).unwrap();
    let r = registration(&cfg, None);
    assert_eq!(r.status, Status::Warn);
    assert!(r.detail.contains("dra.sock exists but"), "{}", r.detail);
    let reg = cfg.paths.registration_socket(&cfg.driver_name);
    std::fs::create_dir_all(reg.parent().unwrap()).unwrap();
    let _reg = UnixListener::bind(&reg).unwrap();
    assert_eq!(registration(&cfg, None).status, Status::Pass);
    let r = registration(&cfg, Some(true));
    assert_eq!(r.status, Status::Pass);
    assert!(r.detail.ends_with("are in place, registered by the kubelet"), "{}", r.detail);
    let r = registration(&cfg, Some(false));
    assert_eq!(r.status, Status::Warn);
    assert!(r.detail.starts_with("sockets in place, not registered by the kubelet"), "{}", r.detail);
    assert!(r.fix.contains("is the kubelet running"), "{}", r.fix);
}

#[test]
fn helpers() {
    let d = tempfile::tempdir().unwrap();
    let deep = d.path().join("a/b/c");
    assert_eq!(nearest_existing(&deep), Some(d.path()));
    assert!(writable(d.path()));
    assert!(!writable(&deep));
}
