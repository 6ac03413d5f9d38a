//! Claims prepared before the kubelet asks (`claims.prepare_early`, with `claims.prefetch`).
//!
//! When the watch of this node's pods reads a pod's claim early ([`super::prefetch`]) and
//! the claim changes nothing on a GPU (no time-slice, MPS daemon, MIG instance or
//! shared-GPU setting), it is prepared at once, exactly as the kubelet's call would prepare
//! it: its CDI spec written, then its record committed as PrepareCompleted (durable). The
//! kubelet's NodePrepareResources then finds the claim prepared and is answered from the
//! state, as a repeated prepare is. A claim that changes a GPU waits for the kubelet: edra
//! changes hardware only when asked to.
//!
//! Staging never competes with the kubelet: it holds the claim's lock, and a claim the
//! kubelet is preparing or has prepared is left alone. Any failure (the claim is not
//! allocated here, a device is held, the disk) is logged at debug and left to the kubelet's
//! call, which prepares the claim itself and reports what went wrong.
//!
//! A claim prepared early that the kubelet never asks for, because its pod was deleted or
//! ended before it started, is released as soon as the watch sees no pod of this node still
//! waiting for it ([`Preparer::unstage`]). Which claims the kubelet has not asked for yet is
//! kept in memory only: after a restart such a claim counts as prepared, and the stale-claim
//! check ([`super::stale`]) releases it once its ResourceClaim is gone.

use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;

use super::ClaimError;
use super::{PrepareError, Preparer, blocking, cdi};
use crate::plugin::ClaimRef;
use crate::state::Phase;

/// What [`Preparer::stage`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Staged {
    /// The claim is prepared now; the kubelet's call will be answered from the state.
    Prepared,
    /// The claim was prepared already (by the kubelet, or staged before).
    AlreadyPrepared,
    /// The claim changes GPU settings: left to the kubelet's call.
    ChangesGpus,
}

impl Preparer {
    /// Prepares `claim` (read early, allocated and reserved for a pod bound to this node)
    /// before the kubelet asks, when that changes nothing on a GPU (module docs). An error
    /// says why it was not; the kubelet's call then prepares it as usual.
    pub async fn stage(&self, claim: &ResourceClaim) -> Result<Staged, PrepareError> {
        let meta = &claim.metadata;
        let claim_ref = ClaimRef {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
        };
        if !cdi::is_valid_uid(&claim_ref.uid) {
            return Err(ClaimError::InvalidUid { uid: claim_ref.uid }.into());
        }
        let guard = Arc::new(self.inner.locks.lock(&claim_ref.uid).await);
        if self.inner.store.claim(&claim_ref.uid)?.is_some() {
            return Ok(Staged::AlreadyPrepared);
        }
        let planned = self.plan_claim(&claim_ref, claim)?;
        if !self.changes_nothing(&planned) {
            return Ok(Staged::ChangesGpus);
        }
        let this = self.clone();
        let held = guard.clone();
        let done = blocking(move || {
            let _held = held;
            this.apply_in_one_step(planned.record)
        })
        .await??;
        self.staged().insert(claim_ref.uid.clone(), (claim_ref.namespace.clone(), claim_ref.name.clone()));
        self.inner.claims.prepared(&claim_ref);
        if done.devices.iter().any(|d| super::is_shared(d.share_id.as_deref(), &d.device)) {
            self.refresh_shared_gpus();
        }
        tracing::info!(
            claim.uid = %done.uid,
            claim = %format!("{}/{}", done.namespace, done.name),
            devices = done.devices.len(),
            "claim prepared before the kubelet asked (its pod is bound to this node)"
        );
        Ok(Staged::Prepared)
    }

    /// Releases claim `namespace/name` when edra prepared it early and the kubelet has not
    /// asked for it (its pod went before starting). Returns whether it was released; a
    /// claim the kubelet asked for meanwhile is left to the kubelet's unprepare.
    pub async fn unstage(&self, namespace: &str, name: &str) -> Result<bool, PrepareError> {
        let uid = {
            let staged = self.staged();
            let found = staged.iter().find(|(_, (ns, n))| ns == namespace && n == name);
            match found {
                Some((uid, _)) => uid.clone(),
                None => return Ok(false),
            }
        };
        let guard = self.inner.locks.lock(&uid).await;
        if self.staged().remove(&uid).is_none() {
            return Ok(false);
        }
        // Released meanwhile (the stale-claim check): nothing left to do.
        if !matches!(self.inner.store.claim(&uid)?, Some(rec) if rec.phase == Phase::PrepareCompleted) {
            return Ok(false);
        }
        let claim = ClaimRef { namespace: namespace.to_string(), name: name.to_string(), uid: uid.clone() };
        if let Err(e) = self.unprepare_locked(claim, guard).await {
            // Still held: the next time the pod watch lets it go, or the stale-claim check.
            self.staged().insert(uid, (namespace.to_string(), name.to_string()));
            return Err(e);
        }
        Ok(true)
    }

    /// Whether claim `uid` was prepared early and the kubelet had not asked for it until
    /// now; it has asked from now on. Called with the claim's lock held.
    pub(super) fn asked_for(&self, uid: &str) -> bool {
        self.staged().remove(uid).is_some()
    }

    /// Claims prepared early that the kubelet has not asked for yet.
    pub fn staged_count(&self) -> usize {
        self.staged().len()
    }

    fn staged(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, (String, String)>> {
        self.inner.staged.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
