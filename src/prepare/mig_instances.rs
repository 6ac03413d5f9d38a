//! Dynamic MIG in prepare, unprepare and recovery: the MIG instances edra creates for the
//! claims allocated a MIG device ([`crate::dynamic_mig`] names them), recorded in the claim's
//! record ([`MigRecord`]) before each step that changes the GPU.
//!
//! Prepare: the placement is checked free (before anything is recorded), the intent is
//! recorded with PrepareStarted, the instance is created, its IDs and MIG UUID are
//! recorded, then the spec is written (the GPU's `/dev/nvidia<minor>` and the capability
//! nodes of the GPU and compute instance). Unprepare: the instances are marked as being
//! released, destroyed (compute, then GPU instance), then the record goes. Only instances
//! a record names are ever destroyed: a recorded intent without IDs (a crash right after
//! the create call) adopts the instance at exactly its placement and profile, which was
//! free when the intent was recorded.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;

use super::{AllocationError, GpuChangeError};
use super::{PrepareError, Preparer, failpoint};
use crate::dynamic_mig::OwnedInstances;
use crate::gpu::mig_control::{MigControl, MigError, MigInstance, MigProfile};
use crate::inventory::{Device, DeviceKind, Inventory, MigInfo};
use crate::state::{ClaimRecord, DeviceRecord, MigRecord, MigState};

/// A MIG instance could not be listed, created or destroyed.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot {action} the MIG instance of {device} (profile {profile} at placement {placement} of GPU {gpu}); {}",
    if *.action == "destroy" {
        "the kubelet retries the unprepare; check the GPU with nvidia-smi mig -lgi"
    } else {
        "the kubelet retries; if this persists, delete the pod so the claim is allocated again"
    }
)]
pub struct MigFailure {
    /// `list`, `create` or `destroy`.
    pub action: &'static str,
    /// The device as allocated.
    pub device: String,
    /// The GPU instance profile.
    pub profile: String,
    /// The placement.
    pub placement: crate::gpu::mig_control::Placement,
    /// The GPU's UUID.
    pub gpu: String,
    /// The backend's error.
    #[source]
    pub source: MigError,
}

/// What recovery did to the MIG instances of a completed claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MigCheck {
    /// All there (or the claim has none).
    Present,
    /// At least one was gone and was created again; the spec needs re-writing.
    Recreated,
    /// At least one was gone and could not be created again; the claim is marked lost.
    Lost,
}

/// The device node of capability `gi` (`ci = None`) or of compute instance `ci` of GPU
/// `gpu_minor`: the minor the driver lists under `<proc>/driver/nvidia/capabilities`, or
/// when it lists none (the mock backend) the driver's fixed numbering
/// (`/proc/driver/nvidia-caps/mig-minors`: 1 and 2 are config and monitor, then per GPU
/// 15 GPU instances of 9 minors, the instance's own and its 8 compute instances').
fn cap_node(dev_root: &Path, proc_root: &Path, gpu_minor: u32, gi: u32, ci: Option<u32>) -> Option<PathBuf> {
    let minor = crate::inventory::host::mig_cap_minor(proc_root, gpu_minor, gi, ci).or_else(|| {
        let base = gpu_minor.checked_mul(15 * 9)?.checked_add(gi.checked_mul(9)?)?.checked_add(3)?;
        match ci {
            None => Some(base),
            Some(ci) => base.checked_add(1)?.checked_add(ci),
        }
    })?;
    Some(dev_root.join(format!("nvidia-caps/nvidia-cap{minor}")))
}

/// The MIG device a created [`MigRecord`] stands for, as a static MIG device looks
/// (named as allocated): the parent's `/dev/nvidia<minor>` and the capability nodes of
/// its GPU and compute instance. `None` while it is not created.
pub(crate) fn created_device(d: &DeviceRecord, m: &MigRecord, dev_root: &Path, proc_root: &Path) -> Option<Device> {
    let (MigState::Created, Some(gi), Some(ci), Some(uuid)) = (m.state, m.gi, m.ci, m.uuid.as_ref()) else {
        return None;
    };
    let mut device_nodes = vec![dev_root.join(format!("nvidia{}", m.gpu_minor))];
    device_nodes.extend(cap_node(dev_root, proc_root, m.gpu_minor, gi, None));
    device_nodes.extend(cap_node(dev_root, proc_root, m.gpu_minor, gi, Some(ci)));
    Some(Device {
        name: d.device.clone(),
        kind: DeviceKind::Mig(MigInfo {
            parent_uuid: m.gpu.clone(),
            parent_minor: m.gpu_minor,
            parent_index: m.gpu_minor,
            gi,
            ci,
            profile: m.profile.clone(),
        }),
        uuid: uuid.clone(),
        index: m.gpu_minor,
        minor: m.gpu_minor,
        attributes: Default::default(),
        capacity: Default::default(),
        device_nodes,
        shared: None,
        consumes: None,
    })
}

