//! edra's configuration: every setting, its default, and validation of the whole.
//!
//! [`Config::load`] reads the TOML file (default `/etc/edra/config.toml`, optional when
//! absent at that default path), the `EDRA_*` environment and command-line overrides,
//! checks every key, and returns either a complete [`Config`] or every [`Problem`] found.
//! Nothing here touches the network, binds a socket or creates a file. Every filesystem
//! path edra uses is a key here, so tests run unprivileged against temp dirs.
//! The documented example is `config/edra.toml`; docs/configuration.md lists every key.

pub mod bounds;
mod mock;
pub mod settings;
mod sharing;
pub mod source;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use mock::{MockMig, MockSettings, validate_mig_profile};
pub use source::{Origin, Problem, Raw, Reader, env_name};
use source::{abs_path, abs_path_list, boolean, string};

/// The configuration file read when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/edra/config.toml";
/// The default DRA driver name.
pub const DEFAULT_DRIVER_NAME: &str = "gpu.edra.dev";

/// Which device backend discovers GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// NVML when the library loads, otherwise a clear error (never a silent mock).
    Auto,
    /// NVIDIA's management library.
    Nvml,
    /// GPUs described in the `[mock]` section; no hardware needed.
    Mock,
}

impl BackendKind {
    fn parse(raw: &Raw) -> Result<Self, String> {
        match string(raw)?.as_str() {
            "auto" => Ok(Self::Auto),
            "nvml" => Ok(Self::Nvml),
            "mock" => Ok(Self::Mock),
            other => Err(format!("expected auto, nvml or mock, found {other:?}")),
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Kubernetes API access.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeSettings {
    /// Explicit kubeconfig; when unset, credentials are searched (see `kube::credentials`).
    pub kubeconfig: Option<PathBuf>,
    /// Context to use from the kubeconfig (default: its current-context).
    pub context: Option<String>,
    /// Client-side rate limit: sustained requests per second.
    pub qps: f64,
    /// Client-side rate limit: burst size.
    pub burst: u32,
    /// Timeout for one request (not for watches).
    pub request_timeout: Duration,
    /// Skip TLS verification of the API server. Dangerous; only when explicitly set.
    pub insecure_skip_tls_verify: bool,
    /// The k3s kubelet's kubeconfig, tried when nothing else is configured.
    pub k3s_kubelet_kubeconfig: PathBuf,
    /// The k3s server's admin kubeconfig, tried last.
    pub k3s_server_kubeconfig: PathBuf,
    /// Where an in-cluster service account's token, CA and namespace are mounted.
    pub service_account_dir: PathBuf,
}

/// Filesystem locations.
#[derive(Debug, Clone, PartialEq)]
pub struct Paths {
    /// The kubelet's root directory.
    pub kubelet_root: PathBuf,
    /// Where kubelet plugins keep their sockets (`<root>/plugins`).
    pub plugins_dir: PathBuf,
    /// The directory the kubelet watches for registration sockets.
    pub registry_dir: PathBuf,
    /// CDI spec directories the container runtime reads, lowest priority first.
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// Where edra writes its per-claim (transient) CDI specs; one of `cdi_spec_dirs`.
    pub cdi_dynamic_dir: PathBuf,
    /// The `edra` binary the CDI specs' hooks run, as a path on the host (the runtime runs
    /// hooks in the host's mount namespace). Default: the running binary.
    pub cdi_hook_binary: Option<PathBuf>,
    /// edra's own state (the sled database).
    pub state_dir: PathBuf,
    /// Root under which the NVIDIA driver's files are found (`/` on most hosts).
    pub driver_root: PathBuf,
    /// Where `driver_root` is on the host, when edra runs in a container that mounts it
    /// elsewhere; CDI specs name host paths. Default: `driver_root` itself.
    pub host_driver_root: Option<PathBuf>,
    /// The `nvidia-smi` edra runs to set time-slice intervals. Default:
    /// `<driver_root>/usr/bin/nvidia-smi`.
    pub nvidia_smi: Option<PathBuf>,
    /// The `nvidia-cuda-mps-control` edra runs for MPS claims. Default:
    /// `<driver_root>/usr/bin/nvidia-cuda-mps-control`.
    pub mps_control: Option<PathBuf>,
    /// edra's runtime directory (MPS daemons' pipe, log and shm directories); on the
    /// host's tmpfs, since what is there does not outlive a reboot.
    pub runtime_dir: PathBuf,
    /// The device filesystem.
    pub dev_root: PathBuf,
    /// procfs.
    pub proc_root: PathBuf,
    /// sysfs.
    pub sys_root: PathBuf,
}

impl Paths {
    /// Every path below `dir`, laid out as on a node (`dir/kubelet/plugins`,
    /// `dir/kubelet/plugins_registry`, `dir/cdi`, `dir/state`, `dir/driver`, `dir/dev`,
    /// `dir/proc`, `dir/sys`): a sandbox for trial runs, tests and benchmarks.
    pub fn under(dir: &Path) -> Paths {
        let kubelet = dir.join("kubelet");
        Paths {
            plugins_dir: kubelet.join("plugins"),
            registry_dir: kubelet.join("plugins_registry"),
            kubelet_root: kubelet,
            cdi_spec_dirs: vec![dir.join("cdi")],
            cdi_dynamic_dir: dir.join("cdi"),
            cdi_hook_binary: None,
            state_dir: dir.join("state"),
            driver_root: dir.join("driver"),
            host_driver_root: None,
            nvidia_smi: None,
            mps_control: None,
            runtime_dir: dir.join("run"),
            dev_root: dir.join("dev"),
            proc_root: dir.join("proc"),
            sys_root: dir.join("sys"),
        }
    }

    /// The directory holding edra's DRA socket: `<plugins dir>/<driver>`.
    pub fn plugin_dir(&self, driver: &str) -> PathBuf {
        self.plugins_dir.join(driver)
    }
    /// The DRA service socket: `<plugins dir>/<driver>/dra.sock`.
    pub fn dra_socket(&self, driver: &str) -> PathBuf {
        self.plugin_dir(driver).join("dra.sock")
    }
    /// The registration socket: `<registry dir>/<driver>-reg.sock`.
    pub fn registration_socket(&self, driver: &str) -> PathBuf {
        self.registry_dir.join(format!("{driver}-reg.sock"))
    }
}

/// The metrics and health endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsSettings {
    /// Where `/metrics`, `/healthz` and `/readyz` are served; `None` when disabled.
    pub address: Option<std::net::SocketAddr>,
}

/// The default metrics address: loopback only.
pub const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:9464";

fn metrics_address(raw: &Raw) -> Result<Option<std::net::SocketAddr>, String> {
    let s = string(raw)?;
    if s.is_empty() {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|_| {
        format!("{s:?} is not an IP address and port such as \"127.0.0.1:9464\" or \"[::1]:9464\"; use \"\" to disable")
    })
}

/// Container runtime configuration files, read by `edra doctor` to tell whether CDI is on.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeConfigPaths {
    /// The containerd configuration k3s generates at every start.
    pub k3s_containerd_config: PathBuf,
    /// The host's containerd configuration.
    pub containerd_config: PathBuf,
    /// CRI-O's main configuration file.
    pub crio_config: PathBuf,
    /// CRI-O's drop-in directory (`*.conf`, applied in name order after the main file).
    pub crio_config_dir: PathBuf,
}

/// NVML settings.
#[derive(Debug, Clone, PartialEq)]
pub struct NvmlSettings {
    /// The NVML library: a bare file name is searched by the dynamic loader (under the
    /// driver root's library folders when a driver root other than `/` is set); a path is
    /// used as it is, relative to the driver root.
    pub library: PathBuf,
}

/// The complete, validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file the configuration was read from, if any.
    pub file: Option<PathBuf>,
    /// This node's name (config, then `NODE_NAME`, then the host name).
    pub node_name: String,
    /// The DRA driver name.
    pub driver_name: String,
    /// Which backend discovers devices.
    pub backend: BackendKind,
    /// Log format.
    pub log_format: LogFormat,
    /// Log filter: a level, or `target=level` entries separated by commas (e.g. `info` or
    /// `edra::publish=debug,info`).
    pub log_level: String,
    /// API access.
    pub kube: KubeSettings,
    /// Filesystem locations.
    pub paths: Paths,
    /// NVML.
    pub nvml: NvmlSettings,
    /// Container runtime configuration files (read by `edra doctor` only).
    pub runtime: RuntimeConfigPaths,
    /// How often devices are rediscovered and slices re-published if they changed.
    pub rediscovery_interval: Duration,
    /// How long in-flight gRPC calls may finish after SIGTERM.
    pub shutdown_grace: Duration,
    /// The metrics and health endpoint.
    pub metrics: MetricsSettings,
    /// The mock backend's devices.
    pub mock: MockSettings,
    /// How MPS control daemons are started, checked and stopped.
    pub mps: MpsTimings,
    /// How full GPUs are offered: whole, as shares, or as replicas.
    pub sharing: settings::SharingSettings,
    /// Which GPUs get dynamic MIG (MIG devices created per claim).
    pub mig: settings::MigSettings,
    /// How GPU health is judged.
    pub health: HealthConfig,
    /// How prepared claims that are gone from the API server are found and released.
    pub claims: settings::StaleSettings,
    /// `claims.prefetch`: watch this node's pods and read their claims before the kubelet
    /// asks (prepare::prefetch).
    pub prefetch_claims: bool,
    /// `claims.prepare_early`: prepare a claim read early at once when it changes nothing
    /// on a GPU (prepare::stage); needs `claims.prefetch`.
    pub prepare_early: bool,
}

