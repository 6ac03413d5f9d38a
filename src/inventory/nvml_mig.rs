//! Dynamic MIG through NVML: what a GPU in MIG mode can be carved into, and creating,
//! listing and destroying its GPU and compute instances.
//!
//! nvml-wrapper 0.13 has no safe API for GPU or compute instances and its
//! `possible_placements` always answers nothing, so this module calls NVML's functions
//! through nvml-wrapper-sys (`Nvml::lib()`), one small checked wrapper per function (the
//! private `raw` module). A function the loaded library lacks (an old driver) is
//! [`MigError::Unsupported`] naming it, never the panic the raw bindings would give. What
//! NVML answers is trusted no further than its buffers: counts are bounded before anything
//! is allocated and only what fits is read back; sizes use saturating arithmetic.
//!
//! A MIG instance here is one GPU instance with one compute instance covering all of it
//! (compute instance profile with the GPU instance's slice count, shared engines), as
//! `nvidia-smi mig -cgi <profile> -C` makes. Profile names follow `nvidia-smi`:
//! `<slices>g.<memory>gb` plus `+me` for the media-extension profiles.

mod raw;

use nvml_wrapper::Device;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;
use sys::nvmlGpuInstance_t;

use super::attributes::{mig_memory_gb, mig_profile_name};
use super::nvml::NvmlBackend;
use crate::gpu::mig_control::{MigCapability, MigControl, MigError, MigInstance, MigProfile, Placement};
use crate::inventory::MigGpu;
use raw::{Fail, INSUFFICIENT_RESOURCES, INVALID_ARGUMENT, NOT_FOUND, Raw};

/// `nvmlDeviceGetMigMode`'s value for "enabled".
const MIG_ENABLED: u32 = 1;

/// The compute instance profile index (`NVML_COMPUTE_INSTANCE_PROFILE_*`) of `slices`.
fn ci_profile_index(slices: u32) -> Option<u32> {
    Some(match slices {
        1 => sys::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        2 => sys::NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
        3 => sys::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        4 => sys::NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
        6 => sys::NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
        7 => sys::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
        8 => sys::NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
        _ => return None,
    })
}

/// The `nvidia-smi` name of GPU instance profile `index`: `<slices>g.<gb>gb` and the
/// suffix of its engine variant (`+me` media extensions, `+me.all` all media engines,
/// `-me` none, `+gfx` graphics).
pub fn profile_name(index: u32, slices: u32, memory_gb: u64) -> String {
    let suffix = match index {
        sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 | sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1 => "+me",
        sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX..=sys::NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX => "+gfx",
        sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME | sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME => "-me",
        sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME | sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME => "+me.all",
        _ => "",
    };
    format!("{}{suffix}", mig_profile_name(slices, slices, memory_gb))
}

/// GPU instance profile `index` of `dev`, `None` when the GPU does not offer it.
fn profile_info(
    dev: &Device<'_>,
    uuid: &str,
    index: u32,
) -> Result<Option<nvml_wrapper::struct_wrappers::device::ProfileInfo>, MigError> {
    const CALL: &str = "nvmlDeviceGetGpuInstanceProfileInfo";
    match dev.profile_info(index) {
        Ok(info) => Ok(Some(info)),
        Err(NvmlError::NotSupported | NvmlError::InvalidArg) => Ok(None),
        Err(NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound) => {
            Err(MigError::Unsupported { call: CALL })
        }
        Err(e) => Err(MigError::Nvml { call: CALL, uuid: uuid.to_string(), message: e.to_string() }),
    }
}

/// Every GPU instance on `dev`, with its first compute instance and MIG UUID.
fn instances(dev: &Device<'_>, raw: &Raw<'_>, uuid: &str) -> Result<Vec<MigInstance>, MigError> {
    // SAFETY: the handle is only passed to NVML while `dev` (and its library) lives.
    let handle = unsafe { dev.handle() };
    let mut out = Vec::new();
    for index in 0..sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
        let Some(profile) = profile_info(dev, uuid, index)? else { continue };
        let gis = raw.gpu_instances(handle, profile.id, profile.instance_count).map_err(|e| e.into_mig(uuid))?;
        for gi in gis {
            let info = raw.gi_info(gi).map_err(|e| e.into_mig(uuid))?;
            let (ci, mig_uuid) = match raw.first_ci(gi).map_err(|e| e.into_mig(uuid))? {
                Some((id, mig)) => (Some(id), Some(raw.uuid_of(mig).map_err(|e| e.into_mig(uuid))?)),
                None => (None, None),
            };
            out.push(MigInstance {
                gi: info.id,
                profile_id: info.profileId,
                placement: Placement { start: info.placement.start, size: info.placement.size },
                ci,
                uuid: mig_uuid,
            });
        }
    }
    out.sort_by_key(|i| i.gi);
    out.dedup_by_key(|i| i.gi);
    Ok(out)
}

