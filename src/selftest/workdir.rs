//! The self-test's own temporary folder, safe in a directory other users can write.
//!
//! The directory it goes in (`--work-dir`, else `$TMPDIR` or /tmp) must be owned by root
//! or by the user running edra, and not writable by group or others unless it has the
//! sticky bit (as /tmp): another user must not be able to rename edra's folder aside and
//! put a link in its place. So must every directory above it. Anything else is refused
//! before a check runs ([`check_base`]).
//!
//! The folder is made with `mkdirat` under a fresh random name relative to a descriptor of
//! that directory, opened with `O_NOFOLLOW | O_DIRECTORY`, and checked with `fstat` to be
//! a directory of edra's user that nobody else may enter. Everything below it is then
//! reached through `/proc/<pid>/fd/<n>` of that held descriptor (checked to lead to the
//! same inode), not through its name: the kernel resolves that path through the
//! descriptor, so renaming the folder, or any folder above it, and planting links in its
//! place changes nothing for the state store, CDI specs, runtime files and hooks that
//! edra's children (which name our pid) reach there. Only the runtime folder, where the
//! MPS daemon bind-mounts its shm folder from a mount namespace of its own (which cannot
//! use such a path), is named by its real path ([`WorkDir::named_path`]), safe by the
//! checks above. At the end its contents are removed
//! through that path and the folder itself by name only while the name still is it.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// What to do when the directory is refused.
pub const FIX: &str = "use a directory owned by root (or by the user running edra) and not writable by others, \
     e.g. `--work-dir /var/tmp`, or make it so with `chown root` and `chmod go-w` (or `chmod +t` for a shared one)";

