//! Tests of the notification protocol against real datagram sockets (path and abstract).

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

use super::*;

/// A receiving socket in a temp dir, and the environment that points at it.
fn listener() -> (tempfile::TempDir, UnixDatagram, NotifyEnv) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).expect("bind notify socket");
    let env = NotifyEnv { socket: Some(path.into_os_string()), ..NotifyEnv::default() };
    (dir, socket, env)
}

fn recv(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 512];
    let n = socket.recv(&mut buf).expect("receive notification");
    String::from_utf8(buf[..n].to_vec()).expect("utf-8 notification")
}

fn notifier(env: &NotifyEnv) -> Notifier {
    Notifier::from_env(env, 4242).expect("valid env").expect("socket set")
}

#[test]
fn no_socket_means_no_notifier() {
    assert!(Notifier::from_env(&NotifyEnv::default(), 1).expect("ok").is_none());
    let empty = NotifyEnv { socket: Some(OsString::new()), ..NotifyEnv::default() };
    assert!(Notifier::from_env(&empty, 1).expect("ok").is_none());
}

#[test]
fn sends_each_state_to_a_path_socket() {
    let (_dir, socket, env) = listener();
    let n = notifier(&env);
    n.ready().expect("ready");
    assert_eq!(recv(&socket), "READY=1");
    n.status("publishing 2 GPUs").expect("status");
    assert_eq!(recv(&socket), "STATUS=publishing 2 GPUs");
    n.watchdog().expect("watchdog");
    assert_eq!(recv(&socket), "WATCHDOG=1");
    n.extend_timeout(Duration::from_secs(90)).expect("extend");
    assert_eq!(recv(&socket), "EXTEND_TIMEOUT_USEC=90000000");
    n.stopping().expect("stopping");
    assert_eq!(recv(&socket), "STOPPING=1");
}

#[test]
fn status_stays_on_one_line() {
    let (_dir, socket, env) = listener();
    notifier(&env).status("line one\nline two\r\n").expect("status");
    assert_eq!(recv(&socket), "STATUS=line one line two  ");
}

#[test]
fn sends_to_an_abstract_socket() {
    let name = format!("edra-test-notify-{}-{}", std::process::id(), fastrand::u64(..));
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract address");
    let socket = UnixDatagram::bind_addr(&addr).expect("bind abstract socket");
    let env = NotifyEnv { socket: Some(format!("@{name}").into()), ..NotifyEnv::default() };
    notifier(&env).ready().expect("ready");
    assert_eq!(recv(&socket), "READY=1");
}

#[test]
fn unusable_addresses_are_reported() {
    for value in ["run/systemd/notify", "vsock:2:1234"] {
        let env = NotifyEnv { socket: Some(value.into()), ..NotifyEnv::default() };
        let err = Notifier::from_env(&env, 1).expect_err(value);
        assert!(matches!(err, NotifyError::Address { .. }), "{value}: {err:?}");
        assert!(err.to_string().contains(value), "{err}");
    }
}

#[test]
fn a_missing_socket_is_a_send_error_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("gone.sock");
    let env = NotifyEnv { socket: Some(path.clone().into_os_string()), ..NotifyEnv::default() };
    let err = notifier(&env).ready().expect_err("nobody listens");
    match &err {
        NotifyError::Send { message, socket, source } => {
            assert_eq!(message, "READY=1");
            assert_eq!(socket, &path.display().to_string());
            assert_eq!(source.kind(), io::ErrorKind::NotFound);
        }
        other => panic!("unexpected error {other:?}"),
    }
}

#[test]
fn watchdog_settings() {
    let us = |n: u64| Some(Duration::from_micros(n));
    // (WATCHDOG_USEC, WATCHDOG_PID, expected timeout) for pid 4242.
    let cases: [(Option<&str>, Option<&str>, Option<Duration>); 6] = [
        (None, None, None),
        (None, Some("4242"), None),
        (Some("30000000"), None, us(30_000_000)),
        (Some("30000000"), Some("4242"), us(30_000_000)),
        (Some("30000000"), Some("1"), None),
        (Some("30000000"), Some("not-a-pid"), None),
    ];
    for (usec, pid, want) in cases {
        assert_eq!(watchdog_timeout(usec, pid, 4242).expect("valid"), want, "{usec:?} {pid:?}");
    }
    for bad in ["0", "-5", "30s", ""] {
        let err = watchdog_timeout(Some(bad), None, 4242).expect_err(bad);
        assert!(matches!(err, NotifyError::WatchdogUsec(ref v) if v == bad), "{err:?}");
    }
}

