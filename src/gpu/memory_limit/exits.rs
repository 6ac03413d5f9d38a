//! When a container's processes are all gone: cgroup v2's `cgroup.events` file says
//! `populated 0` once a cgroup and its descendants hold no process, and the kernel
//! signals a modification of that file on every change ("a value change in this file
//! generates a file modified event", the kernel's cgroup-v2 documentation). The runtime
//! removes the cgroup only later, when the container is deleted, so a limit can still be
//! cleared in between.
//!
//! [`CgroupExits`] is one inotify instance watching the `cgroup.events` of the cgroups
//! given to it; [`populated`] reads a cgroup's state. The watcher says only *that*
//! something changed: the caller looks at the cgroups it cares about, so a lost event (the
//! queue overflowing) costs nothing but a look. Watches go by themselves when their
//! cgroup is removed.

use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The file of a cgroup that says whether it holds processes.
pub const EVENTS: &str = "cgroup.events";
/// The most of `cgroup.events` read (it is two short lines).
const EVENTS_LIMIT: u64 = 4096;

/// Whether the cgroup directory `cgroup` holds processes: `Some(false)` once its
/// `cgroup.events` says `populated 0`, `None` where the file cannot be read or says
/// neither (a cgroup that is gone, or a directory that is not a cgroup).
pub fn populated(cgroup: &Path) -> Option<bool> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(cgroup.join(EVENTS))
        .ok()?;
    let mut text = String::new();
    file.take(EVENTS_LIMIT).read_to_string(&mut text).ok()?;
    parse_populated(&text)
}

/// The `populated` value of a `cgroup.events` text.
pub fn parse_populated(text: &str) -> Option<bool> {
    text.lines().find_map(|l| match l.split_once(' ') {
        Some(("populated", "0")) => Some(false),
        Some(("populated", "1")) => Some(true),
        _ => None,
    })
}

/// One inotify instance watching cgroups' `cgroup.events` (non-blocking, close-on-exec).
#[derive(Debug)]
pub struct CgroupExits {
    fd: OwnedFd,
}

impl CgroupExits {
    /// A new instance, watching nothing yet.
    pub fn new() -> io::Result<CgroupExits> {
        // SAFETY: inotify_init1 takes flags only and returns a new descriptor or -1.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by inotify_init1 and is owned by nothing else.
        Ok(CgroupExits { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Watches the `cgroup.events` of the cgroup directory `cgroup` (again is harmless:
    /// the kernel keeps one watch per file). Links are not followed.
    pub fn watch(&self, cgroup: &Path) -> io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(cgroup.join(EVENTS).as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a cgroup path holds a NUL byte"))?;
        let mask = libc::IN_MODIFY | libc::IN_DONT_FOLLOW;
        // SAFETY: `path` is a valid C string for the call's duration; the descriptor is ours.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), path.as_ptr(), mask) };
        if wd < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    /// Reads every queued event without blocking; whether there was any (an overflowed
    /// queue counts as one).
    pub fn drain(&self) -> io::Result<bool> {
        let mut buf = [0u8; 4096];
        let mut any = false;
        loop {
            // SAFETY: `buf` is valid for writes of its length; the descriptor is ours.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n > 0 {
                any = true;
                continue;
            }
            if n == 0 {
                return Ok(any);
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::WouldBlock => return Ok(any),
                io::ErrorKind::Interrupted => {}
                _ => return Err(err),
            }
        }
    }
}

impl AsRawFd for CgroupExits {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
