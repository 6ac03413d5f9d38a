//! The systemd notification protocol (`sd_notify`), spoken directly over a Unix datagram
//! socket: `READY=1` once edra is registered with the kubelet and its slices are
//! published, `STOPPING=1` when shutdown begins, `STATUS=...` for `systemctl status`,
//! `EXTEND_TIMEOUT_USEC=...` for a slow start, and `WATCHDOG=1` pings while the unit sets
//! `WatchdogSec=`.
//!
//! The service manager passes the socket in `NOTIFY_SOCKET` (a path, or `@name` for an
//! abstract socket) and the watchdog in `WATCHDOG_USEC` / `WATCHDOG_PID`. Those values
//! are read once, by the caller, into [`NotifyEnv`]; nothing here reads the process
//! environment behind the caller's back, so tests pass their own values. Without
//! `NOTIFY_SOCKET` (not started by systemd, or `Type=simple`) there is no [`Notifier`]
//! and nothing is sent.
//!
//! Child processes that edra starts should not inherit these variables: remove every
//! name in [`ENV_VARS`] from their environment. (With `NotifyAccess=main` systemd would
//! ignore their messages anyway.)

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;
use std::time::Duration;

/// The environment variables of the notification protocol.
pub const ENV_VARS: [&str; 3] = ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];

/// What went wrong talking to the service manager.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// `NOTIFY_SOCKET` holds something that is not a socket address edra can use.
    #[error("NOTIFY_SOCKET={value:?} is not usable: {reason}; expected an absolute path or @abstract-name")]
    Address {
        /// The variable's value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Creating the sending socket failed.
    #[error("cannot create a datagram socket to notify the service manager")]
    Socket(#[source] io::Error),
    /// Sending a message failed.
    #[error("cannot send {message:?} to the service manager at {socket}")]
    Send {
        /// The first line of the message.
        message: String,
        /// Where it was sent.
        socket: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// `WATCHDOG_USEC` is not a positive number of microseconds.
    #[error("WATCHDOG_USEC={0:?} is not a positive number of microseconds; check WatchdogSec= in the unit")]
    WatchdogUsec(String),
}

/// The notification-related environment, captured once at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NotifyEnv {
    /// `NOTIFY_SOCKET`.
    pub socket: Option<OsString>,
    /// `WATCHDOG_USEC`.
    pub watchdog_usec: Option<String>,
    /// `WATCHDOG_PID`.
    pub watchdog_pid: Option<String>,
}

impl NotifyEnv {
    /// The values of this process's environment.
    pub fn from_process() -> Self {
        Self {
            socket: std::env::var_os("NOTIFY_SOCKET"),
            watchdog_usec: std::env::var("WATCHDOG_USEC").ok(),
            watchdog_pid: std::env::var("WATCHDOG_PID").ok(),
        }
    }
}

/// Sends notifications to the service manager. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Notifier {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    socket: UnixDatagram,
    addr: SocketAddr,
    /// `NOTIFY_SOCKET` as given, for messages.
    display: String,
    /// The full watchdog timeout, when the watchdog is on for this process.
    watchdog: Option<Duration>,
}

impl Notifier {
    /// A notifier for `env`, or `None` when `NOTIFY_SOCKET` is unset or empty.
    /// `own_pid` is compared with `WATCHDOG_PID`: a watchdog meant for another process
    /// (e.g. inherited from a parent) is ignored, as `sd_watchdog_enabled` does.
    pub fn from_env(env: &NotifyEnv, own_pid: u32) -> Result<Option<Self>, NotifyError> {
        let Some(value) = env.socket.as_ref().filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        let display = value.to_string_lossy().into_owned();
        let addr = parse_address(value.as_bytes())
            .map_err(|reason| NotifyError::Address { value: display.clone(), reason })?;
        let watchdog = watchdog_timeout(env.watchdog_usec.as_deref(), env.watchdog_pid.as_deref(), own_pid)?;
        let socket = UnixDatagram::unbound().map_err(NotifyError::Socket)?;
        // A full receive queue must never stall the async runtime: drop the message and
        // report it instead (the next watchdog ping follows anyway).
        socket.set_nonblocking(true).map_err(NotifyError::Socket)?;
        Ok(Some(Self { inner: Arc::new(Inner { socket, addr, display, watchdog }) }))
    }

    /// A notifier from this process's environment (see [`Notifier::from_env`]).
    pub fn from_process_env() -> Result<Option<Self>, NotifyError> {
        Self::from_env(&NotifyEnv::from_process(), std::process::id())
    }

    /// Start-up is complete: `READY=1`.
    pub fn ready(&self) -> Result<(), NotifyError> {
        self.send("READY=1")
    }

    /// Shutdown has begun: `STOPPING=1`.
    pub fn stopping(&self) -> Result<(), NotifyError> {
        self.send("STOPPING=1")
    }

    /// A one-line status shown by `systemctl status`. Line breaks become spaces, since
    /// the protocol is one assignment per line.
    pub fn status(&self, text: &str) -> Result<(), NotifyError> {
        let line: String = text.chars().map(|c| if c == '\n' || c == '\r' { ' ' } else { c }).collect();
        self.send(&format!("STATUS={line}"))
    }

