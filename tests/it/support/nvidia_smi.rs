//! A stand-in for `nvidia-smi`: a shell script that appends each call's arguments to
//! `nvidia-smi.calls` beside it and fails on demand. Every test node has one at
//! `<driver root>/usr/bin/nvidia-smi`, where edra looks by default.

use std::path::{Path, PathBuf};

/// Fails (exit 4, the rest of `nvidia-smi.fail` on stderr) when `nvidia-smi.fail` exists
/// and its first line is `*` or occurs in the arguments.
const SCRIPT: &str = include_str!("../../../src/test_support/nvidia-smi.sh");

/// The stand-in at a path.
pub struct FakeNvidiaSmi {
    /// The script.
    pub path: PathBuf,
}

impl FakeNvidiaSmi {
    /// Writes the script to `path` (parents created), atomically.
    pub fn install(path: &Path) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let dir = path.parent().expect("a directory for nvidia-smi");
        std::fs::create_dir_all(dir).expect("create the fake nvidia-smi's directory");
        let tmp = dir.join(".nvidia-smi.tmp");
        std::fs::write(&tmp, SCRIPT).expect("write the fake nvidia-smi");
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).expect("chmod the fake nvidia-smi");
        std::fs::rename(&tmp, path).expect("install the fake nvidia-smi");
        Self { path: path.to_path_buf() }
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

    fn dir(&self) -> &Path {
        self.path.parent().expect("nvidia-smi has a directory")
    }
}
