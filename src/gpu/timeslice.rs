//! The time-slice interval of a full GPU, set with the host's `nvidia-smi compute-policy`:
//! NVML has no public call for it. The interval is a property of the physical GPU.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::GpuError;
use crate::device_config::Interval;

/// The config key that overrides where `nvidia-smi` is.
pub const CONFIG_KEY: &str = "paths.nvidia_smi";
/// Where `nvidia-smi` is under the driver root unless [`CONFIG_KEY`] says otherwise.
pub const DEFAULT_RELATIVE_PATH: &str = "usr/bin/nvidia-smi";
/// How long one `nvidia-smi` call may take before it is killed.
pub const TIMEOUT: Duration = Duration::from_secs(30);
/// How much of a failing command's stderr an error carries.
const STDERR_LIMIT: usize = 2048;

/// The value `--set-timeslice` takes for an interval: Default 0, Short 1, Medium 2, Long 3.
pub fn interval_value(interval: Interval) -> u8 {
    match interval {
        Interval::Default => 0,
        Interval::Short => 1,
        Interval::Medium => 2,
        Interval::Long => 3,
    }
}

/// Runs `nvidia-smi`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvidiaSmi {
    /// The binary.
    pub path: PathBuf,
    /// Library directory to put on `LD_LIBRARY_PATH` (the driver root's NVML, when the
    /// driver root is not `/`).
    pub library_dir: Option<PathBuf>,
    /// Bound on one call.
    pub timeout: Duration,
}

impl NvidiaSmi {
    /// `nvidia-smi` at `configured`, or under `driver_root` ([`DEFAULT_RELATIVE_PATH`]);
    /// `library_dir` is the driver root's NVML folder when the driver root is not `/`.
    pub fn new(configured: Option<&Path>, driver_root: &Path, library_dir: Option<PathBuf>) -> Self {
        let path =
            configured.map(Path::to_path_buf).unwrap_or_else(|| super::driver_tool(driver_root, DEFAULT_RELATIVE_PATH));
        Self { path, library_dir, timeout: TIMEOUT }
    }

    /// Fails with [`GpuError::MissingBinary`] unless the binary is an executable file.
    pub fn check(&self) -> Result<(), GpuError> {
        use std::os::unix::fs::PermissionsExt;
        match std::fs::metadata(&self.path) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => Ok(()),
            _ => Err(GpuError::MissingBinary { path: self.path.clone(), key: CONFIG_KEY }),
        }
    }

    /// `nvidia-smi compute-policy -i <uuid> --set-timeslice=<value>`.
    pub fn set_timeslice(&self, uuid: &str, value: u8) -> Result<(), GpuError> {
        self.run(&["compute-policy", "-i", uuid, &format!("--set-timeslice={value}")])
    }

    /// Runs the binary with `args`, bounded by the timeout; a non-zero exit is an error
    /// carrying the command, the status and stderr.
    pub fn run(&self, args: &[&str]) -> Result<(), GpuError> {
        self.check()?;
        let command = std::iter::once(self.path.display().to_string())
            .chain(args.iter().map(|a| a.to_string()))
            .collect::<Vec<_>>()
            .join(" ");
        let mut cmd = Command::new(&self.path);
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        if let Some(dir) = &self.library_dir {
            cmd.env("LD_LIBRARY_PATH", dir);
        }
        let spawn_err = |source| GpuError::Spawn { command: command.clone(), source };
        let mut child = spawn_retrying(&mut cmd).map_err(spawn_err)?;
        let reader = crate::util::read_capped(child.stderr.take(), STDERR_LIMIT);
        let waited = crate::util::wait_bounded(&mut child, self.timeout, Duration::from_millis(5));
        let Some(status) = waited.map_err(spawn_err)? else {
            let _ = reader.join();
            return Err(GpuError::Timeout { command, seconds: self.timeout.as_secs() });
        };
        let stderr = reader.join().unwrap_or_default();
        if status.success() {
            return Ok(());
        }
        use std::os::unix::process::ExitStatusExt;
        let status = match (status.code(), status.signal()) {
            (Some(code), _) => format!("exit status {code}"),
            (None, Some(sig)) => format!("signal {sig}"),
            _ => status.to_string(),
        };
        Err(GpuError::Command { command, status, stderr: String::from_utf8_lossy(&stderr).trim().to_string() })
    }
}

/// Spawns `cmd`, retrying briefly while the binary is busy being written (ETXTBSY: a
/// package upgrade replacing it, or another thread's child still holding it open).
fn spawn_retrying(cmd: &mut Command) -> std::io::Result<std::process::Child> {
    let mut tries = 0u32;
    loop {
        match cmd.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 20 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests;
