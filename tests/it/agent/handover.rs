//! Two agents on one node, as a DaemonSet's rolling update with a surge runs them: the
//! second is started with the same paths and `plugin.take_over` while the first serves,
//! and takes the kubelet's
//! sockets over (`edra::handover`). A claim is prepared again every 20 ms on a new
//! connection throughout, as the kubelet would: no call may fail. A handover the first
//! cannot finish in time leaves it serving; the first's pod, restarted after it handed
//! over, is refused as replaced and waits to be stopped.

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::Method;

use crate::support::agent::{ChildAgent, Cluster, NODE, WAIT, prepare, prepare_ok};
use crate::support::apiserver::{Fault, FaultAction};
use crate::support::kubelet;

/// What the prepare loop saw.
#[derive(Default)]
struct LoopStats {
    answered: AtomicU64,
    failed: AtomicU64,
    longest_ms: AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
}

/// Prepares `claim` every 20 ms on a new connection until `stop`, expecting `devices`.
fn prepare_loop(
    dra: std::path::PathBuf,
    claim: edra::plugin::ClaimRef,
    devices: Vec<String>,
) -> (Arc<LoopStats>, tokio::sync::watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let stats = Arc::new(LoopStats::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let counts = stats.clone();
    let task = tokio::spawn(async move {
        while !*stopped.borrow() {
            let start = Instant::now();
            let answer = tokio::time::timeout(WAIT, async {
                let channel = kubelet::channel(&dra).await.map_err(|e| format!("connect: {e}"))?;
                let mut client = edra::plugin::proto::dra_v1::dra_plugin_client::DraPluginClient::new(channel);
                let answers = prepare(&mut client, std::slice::from_ref(&claim)).await.map_err(|e| e.to_string())?;
                let one = answers.get(&claim.uid).ok_or("no answer for the claim")?;
                let ids: Vec<String> = one.devices.iter().flat_map(|d| d.cdi_device_ids.clone()).collect();
                if one.error.is_empty() && ids == devices { Ok(()) } else { Err(format!("{one:?}")) }
            })
            .await
            .unwrap_or_else(|_| Err("no answer".into()));
            let took = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
            counts.longest_ms.fetch_max(took, Ordering::Relaxed);
            match answer {
                Ok(()) => counts.answered.fetch_add(1, Ordering::Relaxed),
                Err(e) => {
                    counts.first_error.lock().expect("lock").get_or_insert(e);
                    counts.failed.fetch_add(1, Ordering::Relaxed)
                }
            };
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    (stats, stop, task)
}

fn file_id(path: &std::path::Path) -> (u64, u64) {
    let meta = std::fs::symlink_metadata(path).expect("the socket file");
    (meta.dev(), meta.ino())
}

/// The `took_ms` of the log line `message` in `log`.
fn took_ms(log: &str, message: &str) -> Option<u64> {
    let line = log.lines().find(|l| l.contains(message))?;
    line.split_whitespace().find_map(|w| w.strip_prefix("took_ms=")).and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn a_second_edra_takes_the_sockets_over_without_a_failed_call() {
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let info = [("EDRA_LOG_LEVEL", "info"), ("POD_UID", "pod-old")];
    let mut first = ChildAgent::start_with_env(&cluster, "", &info).await;
    let claim = cluster.allocated_claim("looped", "gpu-0");
    let devices = prepare_ok(&mut first.v1().await, &claim).await;
    let files = (file_id(&fs.dra_socket()), file_id(&fs.registration_socket()));
    let (stats, stop, looping) = prepare_loop(fs.dra_socket(), claim.clone(), devices.clone());
    let answered_by = |s: &LoopStats| s.answered.load(Ordering::Relaxed);
    crate::support::agent::wait_until("calls answered by the first", || answered_by(&stats) >= 5).await;

    let newer = [("EDRA_LOG_LEVEL", "info"), ("POD_UID", "pod-new"), ("EDRA_PLUGIN_TAKE_OVER", "true")];
    let second = ChildAgent::start_with_env(&cluster, "", &newer).await;
    let status = first.wait_exit().await;
    assert!(status.success(), "the first edra exits cleanly after handing over: {status}");
    let handed = answered_by(&stats);
    crate::support::agent::wait_until("calls answered by the second", || answered_by(&stats) >= handed + 5).await;
    stop.send_replace(true);
    looping.await.expect("the loop's task");

    let log = second.stderr();
    let (answered, failed) = (stats.answered.load(Ordering::Relaxed), stats.failed.load(Ordering::Relaxed));
    let first_error = stats.first_error.lock().expect("lock").clone();
    assert_eq!(failed, 0, "calls failed during the handover, the first: {first_error:?}\n{log}");
    assert!(log.contains("handed the kubelet's sockets to the newer edra; stopping"), "{log}");
    let handover = took_ms(&log, "took the node over from the edra that served it").expect("the handover's time");
    println!(
        "handover: {handover} ms from asking to holding the node; {answered} calls answered, 0 failed, longest {} ms",
        stats.longest_ms.load(Ordering::Relaxed)
    );
    assert_eq!(
        (file_id(&fs.dra_socket()), file_id(&fs.registration_socket())),
        files,
        "the same socket files, never replaced"
    );
    // The second serves a claim of its own, and the one prepared by the first.
    let mut v1 = second.v1().await;
    prepare_ok(&mut v1, &cluster.allocated_claim("after", "gpu-1")).await;
    assert_eq!(prepare_ok(&mut v1, &claim).await, devices);

    // The first's pod, restarted after it handed over: refused as replaced, it waits to
    // be stopped rather than taking the node back.
    let mut restarted = spawn_edra(&cluster, &[("POD_UID", "pod-old"), ("EDRA_PLUGIN_TAKE_OVER", "true")]);
    let waited = tokio::time::timeout(Duration::from_secs(2), restarted.wait()).await;
    assert!(waited.is_err(), "the replaced edra waits to be stopped: {waited:?}");
    let pid = restarted.id().expect("running");
    // SAFETY: kill(2) with a pid of our own child and a valid signal number.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    let status = tokio::time::timeout(WAIT, restarted.wait()).await.expect("it stops").expect("wait");
    assert!(status.success(), "{status}");
    assert_eq!(prepare_ok(&mut v1, &claim).await, devices, "the second still serves");
    second.terminate().await;
}

#[tokio::test]
async fn a_handover_that_cannot_finish_in_time_leaves_the_first_serving() {
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let short = [("EDRA_PLUGIN_HANDOVER_TIMEOUT", "2s")];
    let first = ChildAgent::start_with_env(&cluster, "", &short).await;
    // A first-time prepare whose claim read takes 3 s: longer than the 1.6 s the first lets
    // calls finish in, shorter than that plus the 2 s grace the old connection then keeps.
    cluster.server.inject(
        Fault::next(1, FaultAction::Delay(Duration::from_secs(3)))
            .method(Method::GET)
            .path_contains("/resourceclaims/"),
    );
    let slow = cluster.allocated_claim("slow", "gpu-0");
    let mut v1 = first.v1().await;
    let call = tokio::spawn(async move { prepare(&mut v1, &[slow]).await });
    cluster
        .server
        .wait_for("the claim read held", WAIT, |s| s.faults_applied() > 0)
        .await
        .expect("the slow prepare is in flight");

    let second = spawn_edra(&cluster, &[short[0], ("EDRA_PLUGIN_TAKE_OVER", "true")]);
    let out = tokio::time::timeout(WAIT, second.wait_with_output()).await.expect("the second exits").expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("the running edra refused to hand over: kubelet calls were still running after 1.6s"),
        "{stderr}"
    );
    // The first serves on: a new call through the same socket, and the slow one finishes.
    prepare_ok(&mut first.v1().await, &cluster.allocated_claim("meanwhile", "gpu-1")).await;
    let answers = call.await.expect("the slow call's task").expect("the slow call is answered");
    assert!(answers.values().all(|a| a.error.is_empty()), "{answers:?}");
    assert!(fs.dra_socket().exists() && fs.registration_socket().exists());
    first.terminate().await;
}

#[tokio::test]
async fn a_task_stuck_in_an_api_request_does_not_hold_the_node_after_a_handover() {
    let cluster = Cluster::start().await;
    let first = ChildAgent::start_with_env(&cluster, "", &[("EDRA_LOG_LEVEL", "info")]).await;
    // The claim's device status write hangs for a minute.
    cluster.server.inject(Fault::next(1, FaultAction::Delay(Duration::from_secs(60))).method(Method::PATCH));
    let claim = cluster.allocated_claim("stuck", "gpu-0");
    prepare_ok(&mut first.v1().await, &claim).await;
    cluster
        .server
        .wait_for("the status write held", WAIT, |s| s.faults_applied() > 0)
        .await
        .expect("the claim status write is in flight");
    let started = Instant::now();
    let second = ChildAgent::start_with_env(&cluster, "", &[("EDRA_PLUGIN_TAKE_OVER", "true")]).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(8), "the second served only after {took:?}\n{}", second.stderr());
    assert!(
        second.stderr().contains("tasks still running after the handover are left to the exit"),
        "{}",
        second.stderr()
    );
    prepare_ok(&mut second.v1().await, &claim).await;
    second.terminate().await;
}

/// `edra run` with the cluster's configuration and `env`, its stderr piped.
fn spawn_edra(cluster: &Cluster, env: &[(&str, &str)]) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_edra"))
        .arg("--config")
        .arg(cluster.config_file(NODE))
        .arg("run")
        .env_remove("KUBECONFIG")
        .env_remove("NOTIFY_SOCKET")
        .env_remove(edra::prepare::failpoint::ENV)
        .env("EDRA_LOG_LEVEL", "info")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn edra run")
}