/// Why the folder could not be made.
#[derive(Debug, thiserror::Error)]
pub enum WorkDirError {
    /// The directory may be changed by another user.
    #[error("refusing {dir} ({origin}) for the self-test's temporary folder: {problem}; {FIX}")]
    Unsafe {
        /// The directory.
        dir: PathBuf,
        /// Where it came from: `--work-dir` or `TMPDIR`.
        origin: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// A system call failed.
    #[error(
        "cannot create the self-test's temporary folder in {dir} ({origin}): {what}; pass --work-dir with a writable folder"
    )]
    Io {
        /// The directory.
        dir: PathBuf,
        /// Where it came from.
        origin: &'static str,
        /// The step that failed.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Whether a directory with `meta` is safe for a folder of user `euid`: owned by root or
/// `euid`, and not writable by group or others unless sticky. The problem otherwise.
pub fn check_base(meta: &std::fs::Metadata, euid: u32) -> Result<(), String> {
    if !meta.is_dir() {
        return Err("it is not a directory".into());
    }
    let (uid, mode) = (meta.uid(), meta.mode());
    if uid != 0 && uid != euid {
        let who = if euid == 0 { "root".to_string() } else { format!("root or uid {euid}") };
        return Err(format!("it is owned by uid {uid}, not by {who}, so that user can rename edra's folder in it"));
    }
    if mode & 0o022 != 0 && mode & libc::S_ISVTX == 0 {
        return Err(format!(
            "it is writable by {} (mode {:o}) without the sticky bit, so others can rename edra's folder in it",
            if mode & 0o002 != 0 { "others" } else { "its group" },
            mode & 0o7777
        ));
    }
    Ok(())
}

/// The folder (0700), held open; removed with everything in it when dropped.
pub struct WorkDir {
    base: File,
    name: OsString,
    dir: File,
    path: PathBuf,
    named: PathBuf,
}

impl WorkDir {
    /// A fresh folder in `base` (`origin` says where `base` came from, for errors).
    pub fn new(base: &Path, origin: &'static str) -> Result<Self, WorkDirError> {
        let io = |what| move |source| WorkDirError::Io { dir: base.to_path_buf(), origin, what, source };
        let unsafe_dir = |problem| WorkDirError::Unsafe { dir: base.to_path_buf(), origin, problem };
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        let base_dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(base)
            .map_err(io("open the directory"))?;
        let held = base_dir.metadata().map_err(io("stat the directory"))?;
        check_base(&held, euid).map_err(unsafe_dir)?;
        let canonical = std::fs::canonicalize(base).map_err(io("resolve the directory"))?;
        let now = std::fs::metadata(&canonical).map_err(io("stat the directory"))?;
        if (now.dev(), now.ino()) != (held.dev(), held.ino()) {
            return Err(unsafe_dir(format!("it changed while it was checked ({} now)", canonical.display())));
        }
        for above in canonical.ancestors().skip(1) {
            let meta = std::fs::metadata(above).map_err(io("stat a directory above it"))?;
            check_base(&meta, euid)
                .map_err(|p| unsafe_dir(format!("the directory above it {}: {p}", above.display())))?;
        }
        Self::make(base_dir, &canonical, euid).map_err(|(what, source)| WorkDirError::Io {
            dir: base.to_path_buf(),
            origin,
            what,
            source,
        })
    }

    /// The folder in the directory `base_dir`, whose name is `canonical`.
    fn make(base_dir: File, canonical: &Path, euid: u32) -> Result<Self, (&'static str, std::io::Error)> {
        let mut tries = 0;
        let name = loop {
            let name = format!("edra-selftest-{}-{:016x}", std::process::id(), fastrand::u64(..));
            match mkdirat(&base_dir, &name) {
                Ok(()) => break OsString::from(name),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 8 => tries += 1,
                Err(e) => return Err(("make the folder", e)),
            }
        };
        // On failure, what is at the name is left alone: it may not be what was made.
        let dir = open_own(&base_dir, &name, euid).map_err(|e| ("open the folder just made", e))?;
        let path = held_path(&dir).map_err(|e| ("reach the folder through /proc/<pid>/fd", e))?;
        let named = canonical.join(&name);
        Ok(WorkDir { base: base_dir, name, dir, path, named })
    }

    /// The folder by its name, for what a child process uses in a mount namespace of its
    /// own, where a `/proc/<pid>/fd` path cannot be bind-mounted (the MPS daemon's shm
    /// folder under the runtime folder). Safe since no directory above it may be changed
    /// by another user ([`WorkDir::new`] checks each).
    pub fn named_path(&self) -> &Path {
        &self.named
    }

    /// The path everything below the folder is reached by (`/proc/<pid>/fd/<n>`).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Ok(entries) = std::fs::read_dir(&self.path) {
            for entry in entries.flatten() {
                let p = entry.path();
                let _ = match entry.file_type() {
                    Ok(t) if t.is_dir() => std::fs::remove_dir_all(&p),
                    _ => std::fs::remove_file(&p),
                };
            }
        }
        // The name is removed only while it still is the folder held (rmdir takes an
        // empty directory only, and follows no link).
        let Ok(held) = self.dir.metadata() else { return };
        let Ok(name) = CString::new(self.name.as_bytes()) else { return };
        // SAFETY: a zeroed stat is a valid out-buffer for fstatat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor, a NUL-terminated name and a stat buffer we own.
        let rc = unsafe { libc::fstatat(self.base.as_raw_fd(), name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
        if rc == 0 && st.st_dev == held.dev() && st.st_ino == held.ino() {
            // SAFETY: as above.
            unsafe { libc::unlinkat(self.base.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) };
        }
    }
}

fn mkdirat(base: &File, name: &str) -> std::io::Result<()> {
    let c = CString::new(name).map_err(std::io::Error::other)?;
    // SAFETY: a valid descriptor and a NUL-terminated name.
    if unsafe { libc::mkdirat(base.as_raw_fd(), c.as_ptr(), 0o700) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Opens `name` in `base` without following a link and checks it is a directory of
/// `euid` that nobody else may enter (as `mkdirat` made it), then makes it exactly 0700.
fn open_own(base: &File, name: &OsString, euid: u32) -> std::io::Result<File> {
    let c = CString::new(name.as_bytes()).map_err(std::io::Error::other)?;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid descriptor and a NUL-terminated name.
    let fd = unsafe { libc::openat(base.as_raw_fd(), c.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: openat just returned this descriptor, owned by nothing else.
    let dir = unsafe { File::from_raw_fd(fd) };
    let meta = dir.metadata()?;
    if !meta.is_dir() || meta.uid() != euid || meta.mode() & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "it is not the folder edra made (uid {}, mode {:o})",
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    dir.set_permissions(std::fs::Permissions::from_mode(0o700))?;
    Ok(dir)
}

/// `/proc/<pid>/fd/<n>` of `dir`, checked to lead to the same directory.
fn held_path(dir: &File) -> std::io::Result<PathBuf> {
    let path = PathBuf::from(format!("/proc/{}/fd/{}", std::process::id(), dir.as_raw_fd()));
    let (via, held) = (std::fs::metadata(&path)?, dir.metadata()?);
    if via.dev() != held.dev() || via.ino() != held.ino() {
        return Err(std::io::Error::other(format!("{} leads elsewhere; is /proc mounted?", path.display())));
    }
    Ok(path)
}

#[cfg(test)]
mod tests;
