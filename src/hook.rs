//! The OCI hooks edra's CDI specs call: `edra hook update-ldcache`, `create-symlinks`
//! ([`symlinks`]) and `disable-device-node-modification` ([`device_params`]); and
//! `edra install-hook` ([`install`]), which puts the binary where the runtime runs them from.
//!
//! A container runtime runs each hook as a `createContainer` hook with the container's
//! state JSON on stdin; this module reads it ([`read_state`]) for all hooks. The hook finds
//! the container's root filesystem through the bundle's `config.json`. Runtimes run these
//! hooks in the container's mount namespace before pivot_root, with the host's filesystem
//! still visible, so the rootfs is at its host path. update-ldcache writes
//! `/etc/ld.so.conf.d/00-edra-gpu.conf` listing the driver's library folders, makes sure
//! `/etc/ld.so.conf` includes `ld.so.conf.d/*.conf` (keeping its other bytes as they are,
//! UTF-8 or not), and runs the host's `ldconfig -r <rootfs>` so the container's dynamic
//! linker cache finds the libraries. When any step fails, the files it wrote are put back as
//! they were ([`Undo`]), so a failed hook leaves the image as it found it.
//!
//! The host's ldconfig is used, never one from the image: the hook runs as root with the
//! host's filesystem in view, and running a binary the image supplies there would hand the
//! host to whoever built the image. Paths in the rootfs are resolved as inside the container
//! (symlinks followed with `/` meaning the rootfs), and a symlink leading above the rootfs's
//! top is refused, so nothing is written outside it. Exit codes: 2 for bad input (state,
//! bundle, folders), 1 when reading or writing the files or ldconfig fails.

use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

use crate::cli::HookCommand;

pub mod device_params;
pub mod install;
pub mod memory_limit;
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
    /// A symlink in the rootfs leads above its top (only meaningful on the host).
    #[error("{} in the container is a symlink leading outside the container's root filesystem; refusing to follow it", path.display())]
    Escapes {
        /// The path in the rootfs.
        path: PathBuf,
    },
    /// A file in the rootfs could not be read.
    #[error("cannot read {} in the container", path.display())]
    Read {
        /// The path in the rootfs.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
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
    /// The container's `/proc` is not a procfs mount where the hook runs.
    #[error(
        "{} is not a procfs mount in this mount namespace; the hook must run as a createContainer hook, \
         which the runtime runs in the container's mount namespace once its /proc is mounted",
        path.display()
    )]
    NoProcfs {
        /// `<rootfs>/proc`.
        path: PathBuf,
    },
    /// Mounting in the container's mount namespace failed.
    #[error("cannot {op} at {} in the container's mount namespace", path.display())]
    Mount {
        /// What failed.
        op: &'static str,
        /// The mount point.
        path: PathBuf,
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
    /// The GPU memory limit could not be set.
    #[error(transparent)]
    MemoryLimit(#[from] memory_limit::LimitHookError),
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
            | Self::Link { .. } => 2,
            Self::Unsafe { .. }
            | Self::Escapes { .. }
            | Self::Read { .. }
            | Self::Write { .. }
            | Self::ReadHost { .. }
            | Self::NoProcfs { .. }
            | Self::Mount { .. }
            | Self::NoLdconfig
            | Self::Ldconfig(_) => 1,
            Self::MemoryLimit(e) => e.exit_code(),
        }
    }
}

#[derive(Deserialize)]
struct State {
    bundle: PathBuf,
}

/// What the hooks need of the container's OCI state.
///
/// The state's `pid` is not used: runtimes disagree on it for `createContainer` hooks (runc
/// reports the container's own view, 1; crun reports 0), and the hooks need no process,
/// since they already run in the container's mount namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    /// The root filesystem, as the host sees it (and the hook, before pivot_root).
    pub rootfs: PathBuf,
}

/// Reads the OCI state JSON (at most 1 MiB) from `stdin` and finds the container's rootfs.
pub fn read_state(stdin: impl Read) -> Result<Container, HookError> {
    let mut state = Vec::new();
    stdin.take(1 << 20).read_to_end(&mut state).map_err(HookError::Stdin)?;
    Ok(Container { rootfs: rootfs_from_state(&state)? })
}

