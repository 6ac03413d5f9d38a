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

pub mod fresh;
pub mod memory_limits;
pub mod record;
#[cfg(test)]
pub(crate) mod tests;

use std::fs::{DirBuilder, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionError};
use tokio::sync::watch;

pub use record::{
    ClaimRecord, DeviceRecord, GPU_CHANGE_SCHEMA, GpuChange, MPS_DAEMON_SCHEMA, MigRecord, MigState, MpsDaemonRecord,
    Phase, RecordError, SCHEMA_VERSION, ShareHolding, ShareRecord,
};

const META_SCHEMA: &[u8] = b"schema";
/// Upper bound of sled's in-memory page cache. sled's default is 1 GiB; edra's state is a
/// few hundred bytes per prepared claim, so a node's whole database fits many times over
/// in 8 MiB, and the bound keeps a long-lived agent's memory from following sled's
/// history of pages.
pub const CACHE_CAPACITY: u64 = 8 * 1024 * 1024;
/// The period of sled's background flusher (sled's default, named here because lazy
/// changes rely on it): every 500 ms it writes what is in sled's log buffer and fsyncs the
/// log file.
pub const FLUSH_EVERY_MS: u64 = 500;
const META_BOOT_ID: &[u8] = b"boot_id";
const META_ID: &[u8] = b"id";
/// When the store was last re-opened after being poisoned (the write that proves the disk).
const META_REOPENED: &[u8] = b"reopened";

/// What went wrong with the state store.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The database could not be opened.
    #[error("cannot open edra's state in {}: {hint}", dir.display())]
    Open {
        /// The state directory.
        dir: PathBuf,
        /// What to do about it.
        hint: &'static str,
        /// The cause.
        #[source]
        source: sled::Error,
    },
    /// The state directory could not be created or secured.
    #[error("cannot create edra's state directory {}; check that its parent exists and is writable", dir.display())]
    CreateDir {
        /// The state directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The database was written by a newer edra.
    #[error(
        "edra's state in {} has schema version {found}, newer than {SCHEMA_VERSION} which this edra understands; \
         upgrade edra, or move the state directory aside (prepared claims are then forgotten)",
        dir.display()
    )]
    NewerSchema {
        /// The state directory.
        dir: PathBuf,
        /// The version found.
        found: u32,
    },
    /// A stored record cannot be used.
    #[error("the stored record of claim {uid} cannot be read; upgrade edra or move the state directory aside")]
    Record {
        /// The claim UID.
        uid: String,
        /// The cause.
        #[source]
        source: RecordError,
    },
    /// A device is already held by another claim.
    #[error(
        "device {device} is already prepared for claim {}UID {holder}; unprepare that claim first (delete its pod)",
        .holder_name.as_ref().map(|n| format!("{n}, ")).unwrap_or_default()
    )]
    DeviceHeld {
        /// The device.
        device: String,
        /// The claim UID holding it.
        holder: String,
        /// `namespace/name` of that claim, when its record is readable.
        holder_name: Option<String>,
    },
    /// A share does not fit in what the GPU's other shares leave.
    #[error(
        "GPU {gpu} has {} of memory left for shares and this claim asks for {}; it is shared with {holders}. \
         The scheduler should not have placed the claim here: check that the published slices match the GPUs \
         (edra doctor), or delete one of those pods",
        crate::util::quantity(*.free), crate::util::quantity(*.asked)
    )]
    SharesExceed {
        /// The GPU's device name.
        gpu: String,
        /// Memory this claim's shares of it take, in bytes.
        asked: u64,
        /// Memory left by the other shares, in bytes.
        free: u64,
        /// The other holders with their memory.
        holders: String,
    },
    /// Another claim holds a share of the device with the same share ID.
    #[error(
        "share {share_id} of device {device} is already prepared for claim {}UID {holder}; a share ID is unique per \
         device, so the allocation is not one the scheduler makes: delete one of the pods so its claim is \
         allocated again",
        .holder_name.as_ref().map(|n| format!("{n}, ")).unwrap_or_default()
    )]
    ShareIdTaken {
        /// The device.
        device: String,
        /// The share ID.
        share_id: String,
        /// The claim UID holding it.
        holder: String,
        /// `namespace/name` of that claim, when its record is readable.
        holder_name: Option<String>,
    },
    /// A GPU's stored list of shares cannot be read.
    #[error(
        "the share list of GPU {gpu} in edra's state cannot be read, so its free memory is unknown and no share of \
         it is taken; restart edra, which rebuilds the list from the claims' records at start"
    )]
    SharesRecord {
        /// The GPU (device name).
        gpu: String,
        /// The cause.
        #[source]
        source: RecordError,
    },
    /// A stored GPU change record cannot be used.
    #[error("the stored change record of GPU {uuid} cannot be read; upgrade edra or move the state directory aside")]
    GpuRecord {
        /// The GPU's UUID.
        uuid: String,
        /// The cause.
        #[source]
        source: RecordError,
    },
    /// A stored MPS daemon record cannot be used.
    #[error(
        "the stored MPS daemon record of claim UID {uid} cannot be read; upgrade edra or move the state directory aside"
    )]
    MpsRecord {
        /// The claim's UID.
        uid: String,
        /// The cause.
        #[source]
        source: RecordError,
    },
    /// A stored GPU memory limit record cannot be decoded.
    #[error("the stored GPU memory limit record {key} cannot be read; upgrade edra or move the state directory aside")]
    MemoryLimitRecord {
        /// The record's key.
        key: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// Another claim is changing the GPU's settings.
    #[error(
        "GPU {uuid} has its compute mode or time-slice set for claim UID {holder}; unprepare that claim first (delete its pod)"
    )]
    GpuChanged {
        /// The GPU's UUID.
        uuid: String,
        /// The claim UID whose change it carries.
        holder: String,
    },
    /// A read or a transaction failed.
    #[error("cannot {op} in edra's state database")]
    Db {
        /// The operation.
        op: &'static str,
        /// The cause.
        #[source]
        source: sled::Error,
    },
    /// An earlier change could not be made durable; nothing is served until a re-open.
    #[error(
        "edra's state in {} is unusable since a change could not be made durable ({reason}); free space or fix the disk \
         there: edra re-opens the state by itself and retries, or restart edra",
        dir.display()
    )]
    Poisoned {
        /// The state directory.
        dir: PathBuf,
        /// The first failure.
        reason: String,
    },
    /// The change could not be made durable.
    #[error("cannot make edra's state durable in {}; check the disk (space, errors)", dir.display())]
    Sync {
        /// The state directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

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

/// The handles of one open database. Dropping the last of them closes it.
struct Db {
    db: sled::Db,
    claims: sled::Tree,
    devices: sled::Tree,
    shares: sled::Tree,
    gpu_changes: sled::Tree,
    mps_daemons: sled::Tree,
    meta: sled::Tree,
    /// sled's log file (`db`), kept open for fsync.
    log: File,
    /// This store's identity (see [`Store::id`]).
    id: String,
    /// Group commit: changes asking to be made durable so far ...
    written: AtomicU64,
    /// ... and how many of them the last flush covered; held while flushing.
    synced: Mutex<u64>,
    /// Flushes made (sled flush + fsync).
    flushes: AtomicU64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("dir", &self.inner.dir).finish_non_exhaustive()
    }
}

