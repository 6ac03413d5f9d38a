//! What a claim recorded in a transaction ([`Store::put_claim`](super::Store::put_claim))
//! gives back and takes: the holdings of its earlier record are released, then its
//! exclusive devices and its shares of GPUs are taken, each refused when another claim
//! with a record holds the device, holds a share with the same ID, or leaves too little
//! of the GPU's memory. A holding whose claim has no record (a lazy removal a crash cut
//! short) holds nothing and is taken over.

use sled::transaction::{ConflictableTransactionError, TransactionalTree, UnabortableTransactionError};

use super::StateError;
use super::record::claim_name;
use super::record::{self, ClaimRecord, ShareHolding};
use super::shares::{read_shares, release_shares};

/// A step that may refuse the claim.
type Refusable<T> = Result<T, ConflictableTransactionError<StateError>>;

/// The trees of [`Store::put_claim`](super::Store::put_claim)'s transaction, and the
/// record it stores.
pub(super) struct Taking<'a> {
    pub(super) claims: &'a TransactionalTree,
    pub(super) devices: &'a TransactionalTree,
    pub(super) shares: &'a TransactionalTree,
    pub(super) record: &'a ClaimRecord,
}

impl<'a> Taking<'a> {
    /// The claim's UID as the trees' key.
    fn uid(&self) -> &'a [u8] {
        self.record.uid.as_bytes()
    }

    /// `namespace/name` of claim `holder`, when its record is readable.
    fn holder_name(&self, holder: &[u8]) -> Result<Option<String>, UnabortableTransactionError> {
        Ok(self.claims.get(holder)?.as_deref().and_then(claim_name))
    }

    /// A holding whose claim has no record is orphaned (a crash in a lazy removal): it
    /// holds nothing and is taken over.
    fn orphaned(&self, holder: &[u8]) -> Result<bool, UnabortableTransactionError> {
        Ok(self.claims.get(holder)?.is_none())
    }

    /// The shares of a GPU that other claims with a record hold.
    fn others_shares(&self, gpu: &[u8]) -> Refusable<Vec<ShareHolding>> {
        let mut live = Vec::new();
        for h in read_shares(self.shares, gpu)? {
            if h.claim != self.record.uid && !self.orphaned(h.claim.as_bytes())? {
                live.push(h);
            }
        }
        Ok(live)
    }

    /// The refusal of `device`, which claim `holder` holds.
    fn held(&self, device: &str, holder: &[u8]) -> Refusable<ConflictableTransactionError<StateError>> {
        Ok(ConflictableTransactionError::Abort(StateError::DeviceHeld {
            device: device.to_string(),
            holder_name: self.holder_name(holder)?,
            holder: String::from_utf8_lossy(holder).into_owned(),
        }))
    }

    /// Releases what the claim held under its earlier record, when it has a readable one:
    /// the devices it still holds and its shares.
    pub(super) fn release_earlier(&self) -> Result<(), UnabortableTransactionError> {
        let uid = self.uid();
        if let Some(old) = self.claims.get(uid)?
            && let Ok(old) = record::decode_claim(&old)
        {
            for d in old.held_devices() {
                if self.devices.get(d.as_bytes())?.as_deref() == Some(uid) {
                    self.devices.remove(d.as_bytes())?;
                }
            }
            for (_, share) in old.shares() {
                release_shares(self.shares, share.gpu.as_bytes(), &self.record.uid)?;
            }
        }
        Ok(())
    }

    /// Takes the claim's exclusive devices; one that another claim with a record holds,
    /// or has a share of, refuses the claim.
    pub(super) fn take_devices(&self) -> Refusable<()> {
        let uid = self.uid();
        for d in self.record.held_devices() {
            let other = match self.devices.get(d.as_bytes())? {
                Some(holder) if holder.as_ref() != uid && !self.orphaned(&holder)? => Some(holder.to_vec()),
                _ => self.others_shares(d.as_bytes())?.into_iter().next().map(|h| h.claim.into_bytes()),
            };
            if let Some(holder) = other {
                return Err(self.held(d, &holder)?);
            }
            self.devices.insert(d.as_bytes(), uid)?;
        }
        Ok(())
    }

    /// The GPUs the claim has shares of, each once with its memory, in the record's order.
    pub(super) fn shared_gpus(&self) -> Vec<(&'a str, u64)> {
        let mut gpus: Vec<(&str, u64)> = Vec::new();
        for (_, share) in self.record.shares() {
            if !gpus.iter().any(|(g, _)| *g == share.gpu) {
                gpus.push((&share.gpu, share.gpu_memory));
            }
        }
        gpus
    }

    /// Takes the claim's shares of `gpu` (`gpu_memory` bytes): refused when another
    /// claim holds the GPU exclusively, holds a share of it with one of the same IDs, or
    /// leaves less memory than the claim's shares take.
    pub(super) fn take_shares(&self, gpu: &str, gpu_memory: u64) -> Refusable<()> {
        let uid = self.uid();
        if let Some(holder) = self.devices.get(gpu.as_bytes())?.filter(|h| h.as_ref() != uid)
            && !self.orphaned(&holder)?
        {
            return Err(self.held(gpu, &holder)?);
        }
        let mut list = self.others_shares(gpu.as_bytes())?;
        let used: u64 = list.iter().fold(0, |a, h| a.saturating_add(h.memory));
        let mine = self.mine(gpu);
        if let Some(taken) = list
            .iter()
            .find(|h| h.share_id.is_some() && mine.iter().any(|m| m.device == h.device && m.share_id == h.share_id))
        {
            return Err(ConflictableTransactionError::Abort(StateError::ShareIdTaken {
                device: taken.device.clone(),
                share_id: taken.share_id.clone().unwrap_or_default(),
                holder_name: self.holder_name(taken.claim.as_bytes())?,
                holder: taken.claim.clone(),
            }));
        }
        let asked: u64 = mine.iter().fold(0, |a, h| a.saturating_add(h.memory));
        if used.saturating_add(asked) > gpu_memory {
            return Err(self.exceeds(gpu, asked, gpu_memory.saturating_sub(used), &list)?);
        }
        list.extend(mine);
        self.shares.insert(gpu.as_bytes(), record::encode_shares(&list))?;
        Ok(())
    }

    /// The claim's shares of `gpu` as holdings.
    fn mine(&self, gpu: &str) -> Vec<ShareHolding> {
        self.record
            .shares()
            .filter(|(_, s)| s.gpu == gpu)
            .map(|(d, s)| ShareHolding {
                claim: self.record.uid.clone(),
                device: d.device.clone(),
                share_id: d.share_id.clone(),
                memory: s.memory,
            })
            .collect()
    }

    /// The refusal of shares of `gpu` taking `asked` bytes where the other shares, `list`,
    /// leave `free`.
    fn exceeds(
        &self,
        gpu: &str,
        asked: u64,
        free: u64,
        list: &[ShareHolding],
    ) -> Refusable<ConflictableTransactionError<StateError>> {
        let mut holders = Vec::new();
        for h in list {
            let name = self.holder_name(h.claim.as_bytes())?.unwrap_or_else(|| format!("UID {}", h.claim));
            holders.push(format!("{name} ({})", crate::util::quantity(h.memory)));
        }
        Ok(ConflictableTransactionError::Abort(StateError::SharesExceed {
            gpu: gpu.to_string(),
            asked,
            free,
            holders: holders.join(", "),
        }))
    }
}
