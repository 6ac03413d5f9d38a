//! Unprepare: a claim's spec, MPS daemon, GPU settings, MIG instances and records
//! removed, in that order; inline on the call's thread when only the spec and the record
//! are to go.

use crate::plugin::handler::ClaimRef;
use crate::state::{ClaimRecord, GpuChange, StateError};

use super::shared::{SHARED_HOLDER, shared_holder};
use super::{PrepareError, Preparer, blocking, cdi, failpoint};

impl Preparer {
    pub(super) async fn unprepare_one(&self, claim: ClaimRef) -> Result<(), PrepareError> {
        let guard = self.inner.locks.lock(&claim.uid).await;
        self.unprepare_locked(claim, guard).await
    }

    /// [`Self::unprepare_one`] with the claim's lock held.
    pub(super) async fn unprepare_locked(
        &self,
        claim: ClaimRef,
        guard: tokio::sync::OwnedMutexGuard<()>,
    ) -> Result<(), PrepareError> {
        // The shared GPUs this release may put back: the claim's, or for a claim already
        // gone every GPU still time-sliced for shares (a put-back that failed).
        let gpu_locks = match self.inner.store.claim(&claim.uid)? {
            Some(rec) => {
                let gpu_locks = self.lock_shared_gpus(&rec.devices).await;
                // Only its spec (an unlink on tmpfs) and its record (removed lazily, in
                // sled's memory) to remove: done here in microseconds, one thread hop less.
                if self.releases_inline(&rec)? {
                    let _held = (guard, gpu_locks);
                    return self.release_inline(&rec);
                }
                gpu_locks
            }
            None => {
                let holders = self.inner.store.gpu_changes()?.into_iter().map(|c| c.claim);
                self.lock_holders(holders.filter(|h| h.starts_with(SHARED_HOLDER)).collect()).await
            }
        };
        let this = self.clone();
        // Held by the blocking task: it outlives this future if the call is cancelled.
        blocking(move || {
            let _held = (guard, gpu_locks);
            this.release(&claim.uid)
        })
        .await?
    }

    /// Removes a claim's spec, stops its MPS daemon, restores the GPUs it changed,
    /// destroys its MIG instances, then removes its records (blocking I/O); unknown UIDs
    /// are fine.
    pub(crate) fn release(&self, uid: &str) -> Result<(), PrepareError> {
        self.release_with(uid, true)
    }

    /// [`Preparer::release`]; a MIG intent without IDs adopts the instance at its
    /// placement only with `adopt_intents` (not when rolling back a prepare whose create
    /// call failed, which leaves nothing).
    pub(super) fn release_with(&self, uid: &str, adopt_intents: bool) -> Result<(), PrepareError> {
        let store = &self.inner.store;
        let Some(rec) = store.claim(uid)? else {
            tracing::debug!(claim.uid = uid, "unprepare of an unknown claim; nothing to do");
            // A shared GPU whose last share went while putting it back failed.
            return self.put_back_idle_shared_gpus(None).map(|_| ());
        };
        remove_spec_of(&rec)?;
        self.remove_memory_limits(uid)?;
        self.stop_mps(uid)?;
        self.restore_gpus(uid)?;
        self.destroy_migs(&rec, adopt_intents)?;
        if self.releases_lazily(&rec)? {
            store.remove_claim_lazily(uid)?;
        } else {
            store.remove_claim(uid)?;
        }
        failpoint::hit("unprepare-after-record-remove");
        if rec.migs().next().is_some() {
            self.refresh_owned_mig();
        }
        let gpus: Vec<String> = rec.shares().map(|(_, s)| s.gpu.clone()).collect();
        if !gpus.is_empty() {
            self.put_back_idle_shared_gpus(Some(&gpus))?;
        }
        tracing::info!(claim.uid = uid, phase = ?rec.phase, "claim unprepared");
        Ok(())
    }
}

/// Removes `rec`'s CDI spec (the first step of a release).
fn remove_spec_of(rec: &ClaimRecord) -> Result<(), PrepareError> {
    cdi::remove_spec(&rec.cdi_spec_path).map_err(|source| PrepareError::Cdi {
        op: "remove",
        path: rec.cdi_spec_path.clone(),
        source,
    })?;
    failpoint::hit("unprepare-after-cdi-remove");
    Ok(())
}

impl Preparer {
    /// [`Preparer::release`] of a claim [`Preparer::releases_inline`] found has only its
    /// spec and its record to remove, as read under its lock: the same steps in the same
    /// order, without reading again what the check read. Nothing of its shared GPUs is to
    /// be put back: the check found no change or daemon of theirs, and their locks are held.
    pub(super) fn release_inline(&self, rec: &ClaimRecord) -> Result<(), PrepareError> {
        remove_spec_of(rec)?;
        self.inner.store.remove_released(rec)?;
        failpoint::hit("unprepare-after-record-remove");
        tracing::info!(claim.uid = rec.uid, phase = ?rec.phase, "claim unprepared");
        Ok(())
    }

    /// Whether the removal of `rec` may be lazy ([`crate::state::Store::remove_claim_lazily`]): its
    /// prepare was one durable step, as [`Preparer::apply`] decides it — no share of a GPU
    /// whose shares edra sets up (`sharing.enforcement`, now or when it was prepared);
    /// the store itself keeps the removal durable for a claim with GPU changes, an MPS
    /// daemon or MIG instances of its own.
    pub(super) fn releases_lazily(&self, rec: &ClaimRecord) -> Result<bool, StateError> {
        // Only shares need the GPU change records.
        let changes = if rec.shares().next().is_some() { self.inner.store.gpu_changes()? } else { Vec::new() };
        self.releases_lazily_given(rec, &changes)
    }

    /// [`Preparer::releases_lazily`] with the GPU change records read already.
    pub(super) fn releases_lazily_given(&self, rec: &ClaimRecord, changes: &[GpuChange]) -> Result<bool, StateError> {
        if self.changes_shared_gpus(rec) {
            return Ok(false);
        }
        let holders: Vec<String> = rec.shares().map(|(_, s)| shared_holder(&s.gpu)).collect();
        if holders.is_empty() {
            return Ok(true);
        }
        let store = &self.inner.store;
        if changes.iter().any(|c| holders.contains(&c.claim)) {
            return Ok(false);
        }
        for h in &holders {
            if store.mps_daemon(h)?.is_some() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether releasing `rec` is only removing its spec and its record lazily: no MIG
    /// instance, no GPU change and no MPS daemon of its own, and its shares (if any) of
    /// GPUs edra set nothing up on ([`Preparer::releases_lazily`]), so nothing that blocks.
    /// Called with the claim's and its shared GPUs' locks held.
    pub(super) fn releases_inline(&self, rec: &ClaimRecord) -> Result<bool, StateError> {
        let store = &self.inner.store;
        if rec.migs().next().is_some()
            || store.mps_daemon(&rec.uid)?.is_some()
            || !store.memory_limits_of(&rec.uid)?.is_empty()
        {
            return Ok(false);
        }
        let changes = store.gpu_changes()?;
        Ok(!changes.iter().any(|c| c.claim == rec.uid) && self.releases_lazily_given(rec, &changes)?)
    }
}
