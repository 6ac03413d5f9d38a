//! Node-local allocation state: a sled database behind a narrow, durable store API.
//!
//! Three trees: `claims` (claim UID → [`ClaimRecord`]), `devices` (device name → UID of the
//! claim holding it exclusively) and `meta` (store schema version, boot ID). Every change
//! is one sled transaction across the trees, made durable before the call returns: sled
//! 0.34's `flush()` only issues `sync_file_range` on Linux (its issue #1452), which persists
//! neither metadata nor the disk cache, so each commit is followed by `fsync` of the
//! database's log file (`db`) and its `conf`; the directory itself is synced after the
//! files are created. Nothing outside this module knows the store is sled.

pub mod record;
#[cfg(test)]
mod tests;

use std::fs::{DirBuilder, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionError};

pub use record::{ClaimRecord, DeviceRecord, Phase, RecordError, SCHEMA_VERSION};

const META_SCHEMA: &[u8] = b"schema";
/// Upper bound of sled's in-memory page cache. sled's default is 1 GiB; edra's state is a
/// few hundred bytes per prepared claim, so a node's whole database fits many times over
/// in 8 MiB, and the bound keeps a long-lived agent's memory from following sled's
/// history of pages.
pub const CACHE_CAPACITY: u64 = 8 * 1024 * 1024;
const META_BOOT_ID: &[u8] = b"boot_id";

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
    /// A read or a transaction failed.
    #[error("cannot {op} in edra's state database")]
    Db {
        /// The operation.
        op: &'static str,
        /// The cause.
        #[source]
        source: sled::Error,
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
    dir: PathBuf,
    db: sled::Db,
    claims: sled::Tree,
    devices: sled::Tree,
    meta: sled::Tree,
    /// sled's log file (`db`), kept open for fsync.
    log: Arc<File>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("dir", &self.dir).finish_non_exhaustive()
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

impl Store {
    /// Opens (creating when absent, mode 0700) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Store, StateError> {
        let create_err = |source| StateError::CreateDir { dir: dir.to_path_buf(), source };
        DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(create_err)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(create_err)?;
        let open_err =
            |source: sled::Error| StateError::Open { dir: dir.to_path_buf(), hint: open_hint(&source), source };
        let db = sled::Config::new().path(dir).cache_capacity(CACHE_CAPACITY).open().map_err(open_err)?;
        let tree = |name: &str| db.open_tree(name).map_err(open_err);
        let sync_err = |source| StateError::Sync { dir: dir.to_path_buf(), source };
        let log = Arc::new(File::open(dir.join("db")).map_err(sync_err)?);
        let store = Store {
            dir: dir.to_path_buf(),
            claims: tree("claims")?,
            devices: tree("devices")?,
            meta: tree("meta")?,
            db,
            log,
        };
        match store.meta.get(META_SCHEMA).map_err(open_err)? {
            Some(v) => {
                let found = std::str::from_utf8(&v).ok().and_then(|s| s.parse::<u32>().ok()).unwrap_or(u32::MAX);
                if found > SCHEMA_VERSION {
                    return Err(StateError::NewerSchema { dir: dir.to_path_buf(), found });
                }
            }
            None => {
                store.meta.insert(META_SCHEMA, SCHEMA_VERSION.to_string().as_bytes()).map_err(open_err)?;
            }
        }
        store.make_durable()?;
        sync_path(&dir.join("conf")).map_err(sync_err)?;
        sync_path(dir).map_err(sync_err)?;
        Ok(store)
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Flushes sled, then fsyncs its log file: the only way a change survives a power cut.
    /// (`conf` is written once, when the database is created, and synced by [`Store::open`].)
    fn make_durable(&self) -> Result<(), StateError> {
        let sync_err = |source| StateError::Sync { dir: self.dir.clone(), source };
        self.db.flush().map_err(|e| match e {
            sled::Error::Io(io) => sync_err(io),
            other => sync_err(io::Error::other(other.to_string())),
        })?;
        self.log.sync_all().map_err(sync_err)
    }

    /// The record of claim `uid`, if any.
    pub fn claim(&self, uid: &str) -> Result<Option<ClaimRecord>, StateError> {
        let v = self.claims.get(uid.as_bytes()).map_err(|source| StateError::Db { op: "read a claim", source })?;
        v.map(|b| record::decode_claim(&b).map_err(|source| StateError::Record { uid: uid.to_string(), source }))
            .transpose()
    }

    /// Every claim record, in UID order.
    pub fn claims(&self) -> Result<Vec<ClaimRecord>, StateError> {
        let mut out = Vec::new();
        for item in self.claims.iter() {
            let (k, v) = item.map_err(|source| StateError::Db { op: "list claims", source })?;
            let uid = String::from_utf8_lossy(&k).into_owned();
            out.push(record::decode_claim(&v).map_err(|source| StateError::Record { uid, source })?);
        }
        Ok(out)
    }

    /// The UID of the claim holding `device`, if any.
    pub fn holder(&self, device: &str) -> Result<Option<String>, StateError> {
        let v = self.devices.get(device.as_bytes()).map_err(|source| StateError::Db { op: "read a device", source })?;
        Ok(v.map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    /// Stores `record` (any phase) and takes its exclusive devices, durably. Fails with
    /// [`StateError::DeviceHeld`] when another claim holds one of them; devices this claim
    /// held under an earlier record and no longer needs are released.
    pub fn put_claim(&self, record: &ClaimRecord) -> Result<(), StateError> {
        let uid = record.uid.as_bytes();
        let bytes = record::encode_claim(record);
        let result = (&self.claims, &self.devices).transaction(|(claims, devices)| {
            if let Some(old) = claims.get(uid)?
                && let Ok(old) = record::decode_claim(&old)
            {
                for d in old.held_devices() {
                    if devices.get(d.as_bytes())?.as_deref() == Some(uid) {
                        devices.remove(d.as_bytes())?;
                    }
                }
            }
            for d in record.held_devices() {
                match devices.get(d.as_bytes())? {
                    Some(holder) if holder.as_ref() != uid => {
                        let holder_name = claims
                            .get(&holder)?
                            .and_then(|b| record::decode_claim(&b).ok())
                            .map(|r| format!("{}/{}", r.namespace, r.name));
                        return Err(ConflictableTransactionError::Abort(StateError::DeviceHeld {
                            device: d.to_string(),
                            holder: String::from_utf8_lossy(&holder).into_owned(),
                            holder_name,
                        }));
                    }
                    _ => {
                        devices.insert(d.as_bytes(), uid)?;
                    }
                }
            }
            claims.insert(uid, bytes.as_slice())?;
            Ok(())
        });
        tx_result(result, "record a claim")?;
        self.make_durable()
    }

    /// Deletes claim `uid` and releases its devices, durably; returns the removed record.
    pub fn remove_claim(&self, uid: &str) -> Result<Option<ClaimRecord>, StateError> {
        let key = uid.as_bytes();
        let result = (&self.claims, &self.devices).transaction(|(claims, devices)| {
            let Some(old) = claims.remove(key)? else { return Ok(None) };
            let old = record::decode_claim(&old).map_err(|source| {
                ConflictableTransactionError::Abort(StateError::Record { uid: uid.to_string(), source })
            })?;
            for d in old.held_devices() {
                if devices.get(d.as_bytes())?.as_deref() == Some(key) {
                    devices.remove(d.as_bytes())?;
                }
            }
            Ok(Some(old))
        });
        let removed = tx_result(result, "remove a claim")?;
        if removed.is_some() {
            self.make_durable()?;
        }
        Ok(removed)
    }

    /// The schema version stored in the database (written when it was created).
    pub fn schema_version(&self) -> Result<u32, StateError> {
        let v =
            self.meta.get(META_SCHEMA).map_err(|source| StateError::Db { op: "read the schema version", source })?;
        Ok(v.and_then(|b| std::str::from_utf8(&b).ok().and_then(|s| s.parse().ok())).unwrap_or(SCHEMA_VERSION))
    }

    /// The boot ID stored by the last start, if any.
    pub fn boot_id(&self) -> Result<Option<String>, StateError> {
        let v = self.meta.get(META_BOOT_ID).map_err(|source| StateError::Db { op: "read the boot ID", source })?;
        Ok(v.map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    /// Stores the current boot ID, durably.
    pub fn set_boot_id(&self, boot_id: &str) -> Result<(), StateError> {
        self.meta
            .insert(META_BOOT_ID, boot_id.as_bytes())
            .map_err(|source| StateError::Db { op: "store the boot ID", source })?;
        self.make_durable()
    }
}

fn tx_result<T>(r: Result<T, TransactionError<StateError>>, op: &'static str) -> Result<T, StateError> {
    r.map_err(|e| match e {
        TransactionError::Abort(e) => e,
        TransactionError::Storage(source) => StateError::Db { op, source },
    })
}

/// fsyncs a file or directory by path.
pub(crate) fn sync_path(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}
