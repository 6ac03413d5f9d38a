//! The command line: global options, subcommands, and how flags become configuration
//! overrides.
//!
//! Flags are the highest-precedence configuration layer. The dedicated flags cover the
//! settings people change most; `--set KEY=VALUE` reaches every key (see
//! docs/configuration.md).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{LoadContext, Overrides};

/// edra: a Kubernetes DRA driver for GPUs on edge nodes.
#[derive(Debug, Parser)]
#[command(name = "edra", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// Options shared by every command.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Options accepted by every command.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Configuration file [default: /etc/edra/config.toml, if it exists].
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Log format.
    #[arg(long, global = true, value_enum, value_name = "FORMAT")]
    pub log_format: Option<LogFormatArg>,
    /// Log filter, e.g. `info`, `debug` or `edra::publish=debug,info`.
    #[arg(long, global = true, value_name = "FILTER")]
    pub log_level: Option<String>,
    /// Override any configuration key, e.g. `--set kubernetes.qps=20` (repeatable).
    #[arg(long = "set", global = true, value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// `--log-format` values.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormatArg {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent: discover GPUs, publish them, serve the kubelet.
    Run(RunArgs),
    /// Show the devices found and the ResourceSlices edra would publish (no cluster needed).
    Inventory(InventoryArgs),
    /// Check this node and its cluster for what edra needs, and say what to fix.
    ///
    /// Exit code: 0 when no check failed (warnings allowed), 1 when a check failed,
    /// 64 for an invalid configuration.
    Doctor(DoctorArgs),
    /// Run the agent's node path on this node's GPUs, without a cluster, and say what works.
    ///
    /// Discovers the GPUs, checks what would be published, registers health events, and
    /// prepares and releases claims it makes up (a whole GPU, two shares) in temporary
    /// state and CDI folders of its own, never the node's. Exit code: 0 when no check
    /// failed, 1 when one did, 64 for bad usage or configuration.
    Selftest(SelftestArgs),
    /// Show the running agent's view of this node: GPUs, health, taints, shares, MPS
    /// daemons, MIG instances and the claims prepared (root only; works offline).
    Status(StatusArgs),
    /// Print the version and build details.
    Version,
    /// OCI hooks run by container runtimes through edra's CDI specs.
    Hook(HookArgs),
    /// Copy this binary to DEST for the container runtime to run edra's hooks from.
    ///
    /// For the DaemonSet's init container: the runtime runs the hooks on the host, so the
    /// binary must be on a host path (cdi.hook_binary). Written under a temporary name and
    /// renamed, mode 0755; left alone when DEST already holds the same bytes.
    InstallHook(InstallHookArgs),
}

/// `edra install-hook DEST`.
#[derive(Debug, Args, Clone)]
pub struct InstallHookArgs {
    /// Where to put the binary, e.g. /var/lib/edra/bin/edra (absolute).
    #[arg(value_name = "DEST")]
    pub dest: PathBuf,
}

/// `edra hook ...`.
#[derive(Debug, Args, Clone)]
pub struct HookArgs {
    /// Which hook.
    #[command(subcommand)]
    pub command: HookCommand,
}

/// The hooks.
#[derive(Debug, Subcommand, Clone)]
pub enum HookCommand {
    /// Refresh the container's dynamic linker cache for the GPU driver's library folders
    /// (reads the OCI container state on stdin).
    UpdateLdcache(UpdateLdcacheArgs),
    /// Create the driver's library symlinks in the container (libcuda.so → libcuda.so.1).
    ///
    /// Reads the OCI container state on stdin. Parent folders are created (0755); symlinks on
    /// the way are resolved inside the container's root filesystem, never outside it. A link
    /// already right is left alone; others are created at a temporary name and renamed.
    CreateSymlinks(CreateSymlinksArgs),
    /// Keep NVML in the container from creating device nodes.
    ///
    /// Reads the OCI container state on stdin. When the host's /proc/driver/nvidia/params
    /// says ModifyDeviceFiles: 1, mounts a read-only copy saying 0 over the container's, in
    /// the mount namespace the hook runs in (a createContainer hook runs in the container's);
    /// otherwise does nothing.
    DisableDeviceNodeModification(DisableDeviceNodeModificationArgs),
    /// Have the agent set a share's GPU memory limit on the container's cgroup.
    ///
    /// Reads the OCI container state on stdin and linux.cgroupsPath from the bundle's
    /// config.json, then asks the running agent over its memory-limit socket, which records
    /// the limit and sets it through NVML. Retries for a while when the agent is restarting;
    /// fails (and so does the container's creation) when the limit cannot be set.
    ApplyMemoryLimit(ApplyMemoryLimitArgs),
}

