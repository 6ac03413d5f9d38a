//! A handover between two edra instances on one node: the running one passes the kubelet's
//! listening sockets to a newer one, so that a rolling update with a surge (the new pod
//! started while the old one serves) never closes them.
//!
//! The running edra offers a handover on `<runtime dir>/handover.sock` (mode 0600, this
//! user only). A newer edra that finds the node locked connects and asks:
//!
//! ```text
//! edra-handover/1 pid=<pid> version=<version> origin=<pod uid or ->
//! ```
//!
//! The running one stops accepting kubelet calls, lets those in flight finish, and answers
//! on the same connection with one line and, attached to it (`SCM_RIGHTS`), its listening
//! sockets in the order the line names them (their names as in systemd's fd store,
//! [`crate::util::fdstore`]):
//!
//! ```text
//! handed-over pid=<pid> origin=<origin or -> dra.2049.1311 registered.2049.1312
//! ```
//!
//! then flushes its state and exits, which releases the node lock the newer one waits for.
//! The kubelet's calls in the gap wait in the sockets' backlog. A running edra that cannot
//! hand over in time (calls still running) answers `refused <reason>` and keeps serving;
//! the newer one gives up with that reason. Both sides check that the other runs as the
//! same user (`SO_PEERCRED`), read bounded lines, and take at most
//! [`crate::util::fdpass::MOST_FDS`] descriptors; the newer one serves a socket handed
//! over only when it passes [`crate::util::fdstore::check_stored_socket`].

use std::io::{self, BufRead, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::util::fdpass;

/// The socket's file name in the runtime directory.
pub const SOCKET_NAME: &str = "handover.sock";
/// The protocol's name and version, the first word of a request.
const PROTOCOL: &str = "edra-handover/1";
/// The longest line either side reads.
const MOST_LINE: usize = 4096;
/// How long the running edra waits for a connected client's request line.
const REQUEST_WAIT: Duration = Duration::from_secs(2);

/// The socket a running edra offers a handover on.
pub fn socket_path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join(SOCKET_NAME)
}

/// Who takes part in a handover: the newer edra in its request, the running one in its
/// answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Party {
    /// Its process ID (as its own PID namespace sees it).
    pub pid: u32,
    /// Its version (`edra --version`), in requests.
    pub version: String,
    /// Where it runs, when known: the pod's UID under a DaemonSet (`POD_UID`).
    pub origin: Option<String>,
}

impl Party {
    /// This process, with the origin `POD_UID` gives.
    pub fn this_process() -> Party {
        let origin = std::env::var("POD_UID").ok().filter(|o| valid_word(o));
        Party { pid: std::process::id(), version: crate::util::VERSION.to_string(), origin }
    }
}

/// Why a handover did not happen.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    /// Nothing answers on the handover socket: no edra runs, or one that offers none.
    #[error("no running edra offers a handover at {} ({source})", path.display())]
    NotOffered {
        /// The handover socket.
        path: PathBuf,
        /// What connecting said.
        source: io::Error,
    },
    /// The running edra said no.
    #[error("the running edra refused to hand over: {0}")]
    Refused(String),
    /// No answer in time.
    #[error("the running edra did not hand over within {}s", .0.as_secs_f64())]
    TimedOut(Duration),
    /// An answer that is not the protocol's, or from another user.
    #[error("the handover failed: {0}")]
    Protocol(String),
    /// Reading or writing the connection failed.
    #[error("the handover connection failed: {0}")]
    Io(#[from] io::Error),
}

/// What the running edra handed over.
#[derive(Debug)]
pub struct Handed {
    /// The edra that handed over.
    pub from: Party,
    /// Its listening sockets, with their names in systemd's fd store.
    pub sockets: Vec<(String, OwnedFd)>,
}

/// Asks the edra running with `runtime_dir` to hand its sockets over to `me`; waits up to
/// `timeout` for them. Blocking: run it off the async workers.
pub fn ask(runtime_dir: &Path, me: &Party, timeout: Duration) -> Result<Handed, HandoverError> {
    let path = socket_path(runtime_dir);
    let deadline = Instant::now() + timeout;
    let mut stream = UnixStream::connect(&path).map_err(|source| HandoverError::NotOffered { path, source })?;
    check_peer(stream.as_fd())?;
    stream.set_write_timeout(Some(timeout))?;
    let origin = me.origin.as_deref().unwrap_or("-");
    writeln!(stream, "{PROTOCOL} pid={} version={} origin={origin}", me.pid, me.version)?;
    let (line, fds) = read_answer(&stream, deadline, timeout)?;
    parse_answer(&line, fds)
}

