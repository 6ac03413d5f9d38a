//! The raw NVML calls of dynamic MIG, one checked wrapper per function: present in the
//! loaded library (else [`Fail::Missing`] naming it, never the bindings' panic), result
//! checked, buffers sized from NVML's own counts and bounded, only what NVML wrote read back.

use std::os::raw::c_char;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings as sys;
use sys::{NvmlLib, nvmlComputeInstance_t, nvmlDevice_t, nvmlGpuInstance_t, nvmlReturn_t};

use crate::gpu::mig_control::{MigError, Placement};

/// Most placements read for one profile (NVML reports at most 8 on every GPU so far).
const MAX_PLACEMENTS: u32 = 64;
/// Most GPU or compute instances read for one profile.
const MAX_INSTANCES: u32 = 64;

const SUCCESS: nvmlReturn_t = sys::nvmlReturn_enum_NVML_SUCCESS;
pub(super) const NOT_FOUND: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const NOT_SUPPORTED: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
pub(super) const INVALID_ARGUMENT: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
pub(super) const INSUFFICIENT_RESOURCES: nvmlReturn_t = sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;

/// Why a raw call failed: the function is missing, or it returned an error code.
#[derive(Debug, Clone, Copy)]
pub(super) enum Fail {
    /// The function is missing from the loaded library.
    Missing(&'static str),
    /// The function returned this error.
    Code(&'static str, nvmlReturn_t),
}

impl Fail {
    pub(super) fn code(self) -> Option<nvmlReturn_t> {
        match self {
            Fail::Code(_, rc) => Some(rc),
            Fail::Missing(_) => None,
        }
    }

    pub(super) fn into_mig(self, uuid: &str) -> MigError {
        match self {
            Fail::Missing(call) => MigError::Unsupported { call },
            Fail::Code(call, rc) => MigError::Nvml { call, uuid: uuid.to_string(), message: describe(rc) },
        }
    }
}

/// NVML's error `rc` in words, with its number (nvml-wrapper 0.13 has no words for the
/// codes above 22, which MIG calls return).
fn describe(rc: nvmlReturn_t) -> String {
    let text = match rc {
        INSUFFICIENT_RESOURCES => "insufficient resources".to_string(),
        sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH => "argument version mismatch".to_string(),
        sys::nvmlReturn_enum_NVML_ERROR_NOT_READY => "not ready".to_string(),
        sys::nvmlReturn_enum_NVML_ERROR_GPU_NOT_FOUND => "GPU not found".to_string(),
        sys::nvmlReturn_enum_NVML_ERROR_INVALID_STATE => "invalid state".to_string(),
        _ => NvmlError::from(rc).to_string(),
    };
    format!("{text} (NVML error {rc})")
}

/// The function `sym` of the loaded library, or [`Fail::Missing`] naming it.
fn sym<'a, T, E>(sym: Result<&'a T, E>, call: &'static str) -> Result<&'a T, Fail> {
    sym.map_err(|_| Fail::Missing(call))
}

fn check(call: &'static str, rc: nvmlReturn_t) -> Result<(), Fail> {
    if rc == SUCCESS { Ok(()) } else { Err(Fail::Code(call, rc)) }
}

/// The raw NVML calls dynamic MIG needs, each checked for presence and result. Handles
/// passed in come from the same library and are used while it stays loaded.
pub(super) struct Raw<'a> {
    pub(super) lib: &'a NvmlLib,
}

impl Raw<'_> {
    pub(super) fn placements(&self, dev: nvmlDevice_t, profile_id: u32) -> Result<Vec<Placement>, Fail> {
        const CALL: &str = "nvmlDeviceGetGpuInstancePossiblePlacements_v2";
        let f = sym(self.lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2.as_ref(), CALL)?;
        let mut count: u32 = 0;
        // SAFETY: `dev` is a live handle of this library; a NULL array asks only for the
        // count, written to `count`.
        check(CALL, unsafe { f(dev, profile_id, std::ptr::null_mut(), &mut count) })?;
        if count == 0 {
            return Ok(Vec::new());
        }
        if count > MAX_PLACEMENTS {
            return Err(Fail::Code(CALL, sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE));
        }
        let mut buf = vec![sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
        let mut len = count;
        // SAFETY: `buf` holds `len` placements and NVML writes at most `len` of them.
        check(CALL, unsafe { f(dev, profile_id, buf.as_mut_ptr(), &mut len) })?;
        buf.truncate(len.min(count) as usize);
        let mut out: Vec<Placement> = buf.iter().map(|p| Placement { start: p.start, size: p.size }).collect();
        out.sort();
        Ok(out)
    }

    pub(super) fn create_gi(
        &self,
        dev: nvmlDevice_t,
        profile_id: u32,
        at: Placement,
    ) -> Result<nvmlGpuInstance_t, Fail> {
        const CALL: &str = "nvmlDeviceCreateGpuInstanceWithPlacement";
        let f = sym(self.lib.nvmlDeviceCreateGpuInstanceWithPlacement.as_ref(), CALL)?;
        let placement = sys::nvmlGpuInstancePlacement_t { start: at.start, size: at.size };
        let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: `dev` is a live handle; `placement` is read and `gi` written, both valid
        // for the call.
        check(CALL, unsafe { f(dev, profile_id, &placement, &mut gi) })?;
        Ok(gi)
    }

    pub(super) fn gi_by_id(&self, dev: nvmlDevice_t, id: u32) -> Result<nvmlGpuInstance_t, Fail> {
        const CALL: &str = "nvmlDeviceGetGpuInstanceById";
        let f = sym(self.lib.nvmlDeviceGetGpuInstanceById.as_ref(), CALL)?;
        let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: `dev` is a live handle; `gi` is a valid out-pointer for one handle.
        check(CALL, unsafe { f(dev, id, &mut gi) })?;
        Ok(gi)
    }

    pub(super) fn gpu_instances(
        &self,
        dev: nvmlDevice_t,
        profile_id: u32,
        room: u32,
    ) -> Result<Vec<nvmlGpuInstance_t>, Fail> {
        const CALL: &str = "nvmlDeviceGetGpuInstances";
        let f = sym(self.lib.nvmlDeviceGetGpuInstances.as_ref(), CALL)?;
        let room = room.clamp(1, MAX_INSTANCES);
        let mut buf: Vec<nvmlGpuInstance_t> = vec![std::ptr::null_mut(); room as usize];
        let mut count: u32 = 0;
        // SAFETY: `buf` has room for the profile's instance count, which NVML requires and
        // never exceeds; `count` is a valid out-pointer.
        check(CALL, unsafe { f(dev, profile_id, buf.as_mut_ptr(), &mut count) })?;
        buf.truncate(count.min(room) as usize);
        Ok(buf)
    }

    pub(super) fn gi_info(&self, gi: nvmlGpuInstance_t) -> Result<sys::nvmlGpuInstanceInfo_t, Fail> {
        const CALL: &str = "nvmlGpuInstanceGetInfo";
        let f = sym(self.lib.nvmlGpuInstanceGetInfo.as_ref(), CALL)?;
        let mut info = sys::nvmlGpuInstanceInfo_t {
            device: std::ptr::null_mut(),
            id: 0,
            profileId: 0,
            placement: sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 },
        };
        // SAFETY: `gi` is a live GPU instance handle; `info` is a valid out-pointer.
        check(CALL, unsafe { f(gi, &mut info) })?;
        Ok(info)
    }

