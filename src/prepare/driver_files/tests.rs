//! Driver file discovery on temp dirs: unversioned and `vdpau/` libraries, the library
//! links the host has, the kernel's firmware search order, the MPS pipe folder, and the
//! hooks a spec gets from them.

use std::os::unix::fs::symlink;
use std::path::Path;

use super::*;
use crate::inventory::{Device, DeviceKind};
use crate::prepare::{cdi, cdi_validate};

const VERSION: &str = "550.54.15";

fn touch(p: &Path) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, b"x").unwrap();
}

fn roots(root: &Path) -> HostRoots {
    HostRoots { sys_root: root.join("sys"), proc_root: root.join("proc") }
}

fn link(dir: &Path, name: &str, target: &str) -> LibraryLink {
    LibraryLink { dir: dir.to_path_buf(), name: name.into(), target: target.into() }
}

#[test]
fn finds_nvvm70_vdpau_libraries_and_the_hosts_library_links() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let lib = root.join("usr/lib/x86_64-linux-gnu");
    for f in [
        format!("libcuda.so.{VERSION}"),
        format!("libnvidia-ml.so.{VERSION}"),
        "libnvidia-nvvm70.so.4".into(),
        "libnvidia-nvvm.so.4".into(),
        "libfoo.so.2".into(),
        format!("vdpau/libvdpau_nvidia.so.{VERSION}"),
    ] {
        touch(&lib.join(f));
    }
    symlink(format!("libnvidia-ml.so.{VERSION}"), lib.join("libnvidia-ml.so.1")).unwrap();
    symlink("libnvidia-ml.so.1", lib.join("libnvidia-ml.so")).unwrap();
    symlink("libcuda.so.999", lib.join("libcuda.so.1")).unwrap();
    symlink("libfoo.so.2", lib.join("libfoo.so")).unwrap();
    symlink(format!("/abs/libnvidia-ml.so.{VERSION}"), lib.join("libnvidia-ml.so.7")).unwrap();
    symlink(format!("libvdpau_nvidia.so.{VERSION}"), lib.join("vdpau/libvdpau_nvidia.so.1")).unwrap();

    let files = discover(root, VERSION, &roots(root));
    let names: Vec<&str> = files.libraries.iter().map(|p| p.file_name().unwrap().to_str().unwrap()).collect();
    let cuda = format!("libcuda.so.{VERSION}");
    let ml = format!("libnvidia-ml.so.{VERSION}");
    let vdpau = format!("libvdpau_nvidia.so.{VERSION}");
    assert_eq!(names, [cuda.as_str(), ml.as_str(), "libnvidia-nvvm70.so.4", vdpau.as_str()]);
    assert_eq!(files.library_dirs, [lib.clone(), lib.join("vdpau")]);
    assert_eq!(
        files.library_links,
        [
            // libcuda's SONAME is known, so the host's wrong link is not copied.
            link(&lib, "libcuda.so.1", &cuda),
            link(&lib, "libcuda.so", "libcuda.so.1"),
            link(&lib, "libnvidia-ml.so.1", &ml),
            link(&lib, "libnvidia-ml.so", "libnvidia-ml.so.1"),
            link(&lib.join("vdpau"), "libvdpau_nvidia.so.1", &vdpau),
        ],
        "links to other libraries, or through other folders, are left alone"
    );
}

#[test]
fn firmware_is_searched_where_the_kernel_looks_first_folder_wins() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    touch(&root.join("sys").join(FIRMWARE_PATH_PARAM));
    std::fs::write(root.join("sys").join(FIRMWARE_PATH_PARAM), "/opt/fw\n").unwrap();
    touch(&root.join("proc").join(OS_RELEASE));
    std::fs::write(root.join("proc").join(OS_RELEASE), "6.8.0-45-generic\n").unwrap();
    assert_eq!(
        firmware_search_path(&roots(root)),
        [
            Path::new("/opt/fw"),
            Path::new("/lib/firmware/updates/6.8.0-45-generic"),
            Path::new("/lib/firmware/updates"),
            Path::new("/lib/firmware/6.8.0-45-generic"),
            Path::new("/lib/firmware"),
            Path::new("/usr/lib/firmware"),
        ]
    );
    let fw = |dir: &str, name: &str| root.join(dir).join("nvidia").join(VERSION).join(name);
    for (dir, name) in [
        ("lib/firmware", "gsp_ga10x.bin"),
        ("lib/firmware", "gsp_tu10x.bin"),
        ("lib/firmware", "readme.txt"),
        ("lib/firmware/updates/6.8.0-45-generic", "gsp_ga10x.bin"),
        ("opt/fw", "gsp_ad10x.bin"),
    ] {
        touch(&fw(dir, name));
    }
    touch(&root.join("lib/firmware/nvidia/1.0/gsp_old.bin"));
    let files = discover(root, VERSION, &roots(root));
    assert_eq!(
        files.firmware,
        [
            fw("opt/fw", "gsp_ad10x.bin"),
            fw("lib/firmware/updates/6.8.0-45-generic", "gsp_ga10x.bin"),
            fw("lib/firmware", "gsp_tu10x.bin"),
        ]
    );
}

