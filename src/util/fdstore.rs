//! Listening sockets that outlive the process: the ones systemd hands back at start
//! (`LISTEN_PID`, `LISTEN_FDS`, `LISTEN_FDNAMES`, from its file descriptor store), the
//! names edra gives them there, and the checks a socket handed back must pass before it is
//! served again.
//!
//! Under systemd with `FileDescriptorStoreMax=`, edra stores each listening socket it
//! serves in the unit's fd store (`FDSTORE=1`, sent by `telemetry::sdnotify`). systemd keeps
//! it open across a restart, an upgrade, a watchdog kill and kill -9, and passes it to the
//! next process as fd 3 onward. The socket never stops listening: a client that connects in
//! the gap waits in its backlog and is answered by the next process.
//!
//! Each stored socket is named `<role>.<dev>.<ino>` (e.g. `dra.2049.1311`): its role and
//! the device and inode of the socket file it was bound to. A socket handed back is served
//! again only when it is a listening `AF_UNIX` stream socket, its file is still at the path
//! edra serves, is that same file (device and inode), is a socket of this user with mode
//! 0600; anything else is closed (and removed from the store) and the path bound anew.

use std::fs;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// The environment variables systemd passes stored or activated sockets in.
pub const ENV_VARS: [&str; 3] = ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"];
/// The first passed descriptor (`SD_LISTEN_FDS_START`).
const FIRST_FD: RawFd = 3;
/// The most descriptors taken from the environment; more is not edra's unit.
const MOST_FDS: usize = 64;

/// What systemd passed in the environment, captured once by the caller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListenEnv {
    /// `LISTEN_PID`.
    pub pid: Option<String>,
    /// `LISTEN_FDS`.
    pub fds: Option<String>,
    /// `LISTEN_FDNAMES`.
    pub names: Option<String>,
}

impl ListenEnv {
    /// The values of this process's environment.
    pub fn from_process() -> Self {
        let var = |name| std::env::var(name).ok();
        Self { pid: var("LISTEN_PID"), fds: var("LISTEN_FDS"), names: var("LISTEN_FDNAMES") }
    }

    /// How many descriptors, from fd 3 on, are meant for the process `own_pid`, with their
    /// names (`"unknown"` where none is given, as systemd names them). Descriptors meant
    /// for another process (an inherited environment) are none.
    pub fn passed(&self, own_pid: u32) -> Result<Vec<String>, String> {
        let (Some(pid), Some(fds)) = (&self.pid, &self.fds) else { return Ok(Vec::new()) };
        if pid.trim().parse::<u32>().ok() != Some(own_pid) {
            return Ok(Vec::new());
        }
        let n: usize = fds.trim().parse().map_err(|_| format!("LISTEN_FDS={fds:?} is not a number"))?;
        if n > MOST_FDS {
            return Err(format!("LISTEN_FDS={n}: more than the {MOST_FDS} descriptors edra takes"));
        }
        let mut names: Vec<String> =
            self.names.as_deref().map(|s| s.split(':').map(str::to_string).collect()).unwrap_or_default();
        names.resize(n, "unknown".to_string());
        Ok(names)
    }
}

/// Sockets handed back at start, by name, until each is taken or dropped.
#[derive(Debug, Default)]
pub struct Inherited {
    fds: Vec<(String, OwnedFd)>,
}

