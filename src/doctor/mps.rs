//! Check: the sharing tools and the MPS control daemons. `nvidia-smi` (TimeSlicing) and
//! `nvidia-cuda-mps-control` (MPS) must exist for claims that ask for those strategies, and
//! for shares when `sharing.enforcement` needs them; every daemon directory under
//! `<paths.runtime_dir>/mps/` (a claim's, or `shared-gpu-0` for a shared GPU's) is listed
//! with whether the process its pid file names runs. Read from the runtime directory, not the state store,
//! which a running edra holds locked.

use std::path::{Path, PathBuf};

use super::{CheckResult, Status};
use crate::config::Config;
use crate::gpu::mps::{self, PID_FILE, process_start};

const NAME: &str = "sharing";

/// One daemon directory and what its pid file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Daemon {
    /// The directory's name: the claim's UID, or `shared-gpu-0` for the shares of `gpu-0`.
    pub claim: String,
    /// The pid in its pid file.
    pub pid: Option<u32>,
    /// Whether that pid runs (and is not a zombie).
    pub running: bool,
}

/// The daemon directories under `runtime_dir/mps`, by name.
pub fn daemons(runtime_dir: &Path, proc_root: &Path) -> Vec<Daemon> {
    let Ok(entries) = std::fs::read_dir(runtime_dir.join("mps")) else { return Vec::new() };
    let mut out: Vec<Daemon> = entries
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| {
            let pid = std::fs::read_to_string(e.path().join("pipe").join(PID_FILE))
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok());
            let running = pid.is_some_and(|p| matches!(process_start(proc_root, p), Some((_, false))));
            Daemon { claim: e.file_name().to_string_lossy().into_owned(), pid, running }
        })
        .collect();
    out.sort_by(|a, b| a.claim.cmp(&b.claim));
    out
}

fn executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

impl Daemon {
    /// Whose daemon it is, for the report: `claim <uid>` or `shared GPU gpu-0`.
    fn owner(&self) -> String {
        match self.claim.strip_prefix("shared-") {
            Some(gpu) => format!("shared GPU {gpu}"),
            None => format!("claim {}", self.claim),
        }
    }
}

/// The check.
pub fn check(cfg: &Config) -> CheckResult {
    let paths = &cfg.paths;
    let smi = paths
        .nvidia_smi
        .clone()
        .unwrap_or_else(|| crate::gpu::driver_tool(&paths.driver_root, crate::gpu::timeslice::DEFAULT_RELATIVE_PATH));
    let control = paths
        .mps_control
        .clone()
        .unwrap_or_else(|| crate::gpu::driver_tool(&paths.driver_root, mps::DEFAULT_RELATIVE_PATH));
    sharing(&smi, &control, &paths.runtime_dir, Path::new("/proc"), cfg.sharing.enforcement)
}

/// The check on explicit paths.
pub fn sharing(
    smi: &Path,
    control: &Path,
    runtime_dir: &Path,
    proc_root: &Path,
    enforcement: crate::sharing::Enforcement,
) -> CheckResult {
    use crate::sharing::Enforcement;
    let (ts, mps_users) = match enforcement {
        Enforcement::TimeSlicing(_) => ("TimeSlicing, and every share (sharing.enforcement = \"timeslicing\"),", "MPS"),
        Enforcement::Mps => ("TimeSlicing", "MPS, and every share (sharing.enforcement = \"mps\"),"),
        Enforcement::None => ("TimeSlicing", "MPS"),
    };
    let missing: Vec<(PathBuf, &str, &str)> = [
        (smi.to_path_buf(), crate::gpu::timeslice::CONFIG_KEY, ts),
        (control.to_path_buf(), mps::CONFIG_KEY, mps_users),
    ]
    .into_iter()
    .filter(|(p, ..)| !executable(p))
    .collect();
    let found = daemons(runtime_dir, proc_root);
    let listed: Vec<String> = found
        .iter()
        .map(|d| match (d.pid, d.running) {
            (Some(pid), true) => format!("{}: pid {pid} running", d.owner()),
            (Some(pid), false) => format!("{}: not running (its pid file names {pid})", d.owner()),
            (None, _) => format!("{}: not running (no pid file)", d.owner()),
        })
        .collect();
    let daemons = match listed.len() {
        0 => "no MPS daemons".to_string(),
        n => format!("{n} MPS daemon{}: {}", if n == 1 { "" } else { "s" }, listed.join("; ")),
    };
    if let Some((path, key, strategy)) = missing.first() {
        let names: Vec<String> = missing
            .iter()
            .map(|(p, key, _)| {
                let what = if *key == mps::CONFIG_KEY { "MPS" } else { "TimeSlicing" };
                format!("{what}: {} missing", p.display())
            })
            .collect();
        return CheckResult::new(
            NAME,
            Status::Warn,
            format!("{}; {daemons}", names.join(", ")),
            format!(
                "claims asking for {strategy} will fail: install the NVIDIA driver's utilities or set {key} (now {})",
                path.display()
            ),
        );
    }
    let dead: Vec<&Daemon> = found.iter().filter(|d| !d.running).collect();
    if let Some(d) = dead.first() {
        let log = runtime_dir.join("mps").join(&d.claim).join("log").join(mps::CONTROL_LOG);
        return CheckResult::new(
            NAME,
            Status::Warn,
            daemons,
            format!(
                "a running edra starts a prepared claim's (or a shared GPU's) daemon again within \
                 mps.check_interval and removes directories nothing owns; if one keeps dying, read {}",
                log.display()
            ),
        );
    }
    CheckResult::pass(NAME, format!("nvidia-smi and nvidia-cuda-mps-control found; {daemons}"))
}

#[cfg(test)]
mod tests;
