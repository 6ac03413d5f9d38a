//! The assembled agent for end-to-end tests: a test API server with node "n1" and the
//! node authorizer, a node filesystem in a temp dir (kubelet, CDI, state, /dev, /proc,
//! /sys, driver root), a configuration file pointing at all of it, and `edra::app::run`
//! on a task (or the real `edra run` binary as a child process, see [`ChildAgent`]),
//! registered with the kubelet client the way the kubelet does it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use edra::app::AppError;
use edra::config::{Config, LoadContext, Overrides, Paths};
use edra::plugin::ClaimRef;
use edra::plugin::proto::dra_v1 as v1;
use edra::plugin::proto::dra_v1::dra_plugin_client::DraPluginClient as V1Client;
use edra::plugin::proto::registration::{InfoRequest, RegistrationStatus};
use serde_json::Value;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

pub use super::captured_logs::CapturedLogs;

use super::apiserver::{AllocatedDevice, ClaimBuilder, Identity, Options, TestApiServer};
use super::kubelet;
use super::layout::{paths_toml, toml_path};
use super::systemd::FdStore;

pub const DRIVER: &str = "gpu.edra.dev";
pub const NODE: &str = "n1";
/// Mock GPUs on the node: `gpu-0` … `gpu-3`.
pub const GPUS: usize = 4;
/// Upper bound of every wait in these tests; a failure says what was awaited.
pub const WAIT: Duration = Duration::from_secs(15);
/// Numbers the children's notification sockets.
static NOTIFY_SOCKETS: AtomicUsize = AtomicUsize::new(0);

/// The test API server plus one node's filesystem and credentials.
pub struct Cluster {
    pub server: TestApiServer,
    pub node_uid: String,
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
}

impl Cluster {
    /// A v1 server with the node authorizer, Node "n1", and a `system:node:n1` kubeconfig.
    pub async fn start() -> Cluster {
        Self::start_with(Options::default()).await
    }

    /// Like [`Cluster::start`] with other server options (the node authorizer stays on).
    pub async fn start_with(options: Options) -> Cluster {
        let server = TestApiServer::start(Options { node_authorizer: true, ..options })
            .await
            .expect("start the test API server");
        let node_uid = server.add_node(NODE);
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = server.write_kubeconfig(dir.path(), &Identity::node(NODE)).expect("write kubeconfig");
        NodeFs::create(&dir.path().join("node"));
        Cluster { server, node_uid, dir, kubeconfig }
    }

    /// The node's filesystem layout.
    pub fn fs(&self) -> NodeFs {
        NodeFs { root: self.dir.path().join("node") }
    }

    /// The configuration file for node `node` (written on each call), as `edra run
    /// --config` reads it.
    pub fn config_file(&self, node: &str) -> PathBuf {
        self.config_file_with(node, &format!("gpus = {GPUS}"))
    }

    /// Like [`Cluster::config_file`] with `mock` as the body of the `[mock]` section.
    pub fn config_file_with(&self, node: &str, mock: &str) -> PathBuf {
        let path = self.dir.path().join(format!("edra-{node}.toml"));
        std::fs::write(&path, self.fs().toml(node, &self.kubeconfig, mock)).expect("write the configuration file");
        path
    }

    /// The configuration of an agent on `node` with this cluster's node-n1 credentials.
    pub fn config(&self, node: &str) -> Config {
        self.config_with(node, &format!("gpus = {GPUS}"))
    }

    /// Like [`Cluster::config`] with `mock` as the body of the `[mock]` section.
    pub fn config_with(&self, node: &str, mock: &str) -> Config {
        let ctx = LoadContext {
            explicit_file: Some(self.config_file_with(node, mock)),
            default_file: self.dir.path().join("absent.toml"),
            env: Vec::new(),
            overrides: Overrides::default(),
            hostname: Some(NODE.into()),
        };
        match Config::load(&ctx) {
            Ok(c) => c,
            Err(problems) => panic!("test configuration is invalid: {problems:?}"),
        }
    }

