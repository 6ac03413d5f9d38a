//! What the benchmarks share: a site (test API server, node kubeconfig, temp directories and
//! an edra configuration file), the agent run in-process or as the release binary, the
//! kubelet's side of registration, claims allocated as the scheduler would leave them, and
//! percentile tables.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use edra::config::{Config, LoadContext, Overrides, Paths};
use edra::plugin::proto::dra_v1 as v1;
use edra::plugin::proto::registration::RegistrationStatus;
use serde_json::Value;
use tokio::sync::watch;

use crate::support::apiserver::{
    AllocatedDevice, ClaimBuilder, Identity, Options, RequestRecord, TestApiServer, bound_pod,
};
use crate::support::kubelet::{RawH2, percent_encoded};
use crate::support::layout::{paths_toml, toml_path};

pub mod phases;

/// The node every benchmark runs as.
pub const NODE: &str = "n1";
/// The driver name (edra's default).
pub const DRIVER: &str = "gpu.edra.dev";
/// Namespace of the benchmark claims.
pub const NAMESPACE: &str = "bench";

/// A test API server with a node, a node kubeconfig and an edra configuration in a temp dir.
pub struct Site {
    /// The site's files and the state directory (`<dir>/state`), on disk.
    pub dir: tempfile::TempDir,
    /// The CDI spec directory (static and dynamic).
    pub cdi_dir: PathBuf,
    /// Where the CDI directory is, in words, for the tables.
    pub layout_note: String,
    _cdi_tmp: Option<tempfile::TempDir>,
    _run_tmp: Option<tempfile::TempDir>,
    pub server: TestApiServer,
    pub config_path: PathBuf,
    pub config: Config,
}

/// What the configuration file sets beyond the paths.
pub struct SiteSettings {
    pub gpus: u32,
    pub rediscovery: &'static str,
    pub log_level: &'static str,
    /// `kubernetes.qps` and `kubernetes.burst`; `None` keeps edra's defaults (100/s, 200).
    pub rate_limit: Option<(u32, u32)>,
    pub layout: Layout,
    /// Health events from `<dir>/gpu-events` (see [`Site::inject`]), probed every 100 ms,
    /// recovering after a quiet second.
    pub health_events: bool,
    /// The mock GPUs in MIG mode, every one selected for dynamic MIG.
    pub mig_mode: bool,
    /// `claims.prefetch` (edra's default: on).
    pub prefetch: bool,
    /// The device backend: `mock` (the default), or `nvml` for this machine's own GPUs
    /// (driver root `/`, the host's `/dev` and `/sys`).
    pub backend: &'static str,
    /// `claims.check_interval` (edra's default: 5 minutes).
    pub check_interval: Option<&'static str>,
}

/// Where the state and CDI directories live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// As on a node: the state on disk (a temp dir under `target/`), the CDI dynamic
    /// directory on tmpfs (`/dev/shm`, standing in for `/var/run/cdi`).
    Production,
    /// Both on disk, in the site's temp dir under `target/`.
    SameDisk,
}

/// The temp dir root on disk: `target/bench-tmp` (`$TMPDIR` may be tmpfs).
pub fn disk_tmp_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-tmp");
    std::fs::create_dir_all(&root).expect("create target/bench-tmp");
    root
}

impl Default for SiteSettings {
    fn default() -> Self {
        Self {
            gpus: 8,
            rediscovery: "60s",
            log_level: "warn",
            rate_limit: None,
            layout: Layout::Production,
            health_events: false,
            mig_mode: false,
            prefetch: true,
            backend: "mock",
            check_interval: None,
        }
    }
}

impl Site {
    /// Appends `line` to the mock backend's events file (`health_events` sites).
    pub fn inject(&self, line: &str) {
        use std::io::Write;
        let path = self.dir.path().join("gpu-events");
        let mut f = std::fs::OpenOptions::new().append(true).open(path).expect("open the events file");
        writeln!(f, "{line}").expect("append an event");
    }

