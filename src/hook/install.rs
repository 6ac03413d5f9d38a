//! `edra install-hook DEST`: puts a copy of the running binary where the container runtime
//! runs edra's hooks from, for the DaemonSet, whose image has no shell and no `cp`.
//!
//! The runtime runs the hooks a CDI spec names on the host, so with edra in a pod the
//! binary must be on a host path: the DaemonSet's init container copies itself into the
//! state directory's `bin/` (a hostPath volume), and `cdi.hook_binary` names that path.
//! The copy is written under a temporary name beside the destination (created new, never
//! through a link), flushed, and renamed over the destination, so a runtime starting a hook
//! meanwhile runs the old binary or the new one, never half of one. A destination that
//! already holds the same bytes is left alone. Folders on the way are created 0755; a
//! destination that is a symlink or not a regular file is refused.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The running binary, as the kernel knows it (not a path someone could swap meanwhile).
const SELF_EXE: &str = "/proc/self/exe";

/// What [`install`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Installed {
    /// The destination was written (`bytes` long).
    Copied { bytes: u64 },
    /// The destination already held the same bytes.
    Unchanged { bytes: u64 },
}

/// Why [`install`] failed: what, where, and the system's error.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The destination is not an absolute path to a file.
    #[error("{0}: the destination must be an absolute path naming a file, e.g. /var/lib/edra/bin/edra")]
    BadDestination(PathBuf),
    /// The destination exists and is not a regular file.
    #[error("{0} exists and is not a regular file (a symlink, folder or device): remove it first")]
    NotAFile(PathBuf),
    /// A file operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> InstallError + 'a {
    move |source| InstallError::Io { what, path: path.to_path_buf(), source }
}

/// Copies the running binary to `dest` (mode 0755), atomically.
pub fn install(dest: &Path) -> Result<Installed, InstallError> {
    install_from(Path::new(SELF_EXE), dest)
}

/// Copies `source` to `dest` (mode 0755), atomically; [`install`] with any source.
pub fn install_from(source: &Path, dest: &Path) -> Result<Installed, InstallError> {
    let (Some(dir), Some(name)) = (dest.parent(), dest.file_name()) else {
        return Err(InstallError::BadDestination(dest.to_path_buf()));
    };
    if !dest.is_absolute() {
        return Err(InstallError::BadDestination(dest.to_path_buf()));
    }
    let binary = std::fs::read(source).map_err(io_err("reading", source))?;
    let bytes = u64::try_from(binary.len()).unwrap_or(u64::MAX);
    match std::fs::symlink_metadata(dest) {
        Ok(m) if !m.file_type().is_file() => return Err(InstallError::NotAFile(dest.to_path_buf())),
        Ok(m) if m.len() == bytes && same_bytes(dest, &binary)? => {
            if m.permissions().mode() & 0o7777 != 0o755 {
                std::fs::set_permissions(dest, std::fs::Permissions::from_mode(0o755))
                    .map_err(io_err("setting the mode of", dest))?;
            }
            return Ok(Installed::Unchanged { bytes });
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("inspecting", dest)(e)),
    }
    std::fs::DirBuilder::new().recursive(true).mode(0o755).create(dir).map_err(io_err("creating", dir))?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(".new.{}", std::process::id()));
    let temp = dir.join(temp_name);
    // A temporary file left by a copy that was killed: this process's id is ours now.
    let _ = std::fs::remove_file(&temp);
    let written = write_new(&temp, &binary).and_then(|()| {
        std::fs::rename(&temp, dest).map_err(io_err("renaming the copy to", dest))?;
        File::open(dir).and_then(|d| d.sync_all()).map_err(io_err("flushing", dir))
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written.map(|()| Installed::Copied { bytes })
}

/// Whether the regular file `path` holds exactly `bytes`.
fn same_bytes(path: &Path, bytes: &[u8]) -> Result<bool, InstallError> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io_err("reading", path))?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut at = 0usize;
    loop {
        let n = file.read(&mut buf).map_err(io_err("reading", path))?;
        if n == 0 {
            return Ok(at == bytes.len());
        }
        let end = at.checked_add(n).filter(|e| *e <= bytes.len());
        match end {
            Some(end) if bytes[at..end] == buf[..n] => at = end,
            _ => return Ok(false),
        }
    }
}

/// Writes `bytes` to the new file `path` (0755, not through a link) and flushes it.
fn write_new(path: &Path, bytes: &[u8]) -> Result<(), InstallError> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o755)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io_err("creating", path))?;
    // The mode given at creation is masked by the umask.
    file.set_permissions(std::fs::Permissions::from_mode(0o755)).map_err(io_err("setting the mode of", path))?;
    file.write_all(bytes).map_err(io_err("writing", path))?;
    file.sync_all().map_err(io_err("flushing", path))
}

#[cfg(test)]
mod tests;