/// Options of `edra hook apply-memory-limit`.
#[derive(Debug, Args, Clone, Default)]
pub struct ApplyMemoryLimitArgs {
    /// The agent's memory-limit socket.
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
    /// The claim UID.
    #[arg(long, value_name = "UID")]
    pub claim: String,
    /// The share's device name in the claim.
    #[arg(long, value_name = "NAME")]
    pub device: String,
    /// The share ID of the allocation, when it has one.
    #[arg(long, value_name = "ID")]
    pub share_id: Option<String>,
}

impl HookCommand {
    /// The hook's name on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Self::UpdateLdcache(_) => "update-ldcache",
            Self::CreateSymlinks(_) => "create-symlinks",
            Self::DisableDeviceNodeModification(_) => "disable-device-node-modification",
            Self::ApplyMemoryLimit(_) => "apply-memory-limit",
        }
    }
}

/// Options of `edra hook update-ldcache`.
#[derive(Debug, Args, Clone, Default)]
pub struct UpdateLdcacheArgs {
    /// A library folder inside the container (absolute; repeatable).
    #[arg(long = "folder", value_name = "DIR")]
    pub folders: Vec<PathBuf>,
    /// The host's ldconfig [default: /sbin/ldconfig, /usr/sbin/ldconfig, /usr/bin/ldconfig].
    #[arg(long, value_name = "PATH")]
    pub ldconfig: Option<PathBuf>,
}

/// Options of `edra hook create-symlinks`.
#[derive(Debug, Args, Clone, Default)]
pub struct CreateSymlinksArgs {
    /// A link to create: TARGET (what the link points to, as written into it) and LINK (its
    /// absolute path in the container, without '..'), e.g.
    /// `libcuda.so.1::/usr/lib64/libcuda.so` (repeatable).
    #[arg(long = "link", value_name = "TARGET::LINK")]
    pub links: Vec<String>,
}

/// Options of `edra hook disable-device-node-modification`.
#[derive(Debug, Args, Clone)]
pub struct DisableDeviceNodeModificationArgs {
    /// The host's procfs, holding driver/nvidia/params and the container's namespaces.
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    pub proc_root: PathBuf,
}

/// Options that select the node, the cluster and the devices.
#[derive(Debug, Args, Clone, Default)]
pub struct NodeArgs {
    /// Device backend: auto (NVML, or a clear error), nvml, or mock (no GPU needed).
    #[arg(long, value_enum)]
    pub backend: Option<BackendArg>,
    /// This node's name [default: NODE_NAME, then the host name].
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// edra's state directory.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Root under which the NVIDIA driver's files are found.
    #[arg(long, value_name = "DIR")]
    pub driver_root: Option<PathBuf>,
}