impl Inherited {
    /// Takes ownership of the descriptors `env` passes to this process (fd 3 onward) and
    /// marks them close-on-exec, so no child process inherits a listening socket.
    pub fn from_env(env: &ListenEnv) -> Result<Self, String> {
        let names = env.passed(std::process::id())?;
        let mut fds = Vec::with_capacity(names.len());
        for (i, name) in names.into_iter().enumerate() {
            let fd =
                FIRST_FD.checked_add(RawFd::try_from(i).map_err(|_| "too many descriptors")?).ok_or("fd overflow")?;
            // SAFETY: fcntl(F_GETFD) on any integer is safe; it fails with EBADF when the
            // descriptor is not open.
            if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
                return Err(format!("LISTEN_FDS names descriptor {fd}, which is not open"));
            }
            // SAFETY: systemd passed descriptors FIRST_FD.. to this process (LISTEN_PID is
            // ours, checked above) and nothing else in edra owns them; they are taken once.
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: fcntl(F_SETFD) on a descriptor this process owns.
            unsafe { libc::fcntl(owned.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
            fds.push((name, owned));
        }
        Ok(Self { fds })
    }

    /// The process's inherited sockets (none when systemd passed none). Called once, early.
    pub fn from_process() -> Result<Self, String> {
        Self::from_env(&ListenEnv::from_process())
    }

    /// Sockets given directly, for tests and for sockets passed by other means.
    pub fn from_fds(fds: Vec<(String, OwnedFd)>) -> Self {
        Self { fds }
    }

    /// Takes the socket stored for `role` (named `<role>.<dev>.<ino>`), with its name.
    pub fn take(&mut self, role: &str) -> Option<(String, OwnedFd)> {
        let at = self.fds.iter().position(|(name, _)| parse_name(name).is_some_and(|(r, _, _)| r == role))?;
        Some(self.fds.swap_remove(at))
    }

    /// The names of the sockets nobody took, dropping (closing) them.
    pub fn drop_rest(&mut self) -> Vec<String> {
        self.fds.drain(..).map(|(name, _)| name).collect()
    }

    /// Whether none is left.
    pub fn is_empty(&self) -> bool {
        self.fds.is_empty()
    }
}

/// The name a socket for `role` bound to the file (`dev`, `ino`) is stored under.
pub fn store_name(role: &str, dev: u64, ino: u64) -> String {
    format!("{role}.{dev}.{ino}")
}

/// The role, device and inode of a stored socket's name.
pub fn parse_name(name: &str) -> Option<(&str, u64, u64)> {
    let mut parts = name.rsplitn(3, '.');
    let ino = parts.next()?.parse().ok()?;
    let dev = parts.next()?.parse().ok()?;
    let role = parts.next().filter(|r| !r.is_empty())?;
    Some((role, dev, ino))
}

/// Checks that `fd`, stored as `name`, is a listening `AF_UNIX` stream socket whose file is
/// still `path`: the file named (device and inode), a socket of this user, mode 0600.
/// Returns the file's (device, inode), or what is wrong.
pub fn check_stored_socket(fd: BorrowedFd<'_>, name: &str, path: &Path) -> Result<(u64, u64), String> {
    let (_, dev, ino) = parse_name(name).ok_or_else(|| format!("its name {name:?} is not one edra gives"))?;
    let opt = |level, option| -> Result<libc::c_int, String> {
        let mut value: libc::c_int = 0;
        let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).map_err(|e| e.to_string())?;
        // SAFETY: `value` and `len` are valid for writes, `len` is the size of `value`;
        // the descriptor is borrowed for the call.
        let rc = unsafe { libc::getsockopt(fd.as_raw_fd(), level, option, (&raw mut value).cast(), &mut len) };
        if rc == 0 { Ok(value) } else { Err(format!("it is not a socket ({})", std::io::Error::last_os_error())) }
    };
    if opt(libc::SOL_SOCKET, libc::SO_DOMAIN)? != libc::AF_UNIX {
        return Err("it is not a Unix socket".into());
    }
    if opt(libc::SOL_SOCKET, libc::SO_TYPE)? != libc::SOCK_STREAM {
        return Err("it is not a stream socket".into());
    }
    if opt(libc::SOL_SOCKET, libc::SO_ACCEPTCONN)? != 1 {
        return Err("it is not listening".into());
    }
    let meta = fs::symlink_metadata(path).map_err(|e| format!("its file {} is gone ({e})", path.display()))?;
    if !meta.file_type().is_socket() {
        return Err(format!("{} is not a socket any more", path.display()));
    }
    if (meta.dev(), meta.ino()) != (dev, ino) {
        return Err(format!("{} is another socket file now", path.display()));
    }
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != euid || meta.mode() & 0o7777 != 0o600 {
        return Err(format!(
            "{} has owner {} and mode {:o}, not {} and 600",
            path.display(),
            meta.uid(),
            meta.mode() & 0o7777,
            euid
        ));
    }
    Ok((dev, ino))
}

#[cfg(test)]
mod tests;
