//! Shared GPUs' settings (`sharing.enforcement`): what a GPU's first share sets on it — a
//! time-slice, or EXCLUSIVE_PROCESS and the GPU's MPS daemon ([`super::mps`]) — held by the
//! GPU's shares (`shared:gpu-0`) rather than by a claim, reused by later shares, and put
//! back after the last share's release; the GPU locks that order concurrent shares.

use super::{PrepareError, Preparer, plan};
use crate::sharing::Enforcement;
use crate::state::ClaimRecord;

impl Preparer {
    /// Whether preparing `record` may change the settings of a shared GPU
    /// (`sharing.enforcement` with an Exclusive share).
    pub(super) fn changes_shared_gpus(&self, record: &ClaimRecord) -> bool {
        self.inner.settings.sharing.enforcement != Enforcement::None
            && enforced_shares(&record.devices).next().is_some()
    }

    /// Applies `sharing.enforcement` to the GPUs of `record`'s shares: the first share of a
    /// GPU sets it (time-slice, or EXCLUSIVE_PROCESS and the GPU's MPS daemon), each change
    /// recorded durably before it is made and held by the GPU's shares ([`shared_holder`])
    /// rather than by the claim; a later share reuses what its GPU has (its MPS daemon is
    /// checked, and started again if it died). Shares whose claim chose its own strategy (a
    /// whole-memory share) are left to it. The caller holds the GPUs' locks
    /// ([`Preparer::lock_shared_gpus`]).
    pub(super) fn enforce_shared(&self, record: &ClaimRecord) -> Result<(), PrepareError> {
        let enforcement = self.inner.settings.sharing.enforcement;
        if enforcement == Enforcement::None {
            return Ok(());
        }
        let inventory = self.inner.inventory.borrow().clone();
        let changes = self.inner.store.gpu_changes()?;
        let interval = enforcement.timeslice().unwrap_or_default();
        let (mut first, mut later): (Vec<plan::TimeSlicedGpu>, Vec<String>) = (Vec::new(), Vec::new());
        for share in enforced_shares(&record.devices) {
            let Some(dev) = inventory.device(&share.gpu) else { continue };
            let holder = shared_holder(&share.gpu);
            if first.iter().any(|g| g.uuid == dev.uuid) || later.contains(&holder) {
                continue;
            }
            if changes.iter().any(|c| c.uuid == dev.uuid && c.claim == holder) {
                later.push(holder);
            } else {
                first.push(plan::TimeSlicedGpu { device: share.gpu.clone(), uuid: dev.uuid.clone(), interval });
            }
        }
        match enforcement {
            Enforcement::None => {}
            Enforcement::TimeSlicing(_) => {
                self.check_nvidia_smi(&first)?;
                for g in first {
                    self.time_slice(&shared_holder(&g.device), std::slice::from_ref(&g))?;
                }
            }
            Enforcement::Mps => {
                // What a GPU got from its first share stays until its last share is gone.
                for holder in later {
                    self.reuse_shared_mps(&holder)?;
                }
                for g in first {
                    self.start_shared_mps(&g.device, &g.uuid)?;
                }
            }
        }
        Ok(())
    }

    /// Puts back every GPU changed for its shares that has no share left (of `gpus`, or of
    /// all): stops its MPS daemon, restores its settings, then drops the daemon and change
    /// records (blocking I/O); returns how many. Run after a claim with shares is released
    /// and at recovery, so a crash between the steps is finished later. The caller holds
    /// the GPUs' locks.
    pub(crate) fn put_back_idle_shared_gpus(&self, gpus: Option<&[String]>) -> Result<usize, PrepareError> {
        let store = &self.inner.store;
        let wanted = |gpu: &str| gpus.is_none_or(|list| list.iter().any(|g| g == gpu));
        let mut n = 0;
        for c in store.gpu_changes()? {
            let Some(gpu) = c.claim.strip_prefix(SHARED_HOLDER) else { continue };
            if !wanted(gpu) || !store.shares_of(gpu)?.is_empty() {
                continue;
            }
            self.stop_mps(&c.claim)?;
            self.restore_gpus(&c.claim)?;
            store.remove_mps_daemon(&c.claim)?;
            store.remove_gpu_change(&c.uuid, &c.claim)?;
            tracing::info!(gpu = %c.uuid, device = gpu, "no share of the GPU is left; its settings are put back");
            n += 1;
        }
        // A daemon record without its change record (dropped in between by a crash).
        for d in store.mps_daemons()? {
            let Some(gpu) = d.claim.strip_prefix(SHARED_HOLDER) else { continue };
            if wanted(gpu) && store.shares_of(gpu)?.is_empty() {
                self.stop_mps(&d.claim)?;
                store.remove_mps_daemon(&d.claim)?;
            }
        }
        Ok(n)
    }

    /// The locks of the GPUs whose shares `devices` hold, in name order (taken after the
    /// claim's own lock, so two claims never wait on each other in opposite order), when
    /// edra changes shared GPUs' settings; none otherwise.
    pub(super) async fn lock_shared_gpus(
        &self,
        devices: &[crate::state::DeviceRecord],
    ) -> Vec<tokio::sync::OwnedMutexGuard<()>> {
        if self.inner.settings.sharing.enforcement == Enforcement::None {
            return Vec::new();
        }
        let gpus = devices.iter().filter_map(|d| d.share.as_ref()).map(|s| shared_holder(&s.gpu)).collect();
        self.lock_holders(gpus).await
    }

    /// The locks of `holders` (shared-GPU holders), in name order.
    pub(super) async fn lock_holders(&self, mut gpus: Vec<String>) -> Vec<tokio::sync::OwnedMutexGuard<()>> {
        gpus.sort();
        gpus.dedup();
        let mut guards = Vec::with_capacity(gpus.len());
        for g in gpus {
            guards.push(self.inner.locks.lock(&g).await);
        }
        guards
    }
}

/// The prefix of the holder of a GPU change made for a GPU's shares.
pub(crate) const SHARED_HOLDER: &str = "shared:";

/// The holder of the GPU change made for the shares of GPU `gpu` (device name): not a
/// claim UID, so no claim's release restores it; the last share's does.
pub(crate) fn shared_holder(gpu: &str) -> String {
    format!("{SHARED_HOLDER}{gpu}")
}

/// The shares among `devices` that `sharing.enforcement` applies to: those whose claim
/// keeps the Exclusive strategy (a whole-memory share with its own strategy is left to it);
/// admin access takes no share.
pub(super) fn enforced_shares(
    devices: &[crate::state::DeviceRecord],
) -> impl Iterator<Item = &crate::state::ShareRecord> {
    devices
        .iter()
        .filter(|d| !d.admin_access && d.config.sharing.strategy == crate::device_config::Strategy::Exclusive)
        .filter_map(|d| d.share.as_ref())
}

/// What `sharing.enforcement` (by name) does to a shared GPU, for messages.
pub(super) fn enforcement_summary(name: &str) -> &'static str {
    match name {
        "mps" => "one MPS daemon serves all the GPU's shares, each share's pinned memory limited to its size",
        "timeslicing" => "the GPU is time-sliced for all its shares",
        _ => "accounting only, nothing is set on the GPU",
    }
}
