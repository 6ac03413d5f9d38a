//! Directories others can write. Whoever can create or rename entries in a CDI spec
//! directory, the kubelet's plugin directories, or edra's state and runtime directories can
//! reach every container on the node: plant a CDI spec or a socket, or swap edra's own
//! files. Such a directory (writable by group or others, unless it is root's and sticky,
//! as `/tmp` is) is reported by `edra doctor` as a failure and by `edra run` at WARN, each
//! with the `chmod` that fixes it; edra does not change the modes of directories it
//! shares with the kubelet and the container runtime.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use crate::config::Paths;

/// A directory edra uses that group or others may write in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenDir {
    /// What edra uses it for, e.g. `CDI spec directory`.
    pub role: &'static str,
    pub path: PathBuf,
    /// Its permission bits.
    pub mode: u32,
}

impl OpenDir {
    /// The command that closes it to group and others.
    pub fn fix(&self) -> String {
        format!("chmod go-w {}", self.path.display())
    }
}

impl std::fmt::Display for OpenDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} (mode {:04o})", self.role, self.path.display(), self.mode)
    }
}

/// Whether a directory with this mode and owner lets users other than its owner create,
/// remove or rename entries: group or other write permission, unless the sticky bit is
/// set on a directory root owns (where nobody may remove or rename another's entries).
pub fn writable_by_others(mode: u32, uid: u32) -> bool {
    let sticky_root = mode & 0o1000 != 0 && uid == 0;
    mode & 0o022 != 0 && !sticky_root
}

/// The directories edra uses, with what it uses each for; one entry per path.
pub fn dirs(paths: &Paths, driver: &str) -> Vec<(&'static str, PathBuf)> {
    let mut out: Vec<(&'static str, PathBuf)> = vec![("edra's CDI directory", paths.cdi_dynamic_dir.clone())];
    out.extend(paths.cdi_spec_dirs.iter().map(|d| ("CDI spec directory", d.clone())));
    out.extend([
        ("kubelet plugin registry", paths.registry_dir.clone()),
        ("kubelet plugins directory", paths.plugins_dir.clone()),
        ("edra's kubelet plugin directory", paths.plugin_dir(driver)),
        ("state directory", paths.state_dir.clone()),
        ("runtime directory", paths.runtime_dir.clone()),
    ]);
    let mut seen = std::collections::BTreeSet::new();
    out.retain(|(_, p)| seen.insert(p.clone()));
    out
}

/// The directories of [`dirs`] that exist and others can write (a missing one is skipped:
/// edra creates it without write permission for others).
pub fn open_dirs(paths: &Paths, driver: &str) -> Vec<OpenDir> {
    dirs(paths, driver)
        .into_iter()
        .filter_map(|(role, path)| {
            let meta = std::fs::metadata(&path).ok().filter(|m| m.is_dir())?;
            let mode = meta.mode() & 0o7777;
            writable_by_others(mode, meta.uid()).then_some(OpenDir { role, path, mode })
        })
        .collect()
}

/// Logs each directory others can write at WARN (once: `edra run` calls this at start).
pub fn warn_open_dirs(paths: &Paths, driver: &str) {
    for open in open_dirs(paths, driver) {
        tracing::warn!(
            dir = %open.path.display(),
            mode = format!("{:04o}", open.mode),
            "{} {} is writable by users other than its owner: they could plant CDI specs, sockets or \
             links that reach every container on the node; fix: {}",
            open.role,
            open.path.display(),
            open.fix()
        );
    }
}

#[cfg(test)]
mod tests;
