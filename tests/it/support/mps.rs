//! A stand-in for `nvidia-cuda-mps-control` (the script edra's unit tests use too): `-d`
//! records its call and starts a daemon process that writes its pid file and runs until
//! told to quit; without `-d` it is the control client. Every test node has one at
//! `<driver root>/usr/bin/nvidia-cuda-mps-control`, where edra looks by default.

use std::path::{Path, PathBuf};

const SCRIPT: &str = include_str!("../../../src/test_support/nvidia-cuda-mps-control.sh");

/// The stand-in at a path.
pub struct FakeMpsControl {
    /// The script.
    pub path: PathBuf,
}

/// A running process's start time (clock ticks after boot), from /proc.
pub fn start_time(pid: u32) -> Option<u64> {
    stat_field(pid, 19)
}

/// A running process's parent, from /proc.
fn parent(pid: u32) -> Option<u64> {
    stat_field(pid, 1)
}

/// Field `index` of /proc/<pid>/stat after the command name (0 is the state), if the
/// process runs (is not a zombie).
fn stat_field(pid: u32, index: usize) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(index)?.parse().ok()
}

/// Whether this process runs as root (an MPS daemon's mount namespace needs it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

impl FakeMpsControl {
    /// Writes the script to `path` (parents created), atomically.
    pub fn install(path: &Path) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let dir = path.parent().expect("a directory for the MPS control");
        std::fs::create_dir_all(dir).expect("create the fake MPS control's directory");
        let tmp = dir.join(".nvidia-cuda-mps-control.tmp");
        std::fs::write(&tmp, SCRIPT).expect("write the fake MPS control");
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).expect("chmod the fake MPS control");
        std::fs::rename(&tmp, path).expect("install the fake MPS control");
        Self { path: path.to_path_buf() }
    }

    /// Every call so far, one line each.
    pub fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.path.parent().expect("a directory").join("mps.calls"))
            .map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// The stand-in daemons of this script that still run (pids), found in /proc by their
    /// command line: a daemon edra lost track of keeps running after its directories go.
    /// A daemon's child between its fork and the exec of `sleep` shows the daemon's command
    /// line too; it is not counted.
    pub fn running_daemons(&self) -> Vec<u32> {
        let script = self.path.as_os_str().as_encoded_bytes();
        let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
        let found: Vec<u32> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let mut args = cmdline.split(|b| *b == 0);
                args.any(|a| a == script) && cmdline.windows(8).any(|w| w == b"__daemon") && start_time(*pid).is_some()
            })
            .collect();
        let forked = |pid: &u32| parent(*pid).is_some_and(|p| found.iter().any(|f| u64::from(*f) == p));
        found.iter().copied().filter(|pid| !forked(pid)).collect()
    }

    /// The pid in daemon directory `dir`'s pid file, if any.
    pub fn pid_in(dir: &Path) -> Option<u32> {
        std::fs::read_to_string(dir.join("pipe/nvidia-cuda-mps-control.pid")).ok()?.trim().parse().ok()
    }
}
