//! The kubelet's sockets kept open across a restart in systemd's fd store, with systemd
//! played by the test: the child stores its listening sockets (`FDSTORE=1`) on its
//! notification socket, is killed, and the next child is handed them as `LISTEN_FDS`. A
//! kubelet call made while no edra runs waits in the socket's backlog and is answered by
//! the next process; without the store it would be refused.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use crate::support::agent::{ChildAgent, Cluster, WAIT, prepare, prepare_ok, unprepare_ok};
use crate::support::kubelet;
use crate::support::systemd::{FdStore, recv};

/// Applies the child's notifications to `store` until it holds the sockets `roles`.
async fn wait_stored(child: &ChildAgent, store: &mut FdStore, roles: &[&str]) {
    let wanted: Vec<String> = roles.iter().map(|r| (*r).to_string()).collect();
    let waiting = async {
        while store.roles() != wanted {
            store.apply(recv(&child.notify).await.expect("read the notification socket"));
        }
    };
    if tokio::time::timeout(WAIT, waiting).await.is_err() {
        panic!("the fd store holds {:?}, not {wanted:?}", store.roles());
    }
}

fn file_id(path: &std::path::Path) -> (u64, u64) {
    let meta = std::fs::symlink_metadata(path).expect("the socket file");
    (meta.dev(), meta.ino())
}

#[tokio::test]
async fn a_call_made_while_edra_is_down_is_answered_by_the_next_process() {
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let mut first = ChildAgent::start(&cluster, "").await;
    let mut store = std::mem::take(&mut first.fd_store);
    // Stored at start; the registration socket is stored again as registered once the
    // kubelet (the test) registered edra.
    wait_stored(&first, &mut store, &["dra", "registered", "status"]).await;
    let files = (file_id(&fs.dra_socket()), file_id(&fs.registration_socket()));
    let before = cluster.allocated_claim("before", "gpu-0");
    prepare_ok(&mut first.v1().await, &before).await;
    first.kill().await;

    // No edra runs: the call connects into the backlog of the socket the store holds.
    let during = cluster.allocated_claim("during", "gpu-1");
    let dra = fs.dra_socket();
    let call = tokio::spawn(async move {
        let mut client = kubelet::dra_v1(&dra).await;
        prepare(&mut client, std::slice::from_ref(&during)).await
    });
    // `edra status` too waits for the next process rather than failing.
    let status_socket =
        edra::status::server::socket_path(&cluster.config(crate::support::agent::NODE).paths.runtime_dir);
    let status_file = file_id(&status_socket);
    let status = tokio::spawn(async move { edra::status::client::fetch(&status_socket).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!call.is_finished(), "the call ended while no edra ran: {:?}", call.await);
    assert!(!status.is_finished(), "edra status ended while no edra ran: {:?}", status.await);

    let second = ChildAgent::start_from_store(&cluster, &store).await;
    let answers = tokio::time::timeout(WAIT, call)
        .await
        .expect("the waiting call is answered by the next process")
        .expect("the call's task")
        .expect("the call made while edra was down succeeds");
    let answer = answers.values().next().expect("an answer for the claim");
    assert!(answer.error.is_empty(), "the claim prepared in the gap failed: {}", answer.error);
    assert_eq!(answer.devices.len(), 1, "{answer:?}");
    assert_eq!(
        (file_id(&fs.dra_socket()), file_id(&fs.registration_socket())),
        files,
        "the same socket files, never replaced"
    );
    let view = tokio::time::timeout(WAIT, status).await.expect("edra status is answered").expect("task");
    assert!(view.is_ok(), "edra status asked while edra was down: {view:?}");
    let runtime_dir = cluster.config(crate::support::agent::NODE).paths.runtime_dir;
    assert_eq!(file_id(&edra::status::server::socket_path(&runtime_dir)), status_file, "the same status socket");
    // The claim prepared before the kill still answers.
    let mut v1 = second.v1().await;
    prepare_ok(&mut v1, &before).await;
    unprepare_ok(&mut v1, &before).await;
    second.terminate().await;
    // Stored sockets' files stay for the next start (systemd keeps them listening).
    assert!(fs.dra_socket().exists() && fs.registration_socket().exists());
}

#[tokio::test]
async fn a_stored_socket_that_is_no_longer_edras_is_closed_and_bound_anew() {
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let mut first = ChildAgent::start(&cluster, "").await;
    let mut store = std::mem::take(&mut first.fd_store);
    wait_stored(&first, &mut store, &["dra", "registered", "status"]).await;
    first.kill().await;
    // Someone replaced the DRA socket's file meanwhile (a file of another inode now).
    let old = file_id(&fs.dra_socket());
    std::fs::remove_file(fs.dra_socket()).expect("remove the socket file");
    drop(std::os::unix::net::UnixListener::bind(fs.dra_socket()).expect("bind another socket there"));
    let second = ChildAgent::start_from_store(&cluster, &store).await;
    assert!(
        second.stderr().contains("the socket kept open across the restart is not the one edra serves"),
        "{}",
        second.stderr()
    );
    assert_ne!(file_id(&fs.dra_socket()), old);
    let claim = cluster.allocated_claim("after", "gpu-2");
    let mut v1 = second.v1().await;
    prepare_ok(&mut v1, &claim).await;
    unprepare_ok(&mut v1, &claim).await;
    second.terminate().await;
}

#[tokio::test]
async fn an_offline_node_is_started_for_systemd_without_a_kubelet_or_an_api_server() {
    let cluster = Cluster::start().await;
    cluster.server.stop().await;
    let started = std::time::Instant::now();
    // READY=1 (awaited by the harness) with nothing registering edra and no API server.
    let child = ChildAgent::start_unregistered(&cluster).await;
    let took = started.elapsed();
    eprintln!("READY=1 {took:?} after the start, offline and unregistered");
    assert!(took < Duration::from_secs(5), "READY=1 took {took:?}");
    // STATUS= says what it waits for, with the API server's error once publishing tried.
    let waiting = async {
        loop {
            let note = recv(&child.notify).await.expect("read the notification socket");
            if let Some(status) = note.value("STATUS")
                && status.contains("not published yet")
            {
                return status.to_string();
            }
        }
    };
    let status = tokio::time::timeout(WAIT, waiting).await.expect("a STATUS= naming the publishing error");
    assert!(status.starts_with("serving; waiting for the kubelet to register edra; not published yet: "), "{status}");
    child.terminate().await;
}
