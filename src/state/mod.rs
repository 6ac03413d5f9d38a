//! Node-local allocation state: a sled database behind a narrow, durable store API.
//!
//! Six trees: `claims` (claim UID → [`ClaimRecord`]), `devices` (device name → UID of the
//! claim holding it exclusively), `shares` (GPU device name → the [`ShareHolding`]s of its
//! shares: consumable-capacity allocations and replicas), `gpu_changes` (GPU UUID → [`GpuChange`], what edra is
//! changing on that GPU for a claim, written before the change), `mps_daemons` (claim UID, or
//! a shared GPU's holder `shared:gpu-0` → [`MpsDaemonRecord`], the MPS control daemon of the claim or of
//! the GPU's shares, written before it starts) and `meta` (store schema
//! version, boot ID, the store's identity). Every change is one sled transaction across the trees, made durable before
//! the call returns: sled 0.34's `flush()` only issues `sync_file_range` on Linux (its
//! issue #1452), which persists neither metadata nor the disk cache, so each commit is
//! followed by `fsync` of the database's log file (`db`) and its `conf`; the directory
//! itself is synced after the files are created. Claims without hardware side effects
//! are the exceptions: [`Store::remove_claim_lazily`] releases one with single-key removals
//! (the record, then its holdings) answered from memory, which sled's background flusher
//! ([`FLUSH_EVERY_MS`]) or the next durable change writes; a holding whose claim has no
//! record holds nothing ([`Store::drop_orphaned_holdings`]). And the first record of one
//! without shares is made with single-key changes (the record, then its holdings), durably
//! ([`fresh`]); a completed record that does not hold its devices is one a crash cut
//! short ([`Store::holds_devices`]). Nothing outside this module knows the store is sled.
//!
//! **A failed durability step poisons the store.** When a change cannot be made durable
//! (a full disk, an I/O error), sled's memory may hold what the disk does not, so from then
//! on every call fails with [`StateError::Poisoned`] naming the first failure — nothing is
//! answered from memory that the disk might not say. [`Store::health`] tells watchers (the
//! health endpoints, the log). [`Store::reopen`] drops the database, opens it again from
//! disk, proves the disk takes a durable write, and only then lifts the poison; the caller
//! then runs recovery, which sees exactly what is on disk.

mod claims;
mod db;
mod error;
pub mod fresh;
mod gpu_changes;
mod holdings;
pub mod memory_limits;
mod meta;
mod mps_daemons;
pub mod record;
mod shares;

use std::fs::DirBuilder;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use tokio::sync::watch;

#[cfg(test)]
pub(crate) use db::lock_busy;
use db::{Db, now_bytes, open_when_released, sled_io};
pub use error::StateError;
use meta::META_REOPENED;
pub use record::{
    ClaimRecord, DeviceRecord, GPU_CHANGE_SCHEMA, GpuChange, MPS_DAEMON_SCHEMA, MigRecord, MigState, MpsDaemonRecord,
    Phase, RecordError, SCHEMA_VERSION, ShareHolding, ShareRecord,
};

/// Upper bound of sled's in-memory page cache. sled's default is 1 GiB; edra's state is a
/// few hundred bytes per prepared claim, so a node's whole database fits many times over
/// in 8 MiB, and the bound keeps a long-lived agent's memory from following sled's
/// history of pages.
pub const CACHE_CAPACITY: u64 = 8 * 1024 * 1024;

/// The period of sled's background flusher (sled's default, named here because lazy
/// changes rely on it): every 500 ms it writes what is in sled's log buffer and fsyncs the
/// log file.
pub const FLUSH_EVERY_MS: u64 = 500;

/// The store. Cheap to clone; all clones share one database.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    /// The period of sled's background flusher, in milliseconds.
    flush_every: Option<u64>,
    /// The open database; `None` only while [`Store::reopen`] swaps it.
    db: RwLock<Option<Db>>,
    /// `Some(why)` from the first failed durability step until a successful re-open.
    health: watch::Sender<Option<String>>,
    /// Syncs that still succeed before every later one fails, as on a disk that fills
    /// up; `u64::MAX` when off (tests only).
    #[cfg(test)]
    syncs_left: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("dir", &self.inner.dir).finish_non_exhaustive()
    }
}

/// What a failed store call did to the store.
enum Failure {
    /// The call failed; the store is as it was.
    Plain(StateError),
    /// The disk may now disagree with memory: poison the store.
    Poison(StateError),
}

impl From<StateError> for Failure {
    fn from(e: StateError) -> Self {
        match e {
            StateError::Db { source: sled::Error::Io(_), .. } | StateError::Sync { .. } => Failure::Poison(e),
            other => Failure::Plain(other),
        }
    }
}

