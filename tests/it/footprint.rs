//! Memory footprint of `edra run`: the agent's anonymous memory after start-up stays small
//! (the figures of a real node are in docs/benchmarks.md; this guards against a dependency
//! quietly committing tens of MiB, as sled's metrics histograms do unless their pages are
//! left untouched), and all its threads share one malloc arena unless the operator's
//! environment says otherwise (`src/malloc.rs`).

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::apiserver::{Identity, Options, TestApiServer};
use crate::support::procfs::malloc_arena_heaps;

/// Anonymous resident memory allowed right after start-up. An unoptimised build holds
/// about 3 MiB; sled's eagerly zeroed histograms alone would add 21 MiB.
const MAX_RSS_ANON_KIB: u64 = 10 * 1024;

fn rss_anon_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A running `edra run` (mock backend, node credentials) that has published its 8 GPUs.
struct Agent {
    child: std::process::Child,
    server: TestApiServer,
    _dir: tempfile::TempDir,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the agent with `env` added to a environment free of allocator settings.
async fn start_agent(env: &[(&str, &str)]) -> Agent {
    let dir = tempfile::tempdir().unwrap();
    let server = TestApiServer::start(Options { node_authorizer: true, ..Options::default() }).await.unwrap();
    server.add_node("n1");
    let kubeconfig = server.write_kubeconfig(dir.path(), &Identity::node("n1")).unwrap();
    let d = dir.path().display();
    let config = format!(
        "node_name = \"n1\"\nbackend = \"mock\"\n[log]\nlevel = \"warn\"\n[kubernetes]\nkubeconfig = \"{}\"\n\
         [kubelet]\nroot_dir = \"{d}/kubelet\"\n[cdi]\nspec_dirs = [\"{d}/cdi\"]\ndynamic_dir = \"{d}/cdi\"\n\
         [paths]\nstate_dir = \"{d}/state\"\ndriver_root = \"{d}/driver\"\ndev_root = \"{d}/dev\"\n\
         sys_root = \"{d}/sys\"\n[metrics]\naddress = \"\"\n[mock]\ngpus = 8\n",
        kubeconfig.display()
    );
    let config_path = dir.path().join("edra.toml");
    std::fs::write(&config_path, config).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_edra"))
        .arg("--config")
        .arg(&config_path)
        .arg("run")
        .env_remove("MALLOC_ARENA_MAX")
        .env_remove("GLIBC_TUNABLES")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let agent = Agent { child, server, _dir: dir };
    agent
        .server
        .wait_for("slices published", Duration::from_secs(30), |s| {
            s.slices_on("n1").iter().map(|sl| sl["spec"]["devices"].as_array().map_or(0, Vec::len)).sum::<usize>() == 8
        })
        .await
        .unwrap();
    agent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edra_run_idles_in_little_anonymous_memory_in_one_malloc_arena() {
    let agent = start_agent(&[]).await;
    // The state store was opened (and the API client used) before publishing completed.
    let pid = agent.child.id();
    let anon = rss_anon_kib(pid).expect("RssAnon of the running agent");
    assert!(anon < MAX_RSS_ANON_KIB, "edra run holds {anon} KiB of anonymous memory after start-up");
    // A dozen threads have allocated by now; glibc's default would have given most of them
    // an arena of their own.
    assert_eq!(malloc_arena_heaps(pid), 0, "edra run has secondary malloc arenas:\n{}", maps(pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_malloc_arena_max_is_left_in_force() {
    let agent = start_agent(&[("MALLOC_ARENA_MAX", "8")]).await;
    let pid = agent.child.id();
    assert!(malloc_arena_heaps(pid) >= 1, "no secondary malloc arena with MALLOC_ARENA_MAX=8:\n{}", maps(pid));
}

fn maps(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default()
}
