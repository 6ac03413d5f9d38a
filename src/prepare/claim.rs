//! The prepare of one claim: answered from the state when it is prepared already;
//! otherwise fetched, planned against the inventory, applied (records, GPU changes, the
//! CDI spec) and answered with its CDI IDs.

use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::time::Instant;
use tracing::Instrument;

use crate::plugin::handler::{ClaimRef, PreparedDevice};
use crate::sharing::Enforcement;
use crate::state::{ClaimRecord, Phase, SCHEMA_VERSION};

use super::shared::{enforced_shares, shared_holder};
use super::{AllocationError, ClaimError, GpuChangeError};
use super::{
    PrepareError, Preparer, blocking, cdi, cdi_validate, failpoint, message, mig_instances, mps, now_secs, plan,
};

/// A claim planned for prepare: its record and the GPU changes it needs.
#[derive(Clone)]
pub(super) struct Planned {
    pub(super) record: ClaimRecord,
    pub(super) gpus: Vec<plan::TimeSlicedGpu>,
    pub(super) mps_plan: Option<plan::MpsPlan>,
}

pub(super) fn answer(record: &ClaimRecord) -> Vec<PreparedDevice> {
    record
        .devices
        .iter()
        .map(|d| PreparedDevice {
            request_names: d.request_names.clone(),
            pool_name: d.pool.clone(),
            device_name: d.device.clone(),
            cdi_device_ids: d.cdi_ids.clone(),
            share_id: d.share_id.clone(),
        })
        .collect()
}

impl Preparer {
    /// Builds and checks the spec of `record` from the current inventory.
    pub(super) fn spec_for(&self, record: &ClaimRecord) -> Result<cdi::Spec, PrepareError> {
        let s = &self.inner.settings;
        let inventory = self.inventory_view();
        let inventory = match record.migs().next() {
            None => inventory,
            Some(_) => {
                if let Some(lost) = record.migs().find(|(_, m)| m.state != crate::state::MigState::Created) {
                    return Err(Self::lost_mig(record).unwrap_or_else(|| {
                        AllocationError::MigUnavailable {
                            device: lost.0.device.clone(),
                            reason: "its MIG instance is not created".into(),
                        }
                        .into()
                    }));
                }
                Arc::new(mig_instances::with_mig_devices(&inventory, &record.devices, &s.dev_root, &s.proc_root))
            }
        };
        let mut devices = Vec::new();
        for d in &record.devices {
            let dev =
                inventory.device(d.gpu()).ok_or_else(|| AllocationError::UnknownDevice { device: d.device.clone() })?;
            // A replica or a share is the GPU under its own CDI name.
            let name = d.cdi_device();
            if !devices.iter().any(|x: &crate::inventory::Device| x.name == name) {
                devices.push(crate::inventory::Device { name, ..dev.clone() });
            }
        }
        // A Jetson's files are those its CSV lists name, read afresh for each spec built.
        let files = if devices.iter().any(crate::inventory::tegra::is_integrated) {
            Arc::new(
                super::driver_files::csv::discover(&s.driver_root, &s.dev_root).map_err(PrepareError::JetsonFiles)?,
            )
        } else {
            self.inner.driver_files.get(&s.driver_root, inventory.driver_version.as_deref().unwrap_or_default())
        };
        let vendor = s.cdi_vendor();
        let layout = cdi::SpecLayout {
            vendor: &vendor,
            dev_root: &s.dev_root,
            hook_binary: &s.hook_binary,
            host_driver_root: s.host_driver_root.as_deref(),
        };
        let devices: Vec<&crate::inventory::Device> = devices.iter().collect();
        let mut spec = cdi::build_spec(&layout, &record.uid, &devices, &files);
        mps::add_edits(&mut spec, record, &s.mps);
        // Shares of GPUs whose shares run an MPS daemon (set by the GPU's first share).
        let mut shared = Vec::new();
        for share in enforced_shares(&record.devices) {
            if !shared.contains(&share.gpu) && self.inner.store.mps_daemon(&shared_holder(&share.gpu))?.is_some() {
                shared.push(share.gpu.clone());
            }
        }
        mps::add_share_edits(&mut spec, record, &s.mps, &shared);
        self.add_memory_limit_hooks(&mut spec, record);
        let problems = cdi_validate::validate(&spec);
        if problems.is_empty() { Ok(spec) } else { Err(PrepareError::InvalidSpec { problems }) }
    }