    /// Starts the server (node authorizer on, as on a real cluster with node credentials)
    /// and writes the configuration.
    pub async fn new(opts: Options, settings: SiteSettings) -> Site {
        let dir = tempfile::tempdir_in(disk_tmp_root()).expect("temp dir");
        let shm = Path::new("/dev/shm");
        let (cdi_tmp, layout_note) = match settings.layout {
            Layout::Production if shm.is_dir() => match tempfile::tempdir_in(shm) {
                Ok(t) => (Some(t), "state on disk (target/bench-tmp), CDI dir on tmpfs (/dev/shm)".to_string()),
                Err(e) => (None, format!("state and CDI dir on disk: /dev/shm unusable ({e})")),
            },
            Layout::Production => (None, "state and CDI dir on disk: no /dev/shm on this machine".to_string()),
            Layout::SameDisk => (None, "state and CDI dir on the same disk (target/bench-tmp)".to_string()),
        };
        let cdi_dir = cdi_tmp.as_ref().map_or_else(|| dir.path().join("cdi"), |t| t.path().to_path_buf());
        let server = TestApiServer::start(Options { node_authorizer: true, ..opts }).await.expect("start the server");
        server.add_node(NODE);
        let kubeconfig = server.write_kubeconfig(dir.path(), &Identity::node(NODE)).expect("write the kubeconfig");
        let d = dir.path();
        for sub in ["kubelet", "cdi", "state", "driver", "dev", "sys"] {
            std::fs::create_dir_all(d.join(sub)).expect("create a site directory");
        }
        // The host's /proc, as on a node (boot ID, driver parameters).
        let mut paths = Paths {
            cdi_spec_dirs: vec![cdi_dir.clone()],
            cdi_dynamic_dir: cdi_dir.clone(),
            proc_root: "/proc".into(),
            ..Paths::under(d)
        };
        // MIG mode: the mock's instances in the runtime directory, on tmpfs as /run is on
        // a node, when the CDI directory is.
        let run_tmp = match (settings.mig_mode, &cdi_tmp) {
            (true, Some(_)) => tempfile::tempdir_in(shm).ok(),
            _ => None,
        };
        if let Some(run) = &run_tmp {
            paths.runtime_dir = run.path().to_path_buf();
        }
        if settings.backend == "nvml" {
            (paths.driver_root, paths.dev_root, paths.sys_root) = ("/".into(), "/dev".into(), "/sys".into());
        }
        let toml = format!(
            r#"node_name = "{NODE}"
backend = "{backend}"

[log]
level = "{log}"

[kubernetes]
kubeconfig = {kubeconfig}
{rate_limit}

{paths}
[publish]
rediscovery_interval = "{rediscovery}"

[claims]
prefetch = {prefetch}
{check_interval}

[mock]
gpus = {gpus}
{mig_mode}
{health}
{mig}
"#,
            log = settings.log_level,
            backend = settings.backend,
            kubeconfig = toml_path(&kubeconfig),
            paths = paths_toml(&paths),
            rediscovery = settings.rediscovery,
            gpus = settings.gpus,
            mig_mode = if settings.mig_mode { "mig_mode = true" } else { "" },
            mig = if settings.mig_mode { "[mig]\ndynamic = [\"*\"]" } else { "" },
            prefetch = settings.prefetch,
            check_interval = settings.check_interval.map_or(String::new(), |i| format!("check_interval = \"{i}\"")),
            rate_limit = settings.rate_limit.map_or(String::new(), |(q, b)| format!("qps = {q}\nburst = {b}")),
            health = if settings.health_events {
                let events = d.join("gpu-events");
                std::fs::write(&events, "").expect("create the events file");
                format!(
                    "events_file = {}\n[health]\nprobe_interval = \"100ms\"\nquiet_period = \"1s\"\n",
                    toml_path(&events)
                )
            } else {
                String::new()
            },
        );
        let config_path = d.join("edra.toml");
        std::fs::write(&config_path, toml).expect("write edra.toml");
        let ctx = LoadContext {
            explicit_file: Some(config_path.clone()),
            default_file: d.join("absent.toml"),
            env: Vec::new(),
            overrides: Overrides::default(),
            hostname: None,
        };
        let config = match Config::load(&ctx) {
            Ok(c) => c,
            Err(problems) => panic!("bench configuration rejected: {problems:?}"),
        };
        let layout_note = match &run_tmp {
            Some(_) => format!("{layout_note}, runtime dir (the mock's MIG instances) on tmpfs"),
            None => layout_note,
        };
        Site { dir, cdi_dir, layout_note, _cdi_tmp: cdi_tmp, _run_tmp: run_tmp, server, config_path, config }
    }

    pub fn dra_socket(&self) -> PathBuf {
        self.config.paths.dra_socket(DRIVER)
    }

    pub fn registration_socket(&self) -> PathBuf {
        self.config.paths.registration_socket(DRIVER)
    }

    /// Devices in this node's published slices.
    pub fn published_devices(&self) -> usize {
        self.server.with_state(published_devices)
    }

    /// Waits (on the server's change signal) until `devices` devices are published.
    pub async fn wait_published(&self, devices: usize, timeout: Duration) {
        self.server
            .wait_for("slices published", timeout, |s| published_devices(s) == devices)
            .await
            .expect("slices published in time");
    }

