//! The mock backend's dynamic MIG (`mock.mig_mode = true`): every mock GPU whose model has
//! a known profile table ([`crate::gpu::mig_control::profiles`]) is in MIG mode, and MIG instances
//! are created and destroyed on demand.
//!
//! The instances live in the mock's own state file, `<paths.runtime_dir>/mock-mig.json`,
//! written atomically (temp file, fsync, rename, fsync of the directory). So they outlive a
//! kill -9 of edra, as instances on a GPU do, and are gone when the runtime directory is
//! (a tmpfs cleared by a reboot, as a GPU's instances are). Creation checks occupancy as
//! NVML does (an overlapping placement or a profile at its instance limit is
//! [`MigError::Occupied`]), gives the lowest free GPU instance ID (from 1) and compute
//! instance 0, and a MIG UUID derived from the node, GPU and IDs. Destroying an instance
//! that does not exist succeeds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::gpu::mig_control::{MigCapability, MigControl, MigError, MigInstance, MigProfile, Placement};

/// The state file's name under `paths.runtime_dir`.
pub const STATE_FILE: &str = "mock-mig.json";

/// Highest GPU instance ID (the driver numbers capability devices for 15 per GPU).
const MAX_GI: u32 = 14;

/// The state file: instances per GPU UUID.
#[derive(Debug, Default, Serialize, Deserialize)]
struct StateFile {
    gpus: BTreeMap<String, Vec<MigInstance>>,
}

/// One MIG-mode GPU of the mock.
#[derive(Debug, Clone)]
pub(super) struct MigModeGpu {
    pub uuid: String,
    pub index: u32,
    pub capability: MigCapability,
}

/// MIG control over the mock's GPUs in MIG mode.
#[derive(Debug)]
pub struct MockMigControl {
    node: String,
    path: PathBuf,
    gpus: Vec<MigModeGpu>,
    /// Serialises read-modify-write of the state file within this process.
    lock: Mutex<()>,
}

impl MockMigControl {
    pub(super) fn new(node: &str, runtime_dir: &Path, gpus: Vec<MigModeGpu>) -> Self {
        Self { node: node.to_string(), path: runtime_dir.join(STATE_FILE), gpus, lock: Mutex::new(()) }
    }

    /// The state file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(super) fn gpus(&self) -> &[MigModeGpu] {
        &self.gpus
    }

    fn gpu(&self, uuid: &str) -> Result<&MigModeGpu, MigError> {
        self.gpus.iter().find(|g| g.uuid == uuid).ok_or_else(|| MigError::UnknownGpu { uuid: uuid.to_string() })
    }

    fn state_error(&self, message: impl Into<String>) -> MigError {
        MigError::MockState { path: self.path.clone(), message: message.into() }
    }

    /// The state file's contents; none yet (a fresh boot) is an empty state.
    fn read(&self) -> Result<StateFile, MigError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| self.state_error(format!("unreadable: {e}"))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(StateFile::default()),
            Err(e) => Err(self.state_error(format!("cannot read: {e}"))),
        }
    }

    fn write(&self, state: &StateFile) -> Result<(), MigError> {
        let dir = self.path.parent().unwrap_or(Path::new("/"));
        let bytes = serde_json::to_vec_pretty(state).map_err(|e| self.state_error(e.to_string()))?;
        let tmp = dir.join(format!(".{STATE_FILE}.tmp-{}", std::process::id()));
        std::fs::create_dir_all(dir)
            .and_then(|()| crate::util::write_atomically(&self.path, &tmp, &bytes, 0o644))
            .and_then(|()| crate::util::sync_path(dir))
            .map_err(|e| self.state_error(format!("cannot write: {e}")))
    }

    /// The instances on GPU `uuid` as the state file says (for discovery).
    pub(super) fn instances_of(&self, uuid: &str) -> Result<Vec<MigInstance>, MigError> {
        let _held = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(self.read()?.gpus.remove(uuid).unwrap_or_default())
    }

    /// The MIG UUID of compute instance `ci` of GPU instance `gi` on GPU `index`.
    fn mig_uuid(&self, index: u32, gi: u32, ci: u32) -> String {
        format!("MIG-{}", super::super::attributes::uuid_text(&format!("{}/gpu/{index}/gi/{gi}/ci/{ci}", self.node)))
    }
}

impl MigControl for MockMigControl {
    fn mig_instances(&self, uuid: &str) -> Result<Vec<MigInstance>, MigError> {
        self.gpu(uuid)?;
        self.instances_of(uuid)
    }

    fn create_mig(&self, uuid: &str, profile: &MigProfile, placement: Placement) -> Result<MigInstance, MigError> {
        let gpu = self.gpu(uuid)?;
        let known = gpu.capability.profile(profile.id).filter(|p| p.placements.contains(&placement));
        let Some(known) = known else {
            return Err(MigError::Nvml {
                call: "nvmlDeviceCreateGpuInstanceWithPlacement",
                uuid: uuid.to_string(),
                message: format!("Invalid Argument (profile ID {} at placement {placement})", profile.id),
            });
        };
        let _held = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let mut state = self.read()?;
        let instances = state.gpus.entry(uuid.to_string()).or_default();
        let occupied = || MigError::Occupied { uuid: uuid.to_string(), profile: known.name.clone(), placement };
        let same_profile = instances.iter().filter(|i| i.profile_id == known.id).count();
        if instances.iter().any(|i| i.placement.overlaps(&placement))
            || u32::try_from(same_profile).unwrap_or(u32::MAX) >= known.instances
        {
            return Err(occupied());
        }
        let gi = (1..=MAX_GI).find(|id| !instances.iter().any(|i| i.gi == *id)).ok_or_else(occupied)?;
        let created = MigInstance {
            gi,
            profile_id: known.id,
            placement,
            ci: Some(0),
            uuid: Some(self.mig_uuid(gpu.index, gi, 0)),
        };
        instances.push(created.clone());
        instances.sort_by_key(|i| i.gi);
        self.write(&state)?;
        tracing::info!(gpu = uuid, gi, profile = %known.name, %placement, "mock MIG instance created");
        Ok(created)
    }

    fn destroy_mig(&self, uuid: &str, gi: u32, ci: Option<u32>) -> Result<(), MigError> {
        self.gpu(uuid)?;
        let _held = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let mut state = self.read()?;
        let Some(instances) = state.gpus.get_mut(uuid) else { return Ok(()) };
        let before = instances.len();
        instances.retain(|i| i.gi != gi);
        if instances.len() == before {
            return Ok(());
        }
        if instances.is_empty() {
            state.gpus.remove(uuid);
        }
        self.write(&state)?;
        tracing::info!(gpu = uuid, gi, ?ci, "mock MIG instance destroyed");
        Ok(())
    }
}

#[cfg(test)]
mod tests;
