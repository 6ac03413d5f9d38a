//! The `mps_daemons` tree: the MPS control daemon of a claim, or of a shared GPU's shares,
//! recorded before it starts so that recovery can find and stop it.

use super::db::db_err;
use super::record::{self, MpsDaemonRecord};
use super::{StateError, Store};

impl Store {
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
}