    /// An allocated claim for `device` (node-local, reserved for a pod on this node).
    pub fn claim(&self, name: &str, devices: &[String]) -> v1::Claim {
        self.claim_with(name, devices, None)
    }

    /// [`Site::claim`] with an opaque `GpuConfig` body (`parameters`) for all its requests.
    pub fn claim_with(&self, name: &str, devices: &[String], parameters: Option<Value>) -> v1::Claim {
        let mut b = ClaimBuilder::new(NAMESPACE, name).on_node(NODE).reserved_for_pod(name, &pod_uid(name));
        for (i, dev) in devices.iter().enumerate() {
            b = b.allocated(AllocatedDevice::new(&format!("gpu{i}"), DRIVER, NODE, dev));
        }
        if let Some(p) = parameters {
            b = b.opaque_config("FromClaim", &[], DRIVER, p);
        }
        self.store_claim(name, b)
    }

    /// A claim allocated one share of `device` (share ID from the name, `memory` consumed),
    /// as the scheduler allocates a multi-allocatable device.
    pub fn claim_share(&self, name: &str, device: &str, memory: &str) -> v1::Claim {
        let b = ClaimBuilder::new(NAMESPACE, name).on_node(NODE).reserved_for_pod(name, &pod_uid(name)).allocated(
            AllocatedDevice::new("gpu0", DRIVER, NODE, device).share(&pod_uid(&format!("share-{name}")), memory),
        );
        self.store_claim(name, b)
    }

    /// Binds pod `name` to this node (as the scheduler does), using claim `claim` through a
    /// template; the pod reserved in [`Site::claim`]'s claims has the claim's name.
    pub fn bind_pod(&self, name: &str, claim: &str) {
        self.server.put_pod(bound_pod(NAMESPACE, name, NODE, &[("gpu", claim)]));
    }

    /// The pod ended and was deleted.
    pub fn delete_pod(&self, name: &str) {
        self.server.delete_pod(NAMESPACE, name);
    }

    /// Stores the claim `b` builds as one of this node's and returns the kubelet's reference.
    /// [`Site::claim`] for `device`, its JSON grown to about `bytes` by an annotation.
    pub fn large_claim(&self, name: &str, device: &str, bytes: usize) -> v1::Claim {
        let b = ClaimBuilder::new(NAMESPACE, name)
            .on_node(NODE)
            .reserved_for_pod(name, &pod_uid(name))
            .allocated(AllocatedDevice::new("gpu0", DRIVER, NODE, device));
        let mut claim = b.build();
        let filler = bytes.saturating_sub(claim.to_string().len() + 64);
        claim["metadata"]["annotations"] = serde_json::json!({"bench.edra.dev/filler": "x".repeat(filler)});
        let stored = self.server.put_claim(claim);
        self.server.mark_claim_on_node(NAMESPACE, name, NODE);
        let uid = stored["metadata"]["uid"].as_str().expect("stored claim has a uid").to_string();
        v1::Claim { namespace: NAMESPACE.into(), uid, name: name.into() }
    }

    fn store_claim(&self, name: &str, b: ClaimBuilder) -> v1::Claim {
        let stored = self.server.put_claim(b.build());
        self.server.mark_claim_on_node(NAMESPACE, name, NODE);
        let uid = stored["metadata"]["uid"].as_str().expect("stored claim has a uid").to_string();
        v1::Claim { namespace: NAMESPACE.into(), uid, name: name.into() }
    }
}