/// Reads one line and the descriptors sent with it, until `deadline`.
fn read_answer(
    stream: &UnixStream,
    deadline: Instant,
    timeout: Duration,
) -> Result<(String, Vec<OwnedFd>), HandoverError> {
    let mut line = Vec::new();
    let mut fds = Vec::new();
    let mut buf = [0u8; 512];
    while !line.ends_with(b"\n") {
        let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero());
        stream.set_read_timeout(Some(left.ok_or(HandoverError::TimedOut(timeout))?))?;
        let (n, more) = match fdpass::recv_with_fds(stream.as_fd(), &mut buf, 0) {
            Ok(got) => got,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(HandoverError::TimedOut(timeout));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            return Err(HandoverError::Protocol("the running edra closed the connection without an answer".into()));
        }
        fds.extend(more);
        line.extend_from_slice(&buf[..n]);
        if line.len() > MOST_LINE || fds.len() > fdpass::MOST_FDS {
            return Err(HandoverError::Protocol("the answer is longer than edra's".into()));
        }
    }
    line.pop();
    let line = String::from_utf8(line).map_err(|_| HandoverError::Protocol("the answer is not UTF-8".into()))?;
    Ok((line, fds))
}

/// The answer `line` with the descriptors `fds` that came with it.
fn parse_answer(line: &str, fds: Vec<OwnedFd>) -> Result<Handed, HandoverError> {
    if let Some(reason) = line.strip_prefix("refused ") {
        return Err(HandoverError::Refused(crate::util::escape_controls(reason).into_owned()));
    }
    let mut words = line.split(' ');
    if words.next() != Some("handed-over") {
        return Err(HandoverError::Protocol(format!("unexpected answer {:?}", crate::util::escape_controls(line))));
    }
    let from = party(&mut words, false)?;
    let names: Vec<String> = words.map(str::to_string).collect();
    if names.len() != fds.len() || names.iter().any(|n| crate::util::fdstore::parse_name(n).is_none()) {
        return Err(HandoverError::Protocol(format!(
            "the answer names {} sockets and carries {} descriptors",
            names.len(),
            fds.len()
        )));
    }
    Ok(Handed { from, sockets: names.into_iter().zip(fds).collect() })
}

/// `pid=`, (`version=` when `with_version`) and `origin=` from `words`.
fn party<'a>(words: &mut impl Iterator<Item = &'a str>, with_version: bool) -> Result<Party, HandoverError> {
    let mut field = |key: &str| {
        words
            .next()
            .and_then(|w| w.strip_prefix(key))
            .filter(|v| valid_word(v))
            .map(str::to_string)
            .ok_or_else(|| HandoverError::Protocol(format!("no valid {key} in the handover message")))
    };
    let pid = field("pid=")?.parse().map_err(|_| HandoverError::Protocol("pid= is not a number".into()))?;
    let version = if with_version { field("version=")? } else { String::new() };
    let origin = Some(field("origin=")?).filter(|o| o != "-");
    Ok(Party { pid, version, origin })
}

/// A word of the protocol: 1 to 128 printable ASCII characters, no space.
fn valid_word(w: &str) -> bool {
    (1..=128).contains(&w.len()) && w.bytes().all(|b| b.is_ascii_graphic())
}

/// Refuses a peer that runs as another user than this process.
fn check_peer(socket: BorrowedFd<'_>) -> Result<(), HandoverError> {
    let cred = crate::util::peer_credentials(socket)?;
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    if cred.uid != euid {
        return Err(HandoverError::Protocol(format!("the other side runs as uid {}, not {euid}", cred.uid)));
    }
    Ok(())
}

/// The running edra's side: the handover socket, bound while it serves.
#[derive(Debug)]
pub struct Offer {
    listener: tokio::net::UnixListener,
    path: PathBuf,
    file: (u64, u64),
}