/// `[health]`: how GPU health events are judged and how often GPUs are probed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthConfig {
    /// XIDs that are application errors: counted in metrics, never a taint.
    pub ignored_xids: std::collections::BTreeSet<u64>,
    /// How often every GPU is probed (and recovery checked).
    pub probe_interval: Duration,
    /// How long a GPU must answer without a critical event before its taint is removed.
    pub quiet_period: Duration,
}

/// `health.ignored_xids`: a list of XID numbers (a TOML array, or comma-separated text).
fn xid_list(raw: &Raw) -> Result<std::collections::BTreeSet<u64>, String> {
    let items: Vec<String> = match raw {
        Raw::Toml(toml::Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                toml::Value::Integer(i) => Ok(i.to_string()),
                other => Err(format!("expected a list of XID numbers, found an element of type {}", other.type_str())),
            })
            .collect::<Result<_, _>>()?,
        Raw::Text(_) => source::string_list(raw)?,
        Raw::Toml(other) => {
            return Err(format!("expected a list of XID numbers such as [13, 31], found {}", other.type_str()));
        }
    };
    let (min, max) = bounds::XID;
    items
        .iter()
        .map(|s| match s.trim().parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(format!("{s:?} is not an XID number from {min} to {max}")),
        })
        .collect()
}

/// `[mps]`: how MPS control daemons are started, checked and stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MpsTimings {
    /// How long a new daemon may take to answer `get_server_list` before the prepare fails.
    pub ready_timeout: Duration,
    /// How long a daemon may take to `quit` before it is killed.
    pub quit_grace: Duration,
    /// How often edra checks that prepared claims' daemons run (and restarts dead ones).
    pub check_interval: Duration,
}

