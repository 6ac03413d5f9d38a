//! The OCI hooks edra's CDI specs call: `edra hook update-ldcache`, `create-symlinks`
//! ([`symlinks`]) and `disable-device-node-modification` ([`device_params`]).
//!
//! A container runtime runs each hook as a `createContainer` hook with the container's
//! state JSON on stdin; this module reads it ([`read_state`]) for all hooks. The hook finds
//! the container's root filesystem through the bundle's `config.json`. update-ldcache writes `/etc/ld.so.conf.d/00-edra-gpu.conf` listing the driver's library
//! folders, makes sure `/etc/ld.so.conf` includes `ld.so.conf.d/*.conf`, and runs the host's
//! `ldconfig -r <rootfs>` so the container's dynamic linker cache finds the libraries.
//!
//! The host's ldconfig is used, never one from the image: the hook runs as root in the
//! host's namespaces, and running a binary the image supplies there would hand the host to
//! whoever built the image. Files inside the rootfs are written without following symlinks
//! in the paths edra writes to, for the same reason. Exit codes: 2 for bad input (state,
//! bundle, folders), 1 when writing the files or ldconfig fails.

use std::io::{self, Read};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

use crate::cli::HookCommand;

pub mod device_params;
pub mod symlinks;

/// The conf file edra writes in the container.
pub const CONF_FILE: &str = "etc/ld.so.conf.d/00-edra-gpu.conf";
/// The include line edra makes sure `/etc/ld.so.conf` has.
pub const INCLUDE_LINE: &str = "include /etc/ld.so.conf.d/*.conf";
/// Where the host's ldconfig is looked for, in order.
pub const HOST_LDCONFIG: [&str; 3] = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "/usr/bin/ldconfig"];