impl NvmlBackend {
    /// The GPU `uuid`, checked to be in MIG mode.
    fn mig_gpu_handle(&self, uuid: &str) -> Result<Device<'_>, MigError> {
        let dev = self.nvml().device_by_uuid(uuid).map_err(|e| match e {
            NvmlError::NotFound => MigError::UnknownGpu { uuid: uuid.to_string() },
            e => MigError::Nvml { call: "nvmlDeviceGetHandleByUUID", uuid: uuid.to_string(), message: e.to_string() },
        })?;
        match dev.mig_mode() {
            Ok(mode) if mode.current == MIG_ENABLED => Ok(dev),
            Ok(_) | Err(NvmlError::NotSupported) => Err(MigError::MigModeOff { uuid: uuid.to_string() }),
            Err(NvmlError::FailedToLoadSymbol(_)) => Err(MigError::Unsupported { call: "nvmlDeviceGetMigMode" }),
            Err(e) => {
                Err(MigError::Nvml { call: "nvmlDeviceGetMigMode", uuid: uuid.to_string(), message: e.to_string() })
            }
        }
    }

    fn raw(&self) -> Raw<'_> {
        Raw { lib: self.nvml().lib() }
    }

    /// What GPU `dev` (in MIG mode, `memory` bytes in all) can be carved into and the
    /// instances on it now.
    pub(super) fn mig_gpu(
        &self,
        dev: &Device<'_>,
        uuid: &str,
        memory: u64,
        whole: crate::inventory::Device,
    ) -> Result<MigGpu, MigError> {
        let raw = self.raw();
        // SAFETY: the handle is only passed to NVML while `dev` (and its library) lives.
        let handle = unsafe { dev.handle() };
        let mut profiles = Vec::new();
        for index in 0..sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
            let Some(info) = profile_info(dev, uuid, index)? else { continue };
            profiles.push(MigProfile {
                name: profile_name(index, info.slice_count, mig_memory_gb(memory, info.memory_size_mb)),
                index,
                id: info.id,
                slices: info.slice_count,
                instances: info.instance_count,
                multiprocessors: info.multiprocessor_count,
                copy_engines: info.copy_engine_count,
                decoders: info.decoder_count,
                encoders: info.encoder_count,
                jpeg_engines: info.jpeg_count,
                ofa_engines: info.ofa_count,
                memory: info.memory_size_mb.saturating_mul(1 << 20),
                placements: raw.placements(handle, info.id).map_err(|e| e.into_mig(uuid))?,
            });
        }
        if profiles.is_empty() {
            return Err(MigError::Nvml {
                call: "nvmlDeviceGetGpuInstanceProfileInfo",
                uuid: uuid.to_string(),
                message: "the GPU offers no GPU instance profile".to_string(),
            });
        }
        profiles.sort_by_key(|p| p.id);
        let memory_slices =
            profiles.iter().flat_map(|p| &p.placements).map(|p| p.start.saturating_add(p.size)).max().unwrap_or(0);
        Ok(MigGpu {
            uuid: uuid.to_string(),
            device: whole,
            capability: MigCapability { memory_slices, profiles },
            instances: instances(dev, &raw, uuid)?,
        })
    }

    /// Creates the compute instance of a new GPU instance and reads its IDs and UUID;
    /// a compute instance created but not readable is destroyed again.
    fn finish_mig(&self, gi: nvmlGpuInstance_t, profile: &MigProfile, uuid: &str) -> Result<MigInstance, MigError> {
        let raw = self.raw();
        let Some(index) = ci_profile_index(profile.slices) else {
            return Err(MigError::Nvml {
                call: "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                uuid: uuid.to_string(),
                message: format!("no compute instance profile has {} slices", profile.slices),
            });
        };
        let ci_profile = raw.ci_profile(gi, index).map_err(|e| e.into_mig(uuid))?;
        let ci = raw.create_ci(gi, ci_profile.id).map_err(|e| e.into_mig(uuid))?;
        let read = || -> Result<MigInstance, Fail> {
            let ci_info = raw.ci_info(ci)?;
            let mig_uuid = raw.uuid_of(ci_info.device)?;
            let gi_info = raw.gi_info(gi)?;
            Ok(MigInstance {
                gi: gi_info.id,
                profile_id: gi_info.profileId,
                placement: Placement { start: gi_info.placement.start, size: gi_info.placement.size },
                ci: Some(ci_info.id),
                uuid: Some(mig_uuid),
            })
        };
        read().map_err(|e| {
            if let Err(undo) = raw.destroy_ci(ci) {
                let undo = undo.into_mig(uuid);
                tracing::warn!(gpu = uuid, error = %undo, "destroying the unreadable compute instance failed");
            }
            e.into_mig(uuid)
        })
    }
}

