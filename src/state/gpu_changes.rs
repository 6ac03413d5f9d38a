//! The `gpu_changes` tree: what edra is changing on a GPU for a claim (compute mode,
//! time-slice), recorded before the change so that the GPU can be put back; one claim's
//! change per GPU at a time.

use sled::transaction::ConflictableTransactionError;

use super::db::tx_result;
use super::record::{self, GpuChange};
use super::{StateError, Store};

impl Store {
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
}
