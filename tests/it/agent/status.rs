//! `edra status` against the real binary: the running agent's view of GPUs (health,
//! taints, shares, whole holders), claims (devices, shares, pods), on a root-only socket,
//! answered while the API server is down.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::agent::{ChildAgent, Cluster, DRIVER, GPUS, NODE, WAIT, prepare_ok};
use crate::support::apiserver::{AllocatedDevice, ClaimBuilder, Fault, FaultAction, bound_pod};

const SHARE: &str = "6de5d941-c79d-4a8a-ba10-668351620525";

fn status(config: &Path, output: &str) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_edra"))
        .env_clear()
        .arg("--config")
        .arg(config)
        .args(["status", "-o", output])
        .output()
        .expect("run edra status");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn json(config: &Path) -> Value {
    let (ok, out, err) = status(config, "json");
    assert!(ok, "edra status failed: {err}");
    serde_json::from_str(&out).expect("the view is JSON")
}

fn gpu<'a>(view: &'a Value, name: &str) -> &'a Value {
    view["gpus"].as_array().into_iter().flatten().find(|g| g["name"] == name).expect("the GPU")
}

/// Polls the view until `ready` holds (within [`WAIT`]).
async fn until(config: &Path, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let view = json(config);
        if ready(&view) {
            return view;
        }
        assert!(started.elapsed() < WAIT, "{what}: {view:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn status_shows_gpus_and_claims_and_answers_while_the_api_server_is_down() {
    let cluster = Cluster::start().await;
    let events = cluster.dir.path().join("gpu-events");
    std::fs::write(&events, "").unwrap();
    let mock = format!(
        "gpus = {GPUS}\nevents_file = \"{}\"\n[health]\nprobe_interval = \"100ms\"\nquiet_period = \"1h\"\n",
        events.display()
    );
    let config = cluster.config_file_with(NODE, &mock);
    let agent = ChildAgent::start_configured(&cluster, &config, "", &[]).await;
    let mut client = agent.v1().await;
    let whole = cluster.reserved_claim("whole", "gpu-1");
    let shared = cluster.put_claim(
        ClaimBuilder::new("default", "shared")
            .allocated(AllocatedDevice::new("gpu", DRIVER, NODE, "gpu-0").share(SHARE, "10Gi"))
            .reserved_for_pod("trainer", "uid-of-trainer"),
    );
    cluster.server.put_pod(bound_pod("default", "trainer", NODE, &[("gpu", "shared")]));
    prepare_ok(&mut client, &whole).await;
    prepare_ok(&mut client, &shared).await;
    std::fs::write(&events, "xid 3 79\n").unwrap();

    let view = until(&config, "gpu-3 tainted and the trainer pod seen", |v| {
        gpu(v, "gpu-3")["health"] == "unhealthy"
            && v["claims"].as_array().is_some_and(|c| c.iter().any(|c| c["pods"] == serde_json::json!(["trainer"])))
    })
    .await;
    assert_eq!(view["schema"], "edra.status/v1");
    assert_eq!((view["node"].as_str(), view["backend"].as_str()), (Some(NODE), Some("mock")));
    assert_eq!(view["kubelet_registered"], true);
    assert_eq!(view["gpus"].as_array().map(Vec::len), Some(GPUS));
    let g0 = gpu(&view, "gpu-0");
    assert_eq!((g0["shares"].as_u64(), g0["memory_shared"].as_u64()), (Some(1), Some(10 << 30)));
    assert_eq!(gpu(&view, "gpu-1")["held_by"], serde_json::json!(["default/whole"]));
    let g3 = gpu(&view, "gpu-3");
    assert_eq!(g3["taints"][0]["taint"], "gpu.edra.dev/xid=79:NoSchedule");
    assert!(g3["conditions"][0]["message"].as_str().unwrap().contains("XID 79 (GPU has fallen off the bus)"));
    let claim = view["claims"].as_array().unwrap().iter().find(|c| c["name"] == "shared").unwrap();
    assert_eq!(claim["uid"], shared.uid.as_str());
    assert_eq!(claim["devices"][0]["share_id"], SHARE);
    assert_eq!(claim["devices"][0]["memory"].as_u64(), Some(10 << 30));
    assert_eq!(claim["devices"][0]["strategy"], "Exclusive");

    let (ok, text, _) = status(&config, "text");
    assert!(ok);
    assert!(text.lines().all(|l| l.chars().count() <= 100), "{text}");
    assert!(text.contains("default/whole") && text.contains("gpu-0#6de5d941") && text.contains("trainer"), "{text}");
    let (ok, wide, _) = status(&config, "wide");
    assert!(ok && wide.contains(&shared.uid) && wide.contains("XID 79"), "{wide}");

    // Root only: the socket is 0600 (connecting needs write permission on it); the runtime
    // directory keeps the mode the packages promise.
    let socket = agent.fs.root.join("run/status.sock");
    let socket = if socket.exists() { socket } else { find_socket(&agent.fs.root) };
    assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o600);
    if crate::support::mps::is_root() {
        // Another user who can reach the socket's folder still cannot connect.
        use std::os::unix::process::CommandExt;
        let dir = socket.parent().unwrap();
        for d in dir.ancestors().take_while(|d| d.starts_with(cluster.dir.path())) {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o711)).unwrap();
        }
        let probe = std::process::Command::new(env!("CARGO_BIN_EXE_edra"))
            .env_clear()
            .args(["--set", &format!("paths.runtime_dir={}", dir.display()), "status"])
            .uid(65534)
            .gid(65534)
            .output()
            .expect("run edra status as nobody");
        let err = String::from_utf8_lossy(&probe.stderr);
        assert!(!probe.status.success(), "nobody was let in");
        assert!(err.contains("cannot reach the running agent") && err.contains("Permission denied"), "{err}");
    }

    // The API server goes away: the view still comes, from what the agent holds.
    cluster.server.stop().await;
    let view = json(&config);
    assert_eq!(view["claims"].as_array().map(Vec::len), Some(2));
    drop(agent);
}

