//! The plugin's Unix socket files: directories, stale-socket cleanup, binding with mode
//! 0600 under a hidden name in edra's own directory then renaming into place (so a socket
//! file is always ready to accept, and the kubelet's watcher sees no other name), the stream of accepted connections (each wrapped in [`AuthorityFix`]), and
//! removal of edra's own sockets on exit.
//!
//! Only a socket at edra's own path is ever removed, and on exit only the very socket
//! this process bound (same device and inode): another instance may have replaced it.

use std::fs::{self, DirBuilder, Permissions};
use std::io;
use std::net::Shutdown;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener as StdUnixListener, UnixStream as StdUnixStream};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::server::Connected;

use super::PluginError;
use super::authority::AuthorityFix;

/// The longest socket path `AF_UNIX` takes (108 bytes including the terminating NUL).
const MAX_SOCKET_PATH: usize = 107;
/// Pause after a failed accept (e.g. out of file descriptors) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// How long after the stop a socket's last accepted connections have to send their first
/// call before the server stops ([`incoming`]).
pub(crate) const STOP_SETTLE: Duration = Duration::from_millis(100);

/// A bound listening socket and the identity of its file.
#[derive(Debug)]
pub(crate) struct BoundSocket {
    pub(crate) path: PathBuf,
    pub(crate) listener: UnixListener,
    pub(crate) file: FileId,
}

/// Serves `path` on the socket `inherited` (one handed back from systemd's fd store, with
/// its name) when it passes [`crate::util::fdstore::check_stored_socket`]; otherwise (or
/// without one) closes it and binds anew ([`bind`]).
pub(crate) fn adopt_or_bind(
    path: &Path,
    stage: &Path,
    inherited: Option<(String, std::os::fd::OwnedFd)>,
) -> Result<BoundSocket, PluginError> {
    use std::os::fd::AsFd;
    if let Some((name, fd)) = inherited {
        match crate::util::fdstore::check_stored_socket(fd.as_fd(), &name, path) {
            Ok((dev, ino)) => {
                let listener = StdUnixListener::from(fd);
                let adopted = listener.set_nonblocking(true).and_then(|()| UnixListener::from_std(listener));
                match adopted {
                    Ok(listener) => {
                        tracing::info!(path = %path.display(), "serving the socket the previous edra kept open");
                        return Ok(BoundSocket { path: path.to_path_buf(), listener, file: FileId { dev, ino } });
                    }
                    Err(e) => tracing::warn!(path = %path.display(), error = %e,
                        "cannot serve the socket kept open across the restart; binding anew"),
                }
            }
            Err(why) => {
                tracing::warn!(path = %path.display(), reason = %why,
                    "the socket kept open across the restart is not the one edra serves; closing it and binding anew");
                // Its own file (the stored copy keeps it answering connections) goes too.
                if let Some((_, dev, ino)) = crate::util::fdstore::parse_name(&name)
                    && fs::symlink_metadata(path)
                        .is_ok_and(|m| m.file_type().is_socket() && (m.dev(), m.ino()) == (dev, ino))
                {
                    let _ = fs::remove_file(path);
                }
            }
        }
    }
    bind(path, stage)
}

/// Device and inode of a socket file this process created (or was handed back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    pub(crate) fn dev(self) -> u64 {
        self.dev
    }

    pub(crate) fn ino(self) -> u64 {
        self.ino
    }
}

/// Creates `dir` (and missing parents) with mode 0750 if it does not exist. With
/// `owned`, the directory belongs to edra and its mode is set to 0750 even if it exists.
pub(crate) fn prepare_dir(dir: &Path, owned: bool) -> Result<(), PluginError> {
    let failed = |source| PluginError::CreateDir { path: dir.to_path_buf(), source };
    DirBuilder::new().recursive(true).mode(0o750).create(dir).map_err(|source: io::Error| {
        // Not made because where it belongs cannot be written: the kubelet has not made it.
        let missing = matches!(source.raw_os_error(), Some(libc::EROFS | libc::EACCES | libc::EPERM));
        if missing && !dir.is_dir() {
            PluginError::KubeletDirMissing { path: outer_missing(dir), source }
        } else {
            failed(source)
        }
    })?;
    if owned {
        crate::util::set_dir_mode(dir, 0o750).map_err(failed)?;
    } else if let Ok(meta) = fs::metadata(dir)
        && meta.mode() & 0o007 != 0
        // One others can write in is reported at start, with its fix (crate::dirmode).
        && !crate::dirmode::writable_by_others(meta.mode() & 0o7777, meta.uid())
    {
        tracing::warn!(path = %dir.display(), mode = format!("{:o}", meta.mode() & 0o7777), "directory is accessible to every user");
    }
    Ok(())
}