fn open_hint(e: &sled::Error) -> &'static str {
    match e {
        sled::Error::Io(io) => match io.kind() {
            io::ErrorKind::PermissionDenied => "permission denied; run edra as the user owning the directory (root)",
            io::ErrorKind::StorageFull => "the disk is full; free space and restart edra",
            io::ErrorKind::WouldBlock => "another edra process holds it; stop that process first",
            _ if io.to_string().contains("lock") => "another edra process holds it; stop that process first",
            _ => "check the directory and the disk",
        },
        sled::Error::Corruption { .. } => {
            "the database is corrupt; move the state directory aside and restart edra (prepared claims are then forgotten)"
        }
        _ => "move the state directory aside and restart edra if this persists",
    }
}

fn sled_io(e: sled::Error) -> io::Error {
    match e {
        sled::Error::Io(io) => plain_io(io),
        other => io::Error::other(other.to_string()),
    }
}

/// A failed read or transaction, its I/O error made plain.
fn db_err(op: &'static str) -> impl Fn(sled::Error) -> StateError {
    move |source| StateError::Db {
        op,
        source: match source {
            sled::Error::Io(io) => sled::Error::Io(plain_io(io)),
            other => other,
        },
    }
}

/// sled re-wraps some OS errors with their `Debug` text (`Os { code: 28, kind: ... }`);
/// those become the plain OS error again ("No space left on device (os error 28)").
fn plain_io(e: io::Error) -> io::Error {
    if e.raw_os_error().is_some() {
        return e;
    }
    let text = e.to_string();
    let code = text
        .strip_prefix("Os { code: ")
        .map(|rest| rest.bytes().take_while(u8::is_ascii_digit).map(char::from).collect::<String>())
        .and_then(|digits| digits.parse::<i32>().ok());
    match code {
        Some(code) => io::Error::from_raw_os_error(code),
        None => e,
    }
}

/// A new random store identity: 128 bits as 32 hex digits.
fn new_id() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

impl Db {
    /// Opens the database in `dir` (which exists), checking its schema and giving it an
    /// identity when it has none; nothing is made durable yet. `flush_every` is the period
    /// of sled's background flusher (`None`: no flusher; tests only).
    fn open(dir: &Path, flush_every: Option<u64>) -> Result<Db, StateError> {
        let open_err =
            |source: sled::Error| StateError::Open { dir: dir.to_path_buf(), hint: open_hint(&source), source };
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(CACHE_CAPACITY)
            .flush_every_ms(flush_every)
            .open()
            .map_err(open_err)?;
        let tree = |name: &str| db.open_tree(name).map_err(open_err);
        let log = File::open(dir.join("db")).map_err(|source| StateError::Sync { dir: dir.to_path_buf(), source })?;
        let (claims, devices, meta) = (tree("claims")?, tree("devices")?, tree("meta")?);
        let gpu_changes = tree("gpu_changes")?;
        let mps_daemons = tree("mps_daemons")?;
        let shares = tree("shares")?;
        match meta.get(META_SCHEMA).map_err(open_err)? {
            Some(v) => {
                let found = std::str::from_utf8(&v).ok().and_then(|s| s.parse::<u32>().ok()).unwrap_or(u32::MAX);
                if found > SCHEMA_VERSION {
                    return Err(StateError::NewerSchema { dir: dir.to_path_buf(), found });
                }
            }
            None => {
                meta.insert(META_SCHEMA, SCHEMA_VERSION.to_string().as_bytes()).map_err(open_err)?;
            }
        }
        let id = match meta.get(META_ID).map_err(open_err)? {
            Some(v) => String::from_utf8_lossy(&v).into_owned(),
            None => {
                let id = new_id();
                meta.insert(META_ID, id.as_bytes()).map_err(open_err)?;
                id
            }
        };
        Ok(Db {
            db,
            claims,
            devices,
            shares,
            gpu_changes,
            mps_daemons,
            meta,
            log,
            id,
            written: AtomicU64::new(0),
            synced: Mutex::new(0),
            flushes: AtomicU64::new(0),
        })
    }

