//! Memory footprint of `edra run`: the agent's anonymous memory after start-up stays small
//! (the figures of a real node are in docs/benchmarks.md; this guards against a dependency
//! quietly committing tens of MiB, as sled's metrics histograms do unless their pages are
//! left untouched).

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::apiserver::{Identity, Options, TestApiServer};

/// Anonymous resident memory allowed right after start-up. An unoptimised build holds
/// about 3 MiB; sled's eagerly zeroed histograms alone would add 21 MiB.
const MAX_RSS_ANON_KIB: u64 = 10 * 1024;

fn rss_anon_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edra_run_idles_in_little_anonymous_memory() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestApiServer::start(Options { node_authorizer: true, ..Options::default() }).await.unwrap();
    server.add_node("n1");
    let kubeconfig = server.write_kubeconfig(dir.path(), &Identity::node("n1")).unwrap();
    let d = dir.path().display();
    let config = format!(
        "node_name = \"n1\"\nbackend = \"mock\"\n[log]\nlevel = \"warn\"\n[kubernetes]\nkubeconfig = \"{}\"\n\
         [kubelet]\nroot_dir = \"{d}/kubelet\"\n[cdi]\nspec_dirs = [\"{d}/cdi\"]\ndynamic_dir = \"{d}/cdi\"\n\
         [paths]\nstate_dir = \"{d}/state\"\ndriver_root = \"{d}/driver\"\ndev_root = \"{d}/dev\"\n\
         sys_root = \"{d}/sys\"\n[mock]\ngpus = 8\n",
        kubeconfig.display()
    );
    let config_path = dir.path().join("edra.toml");
    std::fs::write(&config_path, config).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_edra"))
        .arg("--config")
        .arg(&config_path)
        .arg("run")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let published = server
        .wait_for("slices published", Duration::from_secs(30), |s| {
            s.slices_on("n1").iter().map(|sl| sl["spec"]["devices"].as_array().map_or(0, Vec::len)).sum::<usize>() == 8
        })
        .await;
    // The state store was opened (and the API client used) before publishing completed.
    let anon = rss_anon_kib(child.id());
    let _ = child.kill();
    let _ = child.wait();
    published.unwrap();
    let anon = anon.expect("RssAnon of the running agent");
    assert!(anon < MAX_RSS_ANON_KIB, "edra run holds {anon} KiB of anonymous memory after start-up");
}
