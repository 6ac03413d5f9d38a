//! The kubelet's sockets kept open across restarts in systemd's file descriptor store.
//!
//! At start, the listening sockets systemd hands back (`LISTEN_FDS`, see
//! [`crate::util::fdstore`]) go to the plugin server, which serves them again when they are
//! still edra's. Once serving, each listening socket is stored (`FDSTORE=1`) under a name
//! that says its role and file, and what was handed back but not used is removed from the
//! store. systemd then keeps the sockets listening while edra restarts, is upgraded, killed
//! by the watchdog or with -9: the kubelet's calls in the gap wait in the backlog and are
//! answered by the next process, and the socket files stay (the kubelet never sees its
//! plugin go). Without systemd's notification socket nothing is stored and the sockets are
//! removed at exit as before.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::plugin::{PluginServer, RegistrationState};
use crate::telemetry::sdnotify::Notifier;
use crate::util::error_chain;
use crate::util::fdstore::Inherited;

/// The status socket's name in systemd's fd store.
const STATUS_ROLE: &str = "status";

/// The sockets systemd handed back to this process (none when it handed back none).
pub(super) fn inherited() -> Arc<Mutex<Inherited>> {
    let inherited = match Inherited::from_process() {
        Ok(i) => i,
        Err(e) => {
            warn!(target: "edra::app", error = %e, "cannot take the sockets systemd handed back; binding them anew");
            Inherited::default()
        }
    };
    if !inherited.is_empty() {
        debug!(target: "edra::app", "sockets handed back by systemd's fd store");
    }
    Arc::new(Mutex::new(inherited))
}

/// Stores `plugin`'s listening sockets in systemd's fd store and removes from it what was
/// handed back but not used; from then on the socket files stay at exit. Returns a task
/// that renames the stored registration socket once the kubelet registers edra, so the
/// next process knows it is registered.
pub(super) fn store(
    notifier: Option<&Arc<Notifier>>,
    plugin: &mut PluginServer,
    inherited: &Mutex<Inherited>,
    shutdown: watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    let notifier = notifier?;
    for name in inherited.lock().unwrap_or_else(PoisonError::into_inner).drop_rest() {
        info!(target: "edra::app", name, "closing a socket systemd kept that edra no longer serves");
        let _ = notifier.remove_stored(&name);
    }
    let mut stored = 0;
    let mut registration = None;
    for (name, fd) in plugin.listening_sockets() {
        match notifier.store_fd(&name, fd) {
            Ok(()) => stored += 1,
            Err(e) => warn!(target: "edra::app", name, error = %error_chain(&e),
                "cannot keep a socket in systemd's fd store; a restart closes it (FileDescriptorStoreMax= in the unit?)"),
        }
        if name.starts_with("registration.") {
            registration = fd.try_clone_to_owned().ok().map(|fd| (name, fd));
        }
    }
    if stored == 0 {
        return None;
    }
    plugin.keep_socket_files();
    info!(target: "edra::app", stored, "the kubelet's sockets are kept open across restarts (systemd's fd store)");
    let (name, fd) = registration?;
    Some(tokio::spawn(store_registered(notifier.clone(), plugin.registration(), (name, fd), shutdown)))
}

/// Renames the stored registration socket `registration.<dev>.<ino>` to
/// `registered.<dev>.<ino>` once the kubelet registers edra.
async fn store_registered(
    notifier: Arc<Notifier>,
    mut registration: watch::Receiver<RegistrationState>,
    (name, fd): (String, OwnedFd),
    mut shutdown: watch::Receiver<bool>,
) {
    use std::os::fd::AsFd;
    let registered = tokio::select! {
        r = registration.wait_for(RegistrationState::is_registered) => r.is_ok(),
        () = crate::util::stopped(&mut shutdown) => false,
    };
    if !registered {
        return;
    }
    let Some(rest) = name.strip_prefix("registration.") else { return };
    // The same socket is stored once: the old name goes before the new one comes.
    let renamed =
        notifier.remove_stored(&name).and_then(|()| notifier.store_fd(&format!("registered.{rest}"), fd.as_fd()));
    if let Err(e) = renamed {
        warn!(target: "edra::app", error = %error_chain(&e), "cannot mark the stored registration socket as registered");
    }
}

/// The status socket (`edra status`) across restarts: the one systemd handed back, when
/// there is one.
pub(super) struct StatusSocket {
    kept: Option<(String, OwnedFd)>,
}

impl StatusSocket {
    /// Takes the status socket from what systemd handed back (before the rest is dropped).
    pub(super) fn take(inherited: &Mutex<Inherited>) -> StatusSocket {
        let kept = inherited.lock().unwrap_or_else(PoisonError::into_inner).take(STATUS_ROLE);
        StatusSocket { kept }
    }

    /// The listening status socket under `runtime_dir` (the one kept when still edra's,
    /// else bound anew), stored in the fd store with `notifier` (none: not under systemd);
    /// and whether its file stays at exit (stored). None, logged, when it cannot be bound.
    pub(super) fn bind(
        self,
        runtime_dir: &std::path::Path,
        notifier: Option<&Arc<Notifier>>,
    ) -> Option<(tokio::net::UnixListener, bool)> {
        use std::os::fd::AsFd;
        let (listener, (dev, ino)) = match crate::status::server::adopt_or_bind(runtime_dir, self.kept) {
            Ok(bound) => bound,
            Err(e) => {
                warn!(target: "edra::app", error = %error_chain(&e), "edra status will not answer on this node");
                return None;
            }
        };
        let Some(notifier) = notifier else { return Some((listener, false)) };
        let name = crate::util::fdstore::store_name(STATUS_ROLE, dev, ino);
        match notifier.store_fd(&name, listener.as_fd()) {
            Ok(()) => Some((listener, true)),
            Err(e) => {
                warn!(target: "edra::app", name, error = %error_chain(&e), "cannot keep the status socket in systemd's fd store");
                Some((listener, false))
            }
        }
    }
}
