use super::*;

/// Takes the locks once free. A test elsewhere in this process that forks a child copies
/// the descriptors into it, which holds the locks until it execs: wait that out.
fn acquire_soon(paths: &[PathBuf]) -> InstanceLock {
    let start = std::time::Instant::now();
    loop {
        match InstanceLock::acquire(paths) {
            Ok(l) => return l,
            Err(e) if start.elapsed() < std::time::Duration::from_secs(5) => {
                let _ = e;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn a_second_holder_is_refused_with_the_first_ones_pid_and_may_take_it_after() {
    let tmp = tempfile::tempdir().unwrap();
    let paths = lock_paths(&tmp.path().join("plugins/gpu.edra.dev"), &tmp.path().join("cdi"), "k8s.gpu.edra.dev");
    let first = acquire_soon(&paths);
    let text = std::fs::read_to_string(&paths[0]).unwrap();
    assert_eq!(text.trim(), std::process::id().to_string());
    // flock is per open file description: a second open in this process conflicts
    // exactly as another process would.
    let err = InstanceLock::acquire(&paths).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(&err, InstanceError::Held { pid: Some(p), .. } if *p == std::process::id()), "{msg}");
    assert!(msg.contains(&format!("(pid {})", std::process::id())) && msg.contains("edra.lock"), "{msg}");
    // Only the CDI lock held (another kubelet directory, the same CDI directory).
    drop(first);
    let cdi_only = acquire_soon(&paths[1..]);
    // The kubelet directory's lock is free once a child forked while `first` was held has
    // exec'd; until then the refusal may name it rather than the CDI lock.
    let start = std::time::Instant::now();
    let err = loop {
        let err = InstanceLock::acquire(&paths).unwrap_err();
        if err.to_string().contains(".k8s.gpu.edra.dev.lock") || start.elapsed() > std::time::Duration::from_secs(5) {
            break err;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(err.to_string().contains(".k8s.gpu.edra.dev.lock"), "{err}");
    drop(cdi_only);
    acquire_soon(&paths);
}

#[test]
fn a_stale_file_from_a_dead_process_does_not_block() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("edra.lock");
    std::fs::write(&path, "4194304\n").unwrap();
    let _held = acquire_soon(std::slice::from_ref(&path));
    assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), std::process::id().to_string());
}

#[test]
fn a_link_planted_by_another_user_is_refused_and_its_target_kept() {
    use crate::test_support::planted;
    use std::os::unix::fs::PermissionsExt;
    if !planted::is_root() {
        eprintln!("skipped: planting a link as another user needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let secret = tmp.path().join("secret");
    std::fs::write(&secret, "root's secret\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let cdi = tmp.path().join("cdi");
    std::fs::create_dir(&cdi).unwrap();
    let paths = lock_paths(&tmp.path().join("plugins/gpu.edra.dev"), &cdi, "k8s.gpu.edra.dev");
    planted::link_as_nobody(&cdi, &secret, &paths[1]);
    let err = InstanceLock::acquire(&paths).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, InstanceError::NotAFile { found: "a symbolic link", .. }), "{msg}");
    assert!(msg.contains(".k8s.gpu.edra.dev.lock is a symbolic link, not a regular file"), "{msg}");
    assert!(msg.contains(&format!("chmod go-w {}", cdi.display())), "{msg}");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root's secret\n");
    // A hard link to the same file is refused too.
    std::fs::remove_file(&paths[1]).unwrap();
    std::fs::hard_link(&secret, &paths[1]).unwrap();
    let err = InstanceLock::acquire(&paths).unwrap_err();
    assert!(err.to_string().contains("is a hard link to another file"), "{err}");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root's secret\n");
}

#[test]
fn a_fifo_or_a_directory_at_the_lock_path_is_refused_without_blocking() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("edra.lock");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path for the call's duration.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let err = InstanceLock::acquire(std::slice::from_ref(&fifo)).unwrap_err();
    assert!(err.to_string().contains("is a device, FIFO or socket, not a regular file"), "{err}");
    let dir = tmp.path().join("dir.lock");
    std::fs::create_dir(&dir).unwrap();
    let err = InstanceLock::acquire(std::slice::from_ref(&dir)).unwrap_err();
    assert!(err.to_string().contains("is a directory, not a regular file"), "{err}");
}
