//! Recording a prepared claim seen for the first time without a sled transaction.
//!
//! A sled 0.34 transaction writes out sled's log buffer when it begins and again when it
//! commits, which wakes sled's I/O threads twice per claim, and it runs alone: once any
//! transaction has run, every transaction excludes every other read and write. In a burst of
//! pods starting that is most of what recording the claims costs. A claim prepared in one
//! durable step (it changes nothing outside the store and its CDI spec), recorded for the
//! first time and holding no shares of a GPU, is recorded with single-key changes instead,
//! the same way [`Store::remove_claim_lazily`] removes it:
//!
//! 0. a device held by a claim with a record, or a GPU another such claim has shares of,
//!    refuses the claim at once, so that nothing is taken and given back in the common
//!    case of a conflict that was there before (a holding taken for a moment would refuse
//!    other claims meanwhile, which a transaction never shows);
//! 1. its record is inserted if the claim has none (else the transaction records it);
//! 2. each of its devices is taken with a compare-and-swap: free, or held by a claim that
//!    has no record (what a lazy release cut short leaves, which holds nothing), or already
//!    its own; held by a claim with a record, the claim does not get it;
//! 3. a GPU with shares of another claim that has a record is not taken either;
//! 4. the change is made durable (group commit), and only then is the kubelet answered.
//!
//! The record comes first so that a holding always has its record behind it: a claim
//! recorded in a transaction at the same time sees either the holding and its record (and
//! does not get the device) or no holding (and takes it first; this claim then sees it and
//! does not). When a device is not got, what was taken is put back, then the record goes.
//!
//! sled's log keeps the order of the changes, so a crash leaves a prefix of them: nothing,
//! the record alone, the record and some of its holdings, or (when step 3 refused a GPU
//! and the crash came before the refusal's undoing was written) the record and a holding of
//! a GPU that another claim holds shares of. None of those was answered (the answer follows
//! step 4). A completed record that does not hold all its devices alone is therefore one a
//! crash cut short: [`Store::holds_devices`] says so, prepare does not answer from it (it
//! prepares the claim again, which records it in a transaction), and recovery rolls it
//! back.

use super::db::{Db, db_err};
use super::record::claim_name;
use super::record::{self, ClaimRecord, Phase, ShareHolding};
use super::{Failure, StateError, Store};

/// How often a device's compare-and-swap is retried when its holding changed in between
/// (another claim took or released it): a bound, not a number ever reached in practice.
const TAKE_TRIES: usize = 16;

/// What the compare-and-swap of one device found.
enum Take {
    /// The device was free, or held by a claim without a record: it is this claim's now.
    Taken,
    /// It was this claim's already (a device the record lists twice).
    Mine,
    /// A claim with a record holds it.
    Held(Vec<u8>),
}

