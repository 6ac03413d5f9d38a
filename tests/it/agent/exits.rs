//! Exit statuses of `edra run` that systemd acts on: a stop that had to abort kubelet calls
//! is not clean (exit 1, and it says how many). (A metrics port in use stops nothing:
//! `node_user.rs`.)

use std::time::Duration;

use http::Method;

use crate::support::agent::{ChildAgent, Cluster, WAIT, prepare};
use crate::support::apiserver::{Fault, FaultAction};

#[tokio::test]
async fn a_stop_that_aborts_kubelet_calls_exits_1_and_says_how_many() {
    let cluster = Cluster::start().await;
    let claim = cluster.allocated_claim("slow", "gpu-0");
    let agent = ChildAgent::start(&cluster, "").await;
    // The claim fetch hangs far beyond the 2 s grace period of the test configuration.
    cluster.server.inject(
        Fault::next(1, FaultAction::Delay(Duration::from_secs(60)))
            .method(Method::GET)
            .path_contains("/resourceclaims/"),
    );
    let mut v1 = agent.v1().await;
    let call = tokio::spawn(async move { prepare(&mut v1, &[claim]).await });
    cluster
        .server
        .wait_for("the agent's claim fetch held", WAIT, |s| s.faults_applied() > 0)
        .await
        .expect("a claim fetch is held");
    let mut agent = agent;
    let pid = agent.child.id().expect("running");
    // SAFETY: kill(2) with a pid of our own child and a valid signal number.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    let status = agent.wait_exit().await;
    let stderr = agent.stderr();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("edra: stopped after aborting 1 kubelet call still running after the 2s grace period"),
        "{stderr}"
    );
    assert!(call.await.expect("no panic").is_err(), "the aborted call failed");
}
