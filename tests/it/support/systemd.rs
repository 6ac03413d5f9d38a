//! systemd's side of a child agent, as the service manager does it: the notification
//! socket's messages with the descriptors they carry (`FDSTORE=1`), and a file descriptor
//! store handed to the next process as `LISTEN_FDS` / `LISTEN_FDNAMES` / `LISTEN_PID`.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use tokio::io::Interest;
use tokio::net::UnixDatagram;

/// One datagram on the notification socket and the descriptors it carried.
#[derive(Debug)]
pub struct Notification {
    pub text: String,
    pub fds: Vec<OwnedFd>,
}

impl Notification {
    /// The value of `key` in the message, if it is assigned there.
    pub fn value(&self, key: &str) -> Option<&str> {
        self.text.lines().find_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
    }
}

/// Receives one notification with its descriptors (`SCM_RIGHTS`).
pub async fn recv(socket: &UnixDatagram) -> std::io::Result<Notification> {
    socket.async_io(Interest::READABLE, || recv_now(socket.as_raw_fd())).await
}

/// Drops every notification still queued, with the descriptors it carries.
pub fn drain(socket: &UnixDatagram) {
    while recv_now(socket.as_raw_fd()).is_ok() {}
}

fn recv_now(fd: RawFd) -> std::io::Result<Notification> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: `fd` is the caller's socket, open for the call.
    let socket = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let (n, fds) = edra::util::fdpass::recv_with_fds(socket, &mut buf, libc::MSG_DONTWAIT)?;
    Ok(Notification { text: String::from_utf8_lossy(&buf[..n]).into_owned(), fds })
}

/// A file descriptor store: what the child stored, by name, less what it removed.
#[derive(Debug, Default)]
pub struct FdStore {
    pub fds: Vec<(String, OwnedFd)>,
}

impl FdStore {
    /// Applies `note`'s `FDSTORE=1` / `FDSTOREREMOVE=1` as systemd does (a descriptor
    /// already stored is stored once).
    pub fn apply(&mut self, note: Notification) {
        let name = note.value("FDNAME").unwrap_or("stored").to_string();
        if note.value("FDSTOREREMOVE") == Some("1") {
            self.fds.retain(|(n, _)| *n != name);
        }
        if note.value("FDSTORE") == Some("1") {
            for fd in note.fds {
                if !self.fds.iter().any(|(_, kept)| same_socket(kept, &fd)) {
                    self.fds.push((name.clone(), fd));
                }
            }
        }
    }

    /// The stored names, sorted, with their device and inode left out.
    pub fn roles(&self) -> Vec<String> {
        let mut roles: Vec<String> =
            self.fds.iter().map(|(n, _)| n.split('.').next().unwrap_or_default().to_string()).collect();
        roles.sort();
        roles
    }

    /// Duplicates of the stored descriptors, in order, and `LISTEN_FDNAMES`.
    pub fn to_pass(&self) -> (Vec<OwnedFd>, String) {
        let fds = self.fds.iter().map(|(_, fd)| fd.try_clone().expect("duplicate a stored descriptor")).collect();
        let names = self.fds.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(":");
        (fds, names)
    }
}

fn same_socket(a: &OwnedFd, b: &OwnedFd) -> bool {
    use std::os::unix::fs::MetadataExt;
    let meta = |fd: &OwnedFd| std::fs::File::from(fd.try_clone().expect("dup")).metadata().map(|m| (m.dev(), m.ino()));
    matches!((meta(a), meta(b)), (Ok(x), Ok(y)) if x == y)
}

/// Makes `cmd`'s child receive `fds` as descriptors 3, 4, … (`LISTEN_FDS`), as systemd
/// passes its fd store. `LISTEN_PID` must then be set by the child itself (see
/// [`listen_pid_wrapper`]).
pub fn pass_fds(cmd: &mut tokio::process::Command, fds: Vec<OwnedFd>, names: &str) {
    cmd.env("LISTEN_FDS", fds.len().to_string()).env("LISTEN_FDNAMES", names);
    let raws: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    // SAFETY: between fork and exec the closure calls only fcntl and dup2, which are
    // async-signal-safe, on descriptors the parent holds open (`fds`, moved in).
    unsafe {
        cmd.pre_exec(move || {
            let _keep = &fds;
            // First out of the way of 3.., then into place (dup2 clears close-on-exec).
            let mut high = Vec::with_capacity(raws.len());
            for fd in &raws {
                let h = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 512);
                if h < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                high.push(h);
            }
            for (i, h) in high.iter().enumerate() {
                let target = 3 + i as RawFd;
                if libc::dup2(*h, target) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// A wrapper (program and arguments, then edra's command line) that sets `LISTEN_PID` to
/// the child's own pid before exec'ing edra, as systemd sets it after its fork.
pub fn listen_pid_wrapper() -> Vec<std::ffi::OsString> {
    ["sh", "-c", "LISTEN_PID=$$ exec \"$0\" \"$@\""].iter().map(Into::into).collect()
}
