//! `sharing.memory_limit` with a container given two shares of one GPU: NVML keeps one limit
//! per (GPU, cgroup), so the container's limit is the sum of its shares there, lowered to
//! the shares left when one goes and cleared after the last; whether the shares are of one
//! claim or of two, and across a kill at each step (the failpoints of memory_limits.rs).

use std::path::PathBuf;

use serde_json::Value;

use super::memory_limits::{CGROUPS_PATH, config, limit_lines, node, run_hook, spec_of};
use crate::support::agent::{ChildAgent, Cluster, DRIVER, GPUS, NODE, prepare_ok, unprepare_ok};
use crate::support::apiserver::{AllocatedDevice, ClaimBuilder};

const GI: u64 = 1 << 30;
const SHARE_A: &str = "6de5d941-c79d-4a8a-ba10-668351620525";
const SHARE_B: &str = "1b4e28ba-2fa1-41d2-883f-0016d3cca427";

/// A claim `name` with shares of gpu-2: (share ID, memory) each.
fn claim(cluster: &Cluster, name: &str, shares: &[(&str, &str)]) -> edra::plugin::handler::ClaimRef {
    let mut builder = ClaimBuilder::new("default", name);
    for (k, (id, memory)) in shares.iter().enumerate() {
        builder = builder.allocated(AllocatedDevice::new(&format!("gpu{k}"), DRIVER, NODE, "gpu-2").share(id, memory));
    }
    cluster.put_claim(builder.reserved_for_pod(&format!("pod-{name}"), &format!("uid-of-pod-{name}")))
}

/// Every apply-memory-limit hook of `spec` (argv), in device order.
fn limit_hooks(spec: &Value) -> Vec<Vec<String>> {
    let devices = spec["devices"].as_array().into_iter().flatten();
    devices
        .flat_map(|d| d["containerEdits"]["hooks"].as_array().into_iter().flatten())
        .filter_map(|h| serde_json::from_value::<Vec<String>>(h["args"].clone()).ok())
        .filter(|args| args.get(2).map(String::as_str) == Some("apply-memory-limit"))
        .collect()
}

/// Runs `hook` for the one container (`CGROUPS_PATH`); whether it succeeded.
fn run(cluster: &Cluster, hook: &[String], n: usize) -> bool {
    let out = run_hook(hook, &cluster.dir.path().join(format!("bundle{n}")), CGROUPS_PATH);
    out.status.success()
}

/// The (soft, hard) limits the stand-in was asked to set, in order, all on `scope` of the
/// stand-in's GPU.
fn limits(stub: &super::memory_limits::Stub, scope: &PathBuf) -> Vec<(u64, u64)> {
    let uuid = edra::inventory::mock::gpu_uuid(NODE, 2);
    let lines = limit_lines(stub);
    assert!(lines.iter().all(|(u, _, _, c)| *u == uuid && c == scope), "{lines:?}");
    lines.into_iter().map(|(_, soft, hard, _)| (soft, hard)).collect()
}

const CLEARED: (u64, u64) = (0, u64::MAX);

#[tokio::test]
async fn a_container_with_two_shares_of_a_gpu_is_limited_to_their_sum_until_the_last_goes() {
    let cluster = Cluster::start().await;
    let (stub, scope) = node(&cluster, None);
    let agent = ChildAgent::start_configured(&cluster, &config(&cluster, &stub, "enforced"), "", &[]).await;
    cluster.wait_published(NODE, GPUS).await;
    // Two claims, one share each, used by one container.
    let a = claim(&cluster, "a", &[(SHARE_A, "30Gi")]);
    let b = claim(&cluster, "b", &[(SHARE_B, "10Gi")]);
    let mut v1 = agent.v1().await;
    prepare_ok(&mut v1, &a).await;
    prepare_ok(&mut v1, &b).await;
    let (hook_a, hook_b) = (&limit_hooks(&spec_of(&cluster, &a.uid))[0], &limit_hooks(&spec_of(&cluster, &b.uid))[0]);
    assert!(run(&cluster, hook_a, 0) && run(&cluster, hook_b, 1));
    assert_eq!(limits(&stub, &scope), [(30 * GI, 30 * GI), (40 * GI, 40 * GI)], "the sum of both shares");
    unprepare_ok(&mut v1, &b).await;
    assert_eq!(limits(&stub, &scope).last(), Some(&(30 * GI, 30 * GI)), "the share left");
    unprepare_ok(&mut v1, &a).await;
    assert_eq!(limits(&stub, &scope).last(), Some(&CLEARED), "cleared after the last");
    assert_eq!(limits(&stub, &scope).len(), 4);
    // One claim with two shares of the GPU: two CDI devices, two hooks, one limit.
    let c = claim(&cluster, "c", &[(SHARE_A, "30Gi"), (SHARE_B, "10Gi")]);
    prepare_ok(&mut v1, &c).await;
    let hooks = limit_hooks(&spec_of(&cluster, &c.uid));
    assert_eq!(hooks.len(), 2);
    assert!(run(&cluster, &hooks[0], 2) && run(&cluster, &hooks[1], 3));
    assert_eq!(limits(&stub, &scope)[4..], [(30 * GI, 30 * GI), (40 * GI, 40 * GI)]);
    unprepare_ok(&mut v1, &c).await;
    assert_eq!(limits(&stub, &scope)[6..], [CLEARED], "both shares go at once: cleared");
    agent.terminate().await;
}

