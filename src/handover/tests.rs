use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixListener;

use super::*;

fn me(pid: u32) -> Party {
    Party { pid, version: "1.2.3".into(), origin: Some("pod-a".into()) }
}

/// A listening socket, named as in systemd's fd store after its file.
fn listening(dir: &Path, name: &str) -> (UnixListener, String) {
    let path = dir.join(name);
    let listener = UnixListener::bind(&path).expect("bind");
    let meta = std::fs::symlink_metadata(&path).expect("stat");
    (listener, crate::util::fdstore::store_name(name, meta.dev(), meta.ino()))
}

#[tokio::test]
async fn the_running_edra_hands_its_listening_sockets_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let offer = Offer::bind(dir.path()).expect("bind the handover socket");
    let mode = std::fs::symlink_metadata(socket_path(dir.path())).expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "only this user may ask");
    let (dra, dra_name) = listening(dir.path(), "dra");
    let (reg, reg_name) = listening(dir.path(), "registered");
    let runtime = dir.path().to_path_buf();
    let asking = tokio::task::spawn_blocking(move || ask(&runtime, &me(7), Duration::from_secs(5)));
    let request = offer.next().await.expect("a request");
    assert_eq!(request.from, me(7));
    assert!(request.still_waiting());
    let running = Party { pid: 3, version: String::new(), origin: None };
    request
        .hand_over(&running, &[(dra_name.clone(), dra.as_fd()), (reg_name.clone(), reg.as_fd())])
        .expect("hand over");
    let handed = asking.await.expect("the asking task").expect("handed over");
    assert_eq!(handed.from, running);
    let names: Vec<&str> = handed.sockets.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, [dra_name.as_str(), reg_name.as_str()]);
    // The descriptor handed over is the listening socket itself: a client connecting to
    // its file is accepted on it.
    let (_, fd) = handed.sockets.into_iter().next().expect("the DRA socket");
    drop(dra);
    let taken = UnixListener::from(fd);
    let _client = UnixStream::connect(dir.path().join("dra")).expect("connect to the handed-over socket");
    taken.accept().expect("accepted on the handed-over descriptor");
    drop(offer);
    assert!(!socket_path(dir.path()).exists(), "the handover socket goes with the offer");
}

#[tokio::test]
async fn a_refusal_reaches_the_asker_with_its_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let offer = Offer::bind(dir.path()).expect("bind");
    let runtime = dir.path().to_path_buf();
    let asking = tokio::task::spawn_blocking(move || ask(&runtime, &me(8), Duration::from_secs(5)));
    offer.next().await.expect("a request").refuse("2 kubelet calls\nstill running");
    let err = asking.await.expect("task").expect_err("refused");
    assert!(matches!(&err, HandoverError::Refused(r) if r == "2 kubelet calls still running"), "{err}");
}

#[tokio::test]
async fn an_asker_that_gets_no_answer_in_time_gives_up_and_the_runner_sees_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let offer = Offer::bind(dir.path()).expect("bind");
    let runtime = dir.path().to_path_buf();
    let asking = tokio::task::spawn_blocking(move || ask(&runtime, &me(9), Duration::from_millis(300)));
    let request = offer.next().await.expect("a request");
    let err = asking.await.expect("task").expect_err("no answer");
    assert!(matches!(err, HandoverError::TimedOut(_)), "{err}");
    assert!(!request.still_waiting(), "the asker closed the connection");
}

#[test]
fn nothing_offered_is_said_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = ask(dir.path(), &me(1), Duration::from_secs(1)).expect_err("no socket");
    assert!(matches!(err, HandoverError::NotOffered { .. }), "{err}");
    assert!(err.to_string().contains("no running edra offers a handover"), "{err}");
}

#[tokio::test]
async fn bad_requests_are_refused_and_the_offer_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let offer = Offer::bind(dir.path()).expect("bind");
    let path = socket_path(dir.path());
    let client = std::thread::spawn(move || {
        let mut answers = Vec::new();
        for bad in ["GET / HTTP/1.1\n", "edra-handover/1 pid=x version=1 origin=-\n", "edra-handover/1 pid=1\n"] {
            let mut s = UnixStream::connect(&path).expect("connect");
            s.write_all(bad.as_bytes()).expect("send");
            let mut answer = String::new();
            s.read_to_string(&mut answer).expect("read the answer");
            answers.push(answer);
        }
        // An endless line: cut at the bound, refused.
        let mut s = UnixStream::connect(&path).expect("connect");
        let _ = s.write_all(&vec![b'a'; 2 * MOST_LINE]);
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answers.push(answer);
        ask(path.parent().expect("dir"), &me(5), Duration::from_secs(5)).map(|h| h.from)
    });
    let request = offer.next().await.expect("the valid request after the bad ones");
    assert_eq!(request.from, me(5));
    request.refuse("done");
    let result = client.join().expect("client thread");
    assert!(matches!(result, Err(HandoverError::Refused(_))), "{result:?}");
}

#[test]
fn answers_that_are_not_the_protocols_are_errors() {
    let (a, _b) = UnixStream::pair().expect("pair");
    let fd = || vec![a.as_fd().try_clone_to_owned().expect("dup")];
    assert!(matches!(parse_answer("hello", vec![]), Err(HandoverError::Protocol(_))));
    let two_names = "handed-over pid=3 origin=- dra.1.2 registered.1.3";
    assert!(matches!(parse_answer(two_names, fd()), Err(HandoverError::Protocol(_))), "one descriptor for two names");
    assert!(matches!(parse_answer("handed-over pid=3 origin=- ../x", fd()), Err(HandoverError::Protocol(_))));
    let ok = parse_answer("handed-over pid=3 origin=pod-b dra.1.2", fd()).expect("valid");
    assert_eq!(ok.from.origin.as_deref(), Some("pod-b"));
}

#[test]
fn something_else_at_the_socket_path_is_left_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(socket_path(dir.path()), "data").expect("plant a file");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let err = rt.block_on(async { Offer::bind(dir.path()).expect_err("a file is not replaced") });
    assert!(err.to_string().contains("is not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(socket_path(dir.path())).expect("still there"), "data");
    // A stale socket is replaced.
    std::fs::remove_file(socket_path(dir.path())).expect("rm");
    drop(UnixListener::bind(socket_path(dir.path())).expect("a stale socket"));
    let offer = rt.block_on(async { Offer::bind(dir.path()) }).expect("replaces a stale socket");
    assert!(std::fs::symlink_metadata(socket_path(dir.path())).expect("stat").file_type().is_socket());
    drop(offer);
}