/// Command-line values that override configuration keys.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `(key, value, how the user wrote it)`.
    pub values: Vec<(String, String, String)>,
}

impl Overrides {
    /// Adds `key = value` given by `flag`.
    pub fn push(&mut self, key: &str, value: impl Into<String>, flag: impl Into<String>) {
        self.values.push((key.to_string(), value.into(), flag.into()));
    }
}

/// What `Config::load` needs from the outside world, so tests can pass their own.
#[derive(Debug, Clone)]
pub struct LoadContext {
    /// `--config`, if given.
    pub explicit_file: Option<PathBuf>,
    /// The file read when `--config` is not given and it exists.
    pub default_file: PathBuf,
    /// The process environment.
    pub env: Vec<(String, String)>,
    /// Command-line overrides.
    pub overrides: Overrides,
    /// The host name, used when neither config nor `NODE_NAME` names the node.
    pub hostname: Option<String>,
}

impl LoadContext {
    /// The real process environment and host name.
    pub fn from_process(explicit_file: Option<PathBuf>, overrides: Overrides) -> Self {
        Self {
            explicit_file,
            default_file: PathBuf::from(DEFAULT_CONFIG_PATH),
            env: std::env::vars().collect(),
            overrides,
            hostname: hostname(),
        }
    }
}

/// The host name from the kernel, lower-cased, or `None`.
pub fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for buf.len() bytes; gethostname writes at most that many.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = std::str::from_utf8(&buf[..end]).ok()?.trim().to_ascii_lowercase();
    (!name.is_empty()).then_some(name)
}

