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
mod read;
pub mod settings;
mod sharing;
pub mod source;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use mock::{MockMig, MockSettings, validate_mig_profile};
use source::string;
pub use source::{Origin, Problem, Raw, Reader, env_name};

/// The configuration file read when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/edra/config.toml";
/// The default DRA driver name.
pub const DEFAULT_DRIVER_NAME: &str = "gpu.edra.dev";

/// Which device backend discovers GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// The Tegra backend on a Jetson (detected from the platform's files), otherwise NVML
    /// when the library loads, otherwise a clear error (never a silent mock).
    Auto,
    /// NVIDIA's management library.
    Nvml,
    /// GPUs described in the `[mock]` section; no hardware needed.
    Mock,
    /// The integrated GPU of an NVIDIA Jetson (Tegra), from the platform's files; NVML
    /// where it answers.
    Tegra,
}

impl BackendKind {
    /// The name the configuration gives it: `auto`, `nvml`, `mock` or `tegra`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Nvml => "nvml",
            Self::Mock => "mock",
            Self::Tegra => "tegra",
        }
    }

    fn parse(raw: &Raw) -> Result<Self, String> {
        match string(raw)?.as_str() {
            "auto" => Ok(Self::Auto),
            "nvml" => Ok(Self::Nvml),
            "mock" => Ok(Self::Mock),
            "tegra" => Ok(Self::Tegra),
            other => Err(format!("expected auto, nvml, mock or tegra, found {other:?}")),
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
    /// Where `backend` came from, for messages: `the default`, a file and line, an
    /// environment variable or a flag.
    pub backend_origin: String,
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
    /// How long a newer edra waits for the running one to hand the kubelet's sockets over
    /// (`handover`); the running one lets calls in flight finish for four fifths of it.
    pub handover_timeout: Duration,
    /// Whether this agent, finding another serving the node, asks it to hand over
    /// (`plugin.take_over`; a DaemonSet's rolling update with a surge) rather than refusing
    /// to start.
    pub take_over: bool,
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

#[cfg(test)]
impl Config {
    /// edra's defaults (no file, no environment, no flags) for node `hostname`: where a
    /// unit test's configuration starts.
    pub(crate) fn defaults_for(hostname: &str) -> Config {
        let ctx = LoadContext {
            explicit_file: None,
            default_file: "/nonexistent/edra.toml".into(),
            env: vec![],
            overrides: Overrides::default(),
            hostname: Some(hostname.into()),
        };
        Config::load(&ctx).expect("defaults are valid")
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