impl Store {
    /// Opens (creating when absent, mode 0700) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Store, StateError> {
        Self::open_flushing(dir, Some(FLUSH_EVERY_MS))
    }

    /// [`Store::open`] without sled's background flusher: a lazy change then reaches the
    /// disk only with the next durable one or [`Store::sync`]. For crash tests, which
    /// must see exactly that, and an agent with a failpoint armed.
    pub(crate) fn open_without_flusher(dir: &Path) -> Result<Store, StateError> {
        Self::open_flushing(dir, None)
    }

    fn open_flushing(dir: &Path, flush_every: Option<u64>) -> Result<Store, StateError> {
        let create_err = |source| StateError::CreateDir { dir: dir.to_path_buf(), source };
        DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(create_err)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(create_err)?;
        let db = open_when_released(dir, flush_every)?;
        let sync_err = |source| StateError::Sync { dir: dir.to_path_buf(), source };
        db.make_durable().map_err(sync_err)?;
        sync_path(&dir.join("conf")).map_err(sync_err)?;
        sync_path(dir).map_err(sync_err)?;
        let (health, _) = watch::channel(None);
        Ok(Store {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                flush_every,
                db: RwLock::new(Some(db)),
                health,
                #[cfg(test)]
                syncs_left: std::sync::atomic::AtomicU64::new(u64::MAX),
            }),
        })
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// `None` while the store is usable; `Some(why)` while it is poisoned (module doc).
    pub fn health(&self) -> watch::Receiver<Option<String>> {
        self.inner.health.subscribe()
    }

    /// The error every call returns while the store is poisoned.
    fn poisoned(&self) -> Option<StateError> {
        self.inner
            .health
            .borrow()
            .as_ref()
            .map(|reason| StateError::Poisoned { dir: self.inner.dir.clone(), reason: reason.clone() })
    }

    /// Runs `f` on the open database unless the store is poisoned; a failure that may
    /// have left memory ahead of the disk poisons it.
    fn with_db<T>(&self, f: impl FnOnce(&Db) -> Result<T, Failure>) -> Result<T, StateError> {
        let guard = self.inner.db.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = self.poisoned() {
            return Err(e);
        }
        let Some(db) = guard.as_ref() else {
            return Err(StateError::Poisoned {
                dir: self.inner.dir.clone(),
                reason: "the state is being re-opened".into(),
            });
        };
        f(db).map_err(|failure| match failure {
            Failure::Plain(e) => e,
            Failure::Poison(e) => {
                let reason = crate::util::error_chain(&e);
                let first = self.inner.health.send_if_modified(|h| {
                    if h.is_none() {
                        *h = Some(reason.clone());
                        true
                    } else {
                        false
                    }
                });
                if first {
                    tracing::error!(
                        dir = %self.inner.dir.display(),
                        error = %reason,
                        "edra's state could not be made durable; no claim is prepared or released until it can: \
                         free space or fix the disk under the state directory, edra then re-opens the state by itself"
                    );
                }
                e
            }
        })
    }

    /// Makes the last change durable (see [`Db::make_durable`]).
    fn durable(&self, db: &Db) -> Result<(), Failure> {
        #[cfg(test)]
        {
            use std::sync::atomic::Ordering::SeqCst;
            let left = self.inner.syncs_left.fetch_update(SeqCst, SeqCst, |n| match n {
                u64::MAX | 0 => None,
                n => Some(n - 1),
            });
            if left == Err(0) {
                return Err(Failure::Poison(StateError::Sync {
                    dir: self.inner.dir.clone(),
                    source: std::io::Error::from(std::io::ErrorKind::StorageFull),
                }));
            }
        }
        db.make_durable().map_err(|source| Failure::Poison(StateError::Sync { dir: self.inner.dir.clone(), source }))
    }

    /// Closes the database and opens it again from disk; lifts the poison once a durable
    /// write has succeeded. Run recovery afterwards: records may be older than memory was.
    /// Calls made meanwhile fail as poisoned.
    pub fn reopen(&self) -> Result<(), StateError> {
        let mut guard = self.inner.db.write().unwrap_or_else(PoisonError::into_inner);
        // The old handles go first: sled holds a lock on its files while open.
        drop(guard.take());
        let dir = &self.inner.dir;
        let db = open_when_released(dir, self.inner.flush_every)?;
        let sync_err = |source| StateError::Sync { dir: dir.to_path_buf(), source };
        db.meta.insert(META_REOPENED, now_bytes().as_slice()).map_err(|e| sync_err(sled_io(e)))?;
        self.durable(&db).map_err(|(Failure::Plain(e) | Failure::Poison(e))| e)?;
        *guard = Some(db);
        let was = self.inner.health.send_replace(None);
        if let Some(reason) = was {
            tracing::info!(dir = %dir.display(), was = %reason, "edra's state re-opened from disk; it is durable again");
        }
        Ok(())
    }

    /// Makes every change made so far durable, lazy ones included (at shutdown).
    pub fn sync(&self) -> Result<(), StateError> {
        self.with_db(|db| self.durable(db))
    }
}

pub(crate) use crate::util::sync_path;

#[cfg(test)]
pub(crate) mod tests;
