//! Memory footprint of `edra run`: the agent's anonymous memory after start-up stays small
//! (the figures of a real node are in docs/benchmarks.md; this guards against a dependency
//! quietly committing tens of MiB, as sled's metrics histograms do unless their pages are
//! left untouched), and all its threads share one malloc arena unless the operator's
//! environment says otherwise (`src/malloc.rs`).

use crate::support::agent::{ChildAgent, Cluster, GPUS, NODE};
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

fn maps(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default()
}