/// Failpoints exist only in debug builds (as in memory_limits.rs).
#[cfg(debug_assertions)]
#[tokio::test]
async fn a_kill_at_each_step_of_two_shares_on_one_container_converges_to_their_sum() {
    let cluster = Cluster::start().await;
    let (stub, scope) = node(&cluster, None);
    let file = config(&cluster, &stub, "enforced");
    let limit = |gib: u64| (gib * GI, gib * GI);
    let start = |failpoint: &'static str| ChildAgent::start_configured(&cluster, &file, failpoint, &[]);
    let mut agent = start("memory-limit-after-record").await;
    cluster.wait_published(NODE, GPUS).await;
    let a = claim(&cluster, "a", &[(SHARE_A, "30Gi")]);
    let b = claim(&cluster, "b", &[(SHARE_B, "10Gi")]);
    prepare_ok(&mut agent.v1().await, &a).await;
    prepare_ok(&mut agent.v1().await, &b).await;
    let (hook_a, hook_b) = (&limit_hooks(&spec_of(&cluster, &a.uid))[0], &limit_hooks(&spec_of(&cluster, &b.uid))[0]);
    // a recorded, then a kill before it is set; recovery sets it.
    assert!(!run(&cluster, hook_a, 0));
    agent.wait_exit().await;
    assert_eq!(limits(&stub, &scope), []);
    let mut agent = start("memory-limit-after-record").await;
    assert_eq!(limits(&stub, &scope), [limit(30)], "a's share, set at recovery");
    // b recorded beside a, then a kill before the sum is set; recovery sets the sum.
    assert!(!run(&cluster, hook_b, 1));
    agent.wait_exit().await;
    let mut agent = start("memory-limit-after-set").await;
    assert_eq!(limits(&stub, &scope)[1..], [limit(40)], "the sum, set at recovery");
    // b's hook again (the runtime retries), a kill right after the set.
    assert!(!run(&cluster, hook_b, 2));
    agent.wait_exit().await;
    let mut agent = start("memory-limit-after-clear").await;
    assert_eq!(limits(&stub, &scope)[2..], [limit(40), limit(40)]);
    // b's unprepare lowers the limit to a's share, then a kill before b is forgotten: b's
    // claim is still prepared, so recovery sets the sum again until the kubelet's retry.
    let failed = crate::support::agent::unprepare(&mut agent.v1().await, std::slice::from_ref(&b)).await;
    assert!(failed.is_err() || failed.is_ok_and(|r| !r[&b.uid].is_empty()));
    agent.wait_exit().await;
    assert_eq!(limits(&stub, &scope)[4..], [limit(30)]);
    let mut agent = start("unprepare-after-record-remove").await;
    assert_eq!(limits(&stub, &scope)[5..], [limit(40)]);
    // The retry lowers it and forgets b, then a kill: recovery keeps a's share only.
    let failed = crate::support::agent::unprepare(&mut agent.v1().await, std::slice::from_ref(&b)).await;
    assert!(failed.is_err() || failed.is_ok_and(|r| !r[&b.uid].is_empty()));
    agent.wait_exit().await;
    assert_eq!(limits(&stub, &scope)[6..], [limit(30)]);
    let mut agent = start("memory-limit-after-clear").await;
    assert_eq!(limits(&stub, &scope)[7..], [limit(30)], "a's share alone, set at recovery");
    // a's unprepare clears, then a kill before a is forgotten: set again, cleared at the retry.
    let failed = crate::support::agent::unprepare(&mut agent.v1().await, std::slice::from_ref(&a)).await;
    assert!(failed.is_err() || failed.is_ok_and(|r| !r[&a.uid].is_empty()));
    agent.wait_exit().await;
    assert_eq!(limits(&stub, &scope)[8..], [CLEARED]);
    let mut agent = start("").await;
    assert_eq!(limits(&stub, &scope)[9..], [limit(30)]);
    unprepare_ok(&mut agent.v1().await, &b).await;
    unprepare_ok(&mut agent.v1().await, &a).await;
    assert_eq!(limits(&stub, &scope)[10..], [CLEARED], "cleared in the end, once");
    agent.kill().await;
}
