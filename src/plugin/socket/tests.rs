use super::*;

#[test]
fn a_link_planted_at_edras_own_directory_is_refused_and_its_target_keeps_its_mode() {
    use crate::test_support::planted;
    if !planted::is_root() {
        eprintln!("skipped: planting a link as another user needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(tmp.path(), Permissions::from_mode(0o711)).unwrap();
    let (plugins, target) = (tmp.path().join("plugins"), tmp.path().join("etc"));
    fs::create_dir(&plugins).unwrap();
    fs::create_dir(&target).unwrap();
    fs::set_permissions(&target, Permissions::from_mode(0o755)).unwrap();
    let own = plugins.join("gpu.edra.dev");
    planted::link_as_nobody(&plugins, &target, &own);
    let err = prepare_dir(&own, true).unwrap_err();
    let msg = crate::util::error_chain(&err);
    assert!(msg.contains("is a symbolic link; edra does not follow it"), "{msg}");
    assert_eq!(fs::metadata(&target).unwrap().mode() & 0o7777, 0o755, "the link's target keeps its mode");
}

#[tokio::test]
async fn a_live_socket_is_never_replaced_and_a_dead_one_is() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("dra.sock");
    let live = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let before = fs::metadata(&path).unwrap().ino();
    let err = bind(&path, tmp.path()).unwrap_err();
    assert!(
        matches!(&err, PluginError::SocketInUse { pid: Some(p), .. } if *p == std::process::id()),
        "the peer's pid comes from SO_PEERCRED: {err:?}"
    );
    assert!(err.to_string().contains(&format!("(pid {})", std::process::id())), "{err}");
    assert_eq!(fs::metadata(&path).unwrap().ino(), before, "the live socket is left in place");
    // Nobody listens any more: the file is stale and is replaced. (A child another test
    // thread is spawning may hold the listener until its exec: wait that out, bounded.)
    drop(live);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let bound = loop {
        match bind(&path, tmp.path()) {
            Err(PluginError::SocketInUse { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => break other.unwrap(),
        }
    };
    assert!(StdUnixStream::connect(&path).is_ok(), "the new socket listens");
    drop(bound);
}

#[test]
fn the_missing_kubelet_directory_named_is_the_outermost_one() {
    let tmp = tempfile::tempdir().unwrap();
    let kubelet = tmp.path().join("kubelet");
    assert_eq!(outer_missing(&kubelet.join("plugins/gpu.edra.dev")), kubelet);
    fs::create_dir(&kubelet).unwrap();
    assert_eq!(outer_missing(&kubelet.join("plugins/gpu.edra.dev")), kubelet.join("plugins"));
}
