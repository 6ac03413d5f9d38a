//! The agent's task that clears a container's GPU memory limit when the container exits,
//! before the runtime removes its cgroup: it waits on the [`CgroupExits`] watcher (inotify
//! on each limited cgroup's `cgroup.events`) and, on any change, looks at every recorded
//! limit ([`Preparer::remove_exited_memory_limits`]). It looks once at start too, for
//! containers that exited while no agent ran. Unprepare and recovery still clear whatever
//! this task did not.

use std::convert::Infallible;
use std::sync::Arc;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::gpu::memory_limit::exits::CgroupExits;
use crate::prepare::Preparer;

/// Runs the task for `preparer` on `exits` until `shutdown`.
pub fn watch(
    preparer: Preparer,
    exits: Arc<CgroupExits>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<JoinHandle<()>> {
    // SAFETY: the descriptor is the inotify instance's `OwnedFd`, which the `Arc` this
    // `AsyncFd` holds keeps open, unchanged, for as long as the `AsyncFd` lives.
    let fd = unsafe { AsyncFd::register_with_interest(exits, Interest::READABLE) }?;
    Ok(tokio::spawn(async move {
        tokio::select! {
            Err(e) = follow(&preparer, &fd) => {
                warn!(error = %e, "the cgroup exit watch failed; GPU memory limits are cleared at unprepare only");
            }
            _ = async { let _ = shutdown.wait_for(|s| *s).await; } => {}
        }
    }))
}

/// Looks at start and after every change the watch reports; returns only when it fails.
async fn follow(preparer: &Preparer, fd: &AsyncFd<Arc<CgroupExits>>) -> std::io::Result<Infallible> {
    look(preparer).await;
    loop {
        let mut guard = fd.readable().await?;
        let drained = guard.get_inner().drain();
        guard.clear_ready();
        if drained? {
            look(preparer).await;
        }
    }
}

/// Clears the limits of exited containers (blocking work off the runtime's threads).
async fn look(preparer: &Preparer) {
    let preparer = preparer.clone();
    match tokio::task::spawn_blocking(move || preparer.remove_exited_memory_limits()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(error = %crate::util::error_chain(&e),
            "cannot remove the GPU memory limit of an exited container; unprepare and the next start retry"),
        Err(e) => warn!(error = %e, "the task removing exited containers' GPU memory limits failed"),
    }
}
