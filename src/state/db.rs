//! The open sled database under the store: its trees and log file, opening it (creating
//! its identity, refusing a newer schema, waiting for a lock a closing database still
//! holds), group-committed durability (sled flush, then fsync of the log), and the
//! conversion of sled's errors into [`StateError`]s that name the operation.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use sled::transaction::TransactionError;

use super::{CACHE_CAPACITY, SCHEMA_VERSION, StateError};

/// The `meta` key of the store's schema version (see [`super::meta`]).
pub(super) const META_SCHEMA: &[u8] = b"schema";

/// The `meta` key of the store's identity.
pub(super) const META_ID: &[u8] = b"id";

/// The handles of one open database. Dropping the last of them closes it.
pub(super) struct Db {
    pub(super) db: sled::Db,
    pub(super) claims: sled::Tree,
    pub(super) devices: sled::Tree,
    pub(super) shares: sled::Tree,
    pub(super) gpu_changes: sled::Tree,
    pub(super) mps_daemons: sled::Tree,
    pub(super) meta: sled::Tree,
    /// sled's log file (`db`), kept open for fsync.
    pub(super) log: File,
    /// This store's identity (see [`Store::id`](super::Store::id)).
    pub(super) id: String,
    /// Group commit: changes asking to be made durable so far ...
    pub(super) written: AtomicU64,
    /// ... and how many of them the last flush covered; held while flushing.
    pub(super) synced: Mutex<u64>,
    /// Flushes made (sled flush + fsync).
    pub(super) flushes: AtomicU64,
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

pub(super) fn sled_io(e: sled::Error) -> io::Error {
    match e {
        sled::Error::Io(io) => plain_io(io),
        other => io::Error::other(other.to_string()),
    }
}

/// A failed read or transaction, its I/O error made plain.
pub(super) fn db_err(op: &'static str) -> impl Fn(sled::Error) -> StateError {
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
pub(super) fn plain_io(e: io::Error) -> io::Error {
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
    pub(super) fn open(dir: &Path, flush_every: Option<u64>) -> Result<Db, StateError> {
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
    /// is created, and synced by [`Store::open`](super::Store::open).) Called after a
    /// change is in sled's memory.
    ///
    /// Group commit: one flush at a time; a caller whose change a flush that started after
    /// it covered returns without flushing again, so concurrent changes (a burst of pods
    /// starting) share their fsyncs. A flush covers every change whose caller counted
    /// itself in `written` before the flush began, since its change was made before that.
    ///
    /// A lazy change ([`Store::remove_claim_lazily`](super::Store::remove_claim_lazily))
    /// counts itself nowhere: no caller waits for it, so it can make no caller skip a
    /// flush, and sled's log being one sequence, any flush that starts after the change was
    /// made (the next durable caller's, or sled's background flusher's) writes it too.
    pub(super) fn make_durable(&self) -> io::Result<()> {
        let mine = self.written.fetch_add(1, Ordering::SeqCst).saturating_add(1);
        let mut synced = self.synced.lock().unwrap_or_else(PoisonError::into_inner);
        if *synced >= mine {
            return Ok(());
        }
        let upto = self.written.load(Ordering::SeqCst);
        self.flushes.fetch_add(1, Ordering::Relaxed);
        tracing::trace_span!("state.flush").in_scope(|| self.db.flush()).map_err(sled_io)?;
        tracing::trace_span!("state.fsync").in_scope(|| self.log.sync_all())?;
        *synced = upto;
        Ok(())
    }
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
pub(super) fn open_when_released(dir: &Path, flush_every: Option<u64>) -> Result<Db, StateError> {
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

pub(super) fn now_bytes() -> Vec<u8> {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    secs.to_string().into_bytes()
}

pub(super) fn tx_result<T>(r: Result<T, TransactionError<StateError>>, op: &'static str) -> Result<T, StateError> {
    r.map_err(|e| match e {
        TransactionError::Abort(e) => e,
        TransactionError::Storage(source) => db_err(op)(source),
    })
}