impl Offer {
    /// Binds `<runtime_dir>/handover.sock` (mode 0600), replacing a socket a stopped edra
    /// left; anything else at the path is an error. Call it only with the node lock held.
    pub fn bind(runtime_dir: &Path) -> io::Result<Offer> {
        let path = socket_path(runtime_dir);
        let listener = crate::util::bind_replacing(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let meta = std::fs::symlink_metadata(&path)?;
        Ok(Offer { listener, path, file: (meta.dev(), meta.ino()) })
    }

    /// The next valid request. A client of another user, or one that sends no valid
    /// request within 2 s, is answered `refused` (where it can be) and dropped.
    pub async fn next(&self) -> io::Result<Request> {
        loop {
            let (stream, _) = self.listener.accept().await?;
            let stream = stream.into_std()?;
            stream.set_nonblocking(false)?;
            let read = tokio::task::spawn_blocking(move || read_request(stream)).await.map_err(io::Error::other)?;
            match read {
                Ok(request) => return Ok(request),
                Err((stream, why)) => {
                    tracing::warn!(target: "edra::handover", reason = %why, "a handover request was refused");
                    if let Some(mut s) = stream {
                        let _ = writeln!(s, "refused {why}");
                    }
                }
            }
        }
    }
}

impl Drop for Offer {
    /// Removes the socket file, when it is still this one.
    fn drop(&mut self) {
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.file) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Reads and checks one request from `stream`; on failure, the reason and the stream when
/// it can still be answered.
fn read_request(stream: UnixStream) -> Result<Request, (Option<UnixStream>, String)> {
    if let Err(e) = check_peer(stream.as_fd()) {
        return Err((None, e.to_string()));
    }
    let mut line = Vec::new();
    let read = stream
        .set_read_timeout(Some(REQUEST_WAIT))
        .and_then(|()| io::BufReader::new((&stream).take(MOST_LINE as u64)).read_until(b'\n', &mut line));
    match read {
        Ok(_) if line.ends_with(b"\n") => {}
        Ok(_) => return Err((Some(stream), "no complete request line".into())),
        Err(e) => return Err((Some(stream), format!("no request line ({e})"))),
    }
    let text = String::from_utf8_lossy(&line);
    let mut words = text.trim_end().split(' ');
    if words.next() != Some(PROTOCOL) {
        return Err((Some(stream), format!("not a {PROTOCOL} request")));
    }
    match party(&mut words, true) {
        Ok(from) => Ok(Request { stream, from }),
        Err(e) => Err((Some(stream), e.to_string())),
    }
}

/// A newer edra's request, to be answered once.
#[derive(Debug)]
pub struct Request {
    stream: UnixStream,
    /// Who asks.
    pub from: Party,
}

impl Request {
    /// Says no, with `reason`.
    pub fn refuse(mut self, reason: &str) {
        let reason = reason.replace(['\n', '\r'], " ");
        let _ = writeln!(self.stream, "refused {reason}");
    }

    /// Whether the asking edra still waits for the answer (it has not closed the
    /// connection, e.g. after its timeout).
    pub fn still_waiting(&self) -> bool {
        use std::os::fd::AsRawFd;
        let mut pfd = libc::pollfd { fd: self.stream.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, no wait.
        let ready = unsafe { libc::poll(&raw mut pfd, 1, 0) };
        // Readable after the request line means closed (the asker sends nothing more).
        !(ready > 0 && pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0)
    }

    /// Hands `sockets` (named as in systemd's fd store) over, as `me`.
    pub fn hand_over(mut self, me: &Party, sockets: &[(String, BorrowedFd<'_>)]) -> io::Result<()> {
        let origin = me.origin.as_deref().unwrap_or("-");
        let mut line = format!("handed-over pid={} origin={origin}", me.pid);
        for (name, _) in sockets {
            line.push(' ');
            line.push_str(name);
        }
        line.push('\n');
        let fds: Vec<BorrowedFd<'_>> = sockets.iter().map(|(_, fd)| *fd).collect();
        self.stream.set_write_timeout(Some(REQUEST_WAIT))?;
        let sent = fdpass::send_with_fds(self.stream.as_fd(), line.as_bytes(), &fds)?;
        self.stream.write_all(&line.as_bytes()[sent..])?;
        self.stream.flush()
    }
}

#[cfg(test)]
mod tests;