    /// Puts an allocated claim for `device` of this driver in pool `n1` that a pod on n1
    /// uses; returns the kubelet's reference to it.
    pub fn allocated_claim(&self, name: &str, device: &str) -> ClaimRef {
        self.put_claim(ClaimBuilder::new("default", name).allocated(AllocatedDevice::new("gpu", DRIVER, NODE, device)))
    }

    /// [`Cluster::allocated_claim`] reserved for a pod, as a claim in use is: edra checks
    /// a claim in the way of another against the API server, and one reserved for no pod
    /// is gone.
    pub fn reserved_claim(&self, name: &str, device: &str) -> ClaimRef {
        self.put_claim(
            ClaimBuilder::new("default", name)
                .allocated(AllocatedDevice::new("gpu", DRIVER, NODE, device))
                .reserved_for_pod(&format!("pod-{name}"), &format!("uid-of-pod-{name}")),
        )
    }

    /// Stores the claim built by `builder` on node n1 and returns its reference.
    pub fn put_claim(&self, builder: ClaimBuilder) -> ClaimRef {
        let stored = self.server.put_claim(builder.on_node(NODE).build());
        let text = |v: &Value| v.as_str().expect("stored claim has metadata").to_owned();
        let claim = ClaimRef {
            namespace: text(&stored["metadata"]["namespace"]),
            name: text(&stored["metadata"]["name"]),
            uid: text(&stored["metadata"]["uid"]),
        };
        self.server.mark_claim_on_node(&claim.namespace, &claim.name, NODE);
        claim
    }

    /// The slices of `node`, ordered by name.
    pub fn slices_on(&self, node: &str) -> Vec<Value> {
        self.server.with_state(|s| s.slices_on(node))
    }

    /// Waits until no write follows for a second after `mark` (for [`WAIT`] at most: a
    /// write loop never goes quiet), and returns the writes made.
    pub async fn writes_until_quiet(&self, mark: usize) -> usize {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let before = self.server.with_state(|s| s.writes_since(mark));
            let more = self
                .server
                .wait_for("another write", std::time::Duration::from_secs(1), |s| s.writes_since(mark) > before)
                .await;
            if more.is_err() || std::time::Instant::now() > deadline {
                return before;
            }
        }
    }

    /// Waits until `node`'s pool is published with `devices` devices.
    pub async fn wait_published(&self, node: &str, devices: usize) {
        self.server
            .wait_for(&format!("{devices} published devices on {node}"), WAIT, |s| {
                published_devices(&s.slices_on(node)) == devices
            })
            .await
            .expect("slices published");
    }
}