/// `inventory` with the created MIG devices of `devices` added (named as allocated), so
/// the MPS plan and the spec find them; before creation, the parent GPU stands in.
pub(crate) fn with_mig_devices(
    inventory: &Inventory,
    devices: &[DeviceRecord],
    dev_root: &Path,
    proc_root: &Path,
) -> Inventory {
    let mut out = inventory.clone();
    for d in devices {
        let Some(m) = &d.mig else { continue };
        let device = created_device(d, m, dev_root, proc_root).unwrap_or_else(|| Device {
            name: d.device.clone(),
            kind: DeviceKind::Mig(MigInfo {
                parent_uuid: m.gpu.clone(),
                parent_minor: m.gpu_minor,
                parent_index: m.gpu_minor,
                gi: 0,
                ci: 0,
                profile: m.profile.clone(),
            }),
            uuid: m.gpu.clone(),
            index: m.gpu_minor,
            minor: m.gpu_minor,
            attributes: Default::default(),
            capacity: Default::default(),
            device_nodes: Vec::new(),
            shared: None,
            consumes: None,
        });
        out.devices.retain(|x| x.name != device.name);
        out.devices.push(device);
    }
    out
}

/// The instance of `instances` at exactly `m`'s placement and profile.
fn found<'a>(instances: &'a [MigInstance], m: &MigRecord) -> Option<&'a MigInstance> {
    instances.iter().find(|i| i.placement == m.placement && i.profile_id == m.profile_id)
}

/// Whether a destroy error means there is nothing left to destroy.
fn gone(e: &MigError) -> bool {
    matches!(e, MigError::UnknownGpu { .. } | MigError::MigModeOff { .. })
}

impl Preparer {
    /// The current inventory as prepare sees it: with the whole GPU of each GPU selected
    /// for dynamic MIG that is in MIG mode (published whole, consuming all its counters,
    /// but not among the backend's devices, which are its MIG instances), so a claim for
    /// the whole GPU is prepared as for any GPU.
    pub(super) fn inventory_view(&self) -> Arc<Inventory> {
        let inventory = self.inner.inventory.borrow().clone();
        let mig = &self.inner.settings.mig;
        let missing = |g: &&crate::inventory::MigGpu| {
            g.device.kind == DeviceKind::Gpu
                && mig.dynamic.selects(&g.device)
                && inventory.device(&g.device.name).is_none()
        };
        if !mig.any() || !inventory.mig_gpus.iter().any(|g| missing(&g)) {
            return inventory;
        }
        let mut view = (*inventory).clone();
        view.devices.extend(inventory.mig_gpus.iter().filter(missing).map(|g| g.device.clone()));
        Arc::new(view)
    }

    /// The backend's MIG control, if it has one.
    fn mig_control(&self) -> Option<&dyn MigControl> {
        self.inner.backend.as_deref().and_then(|b| b.mig())
    }

    /// The MIG instances edra recorded (intents included), updated whenever the records
    /// change; every other instance on a dynamic-MIG GPU is foreign.
    pub fn owned_mig(&self) -> watch::Receiver<Arc<OwnedInstances>> {
        self.inner.owned_mig.subscribe()
    }

    /// Ticks after every MIG instance edra created or destroyed on a GPU: the inventory
    /// is stale then. A change since the preparer opened (recovery re-created an
    /// instance) is seen at once by a new receiver.
    pub fn mig_changes(&self) -> watch::Receiver<u64> {
        let mut rx = self.inner.mig_changes.subscribe();
        if *rx.borrow() != 0 {
            rx.mark_changed();
        }
        rx
    }