    pub(super) fn destroy_gi(&self, gi: nvmlGpuInstance_t) -> Result<(), Fail> {
        const CALL: &str = "nvmlGpuInstanceDestroy";
        let f = sym(self.lib.nvmlGpuInstanceDestroy.as_ref(), CALL)?;
        // SAFETY: `gi` is a live GPU instance handle, not used after this call.
        check(CALL, unsafe { f(gi) })
    }

    pub(super) fn ci_profile(
        &self,
        gi: nvmlGpuInstance_t,
        index: u32,
    ) -> Result<sys::nvmlComputeInstanceProfileInfo_t, Fail> {
        const CALL: &str = "nvmlGpuInstanceGetComputeInstanceProfileInfo";
        let f = sym(self.lib.nvmlGpuInstanceGetComputeInstanceProfileInfo.as_ref(), CALL)?;
        let mut info = sys::nvmlComputeInstanceProfileInfo_t {
            id: 0,
            sliceCount: 0,
            instanceCount: 0,
            multiprocessorCount: 0,
            sharedCopyEngineCount: 0,
            sharedDecoderCount: 0,
            sharedEncoderCount: 0,
            sharedJpegCount: 0,
            sharedOfaCount: 0,
        };
        let shared = sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED;
        // SAFETY: `gi` is a live GPU instance handle; `info` is a valid out-pointer.
        check(CALL, unsafe { f(gi, index, shared, &mut info) })?;
        Ok(info)
    }

    pub(super) fn create_ci(&self, gi: nvmlGpuInstance_t, profile_id: u32) -> Result<nvmlComputeInstance_t, Fail> {
        const CALL: &str = "nvmlGpuInstanceCreateComputeInstance";
        let f = sym(self.lib.nvmlGpuInstanceCreateComputeInstance.as_ref(), CALL)?;
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: `gi` is a live GPU instance handle; `ci` is a valid out-pointer.
        check(CALL, unsafe { f(gi, profile_id, &mut ci) })?;
        Ok(ci)
    }