    /// Writes `record`'s spec (blocking I/O).
    pub(super) fn write_spec_of(&self, record: &ClaimRecord) -> Result<(), PrepareError> {
        let spec = tracing::trace_span!("prepare.spec_build").in_scope(|| self.spec_for(record))?;
        let _written = tracing::trace_span!("prepare.spec_write").entered();
        cdi::write_spec(&record.cdi_spec_path, &spec).map_err(|source| PrepareError::Cdi {
            op: "write",
            path: record.cdi_spec_path.clone(),
            source,
        })
    }

    pub(super) async fn prepare_one(
        &self,
        claim: ClaimRef,
        deadline: Instant,
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        if !cdi::is_valid_uid(&claim.uid) {
            return Err(ClaimError::InvalidUid { uid: claim.uid }.into());
        }
        // Blocking work goes on when the kubelet cancels the call and this future is
        // dropped, so each blocking task holds the claim's lock too, until it ends.
        let guard = Arc::new(self.inner.locks.lock(&claim.uid).instrument(tracing::trace_span!("prepare.lock")).await);
        // A read of one small record is served from sled's cache in microseconds; doing it
        // here rather than on the blocking pool keeps the repeated prepare of a prepared
        // claim (every pod restart) to one thread hop less.
        // A completed record that does not hold its devices was cut short by a crash
        // before it was answered: the claim is prepared again.
        let found =
            tracing::trace_span!("prepare.lookup").in_scope(|| match self.inner.store.claim(&claim.uid)? {
                Some(rec) if rec.phase == Phase::PrepareCompleted && self.inner.store.holds_devices(&rec)? => {
                    Ok::<_, PrepareError>(Some(rec))
                }
                _ => Ok(None),
            })?;
        if let Some(rec) = found {
            if let Some(lost) = Self::lost_mig(&rec) {
                return Err(lost);
            }
            if !rec.cdi_spec_path.exists() {
                tracing::info!(claim.uid = %rec.uid, path = %rec.cdi_spec_path.display(), "re-writing a missing CDI spec");
                let this = self.clone();
                let r = rec.clone();
                let held = guard.clone();
                blocking(move || {
                    let _held = held;
                    this.write_spec_of(&r)
                })
                .await??;
            }
            self.inner.claims.prepared(&claim);
            match self.asked_for(&claim.uid) {
                true => {
                    tracing::info!(claim.uid = %rec.uid, "the kubelet asked for a claim prepared early; answered from state")
                }
                false => tracing::debug!(claim.uid = %rec.uid, "claim already prepared; answered from state"),
            }
            return Ok(answer(&rec));
        }
        let fetched = self
            .inner
            .claims
            .claim_for(&claim, deadline)
            .instrument(tracing::trace_span!("prepare.fetch"))
            .await
            .map_err(ClaimError::Fetch)?;
        let planned = tracing::trace_span!("prepare.plan").in_scope(|| self.plan_claim(&claim, &fetched))?;
        // Before anything is recorded or changed: a missing binary leaves all as it was.
        self.check_nvidia_smi(&planned.gpus)?;
        if planned.mps_plan.is_some() {
            self.inner.mps.check_binary().map_err(GpuChangeError::Mps)?;
        }
        if self.inner.settings.sharing.enforcement == Enforcement::Mps
            && let Some(share) = enforced_shares(&planned.record.devices).next()
        {
            let gpu = share.gpu.clone();
            self.inner.mps.check_binary().map_err(|source| GpuChangeError::SharedMps { gpu, source })?;
        }
        let done = self
            .apply_checking_holders(planned, &guard, deadline)
            .instrument(tracing::trace_span!("prepare.apply"))
            .await?;
        self.inner.claims.prepared(&claim);
        tracing::info!(claim.uid = %done.uid, devices = done.devices.len(), "claim prepared");
        Ok(answer(&done))
    }