impl Config {
    /// Reads and validates everything; returns every problem at once on failure.
    pub fn load(ctx: &LoadContext) -> Result<Config, Vec<Problem>> {
        let mut reader = Reader::new();
        let mut early = Vec::new();
        let file = match &ctx.explicit_file {
            Some(p) => Some(p.clone()),
            None if ctx.default_file.exists() => Some(ctx.default_file.clone()),
            None => None,
        };
        if let Some(path) = &file {
            match std::fs::read_to_string(path) {
                Ok(text) => match toml::from_str::<toml::Table>(&text) {
                    Ok(table) => reader = reader.with_toml(path, table).with_key_lines(&source::key_lines(&text)),
                    Err(e) => early.push(Problem {
                        key: String::new(),
                        origin: Some(Origin::File(path.clone())),
                        message: format!("not valid TOML: {}", e.to_string().trim_end()),
                    }),
                },
                Err(e) => early.push(Problem {
                    key: String::new(),
                    origin: Some(Origin::File(path.clone())),
                    message: if e.kind() == std::io::ErrorKind::NotFound {
                        "configuration file not found; check the --config path".to_string()
                    } else {
                        format!("cannot read the configuration file: {e}")
                    },
                }),
            }
        }
        reader = reader.with_env(ctx.env.iter().cloned());
        for (key, value, flag) in &ctx.overrides.values {
            reader = reader.with_flag(key, value.clone(), flag);
        }
        let node_env = ctx.env.iter().find(|(k, _)| k == "NODE_NAME").map(|(_, v)| v.clone());
        let cfg = Self::read(&mut reader, file, node_env, ctx.hostname.clone());
        let mut problems = early;
        problems.extend(reader.finish());
        if problems.is_empty() { Ok(cfg) } else { Err(problems) }
    }