impl MigControl for NvmlBackend {
    fn mig_instances(&self, uuid: &str) -> Result<Vec<MigInstance>, MigError> {
        let dev = self.mig_gpu_handle(uuid)?;
        instances(&dev, &self.raw(), uuid)
    }

    fn create_mig(&self, uuid: &str, profile: &MigProfile, placement: Placement) -> Result<MigInstance, MigError> {
        let dev = self.mig_gpu_handle(uuid)?;
        let raw = self.raw();
        // SAFETY: the handle is only passed to NVML while `dev` (and its library) lives.
        let handle = unsafe { dev.handle() };
        let gi = match raw.create_gi(handle, profile.id, placement) {
            Ok(gi) => gi,
            Err(Fail::Code(_, INSUFFICIENT_RESOURCES)) => {
                return Err(MigError::Occupied { uuid: uuid.to_string(), profile: profile.name.clone(), placement });
            }
            Err(e) => return Err(e.into_mig(uuid)),
        };
        match self.finish_mig(gi, profile, uuid) {
            Ok(instance) => {
                tracing::info!(gpu = uuid, profile = %profile.name, %placement, gi = instance.gi, mig = ?instance.uuid, "MIG instance created");
                Ok(instance)
            }
            Err(e) => {
                if let Err(undo) = raw.destroy_gi(gi) {
                    let undo = undo.into_mig(uuid);
                    tracing::warn!(gpu = uuid, profile = %profile.name, %placement, error = %undo, "destroying the GPU instance without a compute instance failed");
                }
                Err(e)
            }
        }
    }

    fn destroy_mig(&self, uuid: &str, gi: u32, ci: Option<u32>) -> Result<(), MigError> {
        let dev = match self.mig_gpu_handle(uuid) {
            Ok(dev) => dev,
            // MIG mode off: no instance exists.
            Err(MigError::MigModeOff { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let raw = self.raw();
        // SAFETY: the handle is only passed to NVML while `dev` (and its library) lives.
        let handle = unsafe { dev.handle() };
        let gone = |e: Fail| matches!(e.code(), Some(NOT_FOUND | INVALID_ARGUMENT));
        let gi_handle = match raw.gi_by_id(handle, gi) {
            Ok(h) => h,
            Err(e) if gone(e) => {
                tracing::debug!(gpu = uuid, gi, "GPU instance already gone");
                return Ok(());
            }
            Err(e) => return Err(e.into_mig(uuid)),
        };
        if let Some(ci) = ci {
            match raw.ci_by_id(gi_handle, ci) {
                Ok(ci_handle) => match raw.destroy_ci(ci_handle) {
                    Ok(()) => {}
                    Err(e) if e.code() == Some(NOT_FOUND) => {}
                    Err(e) => return Err(e.into_mig(uuid)),
                },
                Err(e) if gone(e) => tracing::debug!(gpu = uuid, gi, ci, "compute instance already gone"),
                Err(e) => return Err(e.into_mig(uuid)),
            }
        }
        match raw.destroy_gi(gi_handle) {
            Ok(()) => {
                tracing::info!(gpu = uuid, gi, ?ci, "MIG instance destroyed");
                Ok(())
            }
            Err(e) if e.code() == Some(NOT_FOUND) => Ok(()),
            Err(e) => Err(e.into_mig(uuid)),
        }
    }
}

#[cfg(test)]
mod tests;