    /// Makes every change made so far durable: flushes sled, then fsyncs its log file, the
    /// only way a change survives a power cut. (`conf` is written once, when the database
    /// is created, and synced by [`Store::open`].) Called after a change is in sled's memory.
    ///
    /// Group commit: one flush at a time; a caller whose change a flush that started after
    /// it covered returns without flushing again, so concurrent changes (a burst of pods
    /// starting) share their fsyncs. A flush covers every change whose caller counted
    /// itself in `written` before the flush began, since its change was made before that.
    ///
    /// A lazy change ([`Store::remove_claim_lazily`]) counts itself nowhere: no caller waits
    /// for it, so it can make no caller skip a flush, and sled's log being one sequence,
    /// any flush that starts after the change was made (the next durable caller's, or sled's
    /// background flusher's) writes it too.
    fn make_durable(&self) -> io::Result<()> {
        let mine = self.written.fetch_add(1, Ordering::SeqCst).saturating_add(1);
        let mut synced = self.synced.lock().unwrap_or_else(PoisonError::into_inner);
        if *synced >= mine {
            return Ok(());
        }
        let upto = self.written.load(Ordering::SeqCst);
        self.flushes.fetch_add(1, Ordering::Relaxed);
        self.db.flush().map_err(sled_io)?;
        self.log.sync_all()?;
        *synced = upto;
        Ok(())
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
                    source: io::Error::from(io::ErrorKind::StorageFull),
                }));
            }
        }
        db.make_durable().map_err(|source| Failure::Poison(StateError::Sync { dir: self.inner.dir.clone(), source }))
    }

    /// Flushes made since the database was opened, and a guard holding back every flush
    /// until it drops (tests only: to line changes up behind one flush).
    #[cfg(test)]
    pub(crate) fn flushes(&self) -> u64 {
        self.with_db(|db| Ok(db.flushes.load(Ordering::Relaxed))).expect("flush count")
    }

    /// See [`Store::flushes`]: runs `f` while no flush can start.
    #[cfg(test)]
    pub(crate) fn holding_flushes<T>(&self, f: impl FnOnce() -> T) -> T {
        let guard = self.inner.db.read().unwrap_or_else(PoisonError::into_inner);
        let db = guard.as_ref().expect("open");
        let _held = db.synced.lock().unwrap_or_else(PoisonError::into_inner);
        f()
    }

    /// Changes that asked to be made durable (tests only).
    #[cfg(test)]
    pub(crate) fn durable_requests(&self) -> u64 {
        self.with_db(|db| Ok(db.written.load(Ordering::SeqCst))).expect("request count")
    }

    /// After `ok` more successful durability steps, makes every later one fail as on a
    /// full disk (tests only); `None` lets them succeed again.
    #[cfg(test)]
    pub(crate) fn fail_syncs_after(&self, ok: Option<u64>) {
        self.inner.syncs_left.store(ok.unwrap_or(u64::MAX), std::sync::atomic::Ordering::SeqCst);
    }

    /// Writes raw bytes into tree `claims`, `gpu_changes`, `mps_daemons`, `shares` or `meta`, durably (tests only: records and
    /// versions no edra writes).
    #[cfg(test)]
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
    #[cfg(test)]
    pub(crate) fn raw_insert_device(&self, device: &str, holder: &str) {
        self.with_db(|db| {
            db.devices.insert(device, holder).map_err(db_err("insert (test)"))?;
            self.durable(db)
        })
        .expect("raw insert of a holding");
    }

    /// Removes key `key` from tree `claims` or `devices`, durably (tests only: what a crash
    /// between the steps of a lazy removal leaves).
    #[cfg(test)]
    pub(crate) fn raw_remove(&self, tree: &str, key: &[u8]) {
        self.with_db(|db| {
            let t = if tree == "devices" { &db.devices } else { &db.claims };
            t.remove(key).map_err(db_err("remove (test)"))?;
            self.durable(db)
        })
        .expect("raw remove");
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

    /// This store's identity: random, made when the database was created and kept with
    /// it, so files edra writes can be proven to belong to this state and no other.
    pub fn id(&self) -> Result<String, StateError> {
        self.with_db(|db| Ok(db.id.clone()))
    }

    /// The record of claim `uid`, if any.
    pub fn claim(&self, uid: &str) -> Result<Option<ClaimRecord>, StateError> {
        self.with_db(|db| {
            let v = db.claims.get(uid.as_bytes()).map_err(db_err("read a claim"))?;
            Ok(v.map(|b| {
                record::decode_claim(&b).map_err(|source| StateError::Record { uid: uid.to_string(), source })
            })
            .transpose()?)
        })
    }

    /// Every claim record, in UID order.
    pub fn claims(&self) -> Result<Vec<ClaimRecord>, StateError> {
        self.with_db(|db| {
            let mut out = Vec::new();
            for item in db.claims.iter() {
                let (k, v) = item.map_err(db_err("list claims"))?;
                let uid = String::from_utf8_lossy(&k).into_owned();
                out.push(record::decode_claim(&v).map_err(|source| StateError::Record { uid, source })?);
            }
            Ok(out)
        })
    }

    /// The UID of the claim holding `device`, if any.
    pub fn holder(&self, device: &str) -> Result<Option<String>, StateError> {
        self.with_db(|db| {
            let v = db.devices.get(device.as_bytes()).map_err(db_err("read a device"))?;
            Ok(v.map(|b| String::from_utf8_lossy(&b).into_owned()))
        })
    }

    /// Stores `record` (any phase) and takes its exclusive devices, durably. Fails with
    /// [`StateError::DeviceHeld`] when another claim holds one of them; devices this claim
    /// held under an earlier record and no longer needs are released. A holding whose
    /// claim has no record (a lazy removal a crash cut short) is taken over. A completed
    /// record without shares, of a claim that has none yet, is recorded without a
    /// transaction ([`fresh`]).
    pub fn put_claim(&self, record: &ClaimRecord) -> Result<(), StateError> {
        let uid = record.uid.as_bytes();
        let bytes = record::encode_claim(record);
        self.with_db(|db| {
            if self.put_fresh(db, record, &bytes)? {
                return Ok(());
            }
            let result = (&db.claims, &db.devices, &db.shares).transaction(|(claims, devices, shares)| {
                let holder_name =
                    |holder: &[u8]| -> Result<Option<String>, sled::transaction::UnabortableTransactionError> {
                        Ok(claims.get(holder)?.as_deref().and_then(claim_name))
                    };
                if let Some(old) = claims.get(uid)?
                    && let Ok(old) = record::decode_claim(&old)
                {
                    for d in old.held_devices() {
                        if devices.get(d.as_bytes())?.as_deref() == Some(uid) {
                            devices.remove(d.as_bytes())?;
                        }
                    }
                    for (_, share) in old.shares() {
                        release_shares(shares, share.gpu.as_bytes(), &record.uid)?;
                    }
                }
                // A holding whose claim has no record is orphaned (a crash in a lazy
                // removal): it holds nothing and is taken over.
                let orphaned = |holder: &[u8]| -> Result<bool, sled::transaction::UnabortableTransactionError> {
                    Ok(claims.get(holder)?.is_none())
                };
                // The shares of a GPU that other claims with a record hold.
                let others_shares =
                    |gpu: &[u8]| -> Result<Vec<ShareHolding>, ConflictableTransactionError<StateError>> {
                        let mut live = Vec::new();
                        for h in read_shares(shares, gpu)? {
                            if h.claim != record.uid && !orphaned(h.claim.as_bytes())? {
                                live.push(h);
                            }
                        }
                        Ok(live)
                    };
                for d in record.held_devices() {
                    let other = match devices.get(d.as_bytes())? {
                        Some(holder) if holder.as_ref() != uid && !orphaned(&holder)? => Some(holder.to_vec()),
                        _ => others_shares(d.as_bytes())?.into_iter().next().map(|h| h.claim.into_bytes()),
                    };
                    if let Some(holder) = other {
                        return Err(ConflictableTransactionError::Abort(StateError::DeviceHeld {
                            device: d.to_string(),
                            holder_name: holder_name(&holder)?,
                            holder: String::from_utf8_lossy(&holder).into_owned(),
                        }));
                    }
                    devices.insert(d.as_bytes(), uid)?;
                }
                let mut gpus: Vec<(&str, u64)> = Vec::new();
                for (_, share) in record.shares() {
                    if !gpus.iter().any(|(g, _)| *g == share.gpu) {
                        gpus.push((&share.gpu, share.gpu_memory));
                    }
                }
                for (gpu, gpu_memory) in gpus {
                    if let Some(holder) = devices.get(gpu.as_bytes())?.filter(|h| h.as_ref() != uid)
                        && !orphaned(&holder)?
                    {
                        return Err(ConflictableTransactionError::Abort(StateError::DeviceHeld {
                            device: gpu.to_string(),
                            holder_name: holder_name(&holder)?,
                            holder: String::from_utf8_lossy(&holder).into_owned(),
                        }));
                    }
                    let mut list = others_shares(gpu.as_bytes())?;
                    let used: u64 = list.iter().fold(0, |a, h| a.saturating_add(h.memory));
                    let mine: Vec<ShareHolding> = record
                        .shares()
                        .filter(|(_, s)| s.gpu == gpu)
                        .map(|(d, s)| ShareHolding {
                            claim: record.uid.clone(),
                            device: d.device.clone(),
                            share_id: d.share_id.clone(),
                            memory: s.memory,
                        })
                        .collect();
                    if let Some(taken) = list.iter().find(|h| {
                        h.share_id.is_some() && mine.iter().any(|m| m.device == h.device && m.share_id == h.share_id)
                    }) {
                        return Err(ConflictableTransactionError::Abort(StateError::ShareIdTaken {
                            device: taken.device.clone(),
                            share_id: taken.share_id.clone().unwrap_or_default(),
                            holder_name: holder_name(taken.claim.as_bytes())?,
                            holder: taken.claim.clone(),
                        }));
                    }
                    let asked: u64 = mine.iter().fold(0, |a, h| a.saturating_add(h.memory));
                    if used.saturating_add(asked) > gpu_memory {
                        let mut holders = Vec::new();
                        for h in &list {
                            let name = holder_name(h.claim.as_bytes())?.unwrap_or_else(|| format!("UID {}", h.claim));
                            holders.push(format!("{name} ({})", crate::util::quantity(h.memory)));
                        }
                        return Err(ConflictableTransactionError::Abort(StateError::SharesExceed {
                            gpu: gpu.to_string(),
                            asked,
                            free: gpu_memory.saturating_sub(used),
                            holders: holders.join(", "),
                        }));
                    }
                    list.extend(mine);
                    shares.insert(gpu.as_bytes(), record::encode_shares(&list))?;
                }
                claims.insert(uid, bytes.as_slice())?;
                Ok(())
            });
            tx_result(result, "record a claim")?;
            self.durable(db)
        })
    }

    /// The GPUs (device names) with shares held, in name order.
    pub fn gpus_with_shares(&self) -> Result<std::collections::BTreeSet<String>, StateError> {
        self.with_db(|db| {
            let mut out = std::collections::BTreeSet::new();
            for item in db.shares.iter() {
                let (k, _) = item.map_err(db_err("list shared GPUs"))?;
                out.insert(String::from_utf8_lossy(&k).into_owned());
            }
            Ok(out)
        })
    }

    /// The shares held on GPU `gpu` (device name), in the order they were taken; an
    /// unreadable list is an error, never "no shares".
    pub fn shares_of(&self, gpu: &str) -> Result<Vec<ShareHolding>, StateError> {
        self.with_db(|db| {
            let v = db.shares.get(gpu.as_bytes()).map_err(db_err("read a GPU's shares"))?;
            match v {
                None => Ok(Vec::new()),
                Some(b) => record::decode_shares(&b)
                    .map_err(|source| Failure::Plain(StateError::SharesRecord { gpu: gpu.to_string(), source })),
            }
        })
    }

    /// Rebuilds every unreadable share list from the claims' records (the source of truth:
    /// each record names its shares), durably; returns the GPUs rebuilt.
    pub fn rebuild_share_lists(&self) -> Result<Vec<String>, StateError> {
        let unreadable: Vec<String> = self.with_db(|db| {
            let mut out = Vec::new();
            for item in db.shares.iter() {
                let (k, v) = item.map_err(db_err("list shared GPUs"))?;
                if record::decode_shares(&v).is_err() {
                    out.push(String::from_utf8_lossy(&k).into_owned());
                }
            }
            Ok(out)
        })?;
        if unreadable.is_empty() {
            return Ok(unreadable);
        }
        let claims = self.claims()?;
        self.with_db(|db| {
            for gpu in &unreadable {
                let list: Vec<ShareHolding> = claims
                    .iter()
                    .flat_map(|c| {
                        c.shares().filter(|(_, s)| s.gpu == *gpu).map(|(d, s)| ShareHolding {
                            claim: c.uid.clone(),
                            device: d.device.clone(),
                            share_id: d.share_id.clone(),
                            memory: s.memory,
                        })
                    })
                    .collect();
                if list.is_empty() {
                    db.shares.remove(gpu.as_bytes()).map_err(db_err("rebuild a GPU's shares"))?;
                } else {
                    db.shares
                        .insert(gpu.as_bytes(), record::encode_shares(&list))
                        .map_err(db_err("rebuild a GPU's shares"))?;
                }
            }
            self.durable(db)
        })?;
        Ok(unreadable)
    }

    /// Deletes claim `uid`, releases its devices and drops its GPU change records and its
    /// MPS daemon record (the caller restored those GPUs and stopped the daemon first),
    /// durably; returns the removed record.
    pub fn remove_claim(&self, uid: &str) -> Result<Option<ClaimRecord>, StateError> {
        self.remove_claim_with(uid, true)
    }

    /// [`Store::remove_claim`] without waiting for the removal to be durable, for a claim
    /// whose prepare changed nothing outside the store and its CDI spec: sled's background
    /// flusher writes and fsyncs it within [`FLUSH_EVERY_MS`], and the next durable change
    /// covers it too. A power cut or kill -9 before that brings the record back, holding
    /// its devices; prepare then checks such a holder against the API server. When the
    /// transaction drops a GPU change or MPS daemon record, or the record has MIG devices,
    /// the removal is made durable all the same: a record of those coming back would have
    /// recovery set up again what was just undone.
    ///
    /// A claim with none of those is removed without a transaction: a sled transaction
    /// writes out sled's log buffer when it begins, which wakes sled's I/O threads right
    /// when the kubelet's answer goes out. The record goes first, then its holdings, each
    /// an atomic single-key change; sled's log keeps their order, so a crash in between
    /// keeps at most holdings whose claim has no record. Such an orphaned holding holds
    /// nothing: [`Store::put_claim`] takes it over, and recovery drops it
    /// ([`Store::drop_orphaned_holdings`]).
    pub fn remove_claim_lazily(&self, uid: &str) -> Result<Option<ClaimRecord>, StateError> {
        // Without a record, change and daemon records of the claim may still be there.
        let Some(rec) = self.claim(uid)? else { return self.remove_claim_with(uid, false) };
        let changes = self.gpu_changes()?.iter().any(|c| c.claim == uid);
        if changes || self.mps_daemon(uid)?.is_some() || rec.migs().next().is_some() {
            return self.remove_claim_with(uid, false);
        }
        self.remove_released(&rec)?;
        Ok(Some(rec))
    }

    /// [`Store::remove_claim_lazily`] of `old`, the record as its caller read it under the
    /// claim's lock and found without GPU change records, an MPS daemon or MIG devices of
    /// its own: removed without a transaction, the record first, then its holdings.
    pub(crate) fn remove_released(&self, old: &ClaimRecord) -> Result<(), StateError> {
        let key = old.uid.as_bytes();
        self.with_db(|db| {
            if db.claims.remove(key).map_err(db_err("remove a claim"))?.is_none() {
                return Ok(());
            }
            for d in old.held_devices() {
                // Only if this claim still holds it; any other answer leaves it as it is.
                let _ = db
                    .devices
                    .compare_and_swap(d.as_bytes(), Some(key), None::<&[u8]>)
                    .map_err(db_err("release a device"))?;
            }
            let mut gpus: Vec<&str> = old.shares().map(|(_, s)| s.gpu.as_str()).collect();
            gpus.sort_unstable();
            gpus.dedup();
            for gpu in gpus {
                db.shares
                    .fetch_and_update(gpu.as_bytes(), |list| without_holder(list, &old.uid))
                    .map_err(db_err("release a GPU's shares"))?;
            }
            Ok(())
        })
    }

    /// Drops every holding (an exclusive device, a share of a GPU) whose claim has no
    /// record — what a crash between the steps of a lazy removal
    /// ([`Store::remove_claim_lazily`]) leaves — durably; returns the devices and GPUs
    /// whose holdings were dropped, in name order.
    pub fn drop_orphaned_holdings(&self) -> Result<Vec<String>, StateError> {
        self.with_db(|db| {
            let known = |uid: &[u8]| db.claims.contains_key(uid).map_err(db_err("read a claim"));
            let mut dropped = Vec::new();
            for item in db.devices.iter() {
                let (device, holder) = item.map_err(db_err("list held devices"))?;
                if !known(&holder)? {
                    let _ = db
                        .devices
                        .compare_and_swap(&device, Some(&holder), None::<&[u8]>)
                        .map_err(db_err("drop an orphaned holding"))?;
                    dropped.push(String::from_utf8_lossy(&device).into_owned());
                }
            }
            for item in db.shares.iter() {
                let (gpu, bytes) = item.map_err(db_err("list shared GPUs"))?;
                // An unreadable list is rebuilt from the records instead.
                let Ok(list) = record::decode_shares(&bytes) else { continue };
                let mut orphans = Vec::new();
                for h in &list {
                    if !known(h.claim.as_bytes())? {
                        orphans.push(h.claim.clone());
                    }
                }
                if orphans.is_empty() {
                    continue;
                }
                db.shares
                    .fetch_and_update(&gpu, |list| {
                        orphans.iter().fold(list.map(<[u8]>::to_vec), |l, o| without_holder(l.as_deref(), o))
                    })
                    .map_err(db_err("drop an orphaned share"))?;
                dropped.push(String::from_utf8_lossy(&gpu).into_owned());
            }
            if !dropped.is_empty() {
                self.durable(db)?;
            }
            dropped.sort();
            Ok(dropped)
        })
    }

    fn remove_claim_with(&self, uid: &str, durable: bool) -> Result<Option<ClaimRecord>, StateError> {
        let key = uid.as_bytes();
        let changes: Vec<String> = self.gpu_changes()?.into_iter().filter(|c| c.claim == uid).map(|c| c.uuid).collect();
        self.with_db(|db| {
            let trees = (&db.claims, &db.devices, &db.gpu_changes, &db.mps_daemons, &db.shares);
            let result = trees.transaction(|(claims, devices, gpus, mps, shares)| {
                for gpu in &changes {
                    if let Some(v) = gpus.get(gpu.as_bytes())?
                        && record::decode_gpu_change(&v).is_ok_and(|c| c.claim == uid)
                    {
                        gpus.remove(gpu.as_bytes())?;
                    }
                }
                let daemon = mps.remove(key)?.is_some();
                let Some(old) = claims.remove(key)? else { return Ok((None, daemon)) };
                let old = record::decode_claim(&old).map_err(|source| {
                    ConflictableTransactionError::Abort(StateError::Record { uid: uid.to_string(), source })
                })?;
                for d in old.held_devices() {
                    if devices.get(d.as_bytes())?.as_deref() == Some(key) {
                        devices.remove(d.as_bytes())?;
                    }
                }
                for (_, share) in old.shares() {
                    release_shares(shares, share.gpu.as_bytes(), uid)?;
                }
                Ok((Some(old), daemon))
            });
            let (removed, daemon) = tx_result(result, "remove a claim")?;
            let side_effects =
                daemon || !changes.is_empty() || removed.as_ref().is_some_and(|r| r.migs().next().is_some());
            let durable = durable || side_effects;
            if durable && (removed.is_some() || side_effects) {
                self.durable(db)?;
            }
            Ok(removed)
        })
    }

    /// Makes every change made so far durable, lazy ones included (at shutdown).
    pub fn sync(&self) -> Result<(), StateError> {
        self.with_db(|db| self.durable(db))
    }

    /// The MPS daemon record of claim `uid`, if any.
    pub fn mps_daemon(&self, uid: &str) -> Result<Option<MpsDaemonRecord>, StateError> {
        self.with_db(|db| {
            let v = db.mps_daemons.get(uid.as_bytes()).map_err(db_err("read an MPS daemon record"))?;
            let decoded = v.map(|b| {
                record::decode_mps_daemon(&b).map_err(|source| StateError::MpsRecord { uid: uid.to_string(), source })
            });
            Ok(decoded.transpose()?)
        })
    }

    /// Every MPS daemon record, in claim UID order.
    pub fn mps_daemons(&self) -> Result<Vec<MpsDaemonRecord>, StateError> {
        self.with_db(|db| {
            let mut out = Vec::new();
            for item in db.mps_daemons.iter() {
                let (k, v) = item.map_err(db_err("list MPS daemons"))?;
                let uid = String::from_utf8_lossy(&k).into_owned();
                out.push(record::decode_mps_daemon(&v).map_err(|source| StateError::MpsRecord { uid, source })?);
            }
            Ok(out)
        })
    }

    /// Stores `record` (the claim's MPS daemon, before it starts and once it runs), durably.
    pub fn put_mps_daemon(&self, record: &MpsDaemonRecord) -> Result<(), StateError> {
        self.with_db(|db| {
            db.mps_daemons
                .insert(record.claim.as_bytes(), record::encode_mps_daemon(record))
                .map_err(db_err("record an MPS daemon"))?;
            self.durable(db)
        })
    }

    /// Drops the MPS daemon record of `holder` (a shared GPU's, after its daemon was
    /// stopped; a claim's goes with [`Store::remove_claim`]), durably. Returns whether there
    /// was one.
    pub fn remove_mps_daemon(&self, holder: &str) -> Result<bool, StateError> {
        self.with_db(|db| {
            let removed =
                db.mps_daemons.remove(holder.as_bytes()).map_err(db_err("drop an MPS daemon record"))?.is_some();
            if removed {
                self.durable(db)?;
            }
            Ok(removed)
        })
    }

    /// Every GPU change record, in GPU UUID order.
    pub fn gpu_changes(&self) -> Result<Vec<GpuChange>, StateError> {
        self.with_db(|db| {
            let mut out = Vec::new();
            for item in db.gpu_changes.iter() {
                let (k, v) = item.map_err(|source| StateError::Db { op: "list GPU changes", source })?;
                let uuid = String::from_utf8_lossy(&k).into_owned();
                out.push(record::decode_gpu_change(&v).map_err(|source| StateError::GpuRecord { uuid, source })?);
            }
            Ok(out)
        })
    }

    /// Records, durably, that `change` is about to be made. Fails with
    /// [`StateError::GpuChanged`] when another claim's change is recorded for the GPU. When
    /// this claim already has one (a prepare retried after a failure), the compute mode
    /// recorded first is kept as the one to restore: the GPU may already carry edra's.
    /// Returns the record as stored.
    pub fn put_gpu_change(&self, change: &GpuChange) -> Result<GpuChange, StateError> {
        let key = change.uuid.as_bytes();
        self.with_db(|db| {
            let result = db.gpu_changes.transaction(|gpus| {
                let mut stored = change.clone();
                if let Some(old) = gpus.get(key)? {
                    let old = record::decode_gpu_change(&old).map_err(|source| {
                        ConflictableTransactionError::Abort(StateError::GpuRecord { uuid: change.uuid.clone(), source })
                    })?;
                    if old.claim != change.claim {
                        return Err(ConflictableTransactionError::Abort(StateError::GpuChanged {
                            uuid: change.uuid.clone(),
                            holder: old.claim,
                        }));
                    }
                    stored.previous_compute_mode = old.previous_compute_mode;
                }
                gpus.insert(key, record::encode_gpu_change(&stored))?;
                Ok(stored)
            });
            let stored = tx_result(result, "record a GPU change")?;
            self.durable(db)?;
            Ok(stored)
        })
    }

    /// Drops the GPU change record of `uuid` if `holder` holds it, durably (after the GPU
    /// was put back). Returns whether a record was dropped.
    pub fn remove_gpu_change(&self, uuid: &str, holder: &str) -> Result<bool, StateError> {
        self.with_db(|db| {
            let result = db.gpu_changes.transaction(|gpus| {
                let held = gpus
                    .get(uuid.as_bytes())?
                    .is_some_and(|v| record::decode_gpu_change(&v).is_ok_and(|c| c.claim == holder));
                if held {
                    gpus.remove(uuid.as_bytes())?;
                }
                Ok(held)
            });
            let removed = tx_result(result, "drop a GPU change")?;
            if removed {
                self.durable(db)?;
            }
            Ok(removed)
        })
    }

    /// The schema version stored in the database (written when it was created).
    pub fn schema_version(&self) -> Result<u32, StateError> {
        self.with_db(|db| {
            let v = db.meta.get(META_SCHEMA).map_err(db_err("read the schema version"))?;
            Ok(v.and_then(|b| std::str::from_utf8(&b).ok().and_then(|s| s.parse().ok())).unwrap_or(SCHEMA_VERSION))
        })
    }

    /// The boot ID stored by the last start, if any.
    pub fn boot_id(&self) -> Result<Option<String>, StateError> {
        self.with_db(|db| {
            let v = db.meta.get(META_BOOT_ID).map_err(db_err("read the boot ID"))?;
            Ok(v.map(|b| String::from_utf8_lossy(&b).into_owned()))
        })
    }

    /// Stores the current boot ID, durably.
    pub fn set_boot_id(&self, boot_id: &str) -> Result<(), StateError> {
        self.with_db(|db| {
            db.meta.insert(META_BOOT_ID, boot_id.as_bytes()).map_err(db_err("store the boot ID"))?;
            self.durable(db)
        })
    }
}