fn pod_uid(name: &str) -> String {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let hex = format!("{h:016x}{h:016x}");
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

fn published_devices(s: &crate::support::apiserver::State) -> usize {
    s.slices_on(NODE).iter().map(|sl| sl["spec"]["devices"].as_array().map_or(0, Vec::len)).sum()
}

/// The agent (`edra::app::run`) on its own two-thread runtime, as `edra run` starts it.
pub struct InProcessAgent {
    shutdown: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl InProcessAgent {
    /// Starts the agent and returns once it serves the kubelet.
    pub async fn start(config: Config) -> InProcessAgent {
        let (tx, rx) = watch::channel(false);
        let (ready, serving) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("agent runtime");
            if let Err(e) = rt.block_on(edra::app::run_signalling(config, rx, Some(ready))) {
                eprintln!("agent stopped with an error: {}", edra::util::error_chain(&e));
            }
        });
        if serving.await.is_err() {
            panic!("the agent stopped before serving the kubelet");
        }
        InProcessAgent { shutdown: tx, thread: Some(thread) }
    }

    pub fn stop(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The release binary: `$BENCH_BINARY`, else `target/release/edra`. `cargo bench` itself
/// rebuilds `target/release/edra` with the bench profile, so copy the release build aside
/// and point `BENCH_BINARY` at the copy (see docs/benchmarks.md).
pub fn release_binary() -> PathBuf {
    match std::env::var_os("BENCH_BINARY") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/edra"),
    }
}

/// Whether an ELF file still has its symbol table (the release profile strips it; the
/// bench profile does not).
pub fn has_symbol_table(path: &Path) -> bool {
    std::fs::read(path).is_ok_and(|bytes| bytes.windows(8).any(|w| w == b".symtab\0"))
}

/// `edra --config <file> run` as a child, its stderr in `<site>/edra.log`.
pub fn spawn_release(site: &Site) -> Child {
    let bin = release_binary();
    let log = std::fs::File::create(site.dir.path().join("edra.log")).expect("create edra.log");
    Command::new(&bin)
        .arg("--config")
        .arg(&site.config_path)
        .arg("run")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}; build it with `cargo build --release`", bin.display()))
}

/// Registers as the kubelet does (GetInfo, then NotifyRegistrationStatus).
pub async fn register(socket: &Path) {
    let mut h2 = RawH2::connect(socket).await.expect("connect to the registration socket");
    let authority = percent_encoded(socket);
    h2.get_info(&authority).await.expect("GetInfo");
    h2.notify(&authority, RegistrationStatus { plugin_registered: true, error: String::new() }).await.expect("Notify");
}

/// Latency samples and their percentiles.
#[derive(Default)]
pub struct Samples(pub Vec<Duration>);

impl Samples {
    pub fn push(&mut self, d: Duration) {
        self.0.push(d);
    }

    pub fn percentile(&self, p: f64) -> Duration {
        let mut v = self.0.clone();
        v.sort();
        if v.is_empty() {
            return Duration::ZERO;
        }
        let idx = ((p / 100.0) * (v.len() as f64)).ceil() as usize;
        v[idx.clamp(1, v.len()) - 1]
    }

    pub fn mean(&self) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        self.0.iter().sum::<Duration>() / self.0.len() as u32
    }

    /// `| what | n | p50 | p99 | max | mean |` in milliseconds.
    pub fn row(&self, what: &str) -> String {
        format!(
            "| {what:<44} | {:>6} | {:>8.3} | {:>8.3} | {:>8.3} | {:>8.3} |",
            self.0.len(),
            ms(self.percentile(50.0)),
            ms(self.percentile(99.0)),
            ms(self.percentile(100.0)),
            ms(self.mean())
        )
    }
}

pub fn latency_header() -> String {
    format!(
        "| {:<44} | {:>6} | {:>8} | {:>8} | {:>8} | {:>8} |\n|{}|{}|{}|{}|{}|{}|",
        "operation (ms)",
        "n",
        "p50",
        "p99",
        "max",
        "mean",
        "-".repeat(46),
        "-".repeat(8),
        "-".repeat(10),
        "-".repeat(10),
        "-".repeat(10),
        "-".repeat(10)
    )
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Requests, body bytes sent and received, per verb, for log entries from `mark` on.
pub fn by_verb(log: &[RequestRecord], mark: usize) -> BTreeMap<&'static str, (usize, usize, usize)> {
    let mut out: BTreeMap<&'static str, (usize, usize, usize)> = BTreeMap::new();
    for r in log.iter().skip(mark) {
        let e = out.entry(if r.verb.is_empty() { "other" } else { r.verb }).or_default();
        e.0 += 1;
        e.1 += r.request_bytes;
        e.2 += r.response_bytes;
    }
    out
}

/// A table of [`by_verb`].
pub fn verb_table(log: &[RequestRecord], mark: usize) -> String {
    let mut s = String::from("| verb | requests | request body bytes | response body bytes |\n|---|---:|---:|---:|\n");
    let mut total = (0, 0, 0);
    for (verb, (n, sent, recv)) in by_verb(log, mark) {
        s.push_str(&format!("| {verb} | {n} | {sent} | {recv} |\n"));
        total = (total.0 + n, total.1 + sent, total.2 + recv);
    }
    s.push_str(&format!("| total | {} | {} | {} |", total.0, total.1, total.2));
    s
}

/// The stored claim's JSON, for debugging a failed call.
pub fn claim_json(site: &Site, name: &str) -> Option<Value> {
    site.server.with_state(|s| s.claim(NAMESPACE, name))
}
