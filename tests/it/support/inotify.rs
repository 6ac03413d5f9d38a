//! The names created in a directory as the kubelet's plugin watcher sees them: inotify's
//! `IN_CREATE` and `IN_MOVED_TO` events (fsnotify reports both as a create).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// An inotify watch on one directory, read without blocking.
pub struct CreatedNames {
    fd: OwnedFd,
}

impl CreatedNames {
    /// Starts watching `dir`.
    pub fn watch(dir: &Path) -> CreatedNames {
        // SAFETY: inotify_init1 with constant flags; a non-negative result is a new
        // descriptor nothing else owns.
        let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(raw >= 0, "inotify_init1: {}", std::io::Error::last_os_error());
        // SAFETY: `raw` was just returned by inotify_init1 and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).expect("a path without NUL");
        // SAFETY: the descriptor is open and `c` is a NUL-terminated path, both for the call.
        let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c.as_ptr(), libc::IN_CREATE | libc::IN_MOVED_TO) };
        assert!(wd >= 0, "inotify_add_watch {}: {}", dir.display(), std::io::Error::last_os_error());
        CreatedNames { fd }
    }

    /// The names created (or moved in) since the watch started or the last call, in order.
    pub fn take(&self) -> Vec<String> {
        let mut names = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            // SAFETY: `buf` is valid for writes of its length; the descriptor is open.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            let Ok(n) = usize::try_from(n) else { return names };
            if n == 0 {
                return names;
            }
            // struct inotify_event: wd (i32), mask, cookie, len (u32), then `len` name bytes.
            let mut at = 0;
            while at + 16 <= n {
                let field = |i: usize| u32::from_ne_bytes(buf[at + i..at + i + 4].try_into().expect("4 bytes"));
                let len = field(12) as usize;
                let name = &buf[at + 16..(at + 16 + len).min(n)];
                let name = name.split(|b| *b == 0).next().unwrap_or_default();
                names.push(String::from_utf8_lossy(name).into_owned());
                at += 16 + len;
            }
        }
    }
}
