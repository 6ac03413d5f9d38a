//! Per-claim serialisation: one async mutex per claim UID, dropped when nobody holds it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// A map from claim UID to its lock. Entries whose lock nobody holds or waits for are
/// pruned on every acquisition, so the map stays as small as the set of claims in flight.
#[derive(Debug, Default)]
pub struct ClaimLocks {
    map: Mutex<HashMap<String, Weak<AsyncMutex<()>>>>,
}

impl ClaimLocks {
    /// Waits for and takes the lock of claim `uid`.
    pub async fn lock(&self, uid: &str) -> OwnedMutexGuard<()> {
        self.entry(uid).lock_owned().await
    }

    /// The lock of `uid`, made when absent.
    fn entry(&self, uid: &str) -> Arc<AsyncMutex<()>> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        match map.get(uid).and_then(Weak::upgrade) {
            Some(l) => l,
            None => {
                let l = Arc::new(AsyncMutex::new(()));
                map.insert(uid.to_string(), Arc::downgrade(&l));
                l
            }
        }
    }

    /// Takes the lock of claim `uid` from blocking code (recovery), waiting if an async
    /// task holds it. Must not be called on an async worker thread when the lock may be
    /// held; uncontended, it never blocks.
    pub fn lock_blocking(&self, uid: &str) -> OwnedMutexGuard<()> {
        let lock = self.entry(uid);
        match lock.clone().try_lock_owned() {
            Ok(guard) => guard,
            Err(_) => lock.blocking_lock_owned(),
        }
    }

    /// Number of entries (claims in flight, plus any not yet pruned).
    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// True when no entry is present.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests;