    fn read(r: &mut Reader, file: Option<PathBuf>, node_env: Option<String>, host: Option<String>) -> Config {
        let node_name = match r.opt("node_name", string) {
            Some(n) => n,
            None => node_env.filter(|n| !n.is_empty()).or(host).unwrap_or_default(),
        };
        if node_name.is_empty() {
            r.problem("node_name", None, "no node name: set node_name, NODE_NAME or a host name");
        } else if let Err(e) = validate_dns_subdomain(&node_name) {
            let origin = r.origin_of("node_name");
            r.problem("node_name", origin, format!("{node_name:?} is not a valid node name: {e}"));
        }
        let driver_name = r.get("driver_name", DEFAULT_DRIVER_NAME.to_string(), |raw| {
            let s = string(raw)?;
            validate_driver_name(&s).map(|_| s)
        });
        let backend = r.get("backend", BackendKind::Auto, BackendKind::parse);
        let log_format = r.get("log.format", LogFormat::Text, |raw| match string(raw)?.as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("expected text or json, found {other:?}")),
        });
        let log_level = r.get("log.level", "info".to_string(), |raw| {
            let s = string(raw)?;
            if s.trim().is_empty() {
                return Err("expected a level (error, warn, info, debug, trace) or a list of target=level".into());
            }
            s.parse::<tracing_subscriber::filter::Targets>().map(|_| s.clone()).map_err(|e| {
                format!("not a valid log filter {s:?}: {e} (expected e.g. info or edra::publish=debug,info)")
            })
        });

        let kube = read_kube(r);

        let paths = read_paths(r);
        let nvml = NvmlSettings {
            library: r.get("nvml.library", "libnvidia-ml.so.1".into(), |raw| {
                let s = string(raw)?;
                if s.is_empty() { Err("expected a library name or path".into()) } else { Ok(PathBuf::from(s)) }
            }),
        };
        let runtime = RuntimeConfigPaths {
            k3s_containerd_config: r.get(
                "runtime.k3s_containerd_config",
                "/var/lib/rancher/k3s/agent/etc/containerd/config.toml".into(),
                abs_path,
            ),
            containerd_config: r.get("runtime.containerd_config", "/etc/containerd/config.toml".into(), abs_path),
            crio_config: r.get("runtime.crio_config", "/etc/crio/crio.conf".into(), abs_path),
            crio_config_dir: r.get("runtime.crio_config_dir", "/etc/crio/crio.conf.d".into(), abs_path),
        };
        let rediscovery_interval = r.get(
            "publish.rediscovery_interval",
            Duration::from_secs(60),
            bounds::duration_in(bounds::REDISCOVERY_INTERVAL),
        );
        let shutdown_grace =
            r.get("plugin.shutdown_grace", Duration::from_secs(10), bounds::duration_in(bounds::SHUTDOWN_GRACE));
        let metrics = MetricsSettings {
            address: r.get("metrics.address", DEFAULT_METRICS_ADDRESS.parse().ok(), metrics_address),
        };
        let mock = mock::read_mock(r);
        let mps = MpsTimings {
            ready_timeout: r.get(
                "mps.ready_timeout",
                Duration::from_secs(10),
                bounds::duration_in(bounds::MPS_READY_TIMEOUT),
            ),
            quit_grace: r.get("mps.quit_grace", Duration::from_secs(5), bounds::duration_in(bounds::MPS_QUIT_GRACE)),
            check_interval: r.get(
                "mps.check_interval",
                Duration::from_secs(5),
                bounds::duration_in(bounds::MPS_CHECK_INTERVAL),
            ),
        };
        let sharing = sharing::read_sharing(r);
        let mig = settings::MigSettings {
            dynamic: r.get("mig.dynamic", settings::MigSettings::default().dynamic, sharing::selection),
        };
        let health = HealthConfig {
            ignored_xids: r.get("health.ignored_xids", settings::DEFAULT_IGNORED_XIDS.into_iter().collect(), xid_list),
            probe_interval: r.get(
                "health.probe_interval",
                Duration::from_secs(10),
                bounds::duration_in(bounds::HEALTH_PROBE_INTERVAL),
            ),
            quiet_period: r.get(
                "health.quiet_period",
                Duration::from_secs(300),
                bounds::duration_in(bounds::HEALTH_QUIET_PERIOD),
            ),
        };
        let stale = settings::StaleSettings::default();
        let claims = settings::StaleSettings {
            check_interval: r.get(
                "claims.check_interval",
                stale.check_interval,
                bounds::duration_in(bounds::CLAIMS_CHECK_INTERVAL),
            ),
            release_after: r.get(
                "claims.release_after",
                stale.release_after,
                bounds::duration_in(bounds::CLAIMS_RELEASE_AFTER),
            ),
        };
        let prefetch_claims = r.get("claims.prefetch", true, boolean);
        let prepare_early = r.get("claims.prepare_early", true, boolean);
        Config {
            file,
            node_name,
            driver_name,
            backend,
            log_format,
            log_level,
            kube,
            paths,
            nvml,
            runtime,
            rediscovery_interval,
            shutdown_grace,
            metrics,
            mock,
            mps,
            sharing,
            mig,
            health,
            claims,
            prefetch_claims,
            prepare_early,
        }
    }
}

/// `paths.state_dir`: an absolute path that is a directory or does not exist yet (then edra
/// creates it), so a file there is reported here rather than as "File exists" at start.
fn state_dir(raw: &Raw) -> Result<PathBuf, String> {
    let dir = abs_path(raw)?;
    match std::fs::metadata(&dir) {
        Ok(m) if !m.is_dir() => Err(format!(
            "{} exists and is not a directory; set paths.state_dir to a directory (edra creates it when missing)",
            dir.display()
        )),
        _ => Ok(dir),
    }
}

/// `[kubernetes]`: credentials and the client's limits.
fn read_kube(r: &mut Reader) -> KubeSettings {
    KubeSettings {
        kubeconfig: r.opt("kubernetes.kubeconfig", |raw| {
            let s = string(raw)?;
            if s.is_empty() { Err("expected a path, found an empty string".into()) } else { Ok(PathBuf::from(s)) }
        }),
        context: r.opt("kubernetes.context", string),
        qps: r.get("kubernetes.qps", 100.0, bounds::f64_in(bounds::QPS)),
        burst: r.get("kubernetes.burst", 200, bounds::u32_in(bounds::BURST)),
        request_timeout: r.get(
            "kubernetes.request_timeout",
            Duration::from_secs(30),
            bounds::duration_in(bounds::REQUEST_TIMEOUT),
        ),
        insecure_skip_tls_verify: r.get("kubernetes.insecure_skip_tls_verify", false, boolean),
        k3s_kubelet_kubeconfig: r.get(
            "kubernetes.k3s_kubelet_kubeconfig",
            "/var/lib/rancher/k3s/agent/kubelet.kubeconfig".into(),
            abs_path,
        ),
        k3s_server_kubeconfig: r.get("kubernetes.k3s_server_kubeconfig", "/etc/rancher/k3s/k3s.yaml".into(), abs_path),
        service_account_dir: r.get(
            "kubernetes.service_account_dir",
            "/var/run/secrets/kubernetes.io/serviceaccount".into(),
            abs_path,
        ),
    }
}