#[test]
fn an_unset_or_unusable_firmware_path_and_release_are_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let plain = [Path::new("/lib/firmware/updates"), Path::new("/lib/firmware"), Path::new("/usr/lib/firmware")];
    assert_eq!(firmware_search_path(&roots(root)), plain, "nothing readable");
    touch(&root.join("sys").join(FIRMWARE_PATH_PARAM));
    std::fs::write(root.join("sys").join(FIRMWARE_PATH_PARAM), "../../etc\n").unwrap();
    touch(&root.join("proc").join(OS_RELEASE));
    std::fs::write(root.join("proc").join(OS_RELEASE), "../x\n").unwrap();
    assert_eq!(firmware_search_path(&roots(root)), plain, "relative or '..' values are ignored");
}

#[test]
fn the_mps_pipe_folder_is_an_ipc_path_when_it_is_a_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    touch(&root.join(MPS_PIPE_DIR));
    assert!(discover(root, VERSION, &roots(root)).ipc_paths.is_empty(), "a file is not the pipe folder");
    std::fs::remove_file(root.join(MPS_PIPE_DIR)).unwrap();
    std::fs::create_dir_all(root.join(MPS_PIPE_DIR)).unwrap();
    let files = discover(root, VERSION, &roots(root));
    assert_eq!(files.ipc_paths, [root.join(MPS_PIPE_DIR)]);
    let layout = cdi::SpecLayout {
        vendor: "k8s.gpu.edra.dev",
        dev_root: Path::new("/dev"),
        hook_binary: Path::new("/usr/bin/edra"),
        host_driver_root: Some(Path::new("/")),
    };
    let spec = cdi::build_spec(&layout, "0a1b2c3d-0000-4000-8000-000000000001", &[&gpu()], &files);
    let mps = spec.container_edits.mounts.iter().find(|m| m.container_path == "/tmp/nvidia-mps").unwrap();
    assert_eq!(mps.host_path, "/tmp/nvidia-mps");
    assert_eq!(mps.options, cdi::IPC_MOUNT_OPTIONS);
}

fn gpu() -> Device {
    Device {
        name: "gpu-0".into(),
        kind: DeviceKind::Gpu,
        uuid: "GPU-00000000-aaaa-bbbb-cccc-000000000000".into(),
        index: 0,
        minor: 0,
        attributes: Default::default(),
        capacity: Default::default(),
        device_nodes: vec!["/dev/nvidia0".into(), "/dev/dri/card1".into(), "/dev/dri/renderD128".into()],
        shared: None,
        consumes: None,
    }
}

#[test]
fn the_spec_runs_create_symlinks_update_ldcache_then_disables_node_creation() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let lib = root.join("usr/lib64");
    touch(&lib.join(format!("libcuda.so.{VERSION}")));
    touch(&lib.join(format!("libnvidia-ptxjitcompiler.so.{VERSION}")));
    symlink(format!("libnvidia-ptxjitcompiler.so.{VERSION}"), lib.join("libnvidia-ptxjitcompiler.so.1")).unwrap();
    let files = discover(root, VERSION, &roots(root));
    assert!(!files.modify_device_files, "no driver params");
    let layout = cdi::SpecLayout {
        vendor: "k8s.gpu.edra.dev",
        dev_root: Path::new("/dev"),
        hook_binary: Path::new("/usr/bin/edra"),
        host_driver_root: Some(Path::new("/")),
    };
    touch(&root.join("proc/driver/nvidia/params"));
    std::fs::write(root.join("proc/driver/nvidia/params"), "ModifyDeviceFiles: 0\n").unwrap();
    assert!(!discover(root, VERSION, &roots(root)).modify_device_files, "already off");
    std::fs::write(root.join("proc/driver/nvidia/params"), "DeviceFileGID: 0\nModifyDeviceFiles: 1\n").unwrap();
    let files = discover(root, VERSION, &roots(root));
    assert!(files.modify_device_files);
    let spec = cdi::build_spec(&layout, "0a1b2c3d-0000-4000-8000-000000000001", &[&gpu()], &files);
    let hooks = &spec.container_edits.hooks;
    let commands: Vec<&str> = hooks.iter().map(|h| h.args[2].as_str()).collect();
    assert_eq!(commands, ["create-symlinks", "update-ldcache", "disable-device-node-modification"]);
    assert_eq!(hooks[2].args.len(), 3);
    assert!(hooks.iter().all(|h| h.hook_name == "createContainer" && h.path == "/usr/bin/edra"));
    assert_eq!(
        hooks[0].args[3..],
        [
            "--link".to_string(),
            format!("libcuda.so.{VERSION}::/usr/lib64/libcuda.so.1"),
            "--link".into(),
            "libcuda.so.1::/usr/lib64/libcuda.so".into(),
            "--link".into(),
            format!("libnvidia-ptxjitcompiler.so.{VERSION}::/usr/lib64/libnvidia-ptxjitcompiler.so.1"),
        ]
    );
    let nodes: Vec<&str> = spec.devices[0].container_edits.device_nodes.iter().map(|n| n.path.as_str()).collect();
    assert_eq!(nodes, ["/dev/nvidia0", "/dev/dri/card1", "/dev/dri/renderD128"]);
    assert_eq!(spec.cdi_version, "0.5.0", "hooks do not raise the version");
    assert!(cdi_validate::validate(&spec).is_empty(), "{:?}", cdi_validate::validate(&spec));
}