/// Device names across `slices`, sorted.
pub fn device_names(slices: &[Value]) -> Vec<String> {
    let mut names: Vec<String> = slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .filter_map(|d| d["name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

fn published_devices(slices: &[Value]) -> usize {
    device_names(slices).len()
}

/// Slice names, sorted.
pub fn slice_names(slices: &[Value]) -> Vec<String> {
    let mut names: Vec<String> =
        slices.iter().filter_map(|s| s["metadata"]["name"].as_str().map(str::to_owned)).collect();
    names.sort();
    names
}

/// A node's filesystem under one root.
#[derive(Debug, Clone)]
pub struct NodeFs {
    pub root: PathBuf,
}

impl NodeFs {
    fn create(root: &Path) -> NodeFs {
        let fs = NodeFs { root: root.to_path_buf() };
        // 0750, as on a node: edra warns about kubelet directories open to every user.
        let mut dirs = std::fs::DirBuilder::new();
        std::os::unix::fs::DirBuilderExt::mode(dirs.recursive(true), 0o750);
        for d in ["kubelet/plugins", "kubelet/plugins_registry", "cdi/static", "cdi/dynamic", "state", "driver", "sys"]
        {
            dirs.create(root.join(d)).expect("create node directory");
        }
        dirs.create(root.join("dev")).expect("create /dev");
        for node in ["nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1", "nvidia2", "nvidia3"] {
            std::fs::write(root.join("dev").join(node), b"").expect("create a device node stand-in");
        }
        let boot = root.join("proc/sys/kernel/random");
        std::fs::create_dir_all(&boot).expect("create /proc");
        std::fs::write(boot.join("boot_id"), "7d0c1b7e-54cd-4e0e-9b39-0c8f5f0a3a11\n").expect("write boot_id");
        crate::support::nvidia_smi::FakeNvidiaSmi::install(&fs.nvidia_smi_path());
        crate::support::mps::FakeMpsControl::install(&fs.root.join("driver/usr/bin/nvidia-cuda-mps-control"));
        fs
    }

    /// The node's stand-in `nvidia-cuda-mps-control` (where edra looks by default).
    pub fn mps_control(&self) -> crate::support::mps::FakeMpsControl {
        crate::support::mps::FakeMpsControl { path: self.root.join("driver/usr/bin/nvidia-cuda-mps-control") }
    }

    /// The directories of claim `uid`'s MPS daemon.
    pub fn mps_dir(&self, uid: &str) -> PathBuf {
        self.paths().runtime_dir.join("mps").join(uid)
    }

    /// Where edra finds `nvidia-smi` by default: under the driver root.
    pub fn nvidia_smi_path(&self) -> PathBuf {
        self.root.join("driver/usr/bin/nvidia-smi")
    }

    /// The node's stand-in `nvidia-smi`.
    pub fn nvidia_smi(&self) -> crate::support::nvidia_smi::FakeNvidiaSmi {
        crate::support::nvidia_smi::FakeNvidiaSmi { path: self.nvidia_smi_path() }
    }

    pub fn cdi_dir(&self) -> PathBuf {
        self.paths().cdi_dynamic_dir
    }

    pub fn state_dir(&self) -> PathBuf {
        self.paths().state_dir
    }

    pub fn dra_socket(&self) -> PathBuf {
        self.paths().dra_socket(DRIVER)
    }

    pub fn registration_socket(&self) -> PathBuf {
        self.paths().registration_socket(DRIVER)
    }

    /// edra's claim spec files in the dynamic CDI directory, sorted.
    pub fn spec_files(&self) -> Vec<PathBuf> {
        let prefix = format!("k8s.{DRIVER}-");
        let mut out: Vec<PathBuf> = std::fs::read_dir(self.cdi_dir())
            .expect("read the CDI directory")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(&prefix))
            .map(|e| e.path())
            .collect();
        out.sort();
        out
    }

    /// The spec file of claim `uid`.
    pub fn spec_file(&self, uid: &str) -> PathBuf {
        self.cdi_dir().join(format!("k8s.{DRIVER}-claim_{uid}.json"))
    }

    /// The layout below `root`, with static and dynamic CDI directories of its own.
    pub fn paths(&self) -> Paths {
        let cdi = self.root.join("cdi");
        Paths {
            cdi_spec_dirs: vec![cdi.join("static"), cdi.join("dynamic")],
            cdi_dynamic_dir: cdi.join("dynamic"),
            ..Paths::under(&self.root)
        }
    }

    fn toml(&self, node: &str, kubeconfig: &Path, mock: &str) -> String {
        format!(
            "node_name = \"{node}\"\nbackend = \"mock\"\n\
             [kubernetes]\nkubeconfig = {kc}\n\
             {paths}\
             [plugin]\nshutdown_grace = \"2s\"\n\
             [mps]\ncheck_interval = \"1s\"\n\
             [metrics]\naddress = \"\"\n\
             [mock]\n{mock}\n",
            kc = toml_path(kubeconfig),
            paths = paths_toml(&self.paths()),
        )
    }
}

/// Connects to the registration socket and registers the way the kubelet does.
pub async fn register(fs: &NodeFs) {
    let mut client = kubelet::registration(&fs.registration_socket()).await;
    let info = client.get_info(InfoRequest {}).await.expect("GetInfo").into_inner();
    assert_eq!(info.name, DRIVER);
    assert_eq!(Path::new(&info.endpoint), fs.dra_socket());
    client
        .notify_registration_status(RegistrationStatus { plugin_registered: true, error: String::new() })
        .await
        .expect("NotifyRegistrationStatus");
}

/// `edra::app::run` on a task.
pub struct Agent {
    pub fs: NodeFs,
    shutdown: watch::Sender<bool>,
    task: Option<JoinHandle<Result<(), AppError>>>,
}

impl Agent {
    /// Starts the agent with `config`, waits until it serves the kubelet and registers.
    pub async fn start(fs: NodeFs, config: Config) -> Agent {
        let (shutdown, rx) = watch::channel(false);
        let (ready, serving) = oneshot::channel();
        let task = tokio::spawn(edra::app::run_signalling(config, rx, Some(ready)));
        let mut agent = Agent { fs, shutdown, task: Some(task) };
        match tokio::time::timeout(WAIT, serving).await {
            Ok(Ok(serving)) => assert_eq!(serving.registration_socket, agent.fs.registration_socket()),
            Ok(Err(_)) => {
                let task = agent.task.take().expect("task present");
                panic!("the agent stopped before serving the kubelet: {:?}", task.await);
            }
            Err(_) => panic!("the agent did not serve the kubelet within {WAIT:?}"),
        }
        register(&agent.fs).await;
        agent
    }

    /// A DRAPlugin v1 client on the agent's DRA socket.
    pub async fn v1(&self) -> V1Client<Channel> {
        kubelet::dra_v1(&self.fs.dra_socket()).await
    }

    /// Whether the agent's task is still running.
    pub fn is_running(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Shuts down through the watch channel; asserts a clean stop and removed sockets.
    pub async fn stop(mut self) {
        self.shutdown.send_replace(true);
        let task = self.task.take().expect("agent running");
        let result = tokio::time::timeout(WAIT, task).await.expect("the agent stops within the grace period");
        match result {
            Ok(Ok(())) => {}
            other => panic!("the agent did not stop cleanly: {other:?}"),
        }
        assert!(!self.fs.dra_socket().exists(), "DRA socket left behind");
        assert!(!self.fs.registration_socket().exists(), "registration socket left behind");
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The real `edra run` binary as a child process (killed when dropped). Its stderr goes to
/// a log file in the cluster's directory (shared by the agents started there, appended),
/// printed when a test fails while the child is alive, so passing runs stay quiet.
pub struct ChildAgent {
    pub child: tokio::process::Child,
    pub fs: NodeFs,
    /// The child's stderr.
    pub log: PathBuf,
    /// The child's `NOTIFY_SOCKET`, as systemd's: `READY=1` says it serves.
    pub notify: tokio::net::UnixDatagram,
    /// What the child stored in systemd's fd store (`FDSTORE=1`) until it was ready.
    pub fd_store: FdStore,
}

impl ChildAgent {
    /// Spawns `edra --config <file> run` with `failpoints` in FAILPOINT_EDRA, waits until
    /// it serves the kubelet and registers. It is told where systemd's notification socket
    /// is (`NOTIFY_SOCKET`); `READY=1` comes there once both sockets are in place, after
    /// the sockets it stores in the fd store. Sockets a killed agent left behind stay: the new one must
    /// replace them.
    pub async fn start(cluster: &Cluster, failpoints: &str) -> ChildAgent {
        ChildAgent::start_with_env(cluster, failpoints, &[]).await
    }

    /// [`ChildAgent::start`] with `env` added to the child's environment, which is
    /// otherwise free of glibc allocator settings (`MALLOC_ARENA_MAX`, `GLIBC_TUNABLES`),
    /// so the agent sets up its allocator as on a node.
    pub async fn start_with_env(cluster: &Cluster, failpoints: &str, env: &[(&str, &str)]) -> ChildAgent {
        ChildAgent::start_configured(cluster, &cluster.config_file(NODE), failpoints, env).await
    }

    /// [`ChildAgent::start_with_env`] with the configuration file `config` (e.g. one from
    /// [`Cluster::config_file_with`]).
    pub async fn start_configured(
        cluster: &Cluster,
        config: &Path,
        failpoints: &str,
        env: &[(&str, &str)],
    ) -> ChildAgent {
        ChildAgent::start_wrapped(cluster, config, failpoints, env, &[]).await
    }

    /// [`ChildAgent::start_configured`] with `edra` run by `wrapper` (its program and
    /// arguments, then edra's command line), which must end by exec'ing it (e.g. `unshare`
    /// setting up a mount namespace of the agent's own), so the child is the agent.
    pub async fn start_wrapped(
        cluster: &Cluster,
        config: &Path,
        failpoints: &str,
        env: &[(&str, &str)],
        wrapper: &[std::ffi::OsString],
    ) -> ChildAgent {
        let child = ChildAgent::spawn(cluster, config, (failpoints, env), wrapper, None).await;
        register(&child.fs).await;
        child
    }

    /// Spawns `edra run` and waits for `READY=1` only: nothing registers it.
    pub async fn start_unregistered(cluster: &Cluster) -> ChildAgent {
        ChildAgent::spawn(cluster, &cluster.config_file(NODE), ("", &[]), &[], None).await
    }

    /// [`ChildAgent::start`] as systemd starts a unit again: the sockets in `store` (what an
    /// earlier child stored) handed to it as `LISTEN_FDS`.
    pub async fn start_from_store(cluster: &Cluster, store: &FdStore) -> ChildAgent {
        let wrapper = super::systemd::listen_pid_wrapper();
        let child = ChildAgent::spawn(cluster, &cluster.config_file(NODE), ("", &[]), &wrapper, Some(store)).await;
        register(&child.fs).await;
        child
    }

    async fn spawn(
        cluster: &Cluster,
        config: &Path,
        (failpoints, env): (&str, &[(&str, &str)]),
        wrapper: &[std::ffi::OsString],
        kept: Option<&FdStore>,
    ) -> ChildAgent {
        let fs = cluster.fs();
        let log = cluster.dir.path().join("edra-run.log");
        let stderr = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("open the agent's log");
        let notify_path = fs.root.join(format!("notify-{}", NOTIFY_SOCKETS.fetch_add(1, Ordering::Relaxed)));
        let _ = std::fs::remove_file(&notify_path);
        let notify = tokio::net::UnixDatagram::bind(&notify_path).expect("bind the notification socket");
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = tokio::process::Command::new(program);
                cmd.args(args).arg(env!("CARGO_BIN_EXE_edra"));
                cmd
            }
            None => tokio::process::Command::new(env!("CARGO_BIN_EXE_edra")),
        };
        cmd.arg("--config")
            .arg(config)
            .arg("run")
            .env_remove("KUBECONFIG")
            .env("EDRA_LOG_LEVEL", "warn")
            .env_remove("NO_COLOR")
            .env_remove("JOURNAL_STREAM")
            .env_remove("MALLOC_ARENA_MAX")
            .env_remove("GLIBC_TUNABLES")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .env("NOTIFY_SOCKET", &notify_path)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true);
        if failpoints.is_empty() {
            cmd.env_remove(edra::prepare::failpoint::ENV);
        } else {
            cmd.env(edra::prepare::failpoint::ENV, failpoints);
        }
        if let Some(store) = kept {
            let (fds, names) = store.to_pass();
            super::systemd::pass_fds(&mut cmd, fds, &names);
        }
        let mut child = cmd.spawn().expect("spawn edra run");
        let mut fd_store = FdStore::default();
        let ready = async {
            loop {
                let note = super::systemd::recv(&notify).await.expect("read the notification socket");
                if note.value("READY") == Some("1") {
                    return;
                }
                fd_store.apply(note);
            }
        };
        tokio::select! {
            () = ready => {}
            status = child.wait() => panic!(
                "edra run exited with {status:?} before serving the kubelet; its stderr:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ),
            () = tokio::time::sleep(WAIT) => panic!("edra run did not serve the kubelet within {WAIT:?}"),
        }
        ChildAgent { child, fs, log, notify, fd_store }
    }

    /// What the child (and earlier agents of the same cluster) wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A DRAPlugin v1 client on the child's DRA socket.
    pub async fn v1(&self) -> V1Client<Channel> {
        kubelet::dra_v1(&self.fs.dra_socket()).await
    }

    /// Waits for the child to exit on its own; returns its status. What it stored in the
    /// fd store is dropped (as by a unit without `FileDescriptorStoreMax=`), so the next
    /// child binds its sockets anew; take [`ChildAgent::fd_store`] first to pass it on.
    pub async fn wait_exit(&mut self) -> std::process::ExitStatus {
        let status = tokio::time::timeout(WAIT, self.child.wait()).await.expect("edra exits").expect("wait for edra");
        self.fd_store = FdStore::default();
        super::systemd::drain(&self.notify);
        status
    }

    /// SIGKILL, then reap.
    pub async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.wait_exit().await;
    }

    /// SIGTERM, then waits for a clean exit.
    pub async fn terminate(mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) with a pid of our own child and a valid signal number.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        }
        let status = self.wait_exit().await;
        assert!(status.success(), "edra run exited with {status} after SIGTERM");
    }
}

