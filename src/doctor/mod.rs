//! `edra doctor`: checks of the node and the cluster that say what is wrong and what to do.
//!
//! Each check is a function returning a [`CheckResult`] (pass, warn, fail or skip, a
//! one-line detail and a one-line fix); every path it looks at comes from the
//! configuration. Host checks ([`host`], [`jetson`], [`runtime`], [`state`], [`mps`],
//! [`gpu_health`], [`metrics_port`]) read the filesystem and
//! the device backend; cluster checks ([`cluster`]) talk to the API server, each bounded by
//! [`NETWORK_TIMEOUT`] so the doctor never hangs. Nothing here changes the node or the
//! cluster, except that opening an idle state database takes (and releases) its lock and
//! sets its directory's mode to 0700, as `edra run` would.
//!
//! Exit code ([`Report::exit_code`]): 0 when no check failed (warnings and skips allowed),
//! 1 when at least one failed. Configuration errors exit 64 before any check runs.

pub mod claim_status;
pub mod cluster;
pub mod gpu_health;
pub mod host;
pub mod jetson;
pub mod memory_limit;
pub mod metrics_port;
pub mod mps;
mod render;
pub mod runtime;
pub mod state;

use std::time::Duration;

use serde::Serialize;

use crate::config::Config;

/// The bound on every network check (connect, request and body).
pub const NETWORK_TIMEOUT: Duration = Duration::from_secs(5);

/// A check's outcome, ordered from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// All good.
    Pass,
    /// Not run, because something it needs is missing (the detail says what).
    Skip,
    /// Works, but something deserves attention.
    Warn,
    /// edra will not work until this is fixed.
    Fail,
}

impl Status {
    /// `pass`, `skip`, `warn`, `fail`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Skip => "skip",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckResult {
    /// Stable name, e.g. `container-runtime`.
    pub name: &'static str,
    pub status: Status,
    /// What was found, on one line.
    pub detail: String,
    /// What to do about it, on one line (empty when nothing is needed).
    pub fix: String,
}

impl CheckResult {
    /// A result; multi-line texts (e.g. an error listing what was tried) become one line.
    pub fn new(name: &'static str, status: Status, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        // Text from outside (API server messages, NVML strings, paths) is shown, never
        // interpreted by the terminal.
        let shown = |text: String| crate::util::escape_controls(&render::one_line(&text)).into_owned();
        Self { name, status, detail: shown(detail.into()), fix: shown(fix.into()) }
    }
    pub fn pass(name: &'static str, detail: impl Into<String>) -> Self {
        Self::new(name, Status::Pass, detail, "")
    }
    pub fn skip(name: &'static str, detail: impl Into<String>) -> Self {
        Self::new(name, Status::Skip, detail, "")
    }
}

/// Every check's result, in the order they ran.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    pub checks: Vec<CheckResult>,
}

