//! The `claims` and `devices` trees: a claim's record and the devices it holds
//! exclusively; recording a claim (in one transaction with its holdings, or without one
//! for a first record, see [`super::fresh`]), and removing it durably or lazily.

use sled::Transactional;
use sled::transaction::ConflictableTransactionError;

use super::db::{db_err, tx_result};
use super::holdings::Taking;
use super::record::{self, ClaimRecord};
use super::shares::{release_shares, without_holder};
use super::{StateError, Store};

impl Store {
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
    /// transaction ([`fresh`](super::fresh)).
    pub fn put_claim(&self, record: &ClaimRecord) -> Result<(), StateError> {
        let uid = record.uid.as_bytes();
        let bytes = record::encode_claim(record);
        self.with_db(|db| {
            if self.put_fresh(db, record, &bytes)? {
                return Ok(());
            }
            let result = (&db.claims, &db.devices, &db.shares).transaction(|(claims, devices, shares)| {
                let taking = Taking { claims, devices, shares, record };
                taking.release_earlier()?;
                taking.take_devices()?;
                for (gpu, gpu_memory) in taking.shared_gpus() {
                    taking.take_shares(gpu, gpu_memory)?;
                }
                claims.insert(uid, bytes.as_slice())?;
                Ok(())
            });
            tx_result(result, "record a claim")?;
            self.durable(db)
        })
    }

    /// Deletes claim `uid`, releases its devices and drops its GPU change records and its
    /// MPS daemon record (the caller restored those GPUs and stopped the daemon first),
    /// durably; returns the removed record.
    pub fn remove_claim(&self, uid: &str) -> Result<Option<ClaimRecord>, StateError> {
        self.remove_claim_with(uid, true)
    }

    /// [`Store::remove_claim`] without waiting for the removal to be durable, for a claim
    /// whose prepare changed nothing outside the store and its CDI spec: sled's background
    /// flusher writes and fsyncs it within [`FLUSH_EVERY_MS`](super::FLUSH_EVERY_MS), and the next durable change
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
}