/// `[kubelet]`, `[cdi]` and `[paths]`: where edra finds and puts everything on the node;
/// the dynamic CDI directory must be one the runtime reads.
fn read_paths(r: &mut Reader) -> Paths {
    let kubelet_root: PathBuf = r.get("kubelet.root_dir", "/var/lib/kubelet".into(), abs_path);
    let plugins_dir = r.get("kubelet.plugins_dir", kubelet_root.join("plugins"), abs_path);
    let registry_dir = r.get("kubelet.registry_dir", kubelet_root.join("plugins_registry"), abs_path);
    let cdi_spec_dirs: Vec<PathBuf> =
        r.get("cdi.spec_dirs", vec!["/etc/cdi".into(), "/var/run/cdi".into()], abs_path_list);
    let cdi_dynamic_dir: PathBuf = r.get("cdi.dynamic_dir", "/var/run/cdi".into(), abs_path);
    if !cdi_spec_dirs.iter().any(|d| d == &cdi_dynamic_dir) {
        let origin = r.origin_of("cdi.dynamic_dir");
        r.problem(
            "cdi.dynamic_dir",
            origin,
            format!(
                "{} is not one of cdi.spec_dirs ({}); the container runtime would not see edra's specs",
                cdi_dynamic_dir.display(),
                cdi_spec_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
            ),
        );
    }
    Paths {
        kubelet_root,
        plugins_dir,
        registry_dir,
        cdi_spec_dirs,
        cdi_dynamic_dir,
        cdi_hook_binary: r.opt("cdi.hook_binary", abs_path),
        state_dir: r.get("paths.state_dir", "/var/lib/edra".into(), state_dir),
        driver_root: r.get("paths.driver_root", "/".into(), abs_path),
        host_driver_root: r.opt("paths.host_driver_root", abs_path),
        nvidia_smi: r.opt("paths.nvidia_smi", abs_path),
        mps_control: r.opt("paths.mps_control", abs_path),
        runtime_dir: r.get("paths.runtime_dir", "/run/edra".into(), abs_path),
        dev_root: r.get("paths.dev_root", "/dev".into(), abs_path),
        proc_root: r.get("paths.proc_root", "/proc".into(), abs_path),
        sys_root: r.get("paths.sys_root", "/sys".into(), abs_path),
    }
}

/// Validates a DNS-1123 subdomain (lower case, ≤253, labels of `[a-z0-9-]` separated by `.`).
pub fn validate_dns_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 253 {
        return Err("must be 1 to 253 characters".into());
    }
    for label in s.split('.') {
        validate_dns_label(label).map_err(|e| format!("label {label:?} {e}"))?;
    }
    Ok(())
}

/// Validates a DNS-1123 label (lower case alphanumerics and `-`, ≤63, alphanumeric ends).
pub fn validate_dns_label(s: &str) -> Result<(), String> {
    let b = s.as_bytes();
    if b.is_empty() || b.len() > 63 {
        return Err("must be 1 to 63 characters".into());
    }
    let ok_mid = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-';
    let ok_end = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !b.iter().all(ok_mid) || !ok_end(&b[0]) || !ok_end(&b[b.len() - 1]) {
        return Err(
            "must consist of lower case letters, digits and '-', and start and end with a letter or digit".into()
        );
    }
    Ok(())
}

/// Validates a DRA driver name: a DNS subdomain of at most 63 characters with a domain.
pub fn validate_driver_name(s: &str) -> Result<(), String> {
    if s.len() > 63 {
        return Err(format!("driver name {s:?} is longer than 63 characters"));
    }
    validate_dns_subdomain(s).map_err(|e| format!("driver name {s:?}: {e}"))?;
    if !s.contains('.') {
        return Err(format!("driver name {s:?} must be a domain such as gpu.example.com"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
