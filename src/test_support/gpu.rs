//! A stand-in for `nvidia-smi` (tests only): a shell script that appends each call's
//! arguments to `nvidia-smi.calls` beside it, and fails on demand.

use std::path::{Path, PathBuf};

/// The script. Fails (exit 4, the rest of `nvidia-smi.fail` on stderr) when
/// `nvidia-smi.fail` exists and its first line is `*` or occurs in the arguments.
pub const SCRIPT: &str = include_str!("nvidia-smi.sh");

/// A stand-in `nvidia-smi` in its own directory.
pub struct FakeNvidiaSmi {
    /// The script.
    pub path: PathBuf,
}

impl FakeNvidiaSmi {
    /// Writes the script as `<dir>/nvidia-smi` (dir is created).
    pub fn install(dir: &Path) -> Self {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).expect("create the fake nvidia-smi's directory");
        let path = dir.join("nvidia-smi");
        let tmp = dir.join(".nvidia-smi.tmp");
        std::fs::write(&tmp, SCRIPT).expect("write the fake nvidia-smi");
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::rename(&tmp, &path).expect("install the fake nvidia-smi");
        Self { path }
    }

    /// Every call so far, one line of arguments each.
    pub fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir().join("nvidia-smi.calls"))
            .map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// Makes calls whose arguments contain `matching` (`*`: all) fail with `stderr`.
    pub fn fail(&self, matching: &str, stderr: &str) {
        std::fs::write(self.dir().join("nvidia-smi.fail"), format!("{matching}\n{stderr}\n")).expect("write fail");
    }

    /// Makes calls succeed again.
    pub fn heal(&self) {
        let _ = std::fs::remove_file(self.dir().join("nvidia-smi.fail"));
    }

    fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }
}

/// Compute modes kept in a file (tests only), so they outlive the process as a GPU's do:
/// every set appends `<uuid> <Mode>`; a GPU's mode is its last line (none: Default).
/// `fail_for` makes calls for one GPU fail as NVML does without root.
pub struct FileModes {
    /// The file.
    pub path: PathBuf,
    /// A GPU whose calls fail.
    pub fail_for: std::sync::Mutex<Option<String>>,
}

impl FileModes {
    /// Modes in `path` (created on the first set).
    pub fn at(path: PathBuf) -> Self {
        Self { path, fail_for: Default::default() }
    }

    /// Every set so far, in order.
    pub fn sets(&self) -> Vec<(String, crate::gpu::ComputeMode)> {
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        text.lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(u, m)| (u.to_string(), serde_json::from_str(&format!("\"{m}\"")).expect("a mode")))
            .collect()
    }

    /// The mode of `uuid` now.
    pub fn mode(&self, uuid: &str) -> crate::gpu::ComputeMode {
        self.sets().into_iter().rev().find(|(u, _)| u == uuid).map_or(crate::gpu::ComputeMode::Default, |(_, m)| m)
    }

    fn check(&self, uuid: &str, call: &'static str) -> Result<(), crate::gpu::GpuError> {
        if self.fail_for.lock().unwrap().as_deref() == Some(uuid) {
            return Err(crate::gpu::GpuError::Nvml {
                call,
                uuid: uuid.to_string(),
                source: "Insufficient Permissions".into(),
            });
        }
        Ok(())
    }
}

impl crate::gpu::ComputeModes for FileModes {
    fn compute_mode(&self, uuid: &str) -> Result<crate::gpu::ComputeMode, crate::gpu::GpuError> {
        self.check(uuid, "nvmlDeviceGetComputeMode")?;
        Ok(self.mode(uuid))
    }

    fn set_compute_mode(&self, uuid: &str, mode: crate::gpu::ComputeMode) -> Result<(), crate::gpu::GpuError> {
        use std::io::Write;
        self.check(uuid, "nvmlDeviceSetComputeMode")?;
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&self.path).expect("open modes");
        writeln!(f, "{uuid} {mode:?}").expect("write modes");
        Ok(())
    }
}

/// A stand-in for `nvidia-cuda-mps-control` (tests only). `-d` records its call and
/// `CUDA_VISIBLE_DEVICES` in `mps.calls` beside the script and starts a daemon process that
/// writes its pid file into `CUDA_MPS_PIPE_DIRECTORY`, logs into `CUDA_MPS_LOG_DIRECTORY`
/// and runs until told to quit. Without `-d` it is the control client: it records the
/// command read from stdin, fails like the real one when no daemon runs, and passes `quit`
/// on. Files beside the script steer it: `mps.crash` (the daemon exits at once, logging
/// why), `mps.hang` (it ignores `quit`), `mps.mute` (it never answers), `mps.refuse` (commands starting with its text fail). The daemon creates
/// `/dev/shm/edra-mps-stand-in.<pid>`, which shows which `/dev/shm` it sees.
pub const MPS_SCRIPT: &str = include_str!("nvidia-cuda-mps-control.sh");

/// The stand-in `nvidia-cuda-mps-control` in its own directory.
pub struct FakeMpsControl {
    /// The script.
    pub path: PathBuf,
}

impl FakeMpsControl {
    /// Writes the script as `<dir>/nvidia-cuda-mps-control` (dir is created).
    pub fn install(dir: &Path) -> Self {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).expect("create the fake MPS control's directory");
        let path = dir.join("nvidia-cuda-mps-control");
        let tmp = dir.join(".nvidia-cuda-mps-control.tmp");
        std::fs::write(&tmp, MPS_SCRIPT).expect("write the fake MPS control");
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::rename(&tmp, &path).expect("install the fake MPS control");
        Self { path }
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir().join("mps.calls"))
            .map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// Creates steering file `name` (`mps.crash`, `mps.hang`, `mps.mute`) holding `text`.
    pub fn set(&self, name: &str, text: &str) {
        std::fs::write(self.dir().join(name), text).expect("write a steering file");
    }

    fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }
}