#[test]
fn watchdog_interval_is_half_the_timeout() {
    let (_dir, _socket, mut env) = listener();
    assert_eq!(notifier(&env).watchdog_interval(), None);
    env.watchdog_usec = Some("20000000".into());
    env.watchdog_pid = Some("4242".into());
    let n = notifier(&env);
    assert_eq!(n.watchdog_timeout(), Some(Duration::from_secs(20)));
    assert_eq!(n.watchdog_interval(), Some(Duration::from_secs(10)));
    env.watchdog_usec = Some("soon".into());
    assert!(matches!(Notifier::from_env(&env, 4242), Err(NotifyError::WatchdogUsec(_))));
}

#[tokio::test(start_paused = true)]
async fn watchdog_task_pings_every_half_timeout_until_cancelled() {
    let (_dir, socket, mut env) = listener();
    env.watchdog_usec = Some("20000000".into());
    let socket = tokio::net::UnixDatagram::from_std({
        socket.set_nonblocking(true).expect("nonblocking");
        socket
    })
    .expect("tokio socket");
    let n = notifier(&env);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        n.run_watchdog(async {
            let _ = stopped.await;
        })
        .await
    });
    let start = tokio::time::Instant::now();
    let mut buf = [0u8; 64];
    let mut at = Vec::new();
    for _ in 0..3 {
        let len = socket.recv(&mut buf).await.expect("ping");
        assert_eq!(&buf[..len], b"WATCHDOG=1");
        at.push(start.elapsed());
    }
    assert_eq!(at, [Duration::ZERO, Duration::from_secs(10), Duration::from_secs(20)]);
    stop.send(()).expect("task still running");
    task.await.expect("watchdog task ends when cancelled");
}

#[tokio::test(start_paused = true)]
async fn watchdog_task_returns_at_once_without_a_watchdog() {
    let (_dir, _socket, env) = listener();
    // The shutdown future never completes: only the missing watchdog can end the task.
    notifier(&env).run_watchdog(std::future::pending()).await;
}

#[tokio::test(start_paused = true)]
async fn watchdog_task_survives_failed_pings() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("later.sock");
    let env = NotifyEnv {
        socket: Some(path.clone().into_os_string()),
        watchdog_usec: Some("2000000".into()),
        watchdog_pid: None,
    };
    let n = notifier(&env);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        n.run_watchdog(async {
            let _ = stopped.await;
        })
        .await
    });
    // The first ping (at 0 s) finds no socket. Bind it afterwards: later pings arrive.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let socket = tokio::net::UnixDatagram::bind(&path).expect("bind");
    let mut buf = [0u8; 64];
    let len = socket.recv(&mut buf).await.expect("ping after a failed one");
    assert_eq!(&buf[..len], b"WATCHDOG=1");
    assert!(!task.is_finished());
    stop.send(()).expect("task still running");
    task.await.expect("watchdog task ends when cancelled");
}

/// Receives one datagram and the descriptors it carried (`SCM_RIGHTS`).
fn recv_with_fds(socket: &UnixDatagram) -> (String, Vec<std::os::fd::OwnedFd>) {
    use std::os::fd::AsFd;
    let mut buf = vec![0u8; 4096];
    let (n, fds) = crate::util::fdpass::recv_with_fds(socket.as_fd(), &mut buf, 0).expect("recvmsg");
    buf.truncate(n);
    (String::from_utf8(buf).expect("utf-8"), fds)
}

#[test]
fn a_socket_is_stored_with_its_name_and_removed_by_name() {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let (dir, socket, env) = listener();
    let n = notifier(&env);
    let stored = std::os::unix::net::UnixListener::bind(dir.path().join("dra.sock")).expect("bind");
    n.store_fd("dra.1.2", stored.as_fd()).expect("store");
    let (text, fds) = recv_with_fds(&socket);
    assert_eq!(text, "FDSTORE=1\nFDNAME=dra.1.2");
    assert_eq!(fds.len(), 1, "one descriptor passed");
    // The very socket: the same inode on the socket filesystem.
    let ino = |fd: std::os::fd::BorrowedFd<'_>| {
        std::fs::File::from(fd.try_clone_to_owned().unwrap()).metadata().unwrap().ino()
    };
    assert_eq!(ino(fds[0].as_fd()), ino(stored.as_fd()));
    n.remove_stored("dra.1.2").expect("remove");
    assert_eq!(recv(&socket), "FDSTOREREMOVE=1\nFDNAME=dra.1.2");
}