/// Options of `edra run`.
#[derive(Debug, Args, Clone, Default)]
pub struct RunArgs {
    /// Node and device selection.
    #[command(flatten)]
    pub node: NodeArgs,
    /// Kubeconfig to use [default: the first found of KUBECONFIG, ~/.kube/config, in-cluster
    /// (service account), the k3s kubelet kubeconfig, the k3s server kubeconfig]
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Context to use from the kubeconfig.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

/// Options of `edra inventory`.
#[derive(Debug, Args, Clone, Default)]
pub struct InventoryArgs {
    /// Node and device selection.
    #[command(flatten)]
    pub node: NodeArgs,
    /// Output format [default: table on a terminal, json otherwise].
    #[arg(long, short = 'o', value_enum, value_name = "FORMAT")]
    pub output: Option<OutputArg>,
}

/// Options of `edra doctor`.
#[derive(Debug, Args, Clone, Default)]
pub struct DoctorArgs {
    /// Node, device and cluster selection, as for `edra run`.
    #[command(flatten)]
    pub run: RunArgs,
    /// Output format [default: table on a terminal, json otherwise].
    #[arg(long, short = 'o', value_enum, value_name = "FORMAT")]
    pub output: Option<DoctorOutputArg>,
}

/// Options of `edra status`.
#[derive(Debug, Args, Clone, Default)]
pub struct StatusArgs {
    /// Output format.
    #[arg(long, short = 'o', value_enum, value_name = "FORMAT", default_value = "text")]
    pub output: StatusOutputArg,
    /// Print the view again every two seconds until interrupted.
    #[arg(long, short = 'w')]
    pub watch: bool,
}

/// `edra status --output` values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum StatusOutputArg {
    /// Tables that fit 100 columns.
    #[default]
    Text,
    /// More columns: UUIDs, share IDs, MIG instances, MPS daemons, conditions.
    Wide,
    /// The whole view as JSON (schema `edra.status/v1`, see docs/status.md).
    Json,
}

/// Options of `edra selftest`.
#[derive(Debug, Args, Clone, Default)]
pub struct SelftestArgs {
    /// Node and device selection.
    #[command(flatten)]
    pub node: NodeArgs,
    /// Output format.
    #[arg(long, short = 'o', value_enum, value_name = "FORMAT", default_value = "text")]
    pub output: SelftestOutputArg,
    /// A local container image: start a container from it with the whole-GPU claim's CDI
    /// devices (needs podman, or --runtime).
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
    /// The container runtime to use with --image (takes podman's arguments).
    #[arg(long, value_name = "PATH")]
    pub runtime: Option<PathBuf>,
    /// Also exercise time-slicing, MPS and dynamic MIG on GPUs no process uses; every
    /// setting changed is put back.
    #[arg(long)]
    pub change_gpu_settings: bool,
    /// Where the temporary state, CDI and runtime folders are made [default: $TMPDIR or /tmp].
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// The command the container runs [default: nvidia-smi -L].
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `edra selftest --output` values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum SelftestOutputArg {
    /// A summary table.
    #[default]
    Text,
    /// The whole report as JSON (schema `edra.selftest/v1`, see docs/selftest.md).
    Json,
}

/// `edra doctor --output` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DoctorOutputArg {
    /// One line per check: status, check, detail, fix.
    Table,
    /// `{"checks": [{"name", "status", "detail", "fix"}], "summary": {...}}`.
    Json,
}

/// `--output` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputArg {
    /// A List of ResourceSlices for `kubectl apply -f -`.
    Json,
    /// The same as YAML.
    Yaml,
    /// One line per device.
    Table,
}

/// `--backend` values.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum BackendArg {
    /// Tegra on a Jetson, otherwise NVML, or a clear error when it cannot be loaded.
    Auto,
    /// NVIDIA's management library.
    Nvml,
    /// Described in configuration; no hardware needed.
    Mock,
    /// The integrated GPU of an NVIDIA Jetson (Tegra).
    Tegra,
}