    pub(super) fn ci_by_id(&self, gi: nvmlGpuInstance_t, id: u32) -> Result<nvmlComputeInstance_t, Fail> {
        const CALL: &str = "nvmlGpuInstanceGetComputeInstanceById";
        let f = sym(self.lib.nvmlGpuInstanceGetComputeInstanceById.as_ref(), CALL)?;
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: `gi` is a live GPU instance handle; `ci` is a valid out-pointer.
        check(CALL, unsafe { f(gi, id, &mut ci) })?;
        Ok(ci)
    }

    fn compute_instances(
        &self,
        gi: nvmlGpuInstance_t,
        profile_id: u32,
        room: u32,
    ) -> Result<Vec<nvmlComputeInstance_t>, Fail> {
        const CALL: &str = "nvmlGpuInstanceGetComputeInstances";
        let f = sym(self.lib.nvmlGpuInstanceGetComputeInstances.as_ref(), CALL)?;
        let room = room.clamp(1, MAX_INSTANCES);
        let mut buf: Vec<nvmlComputeInstance_t> = vec![std::ptr::null_mut(); room as usize];
        let mut count: u32 = 0;
        // SAFETY: `buf` has room for the profile's instance count, which NVML requires and
        // never exceeds; `count` is a valid out-pointer.
        check(CALL, unsafe { f(gi, profile_id, buf.as_mut_ptr(), &mut count) })?;
        buf.truncate(count.min(room) as usize);
        Ok(buf)
    }

    pub(super) fn ci_info(&self, ci: nvmlComputeInstance_t) -> Result<sys::nvmlComputeInstanceInfo_t, Fail> {
        const CALL: &str = "nvmlComputeInstanceGetInfo_v2";
        let f = sym(self.lib.nvmlComputeInstanceGetInfo_v2.as_ref(), CALL)?;
        let mut info = sys::nvmlComputeInstanceInfo_t {
            device: std::ptr::null_mut(),
            gpuInstance: std::ptr::null_mut(),
            id: 0,
            profileId: 0,
            placement: sys::nvmlComputeInstancePlacement_t { start: 0, size: 0 },
        };
        // SAFETY: `ci` is a live compute instance handle; `info` is a valid out-pointer.
        check(CALL, unsafe { f(ci, &mut info) })?;
        Ok(info)
    }

    pub(super) fn destroy_ci(&self, ci: nvmlComputeInstance_t) -> Result<(), Fail> {
        const CALL: &str = "nvmlComputeInstanceDestroy";
        let f = sym(self.lib.nvmlComputeInstanceDestroy.as_ref(), CALL)?;
        // SAFETY: `ci` is a live compute instance handle, not used after this call.
        check(CALL, unsafe { f(ci) })
    }

    /// The UUID of a (MIG) device handle NVML gave out.
    pub(super) fn uuid_of(&self, dev: nvmlDevice_t) -> Result<String, Fail> {
        const CALL: &str = "nvmlDeviceGetUUID";
        let f = sym(self.lib.nvmlDeviceGetUUID.as_ref(), CALL)?;
        let mut buf: [c_char; sys::NVML_DEVICE_UUID_V2_BUFFER_SIZE as usize] =
            [0; sys::NVML_DEVICE_UUID_V2_BUFFER_SIZE as usize];
        // SAFETY: `dev` is a handle NVML gave out; `buf` holds the length passed, and NVML
        // writes a NUL-terminated string within it.
        check(CALL, unsafe { f(dev, buf.as_mut_ptr(), sys::NVML_DEVICE_UUID_V2_BUFFER_SIZE) })?;
        let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The lowest-numbered compute instance of a GPU instance: its ID and MIG device.
    pub(super) fn first_ci(&self, gi: nvmlGpuInstance_t) -> Result<Option<(u32, nvmlDevice_t)>, Fail> {
        let mut first: Option<(u32, nvmlDevice_t)> = None;
        for index in 0..sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            let profile = match self.ci_profile(gi, index) {
                Ok(p) => p,
                Err(Fail::Code(_, NOT_SUPPORTED | INVALID_ARGUMENT)) => continue,
                Err(e) => return Err(e),
            };
            for ci in self.compute_instances(gi, profile.id, profile.instanceCount)? {
                let info = self.ci_info(ci)?;
                if first.is_none_or(|(id, _)| info.id < id) {
                    first = Some((info.id, info.device));
                }
            }
        }
        Ok(first)
    }
}

#[cfg(test)]
mod tests;
