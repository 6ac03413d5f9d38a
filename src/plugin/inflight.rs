//! Handler calls run as their own tasks, tracked here.
//!
//! A kubelet that gives up on a call (its 45 s timeout, a closed connection) drops the
//! gRPC future; running the handler in a separate task lets a prepare or unprepare finish
//! instead of stopping halfway, and the kubelet's retry then finds the finished work. At
//! shutdown, calls still running after the grace period are aborted here, and
//! [`InFlight::idle`] tells when the last one is gone, so state can be closed safely.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinHandle};

/// The handler tasks currently running.
#[derive(Debug)]
pub(crate) struct InFlight {
    tasks: Mutex<HashMap<u64, Option<AbortHandle>>>,
    count: watch::Sender<usize>,
    /// Set by [`InFlight::abort_all`]; read and written under the `tasks` lock.
    closed: AtomicBool,
}

impl InFlight {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(InFlight {
            tasks: Mutex::new(HashMap::new()),
            count: watch::Sender::new(0),
            closed: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Option<AbortHandle>>> {
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `work` as a tracked task named by the call's request id.
    pub(crate) fn spawn<F>(self: &Arc<Self>, id: u64, work: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        // Registered before the spawn and completed after it, without holding the lock
        // across the spawn: a task that ends (or is dropped) at once has removed its
        // entry already, and then nothing is re-inserted.
        {
            let mut tasks = self.lock();
            tasks.insert(id, None);
            self.count.send_replace(tasks.len());
        }
        let guard = Untrack { inflight: Arc::clone(self), id };
        let handle = tokio::spawn(async move {
            let _untrack = guard;
            work.await
        });
        let mut tasks = self.lock();
        if self.closed.load(Ordering::Relaxed) {
            handle.abort();
        } else if let Some(slot) = tasks.get_mut(&id) {
            *slot = Some(handle.abort_handle());
        }
        drop(tasks);
        handle
    }

    /// How many handler calls are running.
    pub(crate) fn len(&self) -> usize {
        *self.count.borrow()
    }

    /// Aborts every running handler call, and every call started from now on.
    pub(crate) fn abort_all(&self) {
        let tasks = self.lock();
        self.closed.store(true, Ordering::Relaxed);
        for task in tasks.values().flatten() {
            task.abort();
        }
    }

    /// Resolves once no handler call is running.
    pub(crate) async fn idle(&self) {
        let mut count = self.count.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = count.wait_for(|n| *n == 0).await;
    }
}

/// Removes a task from the tracker when it finishes or is dropped (also on abort).
struct Untrack {
    inflight: Arc<InFlight>,
    id: u64,
}

impl Drop for Untrack {
    fn drop(&mut self) {
        let mut tasks = self.inflight.lock();
        tasks.remove(&self.id);
        self.inflight.count.send_replace(tasks.len());
    }
}

#[cfg(test)]
mod tests;