/// Runs the hook `command` with the container state on `stdin`.
pub fn run(command: &HookCommand, stdin: impl Read) -> Result<(), HookError> {
    match command {
        HookCommand::UpdateLdcache(a) => update_ldcache(stdin, &a.folders, a.ldconfig.as_deref()),
        HookCommand::CreateSymlinks(a) => symlinks::create_symlinks(stdin, &a.links),
        HookCommand::DisableDeviceNodeModification(a) => device_params::disable(stdin, &a.proc_root),
        HookCommand::ApplyMemoryLimit(a) => memory_limit::apply(stdin, a),
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
    let text = read_bundle_file(&config_path, memory_limit::MAX_CONFIG)
        .map_err(|source| HookError::BundleConfig { path: config_path.clone(), source })?;
    let config: BundleConfig =
        serde_json::from_slice(&text).map_err(|source| HookError::BundleJson { path: config_path, source })?;
    let root = if config.root.path.is_absolute() { config.root.path } else { state.bundle.join(config.root.path) };
    if !root.is_dir() {
        return Err(HookError::Rootfs { path: root });
    }
    Ok(root)
}

/// The bytes of the bundle's file `path` (its `config.json`), at most `max`: opened without
/// following a link and without blocking (`O_NONBLOCK`: the open of a FIFO would otherwise
/// wait for a writer for ever, holding up the runtime), then refused at once unless it is a
/// regular file; a larger file is an error, never truncated.
pub fn read_bundle_file(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let f = match opened {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(io::Error::other(
                "it is a symbolic link; a bundle's config.json must be a regular file, which the runtime writes",
            ));
        }
        Err(e) => return Err(e),
    };
    let kind = f.metadata()?.file_type();
    if !kind.is_file() {
        let found = if kind.is_dir() { "a directory" } else { "a FIFO, socket or device" };
        return Err(io::Error::other(format!(
            "it is {found}, not a regular file; a bundle's config.json must be a regular file, which the runtime \
             writes"
        )));
    }
    let mut text = Vec::new();
    f.take(max.saturating_add(1)).read_to_end(&mut text)?;
    if text.len() as u64 > max {
        return Err(io::Error::other(format!("it is larger than {} MiB", max >> 20)));
    }
    Ok(text)
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

/// A regular file's contents and metadata, as found before the hook changed it.
type Before = Option<(Vec<u8>, std::fs::Metadata)>;

/// What [`write_ld_conf`] changed in the rootfs, so a failed hook can put it back.
#[derive(Debug, Default)]
#[must_use = "roll back on failure"]
pub struct Undo {
    /// Folders created, parents first.
    created_dirs: Vec<PathBuf>,
    /// Files written, with what was there before (contents and metadata), in order.
    files: Vec<(PathBuf, Before)>,
}

impl Undo {
    /// Puts the rootfs back as it was: files restored (contents, mode, owner) or removed,
    /// then the folders created removed. Best effort: the hook is failing anyway.
    pub fn rollback(self) {
        for (path, before) in self.files.into_iter().rev() {
            let _ = match before {
                Some((contents, meta)) => write_atomic(&path, &contents, Some(&meta)),
                None => std::fs::remove_file(&path).map_err(|source| HookError::Write { path: path.clone(), source }),
            };
        }
        for dir in self.created_dirs.into_iter().rev() {
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

/// The contents and metadata of the regular file at `path`; `None` when it does not exist.
/// Anything but a regular file is refused.
fn read_regular(path: &Path) -> Result<Before, HookError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(HookError::Read { path: path.to_path_buf(), source }),
    };
    if !meta.is_file() {
        return Err(HookError::Unsafe { path: path.to_path_buf() });
    }
    let contents = read_file(path)?;
    Ok(Some((contents, meta)))
}

/// The largest file the hook reads (and may rewrite) in the rootfs.
pub const MAX_FILE: u64 = 1 << 20;

/// The bytes of `path` (opened without following a symlink); a file larger than
/// [`MAX_FILE`] is an error, never truncated.
fn read_file(path: &Path) -> Result<Vec<u8>, HookError> {
    let err = |source| HookError::Read { path: path.to_path_buf(), source };
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path).map_err(err)?;
    let mut contents = Vec::new();
    f.take(MAX_FILE + 1).read_to_end(&mut contents).map_err(err)?;
    if contents.len() as u64 > MAX_FILE {
        return Err(err(io::Error::other("the file is larger than 1 MiB, too large for a linker configuration")));
    }
    Ok(contents)
}

/// The file `path` (absolute, inside the container) as a host path under `rootfs`, resolved
/// as inside the container: its folder and, when the file is a symlink, the link's target
/// are followed within the rootfs; a link leading above the rootfs's top is refused.
/// Folders created on the way are added to `created`.
fn resolve_file(rootfs: &Path, path: &Path, created: &mut Vec<PathBuf>) -> Result<PathBuf, HookError> {
    let mut path = path.to_path_buf();
    for _ in 0..=symlinks::MAX_SYMLINKS {
        let name = path.file_name().ok_or_else(|| HookError::Unsafe { path: rootfs.join(&path) })?.to_owned();
        let dir = path.parent().unwrap_or(Path::new("/"));
        let host = symlinks::resolve_dir_with(rootfs, dir, symlinks::Escape::Refuse, created)?.join(&name);
        match std::fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                let target =
                    std::fs::read_link(&host).map_err(|source| HookError::Read { path: host.clone(), source })?;
                // The link's folder as the container sees it, then the target from there.
                let inside = Path::new("/").join(host.strip_prefix(rootfs).unwrap_or(&host));
                let base = inside.parent().unwrap_or(Path::new("/"));
                path = if target.is_absolute() { target } else { base.join(target) };
            }
            _ => return Ok(host),
        }
    }
    Err(HookError::Unsafe { path: rootfs.join(path.strip_prefix("/").unwrap_or(&path)) })
}

