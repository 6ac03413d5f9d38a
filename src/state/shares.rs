//! The `shares` tree: per GPU, the list of shares claims hold of it (consumable-capacity
//! allocations and replicas); reading it, rebuilding an unreadable list from the claims'
//! records, and dropping one claim's shares from a list.

use sled::transaction::ConflictableTransactionError;

use super::db::db_err;
use super::record::{self, ShareHolding};
use super::{Failure, StateError, Store};

impl Store {
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
}

/// The shares listed for `gpu` in a transaction (an unreadable list counts as none: it is
/// rewritten from the claims that hold shares as they are prepared again).
pub(super) fn read_shares(
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
pub(super) fn without_holder(list: Option<&[u8]>, claim: &str) -> Option<Vec<u8>> {
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
pub(super) fn release_shares(
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