#[tokio::test]
async fn text_from_the_api_server_reaches_status_and_the_log_escaped() {
    // A new window title, a cleared screen, and a line of its own.
    let hostile = "\u{1b}]0;owned\u{7}\u{1b}[2J\r\nFAKE LINE: all GPUs healthy";
    let shown = "\\u{1b}]0;owned\\u{7}\\u{1b}[2J\\u{d}\\u{a}FAKE LINE: all GPUs healthy";
    let cluster = Cluster::start().await;
    let fault = FaultAction::InternalErrorSaying(hostile.into());
    cluster.server.inject(Fault::next(usize::MAX, fault).method(http::Method::GET).path_contains("/nodes/"));
    let config = cluster.config_file(NODE);
    let agent = ChildAgent::start_configured(&cluster, &config, "", &[]).await;
    let view = until(&config, "the API server's error in the view", |v| {
        v["publish_error"].as_str().is_some_and(|e| e.contains("FAKE LINE"))
    })
    .await;
    assert!(view["publish_error"].as_str().unwrap().contains(hostile), "JSON keeps the text itself: {view}");
    let raw = |c: char| c.is_control() && c != '\n';
    for output in ["json", "text", "wide"] {
        let (ok, out, err) = status(&config, output);
        assert!(ok, "{err}");
        assert!(!out.chars().any(raw), "edra status -o {output} wrote a control character: {out:?}");
        assert!(!out.lines().any(|l| l.trim_start().starts_with("FAKE LINE")), "{out}");
        if output != "json" {
            assert!(out.contains(shown), "{out}");
            println!("{}", out.lines().find(|l| l.contains(shown)).unwrap_or_default());
        }
    }
    let log = until_logged(&agent, "FAKE LINE").await;
    assert!(!log.chars().any(raw), "the log holds a control character: {log:?}");
    assert!(!log.lines().any(|l| l.starts_with("FAKE LINE")), "a forged log line: {log}");
    let line = log.lines().find(|l| l.contains("cannot reach the API server yet") && l.contains(shown));
    println!("{}", line.expect("the warning, escaped"));
}

