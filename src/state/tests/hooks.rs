//! Hooks into the store for tests only: counting and holding back flushes, failing
//! durability steps as a full disk does, and writing or removing raw entries no edra
//! writes alone.

use std::sync::PoisonError;
use std::sync::atomic::Ordering;

use crate::state::Store;
use crate::state::db::db_err;

impl Store {
    /// Flushes made since the database was opened, and a guard holding back every flush
    /// until it drops (tests only: to line changes up behind one flush).
    pub(crate) fn flushes(&self) -> u64 {
        self.with_db(|db| Ok(db.flushes.load(Ordering::Relaxed))).expect("flush count")
    }

    /// See [`Store::flushes`]: runs `f` while no flush can start.
    pub(crate) fn holding_flushes<T>(&self, f: impl FnOnce() -> T) -> T {
        let guard = self.inner.db.read().unwrap_or_else(PoisonError::into_inner);
        let db = guard.as_ref().expect("open");
        let _held = db.synced.lock().unwrap_or_else(PoisonError::into_inner);
        f()
    }

    /// Changes that asked to be made durable (tests only).
    pub(crate) fn durable_requests(&self) -> u64 {
        self.with_db(|db| Ok(db.written.load(Ordering::SeqCst))).expect("request count")
    }

    /// After `ok` more successful durability steps, makes every later one fail as on a
    /// full disk (tests only); `None` lets them succeed again.
    pub(crate) fn fail_syncs_after(&self, ok: Option<u64>) {
        self.inner.syncs_left.store(ok.unwrap_or(u64::MAX), std::sync::atomic::Ordering::SeqCst);
    }

    /// Writes raw bytes into tree `claims`, `gpu_changes`, `mps_daemons`, `shares` or `meta`, durably (tests only: records and
    /// versions no edra writes).
    pub(crate) fn raw_insert(&self, tree: &str, key: &[u8], value: &[u8]) {
        self.with_db(|db| {
            let t = match tree {
                "meta" => &db.meta,
                "gpu_changes" => &db.gpu_changes,
                "mps_daemons" => &db.mps_daemons,
                "shares" => &db.shares,
                _ => &db.claims,
            };
            t.insert(key, value).map_err(db_err("insert (test)"))?;
            self.durable(db)
        })
        .expect("raw insert");
    }

    /// Makes claim `holder` the holder of `device`, durably, whatever holds it (tests only:
    /// holdings no edra makes alone).
    pub(crate) fn raw_insert_device(&self, device: &str, holder: &str) {
        self.with_db(|db| {
            db.devices.insert(device, holder).map_err(db_err("insert (test)"))?;
            self.durable(db)
        })
        .expect("raw insert of a holding");
    }

    /// Removes key `key` from tree `claims` or `devices`, durably (tests only: what a crash
    /// between the steps of a lazy removal leaves).
    pub(crate) fn raw_remove(&self, tree: &str, key: &[u8]) {
        self.with_db(|db| {
            let t = if tree == "devices" { &db.devices } else { &db.claims };
            t.remove(key).map_err(db_err("remove (test)"))?;
            self.durable(db)
        })
        .expect("raw remove");
    }
}
