//! Compute modes and time-slices a claim sets on its GPUs: checked, recorded before each
//! change, made, put back at release and set again after a reboot.

use crate::gpu::timeslice;
use crate::gpu::{ComputeMode, GpuError, Setting};
use crate::state::{GPU_CHANGE_SCHEMA, GpuChange};

use super::GpuChangeError;
use super::{PrepareError, Preparer, failpoint, gpu_error, plan};

impl Preparer {
    /// Sets a compute mode, counting the outcome.
    pub(super) fn set_mode(&self, uuid: &str, mode: ComputeMode) -> Result<(), GpuError> {
        let r = self.inner.compute_modes.set_compute_mode(uuid, mode);
        self.inner.gpu_counts.record(Setting::ComputeMode, r.is_ok());
        r
    }

    /// Sets a time-slice value, counting the outcome.
    pub(super) fn set_slice(&self, uuid: &str, value: u8) -> Result<(), GpuError> {
        let r = self.inner.settings.nvidia_smi.set_timeslice(uuid, value);
        self.inner.gpu_counts.record(Setting::Timeslice, r.is_ok());
        r
    }

    /// Fails with the reason when time-slicing `gpus` is asked for and `nvidia-smi` cannot
    /// be run, before anything is recorded or changed.
    pub(super) fn check_nvidia_smi(&self, gpus: &[plan::TimeSlicedGpu]) -> Result<(), PrepareError> {
        let Some(first) = gpus.first() else { return Ok(()) };
        self.inner.settings.nvidia_smi.check().map_err(|source| {
            GpuChangeError::Gpu { action: "set the time-slice", uuid: first.uuid.clone(), source }.into()
        })
    }

    /// Sets compute mode DEFAULT and the interval on each GPU, each change recorded
    /// durably before it is made (blocking I/O).
    pub(super) fn time_slice(&self, uid: &str, gpus: &[plan::TimeSlicedGpu]) -> Result<(), PrepareError> {
        let modes = &self.inner.compute_modes;
        for g in gpus {
            let gpu_err = |action| gpu_error(action, &g.uuid);
            let previous = modes.compute_mode(&g.uuid).map_err(gpu_err("read the compute mode"))?;
            let value = timeslice::interval_value(g.interval);
            self.inner.store.put_gpu_change(&GpuChange {
                schema: GPU_CHANGE_SCHEMA,
                uuid: g.uuid.clone(),
                device: g.device.clone(),
                claim: uid.to_string(),
                previous_compute_mode: previous,
                compute_mode: ComputeMode::Default,
                timeslice: Some(value),
            })?;
            failpoint::hit("prepare-after-gpu-recorded");
            self.set_mode(&g.uuid, ComputeMode::Default).map_err(gpu_err("set the compute mode"))?;
            failpoint::hit("prepare-after-compute-mode");
            self.set_slice(&g.uuid, value).map_err(gpu_err("set the time-slice"))?;
            failpoint::hit("prepare-after-timeslice");
            tracing::info!(claim.uid = uid, gpu = %g.uuid, interval = ?g.interval, "GPU time-sliced");
        }
        Ok(())
    }

    /// Puts back what the GPU change records of claim `uid` say edra changed: the
    /// time-slice to the driver's default (0), then the compute mode as it was (blocking
    /// I/O). A GPU no longer in the inventory is skipped. The records stay; the caller drops
    /// them.
    pub(super) fn restore_gpus(&self, uid: &str) -> Result<(), PrepareError> {
        for c in self.inner.store.gpu_changes()?.into_iter().filter(|c| c.claim == uid) {
            let gpu_err = |action| gpu_error(action, &c.uuid);
            let gone = |r: Result<(), GpuError>| match r {
                Err(GpuError::UnknownGpu { uuid }) => {
                    tracing::warn!(claim.uid = uid, gpu = %uuid, "GPU is gone; nothing to restore on it");
                    Ok(())
                }
                other => other,
            };
            if !self.gpu_present(&c.uuid) {
                // Fallen off the bus or removed: nothing to restore, and nvidia-smi would fail forever.
                tracing::warn!(claim.uid = uid, gpu = %c.uuid, "GPU is no longer on this node; nothing to restore on it");
                continue;
            }
            if c.timeslice.is_some() {
                self.set_slice(&c.uuid, 0).map_err(gpu_err("reset the time-slice"))?;
            }
            failpoint::hit("unprepare-after-timeslice-reset");
            gone(self.set_mode(&c.uuid, c.previous_compute_mode)).map_err(gpu_err("restore the compute mode"))?;
            failpoint::hit("unprepare-after-compute-mode-restore");
            tracing::info!(claim.uid = uid, gpu = %c.uuid, compute_mode = ?c.previous_compute_mode, "GPU settings restored");
        }
        Ok(())
    }

    /// Whether the full GPU `uuid` is in the current inventory (itself, or as the parent of
    /// MIG devices).
    pub(super) fn gpu_present(&self, uuid: &str) -> bool {
        let inventory = self.inner.inventory.borrow();
        inventory
            .devices
            .iter()
            .any(|d| d.uuid == uuid || matches!(&d.kind, crate::inventory::DeviceKind::Mig(m) if m.parent_uuid == uuid))
    }

    /// Sets again what the GPU change records of claim `uid` say (blocking I/O): compute
    /// modes and intervals do not survive a reboot or a driver reload, and the claim's
    /// pods expect them.
    pub(crate) fn reapply_gpus(&self, uid: &str) -> Result<usize, PrepareError> {
        let mut n = 0;
        for c in self.inner.store.gpu_changes()?.into_iter().filter(|c| c.claim == uid) {
            let gpu_err = |action| gpu_error(action, &c.uuid);
            self.set_mode(&c.uuid, c.compute_mode).map_err(gpu_err("set the compute mode"))?;
            if let Some(v) = c.timeslice {
                self.set_slice(&c.uuid, v).map_err(gpu_err("set the time-slice"))?;
            }
            n += 1;
        }
        Ok(n)
    }
}