/// The agent's log once it holds `text` (within [`WAIT`]).
async fn until_logged(agent: &ChildAgent, text: &str) -> String {
    let started = Instant::now();
    loop {
        let log = agent.stderr();
        if log.contains(text) {
            return log;
        }
        assert!(started.elapsed() < WAIT, "no {text:?} in the log: {log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The status socket under `root`, wherever the runtime directory is.
fn find_socket(root: &Path) -> std::path::PathBuf {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.file_name().is_some_and(|n| n == "status.sock") {
                return p;
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            }
        }
    }
    panic!("no status.sock under {}", root.display());
}

#[test]
fn status_without_a_running_agent_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("edra.toml");
    std::fs::write(&config, format!("[paths]\nruntime_dir = \"{}\"\n", dir.path().join("run").display())).unwrap();
    let (ok, _, err) = status(&config, "text");
    assert!(!ok);
    assert!(err.contains("cannot reach the running agent") && err.contains("is edra running"), "{err}");
}

#[tokio::test]
async fn status_shows_the_mig_instances_edra_made_and_a_claims_mps_daemon() {
    use crate::support::mps::is_root;
    if !is_root() {
        eprintln!("skipped: an MPS daemon's own mount namespace needs root");
        return;
    }
    let cluster = Cluster::start().await;
    let config = cluster.config_file_with(NODE, "gpus = 2\nmig_mode = true\n[mig]\ndynamic = [\"*\"]");
    let agent = ChildAgent::start_configured(&cluster, &config, "", &[]).await;
    let mut client = agent.v1().await;
    let mig = cluster.reserved_claim("carved", "gpu-0-mig-3g40gb-9-4");
    let mps = cluster.put_claim(
        ClaimBuilder::new("default", "mps")
            .allocated(AllocatedDevice::new("gpu", DRIVER, NODE, "gpu-1"))
            .opaque_config(
                "FromClaim",
                &[],
                DRIVER,
                serde_json::json!({"apiVersion": format!("{DRIVER}/v1alpha1"), "kind": "GpuConfig",
                               "sharing": {"strategy": "MPS"}}),
            ),
    );
    prepare_ok(&mut client, &mig).await;
    prepare_ok(&mut client, &mps).await;
    let view = until(&config, "the MIG instance seen by discovery", |v| {
        gpu(v, "gpu-0")["mig_instances"].as_array().is_some_and(|m| !m.is_empty())
    })
    .await;
    let g0 = gpu(&view, "gpu-0");
    assert_eq!(g0["mig_mode"], true);
    let instance = &g0["mig_instances"][0];
    assert_eq!((instance["profile"].as_str(), instance["placement"].as_str()), (Some("3g.40gb"), Some("4+4")));
    assert_eq!((instance["owner"].as_str(), instance["claim"].as_str()), (Some("edra"), Some("default/carved")));
    let daemon = &gpu(&view, "gpu-1")["mps_daemons"][0];
    assert_eq!(daemon["claim"], "default/mps");
    assert!(daemon["pid"].as_u64().is_some_and(|p| p > 0), "{daemon}");
    assert_eq!(daemon["restarts"], 0);
    let claim = view["claims"].as_array().unwrap().iter().find(|c| c["name"] == "mps").unwrap();
    assert_eq!(claim["devices"][0]["strategy"], "MPS");
    let (ok, wide, _) = status(&config, "wide");
    assert!(ok);
    assert!(wide.contains("gpu-0: MIG 3g.40gb gi") && wide.contains("(edra for default/carved)"), "{wide}");
    assert!(wide.contains("gpu-1: MPS daemon for default/mps pid"), "{wide}");
    crate::support::agent::unprepare_ok(&mut client, &mps).await;
    drop(agent);
}