    fn mig_changed(&self) {
        self.inner.mig_changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Re-reads the recorded MIG instances (an unreadable state keeps the last answer).
    pub(crate) fn refresh_owned_mig(&self) {
        let Ok(claims) = self.inner.store.claims() else { return };
        let owned: OwnedInstances =
            claims.iter().flat_map(|c| c.migs().map(|(_, m)| (m.gpu.clone(), m.placement))).collect();
        self.inner.owned_mig.send_if_modified(|held| {
            let changed = **held != owned;
            if changed {
                *held = Arc::new(owned);
            }
            changed
        });
    }

    fn mig_error(d: &DeviceRecord, m: &MigRecord, action: &'static str, source: MigError) -> PrepareError {
        GpuChangeError::Mig(Box::new(MigFailure {
            action,
            device: d.device.clone(),
            profile: m.profile.clone(),
            placement: m.placement,
            gpu: m.gpu.clone(),
            source,
        }))
        .into()
    }

    /// The MIG control, or why a MIG device cannot be prepared.
    fn mig_control_for(&self, d: &DeviceRecord) -> Result<&dyn MigControl, PrepareError> {
        self.mig_control().ok_or_else(|| {
            AllocationError::MigUnavailable {
                device: d.device.clone(),
                reason: format!(
                    "the {} backend cannot create MIG instances",
                    self.inner.backend.as_deref().map_or("configured", |b| b.name())
                ),
            }
            .into()
        })
    }

    /// Before anything is recorded: the backend can create MIG instances and each MIG
    /// device's placement is free (blocking I/O).
    pub(super) fn check_migs(&self, record: &ClaimRecord) -> Result<(), PrepareError> {
        for (d, m) in record.migs() {
            let control = self.mig_control_for(d)?;
            let instances = control.mig_instances(&m.gpu).map_err(|e| Self::mig_error(d, m, "list", e))?;
            if instances.iter().any(|i| i.placement.overlaps(&m.placement)) {
                let occupied =
                    MigError::Occupied { uuid: m.gpu.clone(), profile: m.profile.clone(), placement: m.placement };
                return Err(Self::mig_error(d, m, "create", occupied));
            }
        }
        Ok(())
    }

    /// The profile `m` names, from the current inventory's MIG GPUs.
    fn profile_of(&self, m: &MigRecord) -> Option<MigProfile> {
        let inventory = self.inner.inventory.borrow();
        let gpu = inventory.mig_gpus.iter().find(|g| g.uuid == m.gpu)?;
        gpu.capability.profile(m.profile_id).cloned()
    }

    /// Creates the instance of device `index` of `record` (its intent is recorded) and
    /// records its IDs, durably; when the record cannot be stored, destroys it again.
    fn create_one(&self, record: &mut ClaimRecord, index: usize) -> Result<(), PrepareError> {
        let Some(d) = record.devices.get(index) else { return Ok(()) };
        let Some(m) = d.mig.clone() else { return Ok(()) };
        let control = self.mig_control_for(d)?;
        let profile = self.profile_of(&m).ok_or_else(|| AllocationError::MigUnavailable {
            device: d.device.clone(),
            reason: format!("GPU {} is not in MIG mode (any more) or lacks profile {}", m.gpu, m.profile),
        })?;
        let created =
            control.create_mig(&m.gpu, &profile, m.placement).map_err(|e| Self::mig_error(d, &m, "create", e))?;
        self.mig_changed();
        failpoint::hit("prepare-after-mig-created");
        tracing::info!(claim.uid = %record.uid, device = %d.device, gpu = %m.gpu, gi = created.gi, uuid = created.uuid.as_deref().unwrap_or_default(), "MIG instance created");
        if let Some(slot) = record.devices.get_mut(index).and_then(|d| d.mig.as_mut()) {
            slot.state = MigState::Created;
            slot.gi = Some(created.gi);
            slot.ci = created.ci;
            slot.uuid = created.uuid.clone();
        }
        if let Err(e) = self.inner.store.put_claim(record) {
            if let Err(undo) = control.destroy_mig(&m.gpu, created.gi, created.ci) {
                tracing::warn!(claim.uid = %record.uid, gpu = %m.gpu, gi = created.gi, error = %undo, "cannot destroy a MIG instance whose creation could not be recorded");
            }
            return Err(e.into());
        }
        failpoint::hit("prepare-after-mig-recorded");
        Ok(())
    }

    /// Creates every MIG instance `record` intends (blocking I/O; the record is stored
    /// with PrepareStarted).
    pub(super) fn create_migs(&self, record: &mut ClaimRecord) -> Result<(), PrepareError> {
        for index in 0..record.devices.len() {
            let pending =
                record.devices.get(index).and_then(|d| d.mig.as_ref()).is_some_and(|m| m.state == MigState::Intent);
            if pending {
                self.create_one(record, index)?;
            }
        }
        Ok(())
    }

    /// Destroys the MIG instances of `rec` (blocking I/O): marks them as being released
    /// (durably), then destroys each recorded one; an intent without IDs adopts the
    /// instance at its placement when `adopt_intents` (after a crash), and is skipped
    /// otherwise (a create that failed leaves nothing). A failure keeps the record.
    pub(super) fn destroy_migs(&self, rec: &ClaimRecord, adopt_intents: bool) -> Result<(), PrepareError> {
        if rec.migs().next().is_none() {
            return Ok(());
        }
        let mut releasing = rec.clone();
        for m in releasing.devices.iter_mut().filter_map(|d| d.mig.as_mut()) {
            if m.state != MigState::Lost {
                m.state = MigState::Releasing;
            }
        }
        if releasing != *rec {
            self.inner.store.put_claim(&releasing)?;
            failpoint::hit("unprepare-after-mig-releasing");
        }
        for (d, m) in rec.migs() {
            if m.state == MigState::Lost || (m.gi.is_none() && !adopt_intents) {
                continue;
            }
            let control = self.mig_control_for(d)?;
            let instances = match control.mig_instances(&m.gpu) {
                Ok(instances) => instances,
                Err(e) if gone(&e) => Vec::new(),
                // Listing is the first step of destroying: same advice.
                Err(e) => return Err(Self::mig_error(d, m, "destroy", e)),
            };
            let target = match m.gi {
                // GPU instance IDs are reused: the recorded ID is destroyed only while it is
                // still the instance edra made (its placement, profile and UUID), never one
                // someone made after edra's was destroyed behind its back.
                Some(gi) => match instances.iter().find(|i| i.gi == gi) {
                    Some(i)
                        if i.placement == m.placement
                            && i.profile_id == m.profile_id
                            && (m.uuid.is_none() || i.uuid == m.uuid) =>
                    {
                        Some((gi, i.ci.or(m.ci)))
                    }
                    Some(i) => {
                        tracing::warn!(
                            claim.uid = %rec.uid,
                            gpu = %m.gpu,
                            gi,
                            "GPU instance {gi} is no longer the MIG instance edra made for {} (it is at placement {} \
                             now); edra's is gone and this one is left alone",
                            d.device,
                            i.placement
                        );
                        None
                    }
                    None => None,
                },
                None => found(&instances, m).map(|i| (i.gi, i.ci)),
            };
            let Some((gi, ci)) = target else { continue };
            match control.destroy_mig(&m.gpu, gi, ci) {
                Ok(()) => self.mig_changed(),
                Err(e) if gone(&e) => {
                    tracing::warn!(claim.uid = %rec.uid, gpu = %m.gpu, error = %e, "the GPU of a MIG instance is gone; nothing to destroy");
                }
                Err(e) => return Err(Self::mig_error(d, m, "destroy", e)),
            }
            failpoint::hit("unprepare-after-mig-destroyed");
            tracing::info!(claim.uid = %rec.uid, device = %d.device, gpu = %m.gpu, gi, "MIG instance destroyed");
        }
        Ok(())
    }

    /// Whether a completed claim has a MIG device marked lost: its next prepare fails.
    pub(super) fn lost_mig(rec: &ClaimRecord) -> Option<PrepareError> {
        rec.migs().find(|(_, m)| m.state == MigState::Lost).map(|(d, m)| {
            GpuChangeError::MigLost {
                device: d.device.clone(),
                profile: m.profile.clone(),
                placement: m.placement,
                gpu: m.gpu.clone(),
                reason: m.lost.clone().unwrap_or_default(),
            }
            .into()
        })
    }

    /// Recovery of a completed claim's MIG instances (blocking I/O): each must still exist
    /// (same GPU, placement and UUID). One that is gone (a reboot) is created again at its
    /// placement, its intent recorded first, and its new IDs recorded; one that cannot be
    /// is marked lost, so the claim's next prepare fails and says why.
    pub(crate) fn recover_migs(&self, rec: &ClaimRecord) -> Result<MigCheck, PrepareError> {
        let mut record = rec.clone();
        let mut outcome = MigCheck::Present;
        for index in 0..record.devices.len() {
            let Some(d) = record.devices.get(index).cloned() else { continue };
            let Some(m) = d.mig.clone() else { continue };
            if m.state == MigState::Lost {
                outcome = MigCheck::Lost;
                continue;
            }
            let Some(control) = self.mig_control() else {
                outcome = MigCheck::Lost;
                self.mark_lost(&mut record, index, "the backend cannot create MIG instances any more".into())?;
                continue;
            };
            let instances = match control.mig_instances(&m.gpu) {
                Ok(i) => i,
                // Unknown, not lost: the claim is kept as it is, and checked at the next start.
                Err(e) => {
                    tracing::warn!(claim.uid = %rec.uid, device = %d.device, gpu = %m.gpu, error = %e, "cannot check that a prepared claim's MIG instance still exists; kept as recorded");
                    continue;
                }
            };
            let present = instances
                .iter()
                .any(|i| Some(i.gi) == m.gi && i.placement == m.placement && i.uuid.is_some() && i.uuid == m.uuid);
            if m.state == MigState::Created && present {
                continue;
            }
            // An intent: a re-creation interrupted after the create call adopts its instance.
            if m.state == MigState::Intent
                && let Some(i) = found(&instances, &m)
            {
                self.record_created(&mut record, index, i)?;
                outcome = outcome.max_with(MigCheck::Recreated);
                continue;
            }
            if let Some(other) = instances.iter().find(|i| i.placement.overlaps(&m.placement)) {
                let reason = format!(
                    "another MIG instance (GPU instance {} at placement {}) occupies its memory slices",
                    other.gi, other.placement
                );
                outcome = MigCheck::Lost;
                self.mark_lost(&mut record, index, reason)?;
                continue;
            }
            let Some(profile) = self.profile_of(&m) else {
                outcome = MigCheck::Lost;
                let reason = format!("GPU {} is not in MIG mode or lacks profile {}", m.gpu, m.profile);
                self.mark_lost(&mut record, index, reason)?;
                continue;
            };
            if let Some(slot) = record.devices.get_mut(index).and_then(|d| d.mig.as_mut()) {
                *slot = MigRecord { state: MigState::Intent, gi: None, ci: None, uuid: None, ..slot.clone() };
            }
            self.inner.store.put_claim(&record)?;
            match control.create_mig(&m.gpu, &profile, m.placement) {
                Ok(i) => {
                    self.mig_changed();
                    self.record_created(&mut record, index, &i)?;
                    tracing::info!(claim.uid = %rec.uid, device = %d.device, gpu = %m.gpu, gi = i.gi, uuid = i.uuid.as_deref().unwrap_or_default(), "re-created a lost MIG instance at its placement");
                    outcome = outcome.max_with(MigCheck::Recreated);
                }
                Err(e) => {
                    outcome = MigCheck::Lost;
                    self.mark_lost(&mut record, index, e.to_string())?;
                }
            }
        }
        if outcome == MigCheck::Lost
            && let Err(e) = super::cdi::remove_spec(&record.cdi_spec_path)
        {
            tracing::warn!(claim.uid = %rec.uid, error = %e, "cannot remove the spec of a claim whose MIG device is lost");
        }
        Ok(outcome)
    }

    fn record_created(&self, record: &mut ClaimRecord, index: usize, i: &MigInstance) -> Result<(), PrepareError> {
        if let Some(slot) = record.devices.get_mut(index).and_then(|d| d.mig.as_mut()) {
            slot.state = MigState::Created;
            slot.gi = Some(i.gi);
            slot.ci = i.ci;
            slot.uuid = i.uuid.clone();
        }
        self.inner.store.put_claim(record)?;
        Ok(())
    }

    fn mark_lost(&self, record: &mut ClaimRecord, index: usize, reason: String) -> Result<(), PrepareError> {
        if let Some(d) = record.devices.get_mut(index)
            && let Some(slot) = d.mig.as_mut()
        {
            tracing::error!(claim.uid = %record.uid, device = %d.device, gpu = %slot.gpu, placement = %slot.placement, reason = %reason, "a prepared claim's MIG instance is gone and cannot be created again; its next prepare fails");
            *slot =
                MigRecord { state: MigState::Lost, gi: None, ci: None, uuid: None, lost: Some(reason), ..slot.clone() };
        }
        self.inner.store.put_claim(record)?;
        Ok(())
    }
}

impl MigCheck {
    /// The worse of two outcomes.
    fn max_with(self, other: MigCheck) -> MigCheck {
        match (self, other) {
            (MigCheck::Lost, _) | (_, MigCheck::Lost) => MigCheck::Lost,
            (MigCheck::Recreated, _) | (_, MigCheck::Recreated) => MigCheck::Recreated,
            _ => MigCheck::Present,
        }
    }
}