/// The outermost missing directory on the way to `dir` (the one the kubelet should have
/// made), or `dir` itself.
fn outer_missing(dir: &Path) -> PathBuf {
    let mut missing = dir;
    while let Some(parent) = missing.parent()
        && !parent.as_os_str().is_empty()
        && !parent.exists()
    {
        missing = parent;
    }
    missing.to_path_buf()
}

/// Binds a listening socket at `path`, replacing a stale socket of that name; anything
/// else at the path is an error and is left alone.
///
/// The socket is private (mode 0600) from the moment its file exists, and is bound and
/// listening under a hidden name in `stage` (a directory edra owns) before it is renamed
/// to `path`: a client that connects as soon as it sees the file is never refused, and a
/// watcher of `path`'s directory (the kubelet's plugin watcher on the registry directory)
/// sees no name but the final one. When the rename cannot cross from `stage` to `path`'s
/// directory (another filesystem or mount, as under systemd's `ReadWritePaths=` or in a
/// pod with one volume per directory), the socket is bound at `path` itself instead:
/// still private from the start, listening a few system calls later.
pub(crate) fn bind(path: &Path, stage: &Path) -> Result<BoundSocket, PluginError> {
    if path.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(PluginError::SocketPathTooLong { path: path.to_path_buf(), max: MAX_SOCKET_PATH });
    }
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            // A socket someone still listens on belongs to a running process (another
            // edra): never take it over.
            if let Ok(live) = StdUnixStream::connect(path) {
                return Err(PluginError::SocketInUse { path: path.to_path_buf(), pid: peer_pid(&live) });
            }
            tracing::info!(path = %path.display(), "removing a stale socket left by an earlier run");
            fs::remove_file(path).map_err(|source| PluginError::RemoveStale { path: path.to_path_buf(), source })?;
        }
        Ok(_) => return Err(PluginError::NotASocket { path: path.to_path_buf() }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(PluginError::Inspect { path: path.to_path_buf(), source }),
    }
    // Where earlier versions bound it, beside `path`: a socket a killed one left there goes.
    if let Some(old) = staged_name(path, path.parent().unwrap_or(stage))
        && old.parent() != Some(stage)
        && fs::symlink_metadata(&old).is_ok_and(|m| m.file_type().is_socket())
    {
        let _ = fs::remove_file(&old);
    }
    let bind_err = |source| PluginError::Bind { path: path.to_path_buf(), source };
    let listener = match staged_name(path, stage).filter(|h| h.as_os_str().len() <= MAX_SOCKET_PATH) {
        Some(staged) => match bind_staged(&staged, path)? {
            Some(listener) => listener,
            None => {
                tracing::debug!(path = %path.display(), stage = %stage.display(), "another filesystem or mount than the staging directory; binding in place");
                crate::util::listen_private(path).map_err(bind_err)?
            }
        },
        // A path too long for the staged name is bound in place.
        None => crate::util::listen_private(path).map_err(bind_err)?,
    };
    let listener =
        listener.set_nonblocking(true).and_then(|()| UnixListener::from_std(listener)).map_err(|source| {
            let _ = fs::remove_file(path);
            bind_err(source)
        })?;
    match fs::symlink_metadata(path) {
        Ok(meta) => {
            Ok(BoundSocket { path: path.to_path_buf(), listener, file: FileId { dev: meta.dev(), ino: meta.ino() } })
        }
        Err(source) => {
            let _ = fs::remove_file(path);
            Err(PluginError::Chmod { path: path.to_path_buf(), source })
        }
    }
}

/// Binds at `staged` (edra's own directory, so the name and its mode are edra's alone) and
/// renames it to `path`; `None` when the rename cannot cross to `path`'s filesystem or
/// mount (`EXDEV`), with the staged socket removed.
fn bind_staged(staged: &Path, path: &Path) -> Result<Option<StdUnixListener>, PluginError> {
    let bind_err = |source| PluginError::Bind { path: path.to_path_buf(), source };
    if fs::symlink_metadata(staged).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = fs::remove_file(staged);
    }
    let listener = crate::util::listen_private(staged).map_err(bind_err)?;
    // Exactly 0600 whatever the umask took away from the owner.
    if let Err(source) = fs::set_permissions(staged, Permissions::from_mode(0o600)) {
        let _ = fs::remove_file(staged);
        return Err(PluginError::Chmod { path: path.to_path_buf(), source });
    }
    match fs::rename(staged, path) {
        Ok(()) => Ok(Some(listener)),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            let _ = fs::remove_file(staged);
            Ok(None)
        }
        Err(source) => {
            let _ = fs::remove_file(staged);
            Err(bind_err(source))
        }
    }
}

