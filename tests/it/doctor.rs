//! `edra doctor` as a process (the real binary, `--backend mock --output json`) against the
//! in-process test API server with a node identity and the node authorizer: every check is
//! reported, the API check names the served versions, a forbidden verb fails with its fix,
//! the exit code follows the worst result, and with no cluster it fails fast.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;

use edra::config::Paths;

use crate::support::apiserver::{ApiVersion, Identity, Options, TestApiServer};
use crate::support::layout::{paths_toml, toml_path};

/// A node's directories under a temp dir, with an edra config file pointing at them.
struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().expect("temp dir");
        for d in ["kubelet/plugins", "kubelet/plugins_registry", "etc/cdi", "run/cdi", "k3s", "home"] {
            std::fs::create_dir_all(dir.path().join(d)).expect("mkdir");
        }
        // A containerd 2.x configuration as k3s generates it, reading the node's CDI dirs.
        let run_cdi = dir.path().join("run/cdi");
        std::fs::write(
            dir.path().join("k3s/config.toml"),
            format!(
                "version = 3\n[plugins.'io.containerd.cri.v1.runtime']\ncdi_spec_dirs = [\"/etc/cdi\", \"{}\"]\n\
                 [plugins.'io.containerd.cri.v1.runtime'.containerd]\ndefault_runtime_name = \"runc\"\n",
                run_cdi.display()
            ),
        )
        .expect("write containerd config");
        Node { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Writes edra.toml with every path under the temp dir and this kubeconfig (the host's
    /// own /proc and /sys, which the doctor reads).
    fn config(&self, kubeconfig: &Path) -> PathBuf {
        let p = |rel: &str| toml_path(&self.path(rel));
        let paths = Paths {
            cdi_spec_dirs: vec![self.path("etc/cdi"), self.path("run/cdi")],
            cdi_dynamic_dir: self.path("run/cdi"),
            proc_root: "/proc".into(),
            sys_root: "/sys".into(),
            ..Paths::under(self.dir.path())
        };
        let text = format!(
            "node_name = \"n1\"\nbackend = \"mock\"\n\
             [kubernetes]\nkubeconfig = {kc}\nk3s_kubelet_kubeconfig = {none}\nk3s_server_kubeconfig = {none}\n\
             service_account_dir = {none}\n\
             {paths}\
             [runtime]\nk3s_containerd_config = {k3s}\ncontainerd_config = {none}\n\
             crio_config = {none}\ncrio_config_dir = {none}\n",
            kc = toml_path(kubeconfig),
            none = p("none"),
            paths = paths_toml(&paths),
            k3s = p("k3s/config.toml"),
        );
        let file = self.path("edra.toml");
        std::fs::write(&file, text).expect("write config");
        file
    }

    /// Runs `edra --config <file> doctor <args>` as a child process with a clean
    /// environment, while this test's runtime keeps serving the API.
    async fn doctor(&self, config: &Path, args: &[&str]) -> Output {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_edra"))
            .env_clear()
            .env("HOME", self.path("home"))
            .arg("--config")
            .arg(config)
            .arg("doctor")
            .args(args)
            .output()
            .await
            .expect("run edra doctor")
    }
}

fn report(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no check {name} in {report:#}"))
}

fn text(v: &Value, field: &str) -> String {
    v[field].as_str().unwrap_or_default().to_string()
}

async fn node_server(opts: Options) -> TestApiServer {
    TestApiServer::start(Options { node_authorizer: true, ..opts }).await.expect("start the test API server")
}

#[tokio::test]
async fn a_forbidden_verb_fails_with_the_fix_and_exit_code_one() {
    let server =
        node_server(Options { versions: vec![ApiVersion::V1, ApiVersion::V1beta2], ..Options::default() }).await;
    server.forbid("system:node:n1", "create", "resourceslices");
    let node = Node::new();
    let kubeconfig = server.write_kubeconfig(node.dir.path(), &Identity::node("n1")).expect("kubeconfig");
    let out = node.doctor(&node.config(&kubeconfig), &["--output", "json"]).await;
    let r = report(&out);
    assert_eq!(out.status.code(), Some(1), "{r:#}");
    assert!(r["checks"].as_array().map_or(0, Vec::len) >= 6, "{r:#}");

    let api = check(&r, "api-server");
    assert_eq!(api["status"], "pass", "{api}");
    let detail = text(api, "detail");
    assert!(
        detail.contains("v1.36.2") && detail.contains("served: v1, v1beta2") && detail.contains("edra uses v1"),
        "{detail}"
    );

    let perms = check(&r, "api-permissions");
    assert_eq!(perms["status"], "fail", "{perms}");
    let detail = text(perms, "detail");
    assert!(detail.contains("system:node:n1") && detail.contains("create resourceslices.resource.k8s.io"), "{detail}");
    assert!(!detail.contains("list resourceslices"), "list with the node's selector is allowed: {detail}");
    assert!(!detail.contains("pods"), "its own pods, by selector, are allowed: {detail}");
    assert!(text(perms, "fix").contains("--authorization-mode=Node,RBAC"), "{perms}");

    assert_eq!(check(&r, "backend")["status"], "warn");
    assert_eq!(check(&r, "kubelet-dirs")["status"], "pass", "{r:#}");
    assert_eq!(check(&r, "cdi-dirs")["status"], "pass", "{r:#}");
    assert_eq!(check(&r, "container-runtime")["status"], "pass", "{r:#}");
    assert_eq!(check(&r, "state")["status"], "pass", "{r:#}");
    assert_eq!(r["summary"]["worst"], "fail");
    assert_eq!(r["summary"]["exit_code"], 1);

    // The doctor asked, as the node, and changed nothing.
    let reviews: Vec<_> =
        server.requests().into_iter().filter(|q| q.path.ends_with("selfsubjectaccessreviews")).collect();
    assert_eq!(
        reviews.len(),
        13,
        "one review per action (with list and watch of pods for claims.prefetch, and three for claim status)"
    );
    assert!(reviews.iter().all(|q| q.user.as_deref() == Some("system:node:n1") && q.status == 201));
    assert_eq!(server.writes_since(0), 0);
}

#[tokio::test]
async fn a_healthy_node_identity_passes_with_per_object_notes() {
    let server = node_server(Options::default()).await;
    let node = Node::new();
    let kubeconfig = server.write_kubeconfig(node.dir.path(), &Identity::node("n1")).expect("kubeconfig");
    let out = node.doctor(&node.config(&kubeconfig), &["-o", "json"]).await;
    let r = report(&out);
    assert_eq!(out.status.code(), Some(0), "{r:#}");
    let perms = check(&r, "api-permissions");
    assert_eq!(perms["status"], "pass", "{perms}");
    assert!(text(perms, "detail").contains("decided per object by the node authorizer"), "{perms}");
    assert_eq!(r["summary"]["fail"], 0);
}

#[tokio::test]
async fn a_cdi_directory_others_can_write_fails_naming_it_and_the_chmod() {
    use std::os::unix::fs::PermissionsExt;
    let server = node_server(Options::default()).await;
    let node = Node::new();
    let kubeconfig = server.write_kubeconfig(node.dir.path(), &Identity::node("n1")).expect("kubeconfig");
    let cdi = node.path("run/cdi");
    std::fs::set_permissions(&cdi, std::fs::Permissions::from_mode(0o777)).expect("chmod 0777");
    let out = node.doctor(&node.config(&kubeconfig), &["--output", "json"]).await;
    let r = report(&out);
    assert_eq!(out.status.code(), Some(1), "{r:#}");
    let modes = check(&r, "dir-modes");
    assert_eq!(modes["status"], "fail", "{modes}");
    let detail = text(modes, "detail");
    assert!(detail.contains(&format!("edra's CDI directory {} (mode 0777)", cdi.display())), "{detail}");
    assert_eq!(text(modes, "fix"), format!("chmod go-w {}", cdi.display()));
    assert_eq!(r["summary"]["fail"], 1, "nothing else fails: {r:#}");
    assert!(!text(check(&r, "cdi-dirs"), "detail").contains("is writable"), "{r:#}");

    // Closed again (and a root-owned sticky one, as /tmp, is not others' to rename in).
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let mode = if root { 0o1777 } else { 0o755 };
    std::fs::set_permissions(&cdi, std::fs::Permissions::from_mode(mode)).expect("chmod");
    let out = node.doctor(&node.config(&kubeconfig), &["--output", "json"]).await;
    let r = report(&out);
    assert_eq!(out.status.code(), Some(0), "{r:#}");
    assert_eq!(check(&r, "dir-modes")["status"], "pass", "{r:#}");
}

#[tokio::test]
async fn a_metrics_port_another_process_holds_is_named_with_its_pid() {
    let server = node_server(Options::default()).await;
    let node = Node::new();
    let kubeconfig = server.write_kubeconfig(node.dir.path(), &Identity::node("n1")).expect("kubeconfig");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = taken.local_addr().expect("address");
    let set = format!("metrics.address={address}");
    let out = node.doctor(&node.config(&kubeconfig), &["--output", "json", "--set", &set]).await;
    let r = report(&out);
    assert_eq!(out.status.code(), Some(0), "edra works without it: {r:#}");
    let port = check(&r, "metrics-port");
    assert_eq!(port["status"], "warn", "{port}");
    let pid = std::process::id();
    assert!(text(port, "detail").starts_with(&format!("{address} is held by pid {pid} (")), "{port}");
    assert!(text(port, "fix").contains(&format!("kill {pid}")), "{port}");
}

#[tokio::test]
async fn a_server_without_dra_gets_the_enable_hint_for_its_version() {
    let server =
        node_server(Options { git_version: "v1.33.4+k3s1".into(), versions: vec![], ..Options::default() }).await;
    let node = Node::new();
    let kubeconfig = server.write_kubeconfig(node.dir.path(), &Identity::node("n1")).expect("kubeconfig");
    let out = node.doctor(&node.config(&kubeconfig), &["--output", "json"]).await;
    let r = report(&out);
    assert_eq!(out.status.code(), Some(1));
    let api = check(&r, "api-server");
    assert_eq!(api["status"], "fail");
    assert!(text(api, "detail").contains("served: none"), "{api}");
    let fix = text(api, "fix");
    assert!(fix.contains("DynamicResourceAllocation=true") && fix.contains("resource.k8s.io/v1beta2=true"), "{fix}");
}

#[tokio::test]
async fn without_a_cluster_it_fails_fast_and_still_checks_the_node() {
    let node = Node::new();
    // A kubeconfig for a server that no longer listens.
    let kubeconfig = {
        let server = TestApiServer::start(Options::default()).await.expect("start");
        let kc = server.write_kubeconfig(node.dir.path(), &Identity::node("n1")).expect("kubeconfig");
        server.stop().await;
        kc
    };
    let started = Instant::now();
    let out = node.doctor(&node.config(&kubeconfig), &["--output", "json"]).await;
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
    let r = report(&out);
    assert_eq!(out.status.code(), Some(1), "{r:#}");
    assert!(r["checks"].as_array().map_or(0, Vec::len) >= 6, "{r:#}");
    let api = check(&r, "api-server");
    assert_eq!(api["status"], "fail");
    assert!(text(api, "fix").contains("reachable"), "{api}");
    assert_eq!(check(&r, "api-permissions")["status"], "skip");
    assert_eq!(check(&r, "kubelet-dirs")["status"], "pass");

    // The table names the columns; a bad configuration is still exit code 64.
    let out = node.doctor(&node.config(&kubeconfig), &["--output", "table"]).await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.starts_with("STATUS") && table.contains("FIX") && table.contains("api-server"), "{table}");
    let out = node.doctor(&node.config(&kubeconfig), &["--set", "backend=bogus"]).await;
    assert_eq!(out.status.code(), Some(64), "{}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test]
async fn claim_status_writes_are_a_warning_until_the_opt_in_rbac_grants_them() {
    let server = node_server(Options::default()).await;
    let node = Node::new();
    let kubeconfig = server.write_kubeconfig(node.dir.path(), &Identity::node("n1")).expect("kubeconfig");
    let out = node.doctor(&node.config(&kubeconfig), &["-o", "json"]).await;
    let r = report(&out);
    assert_eq!(out.status.code(), Some(0), "a warning only: {r:#}");
    let status = check(&r, "claim-status");
    assert_eq!(status["status"], "warn", "{status}");
    assert!(text(status, "detail").contains("lacks patch on resourceclaims/status"), "{status}");
    assert!(text(status, "fix").contains("rbac-claim-status-nodes.yaml"), "{status}");

    server.grant_claim_status();
    let r = report(&node.doctor(&node.config(&kubeconfig), &["-o", "json"]).await);
    let status = check(&r, "claim-status");
    assert_eq!(status["status"], "pass", "{status}");
    assert!(text(status, "detail").contains("arbitrary-node:patch resourceclaims/driver"), "{status}");
    // A grant without the driver permission is named as such.
    server.forbid("system:node:n1", "arbitrary-node:patch", "resourceclaims/driver");
    let r = report(&node.doctor(&node.config(&kubeconfig), &["-o", "json"]).await);
    assert!(text(check(&r, "claim-status"), "detail").contains("lacks the driver permission"), "{r:#}");
}

#[tokio::test]
async fn a_service_account_missing_a_verb_gets_the_cluster_role_fix() {
    let server = TestApiServer::start(Options::default()).await.expect("start the test API server");
    let user = "system:serviceaccount:edra:edra";
    server.forbid(user, "delete", "resourceslices");
    let node = Node::new();
    let kubeconfig =
        server.write_kubeconfig(node.dir.path(), &Identity::token("sa-token", user, &[])).expect("kubeconfig");
    let out = node.doctor(&node.config(&kubeconfig), &["--output", "json"]).await;
    let r = report(&out);
    assert_eq!(out.status.code(), Some(1), "{r:#}");
    let perms = check(&r, "api-permissions");
    assert_eq!(perms["status"], "fail", "{perms}");
    let detail = text(perms, "detail");
    assert!(detail.contains("delete resourceslices.resource.k8s.io") && !detail.contains("create"), "{detail}");
    assert!(text(perms, "fix").contains(&format!("bind {user} to a ClusterRole")), "{perms}");
}
