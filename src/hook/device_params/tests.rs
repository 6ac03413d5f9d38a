//! disable-device-node-modification: the rewrite and when the hook acts. The mount itself,
//! in a second mount namespace, is tested with the real binary (tests/it/hook.rs) and under
//! real runtimes (tests/it/runtime.rs).

use std::path::Path;

use super::*;

const PARAMS_TEXT: &str = "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n";

#[test]
fn rewrites_only_an_enabled_setting() {
    assert_eq!(rewrite(PARAMS_TEXT).unwrap(), "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 0\nDeviceFileUID: 0\n");
    assert_eq!(rewrite("ModifyDeviceFiles:1").unwrap(), "ModifyDeviceFiles: 0", "no trailing newline kept as is");
    assert_eq!(rewrite("ModifyDeviceFiles: 0\n"), None);
    assert_eq!(rewrite("DeviceFileMode: 438\n"), None);
    assert_eq!(rewrite(""), None);
}

fn bundle(tmp: &Path, pid: Option<i32>) -> Vec<u8> {
    let bundle = tmp.join("bundle");
    std::fs::create_dir_all(bundle.join("rootfs/proc")).unwrap();
    std::fs::write(bundle.join("config.json"), r#"{"root": {"path": "rootfs"}}"#).unwrap();
    serde_json::json!({"ociVersion": "1.2.0", "id": "c", "status": "creating", "pid": pid, "bundle": bundle})
        .to_string()
        .into_bytes()
}

#[test]
fn nothing_happens_without_the_driver_or_with_the_setting_off() {
    let tmp = tempfile::tempdir().unwrap();
    let proc_root = tmp.path().join("proc");
    // The rootfs's /proc is a plain folder: any attempt to mount would fail with NoProcfs.
    disable(&bundle(tmp.path(), None)[..], &proc_root).unwrap();
    std::fs::create_dir_all(proc_root.join("driver/nvidia")).unwrap();
    std::fs::write(proc_root.join(PARAMS), "ModifyDeviceFiles: 0\n").unwrap();
    disable(&bundle(tmp.path(), Some(1))[..], &proc_root).unwrap();
    let e = disable(&b"{"[..], &proc_root).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    std::fs::remove_file(proc_root.join(PARAMS)).unwrap();
    std::fs::create_dir(proc_root.join(PARAMS)).unwrap();
    let e = disable(&bundle(tmp.path(), None)[..], &proc_root).unwrap_err();
    assert!(matches!(e, HookError::ReadHost { .. }) && e.exit_code() == 1, "{e}");
}

#[test]
fn without_the_containers_procfs_it_fails_instead_of_pretending() {
    let tmp = tempfile::tempdir().unwrap();
    let proc_root = tmp.path().join("proc");
    std::fs::create_dir_all(proc_root.join("driver/nvidia")).unwrap();
    std::fs::write(proc_root.join(PARAMS), PARAMS_TEXT).unwrap();
    // Whatever the state says about the pid (runc: 1, crun: 0, absent), only the rootfs's
    // /proc where the hook runs counts; here it is a plain folder, as in the host's namespace.
    for pid in [Some(1), Some(0), None] {
        let e = disable(&bundle(tmp.path(), pid)[..], &proc_root).unwrap_err();
        assert!(matches!(&e, HookError::NoProcfs { path } if path.ends_with("rootfs/proc")), "{e}");
        assert_eq!(e.exit_code(), 1);
        assert!(e.to_string().contains("must run as a createContainer hook"), "{e}");
    }
    // A symlink to the host's procfs is not the container's /proc either.
    let rootfs_proc = tmp.path().join("bundle/rootfs/proc");
    std::fs::remove_dir(&rootfs_proc).unwrap();
    std::os::unix::fs::symlink("/proc", &rootfs_proc).unwrap();
    let e = disable(&bundle_state(tmp.path())[..], &proc_root).unwrap_err();
    assert!(matches!(e, HookError::NoProcfs { .. }), "{e}");
}

fn bundle_state(tmp: &Path) -> Vec<u8> {
    serde_json::json!({"ociVersion": "1.2.0", "id": "c", "status": "creating", "bundle": tmp.join("bundle")})
        .to_string()
        .into_bytes()
}
