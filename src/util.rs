//! Small helpers every layer uses and that depend on nothing else in edra: the version
//! string, the one-line rendering of an error with its causes, atomic and link-safe file
//! writes, bounded reads of a child's output, a Unix socket bound private (0600) without
//! touching the process's umask, the API server's Quantity text, waiting for shutdown, and
//! the escaping of control characters in text from outside before it reaches a terminal or
//! the log ([`escape_controls`]).

/// edra's version, from Cargo.toml.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The error and its causes on one line.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    out
}

/// Whether `c` is a control character a terminal may act on: C0 (U+0000–U+001F), DEL
/// (U+007F) or C1 (U+0080–U+009F).
pub fn is_control(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}')
}

/// `s` with every control character ([`is_control`]) written as Rust writes it in a
/// string's `Debug` form, `\u{1b}` for ESC, `\u{d}` for CR, so that text from outside (an
/// API server's message, a claim's name, a driver's string) can neither move the cursor,
/// retitle or clear a terminal, nor start a line of its own in output or a log. Text
/// without control characters is borrowed unchanged.
pub fn escape_controls(s: &str) -> std::borrow::Cow<'_, str> {
    use std::fmt::Write as _;
    escape_chars(s, is_control, |out, c| write!(out, "\\u{{{c:x}}}"))
}

/// JSON text (as serde_json writes it) with the raw DEL and C1 characters inside its
/// strings written as `\u007f`–`\u009f` escapes: serde_json escapes C0 but passes these
/// through, and a terminal may take U+009B for an escape sequence's start. The document
/// means the same; C0 outside strings (the pretty form's newlines) is kept.
pub fn escape_json_controls(json: &str) -> std::borrow::Cow<'_, str> {
    use std::fmt::Write as _;
    escape_chars(json, |c| matches!(c, '\u{7f}'..='\u{9f}'), |out, c| write!(out, "\\u{c:04x}"))
}

/// `s` with each character `which` picks written by `escape` (given its code point); `s`
/// itself, borrowed, when there is none.
fn escape_chars(
    s: &str,
    which: impl Fn(char) -> bool,
    escape: impl Fn(&mut String, u32) -> std::fmt::Result,
) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(&which) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len().saturating_add(16));
    for c in s.chars() {
        if which(c) {
            let _ = escape(&mut out, u32::from(c));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Returns once `shutdown` is true, or its sender is gone (as `edra run` stops then too).
pub async fn stopped(shutdown: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Runs `work` unless `shutdown` turns true first (`None` then).
pub async fn until_stopped<T>(
    work: impl std::future::Future<Output = T>,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
) -> Option<T> {
    tokio::select! {
        out = work => Some(out),
        () = stopped(shutdown) => None,
    }
}

/// Puts a new file or link at `path` atomically: `create` makes it at `tmp` (a name in the
/// same directory), then it is renamed over `path`. `create` must fail with
/// `AlreadyExists` when `tmp` exists (exclusive creation): a stale one left there (or
/// anything planted under its name) is then removed and `create` runs once more. On
/// failure `tmp` is removed and `path` is left as it was.
pub fn replace_atomically(
    path: &std::path::Path,
    tmp: &std::path::Path,
    mut create: impl FnMut(&std::path::Path) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let result = (|| {
        // The temp name is almost never there: trying first saves an unlink per write.
        match create(tmp) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                std::fs::remove_file(tmp)?;
                create(tmp)?;
            }
            other => other?,
        }
        std::fs::rename(tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    result
}

/// [`replace_atomically`] with a regular file holding `contents` with permissions `mode`,
/// created exclusively without following links and synced to disk before the rename.
pub fn write_atomically(
    path: &std::path::Path,
    tmp: &std::path::Path,
    contents: &[u8],
    mode: u32,
) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    replace_atomically(path, tmp, |tmp| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(contents)?;
        f.sync_all()
    })
}

/// The contents of the regular file `path`, opened without following a link at its last
/// component, when it holds at most `max` bytes: a link, a folder, a device or a longer file
/// is an error saying which (`InvalidData`), so text others could plant or grow is never
/// read whole.
pub fn read_small_file(path: &std::path::Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{} is a symbolic link; edra does not follow it", path.display()),
            ),
            _ => e,
        })?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is not a regular file", path.display()),
        ));
    }
    let mut out = Vec::new();
    f.take(max.saturating_add(1)).read_to_end(&mut out)?;
    if u64::try_from(out.len()).unwrap_or(u64::MAX) > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is larger than {max} bytes", path.display()),
        ));
    }
    Ok(out)
}

/// Gives the directory `dir` permissions `mode` through a descriptor opened without
/// following a link, so a link planted at `dir` fails instead of changing the mode of
/// whatever it points at.
pub fn set_dir_mode(dir: &std::path::Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir);
    let f = match opened {
        // O_DIRECTORY | O_NOFOLLOW on a link fails with ENOTDIR (or ELOOP).
        Err(_) if std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) => {
            return Err(std::io::Error::other(format!(
                "{} is a symbolic link; edra does not follow it",
                dir.display()
            )));
        }
        other => other?,
    };
    f.set_permissions(std::fs::Permissions::from_mode(mode))
}