    /// Asks for `extra` more time to finish starting (or stopping) than `TimeoutStartSec=`
    /// (`TimeoutStopSec=`) allows, counted from now: `EXTEND_TIMEOUT_USEC=...`. Useful
    /// while waiting for an API server that is not reachable yet.
    pub fn extend_timeout(&self, extra: Duration) -> Result<(), NotifyError> {
        self.send(&format!("EXTEND_TIMEOUT_USEC={}", extra.as_micros()))
    }

    /// A watchdog keep-alive: `WATCHDOG=1`.
    pub fn watchdog(&self) -> Result<(), NotifyError> {
        self.send("WATCHDOG=1")
    }

    /// How often to ping the watchdog (half its timeout, as systemd recommends), or
    /// `None` when the unit has no `WatchdogSec=` for this process.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.inner.watchdog.map(|t| t / 2)
    }

    /// The watchdog timeout itself (`WATCHDOG_USEC`), if any.
    pub fn watchdog_timeout(&self) -> Option<Duration> {
        self.inner.watchdog
    }

    /// Sends newline-separated `KEY=VALUE` assignments as one datagram.
    pub fn send(&self, message: &str) -> Result<(), NotifyError> {
        self.inner.socket.send_to_addr(message.as_bytes(), &self.inner.addr).map(drop).map_err(|source| {
            NotifyError::Send {
                message: message.lines().next().unwrap_or_default().to_string(),
                socket: self.inner.display.clone(),
                source,
            }
        })
    }

    /// Stores the listening socket `fd` in the unit's file descriptor store under `name`
    /// (`FDSTORE=1`, `FDNAME=<name>`, the descriptor passed with `SCM_RIGHTS`): systemd keeps
    /// it open across restarts and hands it back as `LISTEN_FDS` (`util::fdstore`). Needs
    /// `FileDescriptorStoreMax=` in the unit; without it systemd drops the descriptor.
    pub fn store_fd(&self, name: &str, fd: std::os::fd::BorrowedFd<'_>) -> Result<(), NotifyError> {
        let message = format!("FDSTORE=1\nFDNAME={name}");
        self.send_with_fd(&message, fd)
    }

    /// Removes the descriptors stored under `name` from the fd store (`FDSTOREREMOVE=1`).
    pub fn remove_stored(&self, name: &str) -> Result<(), NotifyError> {
        self.send(&format!("FDSTOREREMOVE=1\nFDNAME={name}"))
    }

    /// Sends `message` with `fd` attached (`SCM_RIGHTS`), over a socket of its own
    /// connected to the service manager's.
    fn send_with_fd(&self, message: &str, fd: std::os::fd::BorrowedFd<'_>) -> Result<(), NotifyError> {
        use std::os::fd::AsFd;
        let failed = |source| NotifyError::Send {
            message: message.lines().next().unwrap_or_default().to_string(),
            socket: self.inner.display.clone(),
            source,
        };
        let socket = UnixDatagram::unbound().map_err(NotifyError::Socket)?;
        socket.set_nonblocking(true).map_err(NotifyError::Socket)?;
        socket.connect_addr(&self.inner.addr).map_err(failed)?;
        crate::util::fdpass::send_with_fds(socket.as_fd(), message.as_bytes(), &[fd]).map(drop).map_err(failed)
    }

    /// Pings the watchdog every [`Notifier::watchdog_interval`] until `shutdown`
    /// completes; returns at once when there is no watchdog. A failed ping is logged and
    /// the next one tried: a single lost datagram must not stop the keep-alive.
    pub async fn run_watchdog<F: Future<Output = ()>>(&self, shutdown: F) {
        let Some(period) = self.watchdog_interval() else {
            return;
        };
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => return,
                _ = ticks.tick() => {
                    if let Err(e) = self.watchdog() {
                        tracing::warn!(error = %crate::util::error_chain(&e), "watchdog ping failed");
                    }
                }
            }
        }
    }
}

/// Parses `NOTIFY_SOCKET`: an absolute path, or `@name` for an abstract socket.
fn parse_address(value: &[u8]) -> Result<SocketAddr, String> {
    match value.first() {
        Some(b'@') => SocketAddr::from_abstract_name(&value[1..]).map_err(|e| e.to_string()),
        Some(b'/') => SocketAddr::from_pathname(std::ffi::OsStr::from_bytes(value)).map_err(|e| e.to_string()),
        Some(_) if value.starts_with(b"vsock:") => Err("VSOCK notification sockets are not supported".into()),
        _ => Err("not an absolute path".into()),
    }
}

/// The watchdog timeout from `WATCHDOG_USEC`, when it applies to `own_pid`.
///
/// Unset `WATCHDOG_USEC` means no watchdog. A `WATCHDOG_PID` naming another process
/// means the watchdog is not ours (an unparsable one too, as systemd treats it). A
/// malformed or zero `WATCHDOG_USEC` is an error: the unit asked for a watchdog and edra
/// cannot honour it.
pub fn watchdog_timeout(usec: Option<&str>, pid: Option<&str>, own_pid: u32) -> Result<Option<Duration>, NotifyError> {
    let Some(usec) = usec else {
        return Ok(None);
    };
    if let Some(pid) = pid
        && pid.trim().parse::<u32>().ok() != Some(own_pid)
    {
        return Ok(None);
    }
    match usec.trim().parse::<u64>() {
        Ok(n) if n > 0 && n < u64::MAX => Ok(Some(Duration::from_micros(n))),
        _ => Err(NotifyError::WatchdogUsec(usec.to_string())),
    }
}

#[cfg(test)]
mod tests;