impl Store {
    /// Whether every device `record` holds exclusively is held by its claim in the store,
    /// and by it alone: no other claim with a record holds shares of it. Only a record
    /// whose recording a crash cut short holds less (see the module docs): one cut before
    /// its devices were all taken, or one whose device sled's background flusher wrote out
    /// before the claim saw another claim's share of it and gave the device back.
    pub fn holds_devices(&self, record: &ClaimRecord) -> Result<bool, StateError> {
        self.with_db(|db| {
            for d in record.held_devices() {
                let holder = db.devices.get(d.as_bytes()).map_err(db_err("read a device"))?;
                if holder.as_deref() != Some(record.uid.as_bytes()) {
                    return Ok(false);
                }
                // An unreadable share list is rebuilt at the next start; it does not undo
                // a holding.
                let shared = others_share(db, d, &record.uid).map_err(db_err("read a GPU's shares"))?;
                if matches!(shared, Some(StateError::DeviceHeld { .. })) {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    }

    /// Records `record` without a transaction when it qualifies (a completed record without
    /// shares, of a claim that has no record yet): `Ok(true)` once recorded durably,
    /// `Ok(false)` when it does not qualify and nothing was changed.
    pub(super) fn put_fresh(&self, db: &Db, record: &ClaimRecord, bytes: &[u8]) -> Result<bool, Failure> {
        if record.phase != Phase::PrepareCompleted || record.shares().next().is_some() {
            return Ok(false);
        }
        let uid = record.uid.as_bytes();
        // A device already in the way refuses the claim before it takes anything: a
        // holding taken and given back would refuse, meanwhile, claims that fit.
        if let Some(refused) = in_the_way(db, record).map_err(db_err("read a device"))? {
            return Err(Failure::Plain(refused));
        }
        let inserted = db.claims.compare_and_swap(uid, None::<&[u8]>, Some(bytes)).map_err(db_err("record a claim"))?;
        if inserted.is_err() {
            return Ok(false);
        }
        crate::failpoint::hit_after("prepare-after-record", || {
            let _ = db.make_durable();
        });
        let mut taken: Vec<&str> = Vec::new();
        let outcome = (|| -> Result<Option<StateError>, sled::Error> {
            for d in record.held_devices() {
                match take(db, d.as_bytes(), uid)? {
                    Take::Taken => taken.push(d),
                    Take::Mine => {}
                    Take::Held(holder) => return held(db, d, &holder).map(Some),
                }
                if let Some(refused) = others_share(db, d, &record.uid)? {
                    return Ok(Some(refused));
                }
            }
            Ok(None)
        })();
        // A failed read or write leaves memory with a record that may lack holdings: the
        // store is poisoned, and a re-open and recovery see what the disk says.
        let poison = |e: sled::Error| Failure::Poison(db_err("record a claim")(e));
        match outcome.map_err(poison)? {
            None => self.durable(db).map(|()| true),
            Some(refused) => {
                for d in taken {
                    // Only if it is still this claim's; any other answer leaves it as it is.
                    let _ = db.devices.compare_and_swap(d.as_bytes(), Some(uid), None::<&[u8]>).map_err(poison)?;
                }
                db.claims.remove(uid).map_err(poison)?;
                Err(Failure::Plain(refused))
            }
        }
    }
}

/// The refusal of `record`'s first device that a claim with a record holds, or another
/// claim with a record holds shares of, as it is now.
fn in_the_way(db: &Db, record: &ClaimRecord) -> Result<Option<StateError>, sled::Error> {
    let uid = record.uid.as_bytes();
    for d in record.held_devices() {
        if let Some(holder) = db.devices.get(d.as_bytes())?
            && holder != uid
            && db.claims.contains_key(&holder)?
        {
            return held(db, d, &holder).map(Some);
        }
        if let Some(refused) = others_share(db, d, &record.uid)? {
            return Ok(Some(refused));
        }
    }
    Ok(None)
}

/// Takes `device` for claim `uid` (see [`Take`]).
fn take(db: &Db, device: &[u8], uid: &[u8]) -> Result<Take, sled::Error> {
    let mut expected: Option<sled::IVec> = None;
    for _ in 0..TAKE_TRIES {
        let current = match db.devices.compare_and_swap(device, expected.as_deref(), Some(uid))? {
            Ok(()) => return Ok(Take::Taken),
            Err(e) => e.current,
        };
        expected = match current {
            Some(h) if h == uid => return Ok(Take::Mine),
            Some(h) if db.claims.contains_key(&h)? => return Ok(Take::Held(h.to_vec())),
            // Free again, or held by a claim without a record: try again from what it is.
            other => other,
        };
    }
    let holder = db.devices.get(device)?.map(|h| h.to_vec()).unwrap_or_default();
    Ok(Take::Held(holder))
}

/// The refusal of `device`, held by claim `holder`.
fn held(db: &Db, device: &str, holder: &[u8]) -> Result<StateError, sled::Error> {
    let holder_name = db.claims.get(holder)?.as_deref().and_then(claim_name);
    Ok(StateError::DeviceHeld {
        device: device.to_string(),
        holder: String::from_utf8_lossy(holder).into_owned(),
        holder_name,
    })
}

/// The refusal of GPU `device` when another claim with a record holds shares of it (or its
/// share list is unreadable), as a transaction would refuse it.
fn others_share(db: &Db, device: &str, uid: &str) -> Result<Option<StateError>, sled::Error> {
    let Some(bytes) = db.shares.get(device.as_bytes())? else { return Ok(None) };
    let list: Vec<ShareHolding> = match record::decode_shares(&bytes) {
        Ok(list) => list,
        Err(source) => return Ok(Some(StateError::SharesRecord { gpu: device.to_string(), source })),
    };
    for h in list {
        if h.claim != uid && db.claims.contains_key(h.claim.as_bytes())? {
            return held(db, device, h.claim.as_bytes()).map(Some);
        }
    }
    Ok(None)
}
