//! disable-device-node-modification: the rewrite, when the hook acts, and (where the test
//! may create mount namespaces, as root in CI) the mount in a real second namespace.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

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
    // No pid in the state: any attempt to mount would fail with NoPid.
    disable(&bundle(tmp.path(), None)[..], &proc_root).unwrap();
    std::fs::create_dir_all(proc_root.join("driver/nvidia")).unwrap();
    std::fs::write(proc_root.join(PARAMS), "ModifyDeviceFiles: 0\n").unwrap();
    disable(&bundle(tmp.path(), None)[..], &proc_root).unwrap();
    std::fs::write(proc_root.join(PARAMS), PARAMS_TEXT).unwrap();
    let e = disable(&bundle(tmp.path(), None)[..], &proc_root).unwrap_err();
    assert!(matches!(e, HookError::NoPid), "{e}");
    let e = disable(&bundle(tmp.path(), Some(4242))[..], &proc_root).unwrap_err();
    assert!(matches!(e, HookError::Namespace { pid: 4242, .. }), "no such namespace file: {e}");
    assert_eq!(e.exit_code(), 1);
    let e = disable(&b"{"[..], &proc_root).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    std::fs::remove_file(proc_root.join(PARAMS)).unwrap();
    std::fs::create_dir(proc_root.join(PARAMS)).unwrap();
    let e = disable(&bundle(tmp.path(), Some(4242))[..], &proc_root).unwrap_err();
    assert!(matches!(e, HookError::ReadHost { .. }) && e.exit_code() == 1, "{e}");
}

/// A process in a new, private mount namespace, ready once it has printed a line.
struct Namespaced(std::process::Child);

impl Namespaced {
    fn start() -> Option<Namespaced> {
        let mut child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", "echo ready; exec sleep 600"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let mut line = String::new();
        let ready = BufReader::new(child.stdout.take()?).read_line(&mut line).is_ok_and(|_| line == "ready\n");
        let me = Namespaced(child);
        ready.then_some(me)
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.0.id()).unwrap()
    }
}

impl Drop for Namespaced {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn mounts_a_read_only_copy_in_the_containers_namespace_only() {
    let Some(container) = Namespaced::start() else {
        eprintln!("skipped: cannot create a mount namespace here (needs root and util-linux unshare)");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("params");
    std::fs::write(&target, PARAMS_TEXT).unwrap();
    let pid = container.pid();
    let ns = Path::new("/proc").join(pid.to_string()).join("ns/mnt");
    let copy = rewrite(PARAMS_TEXT).unwrap();
    match mount_file_in_namespace(pid, &ns, &target, copy.as_bytes(), None) {
        Err(HookError::Namespace { source, .. }) if source.raw_os_error() == Some(libc::EPERM) => {
            eprintln!("skipped: mounting is not permitted here");
            return;
        }
        r => r.unwrap(),
    }
    let seen = Path::new("/proc").join(pid.to_string()).join("root").join(target.strip_prefix("/").unwrap());
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), copy, "the container sees the copy");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), PARAMS_TEXT, "the host does not");
    let e = std::fs::OpenOptions::new().write(true).open(&seen).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "read-only: {e}");
    let leftovers = std::fs::read_dir("/run")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| {
                    e.file_name().to_string_lossy().contains(&format!("edra-nvidia-params-{}", std::process::id()))
                })
                .count()
        })
        .unwrap_or(0);
    assert_eq!(leftovers, 0, "the host copy is removed once mounted");

    // With the procfs guard, a rootfs whose /proc is not procfs is left alone.
    let rootfs = tmp.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("proc/driver/nvidia")).unwrap();
    std::fs::write(rootfs.join("proc").join(PARAMS), PARAMS_TEXT).unwrap();
    mount_copy(pid, &ns, &rootfs, copy.as_bytes()).unwrap();
    let seen = Path::new("/proc").join(pid.to_string()).join("root").join(rootfs.strip_prefix("/").unwrap());
    assert_eq!(std::fs::read_to_string(seen.join("proc").join(PARAMS)).unwrap(), PARAMS_TEXT);
}