/// `namespace/name` of the claim whose stored record is `bytes`, when it is readable.
fn claim_name(bytes: &[u8]) -> Option<String> {
    record::decode_claim(bytes).ok().map(|r| format!("{}/{}", r.namespace, r.name))
}

/// The shares listed for `gpu` in a transaction (an unreadable list counts as none: it is
/// rewritten from the claims that hold shares as they are prepared again).
fn read_shares(
    shares: &sled::transaction::TransactionalTree,
    gpu: &[u8],
) -> Result<Vec<ShareHolding>, ConflictableTransactionError<StateError>> {
    match shares.get(gpu)? {
        None => Ok(Vec::new()),
        Some(b) => record::decode_shares(&b).map_err(|source| {
            ConflictableTransactionError::Abort(StateError::SharesRecord {
                gpu: String::from_utf8_lossy(gpu).into_owned(),
                source,
            })
        }),
    }
}

/// The encoded share list `list` without `claim`'s shares: `None` when none are left, the
/// same bytes when it has none of them. An unreadable list stays as it is (it refuses new
/// shares of the GPU until it is rebuilt from the claims' records at the next start), so
/// the release itself goes on.
fn without_holder(list: Option<&[u8]>, claim: &str) -> Option<Vec<u8>> {
    let bytes = list?;
    let Ok(mut holdings) = record::decode_shares(bytes) else { return Some(bytes.to_vec()) };
    let before = holdings.len();
    holdings.retain(|h| h.claim != claim);
    if holdings.len() == before {
        return Some(bytes.to_vec());
    }
    (!holdings.is_empty()).then(|| record::encode_shares(&holdings))
}

