//! `edra selftest`: the agent's real node path on this node's GPUs, with no API server.
//!
//! It discovers the GPUs with the configured backend, builds the ResourceSlices edra would
//! publish and checks them against the API's limits, registers the health event set and
//! probes each GPU, then prepares and unprepares claims it makes up itself (a whole GPU,
//! two memory shares) through the real [`crate::prepare::Preparer`] with a state store,
//! CDI directory and runtime directory of its own in a temporary folder — never the
//! node's, so it runs beside a running agent without touching it. That folder is made and
//! held by descriptor in a directory no other user can change ([`workdir`]). Each CDI spec is
//! checked (the CDI rules, every device node a character device with the driver's
//! major and minor, every mounted file present) and its hooks are run against a scratch
//! root filesystem; with `--image` and a container runtime, a container is started with
//! the spec. GPU settings (time-slicing, MPS, dynamic MIG) are exercised only with
//! `--change-gpu-settings`, only on GPUs no process uses, and are put back.
//!
//! Steps: [`discovery`] (facts and slices), [`health`] (events and probe), [`claims`]
//! (prepare and unprepare), [`spec`] (what a CDI spec names), [`hooks`] (the hooks on a
//! scratch root), [`container`] (an optional container run), [`settings`] (GPU settings),
//! [`render`] (text and JSON), [`workdir`] (the temporary folder). Exit code ([`Report::exit_code`]): 0 when no check failed,
//! 1 when one did; bad usage exits 64 before any check runs.

pub mod claims;
pub mod container;
pub mod discovery;
pub mod health;
pub mod hooks;
pub mod render;
pub mod settings;
pub mod spec;
#[cfg(test)]
mod tests;
pub mod workdir;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::Config;
pub use crate::doctor::Status;
use crate::inventory::{DeviceBackend, DeviceKind, Inventory};

/// The JSON document's schema name; it changes only when a field changes meaning.
pub const SCHEMA: &str = "edra.selftest/v1";

/// What to run, from the command line.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// A local image to start a container from with the claim's CDI spec (`--image`).
    pub image: Option<String>,
    /// The command the container runs [default: `nvidia-smi -L`].
    pub command: Vec<String>,
    /// Exercise time-slicing, MPS and dynamic MIG on idle GPUs (`--change-gpu-settings`).
    pub change_gpu_settings: bool,
    /// Where the temporary state, CDI and runtime folders go [default: the system's temp
    /// folder]; refused when another user could change it ([`workdir::check_base`]). They
    /// are removed at the end.
    pub work_dir: Option<PathBuf>,
    /// The container runtime [default: the first of podman, nerdctl found on PATH].
    pub runtime: Option<PathBuf>,
}

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Stable name, e.g. `prepare-gpu`.
    pub name: &'static str,
    /// The GPU's device name (`gpu-0`), or `None` for a node-wide check.
    pub gpu: Option<String>,
    /// Pass, warn, fail or skip.
    pub status: Status,
    /// How long it took, in milliseconds.
    pub duration_ms: u64,
    /// What was found, on one line.
    pub detail: String,
    /// What to do about a failure or warning, on one line (empty when nothing is needed).
    pub fix: String,
}

impl Check {
    /// A check result; `started` is when the check began.
    pub fn new(
        name: &'static str,
        gpu: Option<&str>,
        status: Status,
        started: Instant,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        // One line, and text from outside (NVML strings, runtime output) shown, never
        // interpreted by the terminal.
        let one_line =
            |s: String| crate::util::escape_controls(&s.split_whitespace().collect::<Vec<_>>().join(" ")).into_owned();
        Check {
            name,
            gpu: gpu.map(str::to_string),
            status,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            detail: one_line(detail.into()),
            fix: one_line(fix.into()),
        }
    }
    /// A passed check.
    pub fn pass(name: &'static str, gpu: Option<&str>, started: Instant, detail: impl Into<String>) -> Self {
        Self::new(name, gpu, Status::Pass, started, detail, "")
    }
    /// A check not run, and why.
    pub fn skip(name: &'static str, gpu: Option<&str>, detail: impl Into<String>) -> Self {
        Self::new(name, gpu, Status::Skip, Instant::now(), detail, "")
    }
    /// A failed check with its fix.
    pub fn fail(
        name: &'static str,
        gpu: Option<&str>,
        started: Instant,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self::new(name, gpu, Status::Fail, started, detail, fix)
    }
}

/// Counts per status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub passed: usize,
    pub warnings: usize,
    pub failed: usize,
    pub skipped: usize,
    /// The whole run, in milliseconds.
    pub duration_ms: u64,
}

/// The whole self-test.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// [`SCHEMA`].
    pub schema: &'static str,
    /// edra's version.
    pub version: &'static str,
    /// The device backend (`nvml`, `mock`), or empty when none could be loaded.
    pub backend: String,
    /// The node name the slices and claims use.
    pub node: String,
    /// What discovery found per GPU.
    pub gpus: Vec<discovery::GpuFacts>,
    /// Every check, in the order run.
    pub checks: Vec<Check>,
    /// Counts.
    pub summary: Summary,
}

