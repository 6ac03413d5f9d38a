//! The mock backend's dynamic MIG (`mock.mig_mode = true`): every mock GPU whose model has
//! a known profile table ([`crate::gpu::mig::profiles`]) is in MIG mode, and MIG instances
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

use crate::gpu::mig::{MigCapability, MigControl, MigError, MigInstance, MigProfile, Placement};

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
        format!("MIG-{}", super::uuid_text(&format!("{}/gpu/{index}/gi/{gi}/ci/{ci}", self.node)))
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
mod tests {
    use crate::config::{Config, LoadContext, Overrides};
    use crate::gpu::mig::{MigError, Placement};
    use crate::inventory::mock::MockBackend;
    use crate::inventory::{DeviceBackend, DeviceKind};

    fn backend(runtime: &std::path::Path, product: &str) -> MockBackend {
        let ctx = LoadContext {
            explicit_file: None,
            default_file: "/nonexistent/edra.toml".into(),
            env: vec![],
            overrides: Overrides::default(),
            hostname: Some("n1".into()),
        };
        let mut cfg = Config::load(&ctx).expect("defaults are valid");
        cfg.paths.dev_root = "/tdev".into();
        cfg.paths.runtime_dir = runtime.to_path_buf();
        cfg.mock.mig_mode = true;
        cfg.mock.product_name = product.into();
        MockBackend::new(&cfg)
    }

    #[test]
    fn instances_are_created_where_free_listed_and_survive_a_new_backend() {
        let dir = tempfile::tempdir().unwrap();
        let b = backend(dir.path(), "NVIDIA A100-SXM4-80GB");
        let inv = b.discover().unwrap();
        assert!(inv.devices.is_empty(), "a GPU in MIG mode without instances has no devices");
        assert_eq!(inv.mig_gpus.len(), 2);
        let gpu = &inv.mig_gpus[0];
        assert_eq!((gpu.device.name.as_str(), gpu.device.kind.clone()), ("gpu-0", DeviceKind::Gpu));
        let three = gpu.capability.profile(9).unwrap().clone();
        let mig = b.mig().expect("MIG control");
        let first = mig.create_mig(&gpu.uuid, &three, Placement { start: 4, size: 4 }).unwrap();
        assert_eq!((first.gi, first.ci), (1, Some(0)));
        let second = mig.create_mig(&gpu.uuid, &three, Placement { start: 0, size: 4 }).unwrap();
        assert_eq!(second.gi, 2, "the lowest free GPU instance ID");
        assert_ne!(first.uuid, second.uuid);
        let one = gpu.capability.profile(19).unwrap().clone();
        let err = mig.create_mig(&gpu.uuid, &one, Placement { start: 5, size: 1 }).unwrap_err();
        assert!(matches!(err, MigError::Occupied { .. }), "{err}");
        let err = mig.create_mig(&gpu.uuid, &three, Placement { start: 2, size: 4 }).unwrap_err();
        assert!(matches!(err, MigError::Nvml { .. }), "not a placement of the profile: {err}");

        // A new backend (edra restarted) sees the same instances, as MIG devices too.
        let again = backend(dir.path(), "NVIDIA A100-SXM4-80GB");
        let inv = again.discover().unwrap();
        let names: Vec<&str> = inv.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["gpu-0-mig-1-0", "gpu-0-mig-2-0"]);
        assert_eq!(inv.devices[0].uuid, first.uuid.clone().unwrap());
        assert_eq!(inv.devices[0].capacity["memory"], 40192 << 20);
        assert_eq!(inv.mig_gpus[0].instances, vec![first.clone(), second.clone()]);

        again.mig().unwrap().destroy_mig(&gpu.uuid, first.gi, first.ci).unwrap();
        again.mig().unwrap().destroy_mig(&gpu.uuid, first.gi, first.ci).expect("a missing instance is destroyed");
        assert_eq!(again.mig().unwrap().mig_instances(&gpu.uuid).unwrap(), vec![second]);
        let freed = again.mig().unwrap().create_mig(&gpu.uuid, &one, Placement { start: 5, size: 1 }).unwrap();
        assert_eq!(freed.gi, 1);
        // A reboot clears the runtime directory, and the instances with it.
        std::fs::remove_file(dir.path().join(super::STATE_FILE)).unwrap();
        assert!(again.mig().unwrap().mig_instances(&gpu.uuid).unwrap().is_empty());
    }

    #[test]
    fn instance_limits_unknown_models_and_unreadable_state() {
        let dir = tempfile::tempdir().unwrap();
        let b = backend(dir.path(), "NVIDIA H100 80GB HBM3");
        let gpu = b.discover().unwrap().mig_gpus[0].clone();
        let me = gpu.capability.profile(20).unwrap().clone();
        let mig = b.mig().unwrap();
        mig.create_mig(&gpu.uuid, &me, Placement { start: 0, size: 1 }).unwrap();
        let err = mig.create_mig(&gpu.uuid, &me, Placement { start: 3, size: 1 }).unwrap_err();
        assert!(matches!(err, MigError::Occupied { .. }), "1g.10gb+me allows one instance: {err}");
        assert!(matches!(mig.mig_instances("GPU-nope"), Err(MigError::UnknownGpu { .. })));
        std::fs::write(dir.path().join(super::STATE_FILE), b"{not json").unwrap();
        let err = mig.destroy_mig(&gpu.uuid, 1, Some(0)).unwrap_err();
        assert!(err.to_string().contains("mock-mig.json"), "{err}");
        assert!(b.discover().is_err(), "an unreadable state is an error, not an empty GPU");

        let t4 = backend(dir.path(), "Tesla T4");
        assert!(t4.mig().is_none(), "no profile table, no MIG");
        assert_eq!(t4.discover().unwrap().devices.len(), 2, "whole GPUs");
    }
}
