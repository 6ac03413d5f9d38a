//! The `meta` tree: the store's schema version, the boot ID of the last start, the store's
//! identity and when it was last re-opened after being poisoned.

use super::db::{META_SCHEMA, db_err};
use super::{SCHEMA_VERSION, StateError, Store};

pub(super) const META_BOOT_ID: &[u8] = b"boot_id";

/// When the store was last re-opened after being poisoned (the write that proves the disk).
pub(super) const META_REOPENED: &[u8] = b"reopened";

impl Store {
    /// This store's identity: random, made when the database was created and kept with
    /// it, so files edra writes can be proven to belong to this state and no other.
    pub fn id(&self) -> Result<String, StateError> {
        self.with_db(|db| Ok(db.id.clone()))
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
