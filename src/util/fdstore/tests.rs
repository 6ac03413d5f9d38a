use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixDatagram, UnixListener};

use super::*;

fn env(pid: &str, fds: &str, names: Option<&str>) -> ListenEnv {
    ListenEnv { pid: Some(pid.into()), fds: Some(fds.into()), names: names.map(Into::into) }
}

#[test]
fn descriptors_are_taken_only_when_meant_for_this_process() {
    assert_eq!(ListenEnv::default().passed(42), Ok(Vec::<String>::new()));
    assert_eq!(env("41", "2", Some("a:b")).passed(42), Ok(Vec::<String>::new()), "another process's");
    assert_eq!(env("x", "2", None).passed(42), Ok(Vec::<String>::new()), "an unparsable LISTEN_PID");
    assert_eq!(env("42", "2", Some("dra.1.2:registered.1.3")).passed(42).unwrap(), ["dra.1.2", "registered.1.3"]);
    // Missing names are "unknown", as systemd names them; extra names are ignored.
    assert_eq!(env("42", "2", None).passed(42).unwrap(), ["unknown", "unknown"]);
    assert_eq!(env("42", "1", Some("a:b:c")).passed(42).unwrap(), ["a"]);
}

#[test]
fn a_bad_or_huge_count_is_an_error() {
    assert!(env("42", "two", None).passed(42).unwrap_err().contains("LISTEN_FDS=\"two\""));
    assert!(env("42", "100000", None).passed(42).unwrap_err().contains("more than the 64"));
}

#[test]
fn names_carry_the_role_and_the_file() {
    let name = store_name("registration", 2049, 1311);
    assert_eq!(name, "registration.2049.1311");
    assert_eq!(parse_name(&name), Some(("registration", 2049, 1311)));
    for bad in ["", "dra", "dra.1", ".1.2", "dra.x.2", "dra.1.-2", "unknown"] {
        assert_eq!(parse_name(bad), None, "{bad:?}");
    }
}

#[test]
fn sockets_are_taken_by_role_once() {
    let dir = tempfile::tempdir().unwrap();
    let a: OwnedFd = UnixListener::bind(dir.path().join("a")).unwrap().into();
    let b: OwnedFd = UnixListener::bind(dir.path().join("b")).unwrap().into();
    let mut inherited = Inherited::from_fds(vec![("dra.1.2".into(), a), ("odd".into(), b)]);
    assert_eq!(inherited.take("dra").map(|(n, _)| n).as_deref(), Some("dra.1.2"));
    assert!(inherited.take("dra").is_none(), "taken once");
    assert!(inherited.take("registration").is_none());
    assert_eq!(inherited.drop_rest(), ["odd"]);
    assert!(inherited.is_empty());
}

/// A listening socket at `dir/name`, mode 0600, and its stored name.
fn listening(dir: &std::path::Path, name: &str) -> (UnixListener, String) {
    let path = dir.join(name);
    let listener = UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let meta = std::fs::symlink_metadata(&path).unwrap();
    (listener, store_name("dra", meta.dev(), meta.ino()))
}

#[test]
fn the_socket_edra_stored_passes() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, name) = listening(dir.path(), "dra.sock");
    let (_, dev, ino) = parse_name(&name).unwrap();
    assert_eq!(check_stored_socket(listener.as_fd(), &name, &dir.path().join("dra.sock")), Ok((dev, ino)));
}

#[test]
fn a_socket_that_is_not_the_one_served_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dra.sock");
    let (listener, name) = listening(dir.path(), "dra.sock");
    let check = |name: &str| check_stored_socket(listener.as_fd(), name, &path).unwrap_err();
    assert!(check("dra").contains("not one edra gives"));
    // Another file at the path: the stored name's inode is not it.
    let (_, dev, ino) = parse_name(&name).unwrap();
    assert!(check(&store_name("dra", dev, ino + 1)).contains("another socket file"));
    // Readable by others.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert!(check(&name).contains("mode 666"));
    // Gone.
    std::fs::remove_file(&path).unwrap();
    assert!(check(&name).contains("is gone"));
}

#[test]
fn a_descriptor_that_is_not_a_listening_stream_socket_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_listener, name) = listening(dir.path(), "dra.sock");
    let path = dir.path().join("dra.sock");
    let datagram = UnixDatagram::bind(dir.path().join("d")).unwrap();
    assert!(check_stored_socket(datagram.as_fd(), &name, &path).unwrap_err().contains("not a stream socket"));
    let file = std::fs::File::open(dir.path()).unwrap();
    assert!(check_stored_socket(file.as_fd(), &name, &path).unwrap_err().contains("not a socket"));
    let (client, _) = std::os::unix::net::UnixStream::pair().unwrap();
    assert!(check_stored_socket(client.as_fd(), &name, &path).unwrap_err().contains("not listening"));
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    assert!(check_stored_socket(tcp.as_fd(), &name, &path).unwrap_err().contains("not a Unix socket"));
}
