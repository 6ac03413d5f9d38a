//! `edra hook ...` as the container runtime runs it: the real binary, the OCI state on
//! stdin, a fake bundle in a temp dir, the host's ldconfig.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn run_hook(args: &[&str], stdin: &[u8]) -> Output {
    run(&[&["update-ldcache"], args].concat(), stdin)
}

fn run(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_edra"))
        .arg("hook")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The hook may exit before reading everything (bad arguments); a broken pipe is fine.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    child.wait_with_output().unwrap()
}

fn bundle(dir: &Path) -> Vec<u8> {
    std::fs::create_dir_all(dir.join("rootfs/etc")).unwrap();
    std::fs::create_dir_all(dir.join("rootfs/usr/lib/gpu")).unwrap();
    std::fs::write(dir.join("config.json"), r#"{"ociVersion":"1.2.0","root":{"path":"rootfs"}}"#).unwrap();
    serde_json::json!({"ociVersion": "1.2.0", "id": "c", "status": "creating", "pid": 1, "bundle": dir})
        .to_string()
        .into_bytes()
}

#[test]
fn hook_succeeds_and_writes_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let out = run_hook(&["--folder", "/usr/lib/gpu"], &state);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(tmp.path().join("rootfs/etc/ld.so.cache").is_file());
    let conf = std::fs::read_to_string(tmp.path().join("rootfs/etc/ld.so.conf.d/00-edra-gpu.conf")).unwrap();
    assert!(conf.contains("/usr/lib/gpu\n"));
}

#[test]
fn hook_exit_codes_tell_bad_input_from_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let bad = run_hook(&["--folder", "/usr/lib/gpu"], b"not json");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not valid OCI state JSON"));
    let relative = run_hook(&["--folder", "usr/lib"], &state);
    assert_eq!(relative.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&relative.stderr).contains("absolute path"));
    let failing = run_hook(&["--folder", "/usr/lib/gpu", "--ldconfig", "/bin/false"], &state);
    assert_eq!(failing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&failing.stderr).contains("ldconfig failed"));
}

#[test]
fn hook_help_works() {
    let out = Command::new(env!("CARGO_BIN_EXE_edra")).args(["hook", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for hook in ["update-ldcache", "create-symlinks", "disable-device-node-modification"] {
        assert!(help.contains(hook), "{hook}: {help}");
    }
}

#[test]
fn create_symlinks_links_in_the_rootfs_and_rejects_bad_links() {
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let out = run(&["create-symlinks", "--link", "libcuda.so.1::/usr/lib/gpu/libcuda.so"], &state);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let link = std::fs::read_link(tmp.path().join("rootfs/usr/lib/gpu/libcuda.so")).unwrap();
    assert_eq!(link, Path::new("libcuda.so.1"));
    let bad = run(&["create-symlinks", "--link", "x::/usr/../etc/passwd"], &state);
    assert_eq!(bad.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.starts_with("edra hook create-symlinks: --link"), "{stderr}");
}

#[test]
fn disable_device_node_modification_acts_only_when_the_driver_may_create_nodes() {
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let proc_root = tmp.path().join("proc");
    std::fs::create_dir_all(proc_root.join("driver/nvidia")).unwrap();
    std::fs::write(proc_root.join("driver/nvidia/params"), "ModifyDeviceFiles: 0\n").unwrap();
    let proc_arg = proc_root.display().to_string();
    let out = run(&["disable-device-node-modification", "--proc-root", &proc_arg], &state);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(proc_root.join("driver/nvidia/params"), "ModifyDeviceFiles: 1\n").unwrap();
    let out = run(&["disable-device-node-modification", "--proc-root", &proc_arg], &state);
    // Run by hand in the host's namespace, the rootfs's /proc is no procfs mount: the hook
    // says so instead of reporting a success it did not have.
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("rootfs/proc is not a procfs mount") && stderr.contains("createContainer hook"),
        "{stderr}"
    );
}

/// The hook in a second mount namespace, as a runtime runs it (`unshare --mount`, no runtime
/// needed): the host's `/proc/driver` is a tmpfs saying `ModifyDeviceFiles: 1` there, the
/// rootfs's `/proc` a recursive bind of that `/proc`, and the state says pid 1 (as runc
/// does). The copy must be mounted in that namespace only.
#[test]
fn disable_device_node_modification_mounts_in_the_namespace_it_runs_in() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let unshare = Command::new("unshare").arg("--version").output().is_ok_and(|o| o.status.success());
    if !root || !unshare {
        let reason = if root { "util-linux unshare is not installed" } else { "not running as root" };
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{reason}; .ci/run runs as root with util-linux");
        eprintln!("disable_device_node_modification_mounts_in_the_namespace_it_runs_in: skipped: {reason}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let rootfs = tmp.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("proc")).unwrap();
    std::fs::write(tmp.path().join("state.json"), &state).unwrap();
    let script = r#"set -e
mount -t tmpfs -o mode=0755 edra-test /proc/driver
mkdir /proc/driver/nvidia
printf 'ModifyDeviceFiles: 1\nDeviceFileUID: 0\n' > /proc/driver/nvidia/params
mount --rbind /proc "$2/proc"
"$1" hook disable-device-node-modification < "$3" &
pid=$!
wait "$pid"
echo "hook=$pid"
echo "container=$(tr '\n' ';' < "$2/proc/driver/nvidia/params")"
echo "write=$( (echo x > "$2/proc/driver/nvidia/params") 2>/dev/null && echo allowed || echo refused)"
echo "namespace=$(tr '\n' ';' < /proc/driver/nvidia/params)"
"#;
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", script, "sh", env!("CARGO_BIN_EXE_edra")])
        .arg(&rootfs)
        .arg(tmp.path().join("state.json"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("container=ModifyDeviceFiles: 0;DeviceFileUID: 0;\n"), "the copy is mounted: {stdout}");
    assert!(stdout.contains("write=refused\n"), "read-only: {stdout}");
    assert!(stdout.contains("namespace=ModifyDeviceFiles: 1;DeviceFileUID: 0;\n"), "only over the rootfs: {stdout}");
    // Outside that namespace nothing was mounted: the rootfs's /proc is still an empty folder.
    assert_eq!(std::fs::read_dir(rootfs.join("proc")).unwrap().count(), 0);
    let pid = stdout.lines().find_map(|l| l.strip_prefix("hook=")).expect("the hook's pid");
    let prefix = format!(".edra-nvidia-params-{pid}-");
    let leftovers = std::fs::read_dir("/run")
        .map(|rd| rd.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&prefix)).count())
        .unwrap_or(0);
    assert_eq!(leftovers, 0, "the host copy is removed once mounted");
}