impl Drop for ChildAgent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("stderr of edra run ({}):\n{}", self.log.display(), self.stderr());
        }
    }
}

fn v1_claims(claims: &[ClaimRef]) -> Vec<v1::Claim> {
    claims
        .iter()
        .map(|c| v1::Claim { namespace: c.namespace.clone(), uid: c.uid.clone(), name: c.name.clone() })
        .collect()
}

/// NodePrepareResources (v1); per-claim answers by UID.
pub async fn prepare(
    client: &mut V1Client<Channel>,
    claims: &[ClaimRef],
) -> Result<BTreeMap<String, v1::NodePrepareResourceResponse>, tonic::Status> {
    let request = v1::NodePrepareResourcesRequest { claims: v1_claims(claims) };
    client.node_prepare_resources(request).await.map(|r| r.into_inner().claims.into_iter().collect())
}

/// NodeUnprepareResources (v1); per-claim errors by UID (empty = success).
pub async fn unprepare(
    client: &mut V1Client<Channel>,
    claims: &[ClaimRef],
) -> Result<BTreeMap<String, String>, tonic::Status> {
    let request = v1::NodeUnprepareResourcesRequest { claims: v1_claims(claims) };
    client
        .node_unprepare_resources(request)
        .await
        .map(|r| r.into_inner().claims.into_iter().map(|(uid, c)| (uid, c.error)).collect())
}

/// Prepares one claim and asserts it succeeded; returns its CDI device IDs.
pub async fn prepare_ok(client: &mut V1Client<Channel>, claim: &ClaimRef) -> Vec<String> {
    let answer = prepare(client, std::slice::from_ref(claim)).await.expect("NodePrepareResources");
    let one = answer.get(&claim.uid).expect("an answer for the claim");
    assert_eq!(one.error, "", "prepare of {} failed", claim.name);
    one.devices.iter().flat_map(|d| d.cdi_device_ids.clone()).collect()
}

/// Unprepares one claim and asserts it succeeded.
pub async fn unprepare_ok(client: &mut V1Client<Channel>, claim: &ClaimRef) {
    let answer = unprepare(client, std::slice::from_ref(claim)).await.expect("NodeUnprepareResources");
    assert_eq!(answer.get(&claim.uid).map(String::as_str), Some(""), "unprepare of {} failed", claim.name);
}

/// Waits (polling, at most [`WAIT`]) until `f` holds; fails the test naming `what` if it never does.
pub async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + WAIT;
    while !f() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
