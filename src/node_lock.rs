//! One agent per node: lock files that a second `edra run` cannot take.
//!
//! Two things on a node must never have two owners: the kubelet plugin directory of the
//! driver (its registration and DRA sockets) and the driver's CDI specs in the dynamic CDI
//! directory (recovery removes the specs no record owns). `edra run` takes an exclusive
//! `flock` on a lock file in each before it touches either, and writes its pid there, so a
//! second instance — even one with another state directory — refuses to start and names
//! the pid of the first. The kernel drops the locks when the process ends, however it
//! ends, so a crashed agent never blocks its successor.
//!
//! The CDI directory may be writable by others (see [`crate::dirmode`]): a lock file is
//! opened without following a link, and anything but a regular file with a single link
//! is refused, so a link planted under its name never makes edra (root) write elsewhere.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// Another process holds it.
    #[error(
        "another edra{} is already running for this node: it holds {}; stop it first (systemctl stop edra), \
         give this one its own kubelet plugin and CDI directories, or start this one with plugin.take_over = true \
         to have the running one hand the node over",
        .pid.map(|p| format!(" (pid {p})")).unwrap_or_default(),
        path.display()
    )]
    Held {
        /// The lock file.
        path: PathBuf,
        /// The holder's pid, when it wrote one.
        pid: Option<u32>,
    },
    /// Something other than a plain file of its own is at the lock file's path.
    #[error(
        "{} is {found}, not a regular file; edra does not write through it: remove it, and keep others from \
         writing in its directory (chmod go-w {})",
        path.display(),
        path.parent().unwrap_or(path).display()
    )]
    NotAFile {
        /// The lock file.
        path: PathBuf,
        /// What is there instead.
        found: &'static str,
    },
    /// The lock file's directory is missing and its parent cannot be written: under
    /// systemd, a kubelet directory that did not exist when edra started.
    #[error("{} does not exist and cannot be made here ({source}): {}", dir.display(), crate::util::KUBELET_DIR_MISSING_FIX)]
    DirMissing {
        /// The missing directory.
        dir: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// The lock file could not be created or locked.
    #[error("cannot create or lock {}; check that its directory exists and is writable by edra", path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// Held locks; dropping the value releases them.
#[derive(Debug)]
pub struct InstanceLock {
    _files: Vec<File>,
}

impl InstanceLock {
    /// Takes every lock in `paths` (creating the files, mode 0600, and missing parent
    /// directories, mode 0750), or none.
    pub fn acquire(paths: &[PathBuf]) -> Result<InstanceLock, InstanceError> {
        let files = paths.iter().map(|p| lock(p)).collect::<Result<Vec<_>, _>>()?;
        Ok(InstanceLock { _files: files })
    }
}

fn lock(path: &Path) -> Result<File, InstanceError> {
    let io_err = |source| InstanceError::Io { path: path.to_path_buf(), source };
    if let Some(dir) = path.parent() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().recursive(true).mode(0o750).create(dir).map_err(|source: io::Error| {
            let unwritable = matches!(source.raw_os_error(), Some(libc::EROFS | libc::EACCES | libc::EPERM));
            if unwritable && !dir.is_dir() {
                InstanceError::DirMissing { dir: dir.to_path_buf(), source }
            } else {
                io_err(source)
            }
        })?;
    }
    let mut file = open_own_file(path)?;
    match try_flock(&file) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            return Err(InstanceError::Held { path: path.to_path_buf(), pid: read_pid(&mut file) });
        }
        Err(source) => return Err(io_err(source)),
    }
    file.set_len(0).map_err(io_err)?;
    file.rewind().map_err(io_err)?;
    writeln!(file, "{}", std::process::id()).map_err(io_err)?;
    Ok(file)
}

/// Opens (creating it, mode 0600) the regular file at `path` for reading and writing,
/// without following a link there; anything else at the path is refused: a link
/// (`O_NOFOLLOW` fails with `ELOOP`), a directory, device, FIFO or socket (`O_NONBLOCK`
/// keeps a FIFO from blocking the open), or a file with other hard links.
fn open_own_file(path: &Path) -> Result<File, InstanceError> {
    let io_err = |source| InstanceError::Io { path: path.to_path_buf(), source };
    let refused = |found| InstanceError::NotAFile { path: path.to_path_buf(), found };
    let opened = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path);
    let file = match opened {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(refused("a symbolic link")),
        Err(e) if e.raw_os_error() == Some(libc::EISDIR) => return Err(refused("a directory")),
        Err(e) => return Err(io_err(e)),
    };
    let meta = file.metadata().map_err(io_err)?;
    if !meta.is_file() {
        return Err(refused("a device, FIFO or socket"));
    }
    if std::os::unix::fs::MetadataExt::nlink(&meta) > 1 {
        return Err(refused("a hard link to another file"));
    }
    Ok(file)
}

/// `flock(LOCK_EX | LOCK_NB)`: an exclusive lock on the open file, or `WouldBlock`.
fn try_flock(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock only reads the descriptor, which `file` keeps open during the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// The pid written in a lock file, if it holds one (a few bytes at most are read).
fn read_pid(file: &mut File) -> Option<u32> {
    let mut buf = [0u8; 16];
    let n = file.read(&mut buf).ok()?;
    std::str::from_utf8(buf.get(..n)?).ok()?.trim().parse().ok()
}

/// The lock files of `edra run`: one in the driver's kubelet plugin directory, one beside
/// the driver's CDI specs (hidden, and not `.json`/`.yaml`, so CDI consumers skip it).
pub fn lock_paths(plugin_dir: &Path, cdi_dir: &Path, cdi_vendor: &str) -> Vec<PathBuf> {
    vec![plugin_dir.join("edra.lock"), cdi_dir.join(format!(".{cdi_vendor}.lock"))]
}

#[cfg(test)]
mod tests;