/// Writes `contents` to `path` through a temp file renamed into place; with `like`, the new
/// file gets that mode and owner (a replaced file keeps its own), else mode 0644.
fn write_atomic(path: &Path, contents: &[u8], like: Option<&std::fs::Metadata>) -> Result<(), HookError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tmp = path.with_extension(format!("edra-tmp-{}", std::process::id()));
    // A stale temp file (or a symlink planted under its name) is removed, and the new one
    // is created exclusively without following symlinks, with the old file's owner and mode.
    crate::util::replace_atomically(path, &tmp, |tmp| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(tmp)?;
        f.write_all(contents)?;
        let mode = like.map_or(0o644, |m| m.mode() & 0o7777);
        if let Some(m) = like {
            std::os::unix::fs::fchown(&f, Some(m.uid()), Some(m.gid()))?;
        }
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.sync_all()
    })
    .map_err(|source| HookError::Write { path: path.to_path_buf(), source })
}

/// True when `conf` (an ld.so.conf, any bytes) has an `include` line for `ld.so.conf.d/*.conf`.
pub fn includes_conf_d(conf: &[u8]) -> bool {
    conf.split(|b| *b == b'\n').any(|line| {
        let line = line.trim_ascii();
        line.starts_with(b"include") && line.windows(19).any(|w| w == b"ld.so.conf.d/*.conf")
    })
}

/// Writes the conf files in `rootfs` (the testable core of the hook, without ldconfig):
/// `00-edra-gpu.conf` in the container's `/etc/ld.so.conf.d` and, when missing, the include
/// line at the top of `/etc/ld.so.conf` (whose other bytes are kept as they are). Symlinks
/// on the way are resolved as inside the container; one leading out of the rootfs is
/// refused. On failure nothing is left changed; on success the returned [`Undo`] can still
/// put everything back (when ldconfig fails).
pub fn write_ld_conf(rootfs: &Path, folders: &[PathBuf]) -> Result<Undo, HookError> {
    check_folders(folders)?;
    let mut undo = Undo::default();
    match write_ld_conf_into(rootfs, folders, &mut undo) {
        Ok(()) => Ok(undo),
        Err(e) => {
            undo.rollback();
            Err(e)
        }
    }
}

fn write_ld_conf_into(rootfs: &Path, folders: &[PathBuf], undo: &mut Undo) -> Result<(), HookError> {
    let conf_dir = Path::new("/").join(CONF_FILE);
    let conf_dir = conf_dir.parent().unwrap_or(Path::new("/etc/ld.so.conf.d"));
    let conf = symlinks::resolve_dir_with(rootfs, conf_dir, symlinks::Escape::Refuse, &mut undo.created_dirs)?
        .join(Path::new(CONF_FILE).file_name().unwrap_or_default());
    let conf_before = read_regular(&conf)?;
    let main = resolve_file(rootfs, Path::new("/etc/ld.so.conf"), &mut undo.created_dirs)?;
    let main_before = read_regular(&main)?;

    let mut body = b"# Written by edra's update-ldcache hook: the GPU driver's library folders.\n".to_vec();
    for f in folders {
        body.extend_from_slice(f.as_os_str().as_bytes());
        body.push(b'\n');
    }
    if conf_before.as_ref().is_none_or(|(c, _)| *c != body) {
        undo.files.push((conf.clone(), conf_before));
        write_atomic(&conf, &body, None)?;
    }
    if !main_before.as_ref().is_some_and(|(c, _)| includes_conf_d(c)) {
        let mut new = format!("{INCLUDE_LINE}\n").into_bytes();
        new.extend_from_slice(main_before.as_ref().map_or(&[][..], |(c, _)| c));
        let like = main_before.as_ref().map(|(_, m)| m.clone());
        undo.files.push((main.clone(), main_before));
        write_atomic(&main, &new, like.as_ref())?;
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

/// The whole `update-ldcache` hook: state from `stdin`, then conf files and ldconfig. When
/// any step fails, the conf files are put back as they were.
pub fn update_ldcache(stdin: impl Read, folders: &[PathBuf], ldconfig: Option<&Path>) -> Result<(), HookError> {
    check_folders(folders)?;
    let rootfs = read_state(stdin)?.rootfs;
    let ldconfig = find_ldconfig(ldconfig)?;
    let undo = write_ld_conf(&rootfs, folders)?;
    run_ldconfig(&ldconfig, &rootfs).inspect_err(|_| undo.rollback())
}

#[cfg(test)]
mod tests;
