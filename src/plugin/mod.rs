//! The kubelet's gRPC APIs on Unix sockets: plugin registration, DRAPlugin v1/v1beta1 and
//! the DRAResourceHealth stream.
//!
//! [`PluginServer::start`] serves the DRA socket (both DRAPlugin versions, answered by a
//! [`DraHandler`], and with [`PluginServer::start_with_health`] the device health stream)
//! and then the registration socket; the kubelet's verdict is published
//! as a [`RegistrationState`]; finished calls are reported to an optional
//! [`CallObserver`] ([`PluginServer::start_with`]); [`PluginServer::shutdown`] drains and removes the sockets.
//! Every accepted connection goes through [`authority::AuthorityFix`], which makes the
//! kubelet's registration dial (whose `:authority` is a socket path) acceptable to the
//! HTTP/2 server.

use std::io;
use std::path::PathBuf;

pub mod authority;
mod dra;
pub mod handler;
mod health;
mod inflight;
mod observer;
pub mod proto;
mod registration;
mod server;
mod socket;

pub use handler::{ClaimRef, DraHandler, PrepareResults, PreparedDevice, UnprepareResults};
pub use health::{DeviceHealth, HEALTH_SERVICES, Health, HealthList, MESSAGE_LIMIT, RESEND_EVERY};
pub use observer::{CallObserver, CallOutcome, CallReport, DraMethod, NoObserver};
pub use registration::{PLUGIN_TYPE, RegistrationState, SUPPORTED_VERSIONS};
pub use server::{PluginOptions, PluginServer};
pub use socket::PluginStream;

/// Why the plugin sockets could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The driver name cannot be used in socket paths.
    #[error("driver name {name:?} is not valid: {reason}")]
    InvalidDriverName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A socket path could not be made absolute.
    #[error("could not make the socket path {path} absolute; configure absolute kubelet paths")]
    Endpoint {
        /// The configured path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The DRA socket path is not UTF-8, so it cannot be sent to the kubelet.
    #[error("the DRA socket path {path:?} is not valid UTF-8; configure a UTF-8 plugins directory")]
    NonUtf8Path {
        /// The path.
        path: PathBuf,
    },
    /// A socket directory could not be created or given mode 0750.
    #[error("could not create the socket directory {path} (mode 0750); check its parent's permissions")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A kubelet directory is missing and cannot be made: under systemd the unit opens the
    /// kubelet's directories for writing only when they exist as edra starts.
    #[error("{} does not exist and cannot be made here ({source}): {}", path.display(), crate::util::KUBELET_DIR_MISSING_FIX)]
    KubeletDirMissing {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// The socket path is longer than a Unix socket address can hold.
    #[error("socket path {path} is longer than {max} bytes, the Unix socket limit; use a shorter kubelet directory")]
    SocketPathTooLong {
        /// The path.
        path: PathBuf,
        /// The longest usable path.
        max: usize,
    },
    /// Something other than a socket is at the socket path; edra leaves it alone.
    #[error("{path} exists and is not a socket; edra will not remove it, so move it away and restart")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// The socket path could not be inspected.
    #[error("could not inspect {path}")]
    Inspect {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A live socket is at edra's path: another process serves it.
    #[error(
        "{path} is served by a running process{}; another edra is running for this node: stop it first \
         (systemctl stop edra)",
        .pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    SocketInUse {
        /// The socket.
        path: PathBuf,
        /// The pid of the process serving it, when the kernel tells.
        pid: Option<u32>,
    },
    /// A stale socket of edra's own name could not be removed.
    #[error("could not remove the stale socket {path}; remove it by hand")]
    RemoveStale {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Binding the socket failed.
    #[error("could not listen on {path}; is another edra running?")]
    Bind {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The new socket could not be given mode 0600.
    #[error("could not set mode 0600 on the socket {path}")]
    Chmod {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}
