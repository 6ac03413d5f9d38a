use super::*;

const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:24D8 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0 100 0 0 10 0
   1: 0100007F:24D9 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0 20 4 30 10 -1
";
const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5151 1 0 100 0 0 10 0
";

#[test]
fn listening_sockets_are_read_with_their_address_owner_and_inode() {
    let v4 = listeners(TCP);
    assert_eq!(v4, [Listener { address: "127.0.0.1:9432".parse().unwrap(), uid: 1000, inode: 4242 }]);
    let v6 = listeners(TCP6);
    assert_eq!(v6, [Listener { address: "[::]:8080".parse().unwrap(), uid: 0, inode: 5151 }]);
}

#[test]
fn an_address_conflicts_with_the_same_one_or_a_wildcard_on_its_port() {
    let a = |s: &str| s.parse::<SocketAddr>().unwrap();
    assert!(conflicts(a("127.0.0.1:9464"), a("127.0.0.1:9464")));
    assert!(conflicts(a("0.0.0.0:9464"), a("127.0.0.1:9464")));
    assert!(conflicts(a("[::]:9464"), a("127.0.0.1:9464")));
    assert!(conflicts(a("127.0.0.1:9464"), a("0.0.0.0:9464")));
    assert!(conflicts(a("[::ffff:127.0.0.1]:9464"), a("127.0.0.1:9464")));
    assert!(!conflicts(a("127.0.0.1:9465"), a("127.0.0.1:9464")));
    assert!(!conflicts(a("127.0.0.2:9464"), a("127.0.0.1:9464")));
}

#[test]
fn a_port_this_process_holds_is_named_with_its_pid() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap();
    let r = check(Some(address), Path::new("/proc"));
    let pid = std::process::id();
    assert_eq!(r.status, Status::Warn, "{r:?}");
    assert!(r.detail.starts_with(&format!("{address} is held by pid {pid} (")), "{r:?}");
    assert!(r.fix.contains(&format!("kill {pid}")), "{r:?}");
    drop(taken);
    // The freed port is this machine's again: a test running beside this one may get it
    // for a moment, so a free port is asked for a few times before the answer counts.
    let mut r = check(Some(address), Path::new("/proc"));
    for _ in 0..20 {
        if r.status == Status::Pass {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        r = check(Some(address), Path::new("/proc"));
    }
    assert_eq!(r.status, Status::Pass, "{r:?}");
    assert_eq!(check(None, Path::new("/proc")).status, Status::Skip);
}

#[test]
fn a_holder_proc_does_not_show_is_a_warning_without_a_pid() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("net")).unwrap();
    std::fs::write(dir.path().join("net/tcp"), TCP).unwrap();
    let r = check(Some("127.0.0.1:9432".parse().unwrap()), dir.path());
    assert_eq!(r.status, Status::Warn);
    assert!(r.detail.contains("held by a process of uid 1000 that /proc does not name"), "{r:?}");
    // Named once /proc shows its descriptor (a link, as the kernel's).
    let fd = dir.path().join("4711/fd");
    std::fs::create_dir_all(&fd).unwrap();
    std::os::unix::fs::symlink("socket:[4242]", fd.join("3")).unwrap();
    std::fs::write(dir.path().join("4711/comm"), "nc\n").unwrap();
    let r = check(Some("0.0.0.0:9432".parse().unwrap()), dir.path());
    assert_eq!(
        r.detail,
        format!(
            "127.0.0.1:9432 is held by pid 4711 (nc, uid 1000): edra cannot serve /metrics, /healthz and /readyz there until it is free (it keeps trying)"
        )
    );
    std::fs::write(dir.path().join("4711/comm"), "edra\n").unwrap();
    let r = check(Some("127.0.0.1:9432".parse().unwrap()), dir.path());
    assert_eq!((r.status, r.detail.as_str()), (Status::Pass, "127.0.0.1:9432 is served by edra (pid 4711)"));
}