impl Report {
    /// 0 when no check failed, 1 when one did.
    pub fn exit_code(&self) -> u8 {
        u8::from(self.checks.iter().any(|c| c.status == Status::Fail))
    }

    fn finish(&mut self, started: Instant) {
        let count = |s: Status| self.checks.iter().filter(|c| c.status == s).count();
        self.summary = Summary {
            passed: count(Status::Pass),
            warnings: count(Status::Warn),
            failed: count(Status::Fail),
            skipped: count(Status::Skip),
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        };
    }
}

/// Why the self-test could not run at all (its checks' failures are in the report).
#[derive(Debug, thiserror::Error)]
pub enum SelftestError {
    /// The temporary folder could not be made, or not safely where asked.
    #[error(transparent)]
    WorkDir(#[from] workdir::WorkDirError),
    /// The async runtime could not be started.
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
}

/// The GPUs (whole ones and those in MIG mode) of `inv`: device name, UUID, by name.
pub fn gpus(inv: &Inventory) -> Vec<(String, String)> {
    let whole = inv.devices.iter().filter(|d| d.kind == DeviceKind::Gpu);
    let mig = inv.mig_gpus.iter().map(|g| &g.device);
    let found: std::collections::BTreeMap<String, String> =
        whole.chain(mig).map(|d| (d.name.clone(), d.uuid.clone())).collect();
    found.into_iter().collect()
}

/// Runs every check with `config`'s backend and paths (the state, CDI and runtime
/// folders replaced by temporary ones).
pub fn run_blocking(config: &Config, options: &Options) -> Result<Report, SelftestError> {
    let started = Instant::now();
    let (base, origin) = match &options.work_dir {
        Some(dir) => (dir.clone(), "--work-dir"),
        None => (std::env::temp_dir(), "TMPDIR, or /tmp when unset"),
    };
    let work = workdir::WorkDir::new(&base, origin)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(SelftestError::Runtime)?;
    let mut config = config.clone();
    config.paths.state_dir = work.path().join("state");
    config.paths.cdi_dynamic_dir = work.path().join("cdi");
    config.paths.runtime_dir = work.named_path().join("run");
    let mut report = Report {
        schema: SCHEMA,
        version: crate::VERSION,
        // The configured kind until a backend loads and names itself.
        backend: config.backend.name().to_string(),
        node: config.node_name.clone(),
        gpus: Vec::new(),
        checks: Vec::new(),
        summary: Summary::default(),
    };
    let mock = config.backend == crate::config::BackendKind::Mock;
    let jetson = match config.backend {
        crate::config::BackendKind::Tegra => true,
        crate::config::BackendKind::Auto => crate::inventory::tegra::platform::detect(&config.paths).is_some(),
        _ => false,
    };
    let ctx = Context { config, work: work.path().to_path_buf(), options: options.clone(), mock, jetson };
    rt.block_on(run_checks(&ctx, &mut report));
    rt.shutdown_timeout(Duration::from_secs(5));
    report.finish(started);
    Ok(report)
}

/// What every step reads.
pub struct Context {
    /// The configuration, with the temporary folders.
    pub config: Config,
    /// The temporary folder.
    pub work: PathBuf,
    /// The command line's choices.
    pub options: Options,
    /// The backend is the mock: there are no real device nodes or driver files to check.
    pub mock: bool,
    /// The node is a Jetson: its files come from CSV lists, its GPU has no settings to change.
    pub jetson: bool,
}

async fn run_checks(ctx: &Context, report: &mut Report) {
    let started = Instant::now();
    let backend: Arc<dyn DeviceBackend> = match crate::inventory::backend_from_config(&ctx.config) {
        Ok(b) => Arc::from(b),
        Err(e) => {
            let fix = "install the NVIDIA driver (nvidia-smi must work), or set nvml.library / paths.driver_root";
            report.checks.push(Check::fail("backend", None, started, crate::util::error_chain(&e), fix));
            return;
        }
    };
    report.backend = backend.name().to_string();
    let inv = match discovery::discover(&backend).await {
        Ok(inv) => inv,
        Err(check) => {
            report.checks.push(check);
            return;
        }
    };
    report.checks.push(Check::pass(
        "backend",
        None,
        started,
        format!("{} found {} device(s); {}", backend.name(), inv.devices.len(), discovery::versions(&inv)),
    ));
    let facts = discovery::facts(ctx, &backend, &inv);
    report.checks.extend(discovery::check_facts(&facts));
    report.checks.push(discovery::check_slices(&ctx.config, &inv));
    report.checks.push(match ctx.jetson {
        true => spec::check_jetson_files(ctx),
        false => spec::check_driver_files(ctx, inv.driver_version.as_deref()),
    });
    report.gpus = facts;
    report.checks.extend(health::check(ctx, backend.name(), &inv).await);
    let preparer = match claims::preparer(ctx, backend.clone(), &inv) {
        Ok(p) => p,
        Err(check) => {
            report.checks.push(check);
            return;
        }
    };
    for (gpu, _) in gpus(&inv) {
        report.checks.extend(claims::check_gpu(ctx, &preparer, &inv, &gpu).await);
    }
    report.checks.extend(settings::check(ctx, &preparer, &backend, &inv, &report.gpus).await);
}
