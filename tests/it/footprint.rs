//! Memory footprint of `edra run`: the agent's anonymous memory after start-up stays small
//! (the figures of a real node are in docs/benchmarks.md; this guards against a dependency
//! quietly committing tens of MiB, as sled's metrics histograms do unless their pages are
//! left untouched), and all its threads share one malloc arena unless the operator's
//! environment says otherwise (`src/malloc.rs`). A claim whose bytes fit the body limit
//! but would decode into hundreds of MiB is refused within a bounded peak.

use crate::support::agent::{ChildAgent, Cluster, DRIVER, GPUS, NODE, prepare};
use crate::support::apiserver::{AllocatedDevice, ClaimBuilder};
use crate::support::procfs::{self, malloc_arena_heaps, smaps};

/// Anonymous resident memory allowed right after start-up. An unoptimised build holds
/// about 3 MiB; sled's eagerly zeroed histograms alone would add 21 MiB.
const MAX_RSS_ANON_KIB: u64 = 10 * 1024;

/// The real `edra run` as a child (mock backend, node credentials), its GPUs published.
async fn start_agent(env: &[(&str, &str)]) -> (Cluster, ChildAgent) {
    let cluster = Cluster::start().await;
    let agent = ChildAgent::start_with_env(&cluster, "", env).await;
    // The state store was opened (and the API client used) before publishing completed.
    cluster.wait_published(NODE, GPUS).await;
    (cluster, agent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edra_run_idles_in_little_anonymous_memory_in_one_malloc_arena() {
    let (_cluster, agent) = start_agent(&[]).await;
    let pid = agent.child.id().expect("edra run is running");
    let anon = *procfs::status(pid).get("RssAnon").expect("RssAnon of the running agent");
    assert!(anon < MAX_RSS_ANON_KIB, "edra run holds {anon} KiB of anonymous memory after start-up");
    // A dozen threads have allocated by now; glibc's default would have given most of them
    // an arena of their own.
    assert_eq!(malloc_arena_heaps(&smaps(pid)), 0, "edra run has secondary malloc arenas:\n{}", maps(pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_malloc_arena_max_is_left_in_force() {
    let (_cluster, agent) = start_agent(&[("MALLOC_ARENA_MAX", "8")]).await;
    let pid = agent.child.id().expect("edra run is running");
    assert!(malloc_arena_heaps(&smaps(pid)) >= 1, "no secondary malloc arena with MALLOC_ARENA_MAX=8:\n{}", maps(pid));
}

/// Peak resident memory allowed above the idle agent's while it reads one claim.
const MAX_CLAIM_PEAK_KIB: u64 = 32 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_a_long_opaque_array_is_refused_within_a_bounded_peak() {
    let (cluster, agent) = start_agent(&[]).await;
    let pid = agent.child.id().expect("edra run is running");
    // 7.8 million zeros: 15.6 MB of JSON, under the 16 MiB body limit, 250 MiB as values.
    let zeros = serde_json::Value::Array(vec![serde_json::Value::from(0u8); 7_800_000]);
    let claim = cluster.put_claim(
        ClaimBuilder::new("default", "huge")
            .allocated(AllocatedDevice::new("gpu", DRIVER, NODE, "gpu-0"))
            .opaque_config("FromClaim", &["gpu"], DRIVER, zeros),
    );
    let idle = procfs::status(pid);
    let (idle_rss, idle_hwm) = (idle["VmRSS"], idle["VmHWM"]);
    let answer = prepare(&mut agent.v1().await, std::slice::from_ref(&claim)).await.expect("NodePrepareResources");
    let hwm = procfs::status(pid)["VmHWM"];
    let above = hwm.saturating_sub(idle_rss);
    println!(
        "VmRSS idle {idle_rss} KiB, VmHWM before {idle_hwm} KiB, after the 15.6 MB claim {hwm} KiB: {above} KiB above idle"
    );
    let error = &answer[&claim.uid].error;
    assert!(
        error.contains(
            "ResourceClaim default/huge cannot be read: the claim's opaque.parameters is 15600001 bytes, more than \
             the 16384 edra reads"
        ),
        "{error}"
    );
    assert!(above < MAX_CLAIM_PEAK_KIB, "reading one claim took the peak {above} KiB above the idle {idle_rss} KiB");
}

fn maps(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default()
}