/// Drops `claim`'s shares from `gpu`'s list in a transaction.
fn release_shares(
    shares: &sled::transaction::TransactionalTree,
    gpu: &[u8],
    claim: &str,
) -> Result<(), sled::transaction::UnabortableTransactionError> {
    let Some(old) = shares.get(gpu)? else { return Ok(()) };
    match without_holder(Some(&old), claim) {
        None => {
            shares.remove(gpu)?;
        }
        Some(new) if new.as_slice() != old.as_ref() => {
            shares.insert(gpu, new)?;
        }
        Some(_) => {}
    }
    Ok(())
}

/// How long opening waits for the lock on the database's files to clear.
const REOPEN_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether opening failed only because the database's lock is held.
pub(crate) fn lock_busy(e: &StateError) -> bool {
    match e {
        StateError::Open { source: sled::Error::Io(io), .. } => {
            io.kind() == io::ErrorKind::WouldBlock || io.to_string().contains("could not acquire lock")
        }
        _ => false,
    }
}

/// Opens the database in `dir`, waiting up to [`REOPEN_LOCK_WAIT`] for the lock on its files
/// to be released: right after the old handles are dropped, sled's own threads (or a child
/// being spawned by another thread, until it execs) can hold it a moment longer.
fn open_when_released(dir: &Path, flush_every: Option<u64>) -> Result<Db, StateError> {
    let deadline = std::time::Instant::now() + REOPEN_LOCK_WAIT;
    loop {
        match Db::open(dir, flush_every) {
            Err(e) if lock_busy(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

fn now_bytes() -> Vec<u8> {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    secs.to_string().into_bytes()
}

fn tx_result<T>(r: Result<T, TransactionError<StateError>>, op: &'static str) -> Result<T, StateError> {
    r.map_err(|e| match e {
        TransactionError::Abort(e) => e,
        TransactionError::Storage(source) => db_err(op)(source),
    })
}

pub(crate) use crate::util::sync_path;