/// Why a hook failed.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The container state on stdin is unusable.
    #[error("the container state on stdin is not valid OCI state JSON with a bundle")]
    State(#[source] serde_json::Error),
    /// stdin could not be read.
    #[error("cannot read the container state from stdin")]
    Stdin(#[source] io::Error),
    /// The bundle's config.json is missing or unreadable.
    #[error("cannot read the bundle's config {}", path.display())]
    BundleConfig {
        /// The config.json path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// config.json is not valid or has no root.path.
    #[error("the bundle's config {} has no usable root.path", path.display())]
    BundleJson {
        /// The config.json path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The rootfs is not a directory.
    #[error("the container's root filesystem {} is not a directory", path.display())]
    Rootfs {
        /// The rootfs.
        path: PathBuf,
    },
    /// A folder argument is unusable.
    #[error("--folder {folder:?} must be an absolute path without '..'")]
    Folder {
        /// The folder as given.
        folder: String,
    },
    /// A path in the rootfs is a symlink or not what it should be.
    #[error("{} in the container is a symlink or not a regular file/folder; refusing to write through it", path.display())]
    Unsafe {
        /// The path in the rootfs.
        path: PathBuf,
    },
    /// A file in the rootfs could not be written.
    #[error("cannot write {} in the container", path.display())]
    Write {
        /// The path in the rootfs.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A host file the hook needs could not be read.
    #[error("cannot read {} on the host", path.display())]
    ReadHost {
        /// The host path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A `--link` argument is unusable.
    #[error("--link {link:?} must be TARGET::LINK with a non-empty target and an absolute LINK without '..'")]
    Link {
        /// The argument as given.
        link: String,
    },
    /// The OCI state has no container process ID.
    #[error("the container state on stdin has no pid; the hook must run as a createContainer hook")]
    NoPid,
    /// Entering the container's mount namespace or mounting in it failed.
    #[error("cannot {op} for the container (pid {pid})")]
    Namespace {
        /// What failed.
        op: &'static str,
        /// The container's process.
        pid: i32,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// No ldconfig was found on the host.
    #[error("no ldconfig found on the host (looked in {}); pass --ldconfig", HOST_LDCONFIG.join(", "))]
    NoLdconfig,
    /// ldconfig could not run or failed.
    #[error("ldconfig failed: {0}")]
    Ldconfig(String),
}

impl HookError {
    /// The process exit code for this error: 2 bad input, 1 failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::State(_)
            | Self::Stdin(_)
            | Self::BundleConfig { .. }
            | Self::BundleJson { .. }
            | Self::Rootfs { .. }
            | Self::Folder { .. }
            | Self::Link { .. }
            | Self::NoPid => 2,
            Self::Unsafe { .. }
            | Self::Write { .. }
            | Self::ReadHost { .. }
            | Self::Namespace { .. }
            | Self::NoLdconfig
            | Self::Ldconfig(_) => 1,
        }
    }
}

#[derive(Deserialize)]
struct State {
    bundle: PathBuf,
    #[serde(default)]
    pid: Option<i32>,
}

/// What the hooks need of the container's OCI state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    /// The root filesystem, as the host sees it.
    pub rootfs: PathBuf,
    /// The container's process (present from `createContainer` on).
    pub pid: Option<i32>,
}

/// Reads the OCI state JSON (at most 1 MiB) from `stdin` and finds the container's rootfs.
pub fn read_state(stdin: impl Read) -> Result<Container, HookError> {
    let mut state = Vec::new();
    stdin.take(1 << 20).read_to_end(&mut state).map_err(HookError::Stdin)?;
    let pid = serde_json::from_slice::<State>(&state).map_err(HookError::State)?.pid.filter(|p| *p > 0);
    Ok(Container { rootfs: rootfs_from_state(&state)?, pid })
}

/// Runs the hook `command` with the container state on `stdin`.
pub fn run(command: &HookCommand, stdin: impl Read) -> Result<(), HookError> {
    match command {
        HookCommand::UpdateLdcache(a) => update_ldcache(stdin, &a.folders, a.ldconfig.as_deref()),
        HookCommand::CreateSymlinks(a) => symlinks::create_symlinks(stdin, &a.links),
        HookCommand::DisableDeviceNodeModification(a) => device_params::disable(stdin, &a.proc_root),
    }
}

#[derive(Deserialize)]
struct BundleConfig {
    root: BundleRoot,
}

#[derive(Deserialize)]
struct BundleRoot {
    path: PathBuf,
}

/// The container's rootfs from its OCI state JSON.
pub fn rootfs_from_state(state_json: &[u8]) -> Result<PathBuf, HookError> {
    let state: State = serde_json::from_slice(state_json).map_err(HookError::State)?;
    let config_path = state.bundle.join("config.json");
    let text =
        std::fs::read(&config_path).map_err(|source| HookError::BundleConfig { path: config_path.clone(), source })?;
    let config: BundleConfig =
        serde_json::from_slice(&text).map_err(|source| HookError::BundleJson { path: config_path, source })?;
    let root = if config.root.path.is_absolute() { config.root.path } else { state.bundle.join(config.root.path) };
    if !root.is_dir() {
        return Err(HookError::Rootfs { path: root });
    }
    Ok(root)
}

/// Checks the folders: absolute, no `..`, no newlines.
pub fn check_folders(folders: &[PathBuf]) -> Result<(), HookError> {
    for f in folders {
        let s = f.to_string_lossy();
        let ok = f.is_absolute() && !f.components().any(|c| c == Component::ParentDir) && !s.contains(['\n', '\0']);
        if !ok {
            return Err(HookError::Folder { folder: s.into_owned() });
        }
    }
    Ok(())
}

/// Makes sure `<root>/<rel>`'s parent folders exist as real folders (no symlinks) and
/// that `rel` itself is not a symlink; returns the full path.
fn safe_path(root: &Path, rel: &str) -> Result<PathBuf, HookError> {
    let rel = Path::new(rel);
    let mut cur = root.to_path_buf();
    let parts: Vec<_> = rel.components().collect();
    for (i, part) in parts.iter().enumerate() {
        cur.push(part);
        let last = i + 1 == parts.len();
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => return Err(HookError::Unsafe { path: cur }),
            Ok(m) if !last && !m.is_dir() => return Err(HookError::Unsafe { path: cur }),
            Ok(m) if last && !m.is_file() => return Err(HookError::Unsafe { path: cur }),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound && !last => std::fs::DirBuilder::new()
                .mode(0o755)
                .create(&cur)
                .map_err(|source| HookError::Write { path: cur.clone(), source })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(HookError::Write { path: cur, source }),
        }
    }
    Ok(cur)
}

fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), HookError> {
    // A stale temp file (or a symlink planted under its name) is removed, and the new one
    // is created exclusively without following symlinks.
    let tmp = path.with_extension(format!("edra-tmp-{}", std::process::id()));
    crate::util::write_atomically(path, &tmp, contents, 0o644)
        .map_err(|source| HookError::Write { path: path.to_path_buf(), source })
}

/// Writes the conf files in `rootfs` (the testable core of the hook, without ldconfig).
pub fn write_ld_conf(rootfs: &Path, folders: &[PathBuf]) -> Result<(), HookError> {
    check_folders(folders)?;
    let conf = safe_path(rootfs, CONF_FILE)?;
    let mut body = String::from("# Written by edra's update-ldcache hook: the GPU driver's library folders.\n");
    for f in folders {
        body.push_str(&f.to_string_lossy());
        body.push('\n');
    }
    write_atomic(&conf, body.as_bytes())?;
    let main = safe_path(rootfs, "etc/ld.so.conf")?;
    let existing = match std::fs::read_to_string(&main) {
        Ok(s) => Some(s),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(source) => return Err(HookError::Write { path: main, source }),
    };
    let includes = existing.as_deref().is_some_and(|s| {
        s.lines().any(|l| {
            let l = l.trim();
            l.starts_with("include") && l.contains("ld.so.conf.d/*.conf")
        })
    });
    if !includes {
        let new = format!("{INCLUDE_LINE}\n{}", existing.unwrap_or_default());
        write_atomic(&main, new.as_bytes())?;
    }
    Ok(())
}

/// The ldconfig to run: `explicit`, else the first of [`HOST_LDCONFIG`] that exists.
pub fn find_ldconfig(explicit: Option<&Path>) -> Result<PathBuf, HookError> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    HOST_LDCONFIG.iter().map(PathBuf::from).find(|p| p.is_file()).ok_or(HookError::NoLdconfig)
}

/// Runs `ldconfig -r <rootfs> -C /etc/ld.so.cache -f /etc/ld.so.conf`.
pub fn run_ldconfig(ldconfig: &Path, rootfs: &Path) -> Result<(), HookError> {
    let out = Command::new(ldconfig)
        .arg("-r")
        .arg(rootfs)
        .args(["-C", "/etc/ld.so.cache", "-f", "/etc/ld.so.conf"])
        .output()
        .map_err(|e| HookError::Ldconfig(format!("cannot run {}: {e}", ldconfig.display())))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(HookError::Ldconfig(format!(
            "{} exited with {}: {}",
            ldconfig.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// The whole `update-ldcache` hook: state from `stdin`, then conf files and ldconfig.
pub fn update_ldcache(stdin: impl Read, folders: &[PathBuf], ldconfig: Option<&Path>) -> Result<(), HookError> {
    check_folders(folders)?;
    let rootfs = read_state(stdin)?.rootfs;
    write_ld_conf(&rootfs, folders)?;
    let ldconfig = find_ldconfig(ldconfig)?;
    run_ldconfig(&ldconfig, &rootfs)
}

#[cfg(test)]
#[path = "hook_tests.rs"]
mod tests;
