//! One agent per node: a second `edra run` with the same kubelet and CDI directories —
//! even with a state directory of its own — refuses to start, names the first one's pid,
//! and leaves its sockets and CDI specs alone.

use std::os::unix::fs::MetadataExt;
use std::process::Stdio;
use std::time::Duration;

use crate::support::agent::{ChildAgent, Cluster, prepare_ok, unprepare_ok};

#[tokio::test]
async fn a_second_agent_refuses_to_start_and_leaves_the_first_alone() {
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let first = ChildAgent::start(&cluster, "").await;
    let claim = cluster.allocated_claim("held", "gpu-0");
    let mut v1 = first.v1().await;
    let ids = prepare_ok(&mut v1, &claim).await;
    let inode = |p: std::path::PathBuf| std::fs::metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).ino();
    let before = (inode(fs.dra_socket()), inode(fs.registration_socket()), inode(fs.spec_file(&claim.uid)));

    let other_state = tempfile::tempdir().expect("temp dir");
    let second = tokio::process::Command::new(env!("CARGO_BIN_EXE_edra"))
        .arg("--config")
        .arg(cluster.config_file(crate::support::agent::NODE))
        .arg("run")
        .arg("--state-dir")
        .arg(other_state.path().join("state"))
        .env_remove("KUBECONFIG")
        .env_remove(edra::prepare::failpoint::ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out =
        tokio::time::timeout(Duration::from_secs(30), second).await.expect("the second agent exits").expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let pid = first.child.id().expect("first agent running");
    assert!(
        stderr.contains(&format!("another edra (pid {pid}) is already running for this node")),
        "the message names the first agent's pid: {stderr}"
    );
    assert!(!other_state.path().join("state").exists(), "the second agent stopped before opening a state");

    // The first agent's sockets and spec are the same files, and it still answers.
    let after = (inode(fs.dra_socket()), inode(fs.registration_socket()), inode(fs.spec_file(&claim.uid)));
    assert_eq!(before, after);
    assert_eq!(prepare_ok(&mut v1, &claim).await, ids);
    unprepare_ok(&mut v1, &claim).await;
    first.terminate().await;
}
