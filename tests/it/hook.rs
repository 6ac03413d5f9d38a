//! `edra hook update-ldcache` as the container runtime runs it: the real binary, the OCI
//! state on stdin, a fake bundle in a temp dir, the host's ldconfig.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn run_hook(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_edra"))
        .arg("hook")
        .arg("update-ldcache")
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
    assert!(String::from_utf8_lossy(&out.stdout).contains("update-ldcache"));
}