/// Why the doctor itself could not run or print.
#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    /// The async runtime for the network checks could not start.
    #[error("cannot start the async runtime for the API checks")]
    Runtime(#[source] std::io::Error),
    /// The report could not be written.
    #[error("cannot write the report")]
    Write(#[source] std::io::Error),
}

impl Report {
    /// The worst status, `Pass` for an empty report.
    pub fn worst(&self) -> Status {
        self.checks.iter().map(|c| c.status).max().unwrap_or(Status::Pass)
    }

    /// 0 when nothing failed (warnings allowed), 1 when a check failed.
    pub fn exit_code(&self) -> u8 {
        if self.worst() == Status::Fail { 1 } else { 0 }
    }

    /// The check called `name`, if it ran.
    pub fn check(&self, name: &str) -> Option<&CheckResult> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// How many checks ended with `status`.
    pub fn count(&self, status: Status) -> usize {
        self.checks.iter().filter(|c| c.status == status).count()
    }
}

/// Runs every check: host checks first, then the API server checks (bounded in time).
pub async fn run(cfg: &Config) -> Report {
    let mut checks = Vec::new();
    let (backend, discovered) = host::backend(cfg);
    checks.push(backend);
    checks.push(host::device_nodes(cfg, discovered.as_ref()));
    checks.push(jetson::check(cfg, discovered.as_ref()));
    checks.push(host::kubelet_dirs(&cfg.paths));
    checks.push(host::cdi_dirs(&cfg.paths, &cfg.driver_name));
    checks.push(host::dir_modes(&cfg.paths, &cfg.driver_name));
    checks.push(runtime::container_runtime(&cfg.runtime, &cfg.paths.cdi_dynamic_dir));
    checks.extend(cluster::checks(cfg).await);
    let specs = host::edra_spec_uids(&cfg.paths.cdi_dynamic_dir, &cfg.driver_name);
    checks.push(state::state_dir(&cfg.paths.state_dir, &cfg.paths.proc_root, &specs));
    checks.push(host::registration(cfg, agent_registered(&cfg.paths.runtime_dir).await));
    checks.push(metrics_port::check(cfg.metrics.address, &cfg.paths.proc_root));
    checks.push(mps::check(cfg));
    checks.push(memory_limit::check(cfg));
    checks.push(gpu_health::check(cfg, discovered.as_ref().map(|d| &d.inventory)));
    Report { checks }
}

/// Whether the running agent says the kubelet registered it (its status socket, asked for
/// up to 2 s); `None` when no agent answers.
async fn agent_registered(runtime_dir: &std::path::Path) -> Option<bool> {
    let socket = crate::status::server::socket_path(runtime_dir);
    let asked = tokio::time::timeout(std::time::Duration::from_secs(2), crate::status::client::fetch(&socket));
    asked.await.ok()?.ok().map(|s| s.kubelet_registered)
}

/// Runs every check on a new single-threaded runtime.
pub fn run_blocking(cfg: &Config) -> Result<Report, DoctorError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(DoctorError::Runtime)?;
    Ok(rt.block_on(run(cfg)))
}

/// Writes the report as a table or as pretty JSON.
pub fn write(report: &Report, json: bool, out: &mut dyn std::io::Write) -> Result<(), DoctorError> {
    let text = if json {
        let mut s = serde_json::to_string_pretty(&report.to_json()).unwrap_or_default();
        s.push('\n');
        s
    } else {
        report.to_table()
    };
    out.write_all(text.as_bytes()).and_then(|()| out.flush()).map_err(DoctorError::Write)
}

/// A configuration whose every path lies under `root`, plus `extra` key overrides.
#[cfg(test)]
pub(crate) fn test_config(root: &std::path::Path, extra: &[(&str, &str)]) -> Config {
    use crate::config::{LoadContext, Overrides, Paths};
    let mut o = Overrides::default();
    let p = |rel: &str| root.join(rel).display().to_string();
    let keys = [
        ("runtime.k3s_containerd_config", p("k3s/containerd/config.toml")),
        ("runtime.containerd_config", p("etc/containerd/config.toml")),
        ("runtime.crio_config", p("etc/crio/crio.conf")),
        ("runtime.crio_config_dir", p("etc/crio/crio.conf.d")),
        ("kubernetes.kubeconfig", p("kubeconfig")),
        ("node_name", "n1".to_string()),
        ("backend", "mock".to_string()),
    ];
    for (k, v) in keys {
        o.push(k, v, "test");
    }
    for (k, v) in extra {
        o.push(k, *v, "test");
    }
    let ctx = LoadContext {
        explicit_file: None,
        default_file: root.join("no-config.toml"),
        env: Vec::new(),
        overrides: o,
        hostname: Some("n1".into()),
    };
    let mut config = match Config::load(&ctx) {
        Ok(c) => c,
        Err(problems) => panic!("test configuration is invalid: {problems:?}"),
    };
    // The layout below `root`, with the host's /proc (the doctor reads processes there).
    config.paths = Paths {
        cdi_spec_dirs: vec![root.join("etc/cdi"), root.join("run/cdi")],
        cdi_dynamic_dir: root.join("run/cdi"),
        proc_root: "/proc".into(),
        ..Paths::under(root)
    };
    config
}

#[cfg(test)]
pub(crate) mod tests;
