//! Tests of the apply-memory-limit hook's input: the bundle's config.json, which must be a
//! regular file, read without blocking.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use super::*;

/// The OCI state of a container whose bundle is `bundle`.
fn state(bundle: &Path) -> Vec<u8> {
    serde_json::json!({"ociVersion": "1.2.0", "id": "c1", "status": "creating", "pid": 1, "bundle": bundle})
        .to_string()
        .into_bytes()
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path for the call's duration.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// Runs `f` on a thread and waits for its answer with a deadline: a hang fails the test
/// instead of holding it up (the thread stays blocked until the test process ends).
fn within<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10)).expect("answered at once, not blocked on the FIFO")
}

#[test]
fn a_fifo_as_config_json_is_refused_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().to_path_buf();
    mkfifo(&bundle.join("config.json"));
    let input = state(&bundle);
    let err = within(move || container(input.as_slice()).map(|_| ()).unwrap_err());
    assert!(matches!(err, LimitHookError::Input(_)), "{err:?}");
    assert_eq!(err.exit_code(), 2);
    let msg = err.to_string();
    assert!(msg.contains("config.json: it is a FIFO, socket or device, not a regular file"), "{msg}");
    // The ldcache hook reads the same file the same way.
    let input = state(&bundle);
    let err = within(move || super::super::rootfs_from_state(&input).unwrap_err());
    let chain = crate::util::error_chain(&err);
    assert!(chain.contains("it is a FIFO, socket or device, not a regular file"), "{chain}");
}

#[test]
fn a_directory_or_a_symlink_as_config_json_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir_bundle = tmp.path().join("a");
    std::fs::create_dir_all(dir_bundle.join("config.json")).unwrap();
    let err = container(state(&dir_bundle).as_slice()).unwrap_err().to_string();
    assert!(err.contains("it is a directory, not a regular file"), "{err}");
    let link_bundle = tmp.path().join("b");
    std::fs::create_dir_all(&link_bundle).unwrap();
    std::fs::write(tmp.path().join("real.json"), r#"{"linux": {"cgroupsPath": "/a/b"}}"#).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("real.json"), link_bundle.join("config.json")).unwrap();
    let err = container(state(&link_bundle).as_slice()).unwrap_err().to_string();
    assert!(err.contains("it is a symbolic link"), "{err}");
}

#[test]
fn a_regular_config_json_gives_the_cgroups_path() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("config.json"), r#"{"linux": {"cgroupsPath": "/kubepods/pod1/abc"}}"#).unwrap();
    let (id, path) = container(state(tmp.path()).as_slice()).unwrap();
    assert_eq!((id.as_str(), path.as_str()), ("c1", "/kubepods/pod1/abc"));
}