impl GlobalArgs {
    /// Turns global flags into overrides; a malformed `--set` is returned as an error text.
    pub fn overrides(&self, out: &mut Overrides) -> Result<(), Vec<String>> {
        if let Some(f) = self.log_format {
            let v = match f {
                LogFormatArg::Text => "text",
                LogFormatArg::Json => "json",
            };
            out.push("log.format", v, "--log-format");
        }
        if let Some(l) = &self.log_level {
            out.push("log.level", l.clone(), "--log-level");
        }
        let mut errors = Vec::new();
        for s in &self.set {
            match s.split_once('=') {
                Some((k, v)) if !k.trim().is_empty() => out.push(k.trim(), v, format!("--set {s}")),
                _ => errors.push(format!("--set {s:?}: expected KEY=VALUE, e.g. --set kubernetes.qps=20")),
            }
        }
        if errors.is_empty() { Ok(()) } else { Err(errors) }
    }
}

impl NodeArgs {
    /// Adds this command's overrides.
    pub fn overrides(&self, out: &mut Overrides) {
        if let Some(b) = self.backend {
            let v = match b {
                BackendArg::Auto => "auto",
                BackendArg::Nvml => "nvml",
                BackendArg::Mock => "mock",
                BackendArg::Tegra => "tegra",
            };
            out.push("backend", v, "--backend");
        }
        if let Some(n) = &self.node_name {
            out.push("node_name", n.clone(), "--node-name");
        }
        if let Some(d) = &self.state_dir {
            out.push("paths.state_dir", d.display().to_string(), "--state-dir");
        }
        if let Some(d) = &self.driver_root {
            out.push("paths.driver_root", d.display().to_string(), "--driver-root");
        }
    }
}

impl RunArgs {
    /// Adds this command's overrides.
    pub fn overrides(&self, out: &mut Overrides) {
        self.node.overrides(out);
        if let Some(k) = &self.kubeconfig {
            out.push("kubernetes.kubeconfig", k.display().to_string(), "--kubeconfig");
        }
        if let Some(c) = &self.context {
            out.push("kubernetes.context", c.clone(), "--context");
        }
    }
}

impl Cli {
    /// A usage error when configuration flags were given to a command that reads no
    /// configuration (`edra hook`, `edra version`), instead of ignoring them silently.
    pub fn unused_global_flags(&self) -> Option<clap::Error> {
        let command = match &self.command {
            Command::Hook(h) => format!("hook {}", h.command.name()),
            Command::Version => "version".to_string(),
            Command::InstallHook(_) => "install-hook".to_string(),
            Command::Run(_)
            | Command::Inventory(_)
            | Command::Doctor(_)
            | Command::Selftest(_)
            | Command::Status(_) => {
                return None;
            }
        };
        let g = &self.global;
        let given: Vec<&str> = [
            (g.config.is_some(), "--config"),
            (!g.set.is_empty(), "--set"),
            (g.log_format.is_some(), "--log-format"),
            (g.log_level.is_some(), "--log-level"),
        ]
        .into_iter()
        .filter_map(|(set, flag)| set.then_some(flag))
        .collect();
        if given.is_empty() {
            return None;
        }
        let message = format!(
            "edra {command} reads no configuration and logs nothing, so {} cannot apply to it; remove {}",
            given.join(", "),
            if given.len() == 1 { "it" } else { "them" }
        );
        let mut cmd = <Self as clap::CommandFactory>::command();
        Some(cmd.error(clap::error::ErrorKind::ArgumentConflict, message))
    }

    /// The configuration load context for this invocation, from the real process.
    pub fn load_context(&self) -> Result<LoadContext, Vec<String>> {
        let mut overrides = Overrides::default();
        self.global.overrides(&mut overrides)?;
        match &self.command {
            Command::Run(args) => args.overrides(&mut overrides),
            Command::Inventory(args) => args.node.overrides(&mut overrides),
            Command::Doctor(args) => args.run.overrides(&mut overrides),
            Command::Selftest(args) => args.node.overrides(&mut overrides),
            Command::Status(_) => {}
            Command::Version | Command::Hook(_) | Command::InstallHook(_) => {}
        }
        Ok(LoadContext::from_process(self.global.config.clone(), overrides))
    }
}

#[cfg(test)]
mod tests;