    /// Plans claim `claim` as the API server sent it (`fetched`): the record to write
    /// (PrepareStarted, its devices resolved against the current inventory) and the GPU
    /// changes it needs.
    pub(super) fn plan_claim(&self, claim: &ClaimRef, fetched: &ResourceClaim) -> Result<Planned, PrepareError> {
        let inventory = self.inventory_view();
        let held_shares = self.inner.shared_gpus.borrow().clone();
        let devices = plan::plan(&self.inner.settings, claim, fetched, &inventory, &held_shares)?;
        let gpus = plan::timeslicing_gpus(&devices, &inventory);
        let mps_plan = match devices.iter().any(|d| d.mig.is_some()) {
            false => plan::mps_plan(&devices, &inventory)?,
            // Checked now with the parent GPUs standing in; planned again once created.
            true => {
                let s = &self.inner.settings;
                plan::mps_plan(
                    &devices,
                    &mig_instances::with_mig_devices(&inventory, &devices, &s.dev_root, &s.proc_root),
                )?
            }
        };
        let record = ClaimRecord {
            schema: SCHEMA_VERSION,
            uid: claim.uid.clone(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            phase: Phase::PrepareStarted,
            devices,
            cdi_spec_path: self.inner.settings.spec_path(&claim.uid),
            created_at: now_secs(),
            boot_id: self.inner.boot_id.clone(),
        };
        Ok(Planned { record, gpus, mps_plan })
    }

    /// Whether a planned claim changes nothing on a GPU (no time-slice, MPS daemon, MIG
    /// instance or shared-GPU setting): then one durable step prepares it.
    pub(super) fn changes_nothing(&self, planned: &Planned) -> bool {
        planned.gpus.is_empty()
            && planned.mps_plan.is_none()
            && planned.record.migs().next().is_none()
            && !self.changes_shared_gpus(&planned.record)
    }

    /// Steps 4–7 of prepare (blocking I/O). A claim that changes nothing on a GPU needs one
    /// durable step: its spec is written first (recovery removes a spec without a record),
    /// then PrepareCompleted is recorded, taking its devices. A claim that changes GPU
    /// settings or runs an MPS daemon records PrepareStarted first, so recovery can undo
    /// them, then the changes, the spec and PrepareCompleted. On a failure, what was done
    /// is undone.
    pub(super) fn apply(&self, planned: Planned) -> Result<ClaimRecord, PrepareError> {
        if self.changes_nothing(&planned) {
            return self.apply_in_one_step(planned.record);
        }
        let Planned { mut record, gpus, mps_plan } = planned;
        let (gpus, mps_plan) = (gpus.as_slice(), mps_plan.as_ref());
        let migs = record.migs().next().is_some();
        let store = &self.inner.store;
        if migs {
            self.check_migs(&record)?;
        }
        store.put_claim(&record)?;
        if migs {
            self.refresh_owned_mig();
            failpoint::hit("prepare-after-mig-intent");
        }
        failpoint::hit("prepare-after-started");
        let finish = (|| {
            self.create_migs(&mut record)?;
            self.time_slice(&record.uid, gpus)?;
            self.enforce_shared(&record)?;
            if let Some(p) = mps_plan {
                let created;
                let p = match migs {
                    false => p,
                    true => {
                        let s = &self.inner.settings;
                        let inventory = self.inventory_view();
                        let inventory =
                            mig_instances::with_mig_devices(&inventory, &record.devices, &s.dev_root, &s.proc_root);
                        created = plan::mps_plan(&record.devices, &inventory)?;
                        created.as_ref().unwrap_or(p)
                    }
                };
                self.start_mps(&record.uid, p)?;
            }
            self.write_spec_of(&record)?;
            failpoint::hit("prepare-after-cdi-write");
            record.phase = Phase::PrepareCompleted;
            failpoint::hit("prepare-before-completed");
            store.put_claim(&record)?;
            failpoint::hit("prepare-after-completed");
            Ok(())
        })();
        if let Err(e) = finish {
            if let Err(undo) = self.release_with(&record.uid, false) {
                tracing::warn!(
                    claim.uid = %record.uid,
                    error = %message(&undo),
                    "cannot roll back a failed prepare; unprepare or recovery at the next start will"
                );
            }
            return Err(e);
        }
        Ok(record)
    }

    /// The one durable step of a claim without GPU changes: spec, then PrepareCompleted.
    pub(super) fn apply_in_one_step(&self, mut record: ClaimRecord) -> Result<ClaimRecord, PrepareError> {
        self.write_spec_of(&record)?;
        failpoint::hit("prepare-after-cdi-write");
        record.phase = Phase::PrepareCompleted;
        failpoint::hit("prepare-before-completed");
        let recorded = tracing::trace_span!("prepare.record").in_scope(|| self.inner.store.put_claim(&record));
        if let Err(e) = recorded {
            // Not recorded (a device held by another claim, or the disk failed): the spec
            // goes; a spec left behind is removed by recovery as an orphan.
            if let Err(undo) = cdi::remove_spec(&record.cdi_spec_path) {
                tracing::warn!(claim.uid = %record.uid, error = %undo, "cannot remove the spec of a failed prepare; recovery will");
            }
            return Err(e.into());
        }
        failpoint::hit("prepare-after-completed");
        Ok(record)
    }
}