/// The pid of the process at the other end of a connected Unix socket (`SO_PEERCRED`).
fn peer_pid(stream: &StdUnixStream) -> Option<u32> {
    use std::os::fd::AsFd;
    let cred = crate::util::peer_credentials(stream.as_fd()).ok()?;
    u32::try_from(cred.pid).ok().filter(|p| *p != 0)
}

/// `<stage>/.<name>~`: where the socket for `path` is bound before it is renamed there.
fn staged_name(path: &Path, stage: &Path) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    Some(stage.join(format!(".{name}~")))
}

/// Removes the socket file at `path` if it is still the one this process bound.
pub(crate) fn remove_own(path: &Path, file: FileId) {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() && FileId { dev: meta.dev(), ino: meta.ino() } == file => {
            match fs::remove_file(path) {
                Ok(()) => tracing::debug!(path = %path.display(), "removed socket"),
                Err(e) => tracing::warn!(path = %path.display(), error = %e, "could not remove own socket"),
            }
        }
        Ok(_) => tracing::warn!(path = %path.display(), "socket path now belongs to someone else; leaving it"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(path = %path.display(), error = %e, "could not inspect own socket"),
    }
}

/// An accepted connection: the incoming `:authority` rewritten (see [`AuthorityFix`]),
/// and closable by the server when the shutdown grace period is over.
pub struct PluginStream {
    io: AuthorityFix<UnixStream>,
    /// A duplicate of the socket; closed with this stream, so only a weak reference in
    /// [`Connections`] outlives it.
    _handle: Arc<StdUnixStream>,
}

impl Connected for PluginStream {
    type ConnectInfo = <UnixStream as Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.get_ref().connect_info()
    }
}

impl AsyncRead for PluginStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for PluginStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The open connections of one socket, so they can be closed when the grace period
/// is over (the HTTP/2 server runs each connection as its own task).
#[derive(Debug, Default)]
pub(crate) struct Connections {
    open: Mutex<Vec<Weak<StdUnixStream>>>,
}

impl Connections {
    fn track(&self, stream: UnixStream) -> io::Result<PluginStream> {
        let std = stream.into_std()?;
        let handle = Arc::new(std.try_clone()?);
        let stream = UnixStream::from_std(std)?;
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|c| c.strong_count() > 0);
        open.push(Arc::downgrade(&handle));
        Ok(PluginStream { io: AuthorityFix::new(stream), _handle: handle })
    }

    /// Shuts down every open connection in both directions; the server sees the peer
    /// gone and drops the connection.
    pub(crate) fn close_all(&self) -> usize {
        let open = std::mem::take(&mut *self.open.lock().unwrap_or_else(PoisonError::into_inner));
        let mut closed = 0;
        for conn in open.iter().filter_map(Weak::upgrade) {
            if conn.shutdown(Shutdown::Both).is_ok() {
                closed += 1;
            }
        }
        closed
    }
}

/// The accepted connections of `listener`, each wrapped and tracked in `connections`, until
/// `stop` fires (or its sender goes): then nothing more is accepted (the next caller waits
/// in the backlog, for the next process where the socket outlives this one), and the
/// stream ends [`STOP_SETTLE`] later, so a connection accepted just before has sent its
/// first call before the server stops gracefully (which lets calls finish, but closes a
/// connection still in its handshake).
pub(crate) fn incoming(
    listener: UnixListener,
    path: PathBuf,
    connections: Arc<Connections>,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> impl Stream<Item = io::Result<PluginStream>> {
    let state = (listener, path, connections, stop);
    futures_util::stream::unfold(state, |(listener, path, connections, mut stop)| async move {
        let accepted = tokio::select! {
            biased;
            _ = &mut stop => None,
            accepted = listener.accept() => Some(accepted),
        };
        let Some(accepted) = accepted else {
            drop(listener);
            tokio::time::sleep(STOP_SETTLE).await;
            return None;
        };
        let next = match accepted.and_then(|(stream, _)| connections.track(stream)) {
            Ok(stream) => Ok(stream),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "accepting a connection failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                Err(e)
            }
        };
        Some((next, (listener, path, connections, stop)))
    })
}

#[cfg(test)]
mod tests;