/// The credentials of the process at the other end of the connected Unix socket `socket`
/// (`SO_PEERCRED`: its pid, uid and gid when it connected or listened).
pub fn peer_credentials(socket: std::os::fd::BorrowedFd<'_>) -> std::io::Result<libc::ucred> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::ucred>()).map_err(std::io::Error::other)?;
    // SAFETY: `cred` and `len` are valid for writes and `len` is the size of `cred`, as
    // getsockopt(SO_PEERCRED) requires; the descriptor is borrowed for the call.
    let rc = unsafe {
        libc::getsockopt(socket.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&raw mut cred).cast(), &mut len)
    };
    if rc == 0 { Ok(cred) } else { Err(std::io::Error::last_os_error()) }
}

/// A listening Unix socket bound at `at`, whose file is created with mode 0600 (less the
/// umask) rather than made private after it appears: Linux gives the file the mode of the
/// socket's own inode at bind, which `fchmod` on the unbound socket sets. The process's
/// umask is never changed: it is shared by every thread, and a file another thread created
/// meanwhile would get the narrow mask.
pub fn listen_private(at: &std::path::Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let bytes = at.as_os_str().as_bytes();
    // SAFETY: zeroed sockaddr_un is a valid value of this plain C struct.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a usable Unix socket path"));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: socket(2) with constant arguments; a non-negative result is a new descriptor
    // that nothing else owns, so `OwnedFd` may take it.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket(2) and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fchmod only reads the descriptor, which `fd` keeps open.
    if unsafe { libc::fchmod(fd.as_raw_fd(), 0o600) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + 1;
    let len = libc::socklen_t::try_from(len).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: `addr` is a valid sockaddr_un whose first `len` bytes hold the family and the
    // NUL-terminated path; the descriptor is open for the call.
    if unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast::<libc::sockaddr>(), len) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: listen only reads the descriptor, which `fd` keeps open.
    if unsafe { libc::listen(fd.as_raw_fd(), libc::SOMAXCONN) } != 0 {
        let err = std::io::Error::last_os_error();
        let _ = std::fs::remove_file(at);
        return Err(err);
    }
    Ok(std::os::unix::net::UnixListener::from(fd))
}

/// A tokio listener bound 0600 at `path` ([`listen_private`]) for one of the agent's own
/// sockets: its directory is made, a socket a previous agent left is replaced, and any
/// other file in the way is refused rather than removed.
pub fn bind_replacing(path: &std::path::Path) -> std::io::Result<tokio::net::UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => std::fs::remove_file(path)?,
        Ok(_) => {
            let what = "a file that is not a socket is in the way; remove it";
            return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, what));
        }
        Err(_) => {}
    }
    let listener = listen_private(path)?;
    listener.set_nonblocking(true)?;
    tokio::net::UnixListener::from_std(listener)
}

/// `v` as the API server's canonical Quantity text, which it returns unchanged: a
/// multiple of 1024 (from 1024 up) in binary-SI form with the largest exact suffix
/// (`85899345920` → `80Gi`), anything else in decimal-SI form with the largest exact
/// power-of-1000 suffix (`108` → `108`, `2000` → `2k`). The server keeps the format it
/// parsed but rewrites the number canonically, so a plain integer is not always returned
/// unchanged (`85000000000` comes back as `85G`); writing the canonical text keeps a
/// read-back slice equal to the desired one.
/// Reads `pipe` to its end on a thread of its own (so the writer never blocks on a full
/// pipe), keeping the first `limit` bytes.
pub fn read_capped<R: std::io::Read + Send + 'static>(
    pipe: Option<R>,
    limit: usize,
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        if let Some(mut pipe) = pipe {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let room = limit.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
        kept
    })
}

/// Waits for `child` at most `limit`, looking every `poll`: its exit status, or `None` when
/// it was still running at the limit (it is then killed and reaped).
pub fn wait_bounded(
    child: &mut std::process::Child,
    limit: std::time::Duration,
    poll: std::time::Duration,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(poll);
    }
}

/// fsyncs a file or directory by path.
pub fn sync_path(path: &std::path::Path) -> std::io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

pub fn quantity(v: u64) -> String {
    if v >= 1024 && v.is_multiple_of(1024) {
        let mut n = v;
        let mut i = 0;
        while n.is_multiple_of(1024) && i < 6 {
            n /= 1024;
            i += 1;
        }
        return format!("{n}{}", ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][i]);
    }
    if v == 0 {
        return "0".into();
    }
    let mut n = v;
    let mut i = 0;
    while n.is_multiple_of(1000) && i < 6 {
        n /= 1000;
        i += 1;
    }
    format!("{n}{}", ["", "k", "M", "G", "T", "P", "E"][i])
}

/// What to do about a kubelet directory that is missing and cannot be made (said both
/// where the node lock and where the plugin sockets find it missing).
pub const KUBELET_DIR_MISSING_FIX: &str = "is the kubelet running? It makes its plugin directory when it starts; \
     edra is started again until it exists (under systemd, ReadWritePaths= opens only directories present when \
     edra starts). If the kubelet runs with another --root-dir, set kubelet.root_dir in edra's config";

pub mod fdpass;
pub mod fdstore;

#[cfg(test)]
mod tests;
