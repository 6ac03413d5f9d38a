//! edra's opaque device configuration (`GpuConfig`) and how a claim's configs resolve.
//!
//! A config entry in `status.allocation.devices.config[]` applies to the allocation results
//! whose request it names (`req` covers `req/sub`; no names = every request). Entries from
//! the device class come first, then the claim's own; a later entry replaces an earlier one.
//! Decoding is strict: unknown fields, kinds or versions and requests the claim does not
//! have are errors, so a typo never silently falls back to defaults.

use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::{DeviceAllocationConfiguration, ResourceClaim};
use serde::Deserialize;

pub use crate::device_config::{GpuConfig, Interval, MpsConfig, Sharing, Strategy, TimeSlicingConfig};

/// The version of the config schema.
pub const CONFIG_VERSION: &str = "v1alpha1";
/// The only kind of opaque config.
pub const GPU_CONFIG_KIND: &str = "GpuConfig";
/// Largest accepted `parameters` object, as the API server limits it on create.
pub const MAX_PARAMETERS_BYTES: usize = 10 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GpuConfigDoc {
    #[allow(dead_code)]
    api_version: String,
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    sharing: Sharing,
}

/// Why a claim's configuration cannot be used. Each message names the entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `parameters` is not a JSON object.
    #[error("config entry {index}: parameters must be a JSON object with apiVersion and kind")]
    NotObject {
        /// Index in status.allocation.devices.config.
        index: usize,
    },
    /// `parameters` is too large.
    #[error("config entry {index}: parameters are {size} bytes, more than the {MAX_PARAMETERS_BYTES} allowed")]
    TooLarge {
        /// Index in status.allocation.devices.config.
        index: usize,
        /// Size in bytes.
        size: usize,
    },
    /// Wrong `apiVersion`.
    #[error("config entry {index}: apiVersion {found:?} is not supported; use {expected:?}")]
    ApiVersion {
        /// Index in status.allocation.devices.config.
        index: usize,
        /// What was found.
        found: String,
        /// What is supported.
        expected: String,
    },
    /// Wrong `kind`.
    #[error("config entry {index}: kind {found:?} is not supported; use \"GpuConfig\"")]
    Kind {
        /// Index in status.allocation.devices.config.
        index: usize,
        /// What was found.
        found: String,
    },
    /// Unknown field or wrong type.
    #[error("config entry {index}: {message}; fix the GpuConfig")]
    Invalid {
        /// Index in status.allocation.devices.config.
        index: usize,
        /// serde's description, naming the field.
        message: String,
    },
    /// A config names a request the claim does not have.
    #[error("config entry {index} names request {request:?}, which the claim does not have; fix its requests list")]
    UnknownRequest {
        /// Index in status.allocation.devices.config.
        index: usize,
        /// The request named.
        request: String,
    },
    /// An unknown `source`.
    #[error("config entry {index}: source {found:?} is neither FromClass nor FromClaim")]
    Source {
        /// Index in status.allocation.devices.config.
        index: usize,
        /// What was found.
        found: String,
    },
}

/// Decodes one `parameters` object strictly.
pub fn decode(driver: &str, index: usize, params: &serde_json::Value) -> Result<GpuConfig, ConfigError> {
    let obj = params.as_object().ok_or(ConfigError::NotObject { index })?;
    let size = serde_json::to_vec(params).map(|v| v.len()).unwrap_or(usize::MAX);
    if size > MAX_PARAMETERS_BYTES {
        return Err(ConfigError::TooLarge { index, size });
    }
    let expected = format!("{driver}/{CONFIG_VERSION}");
    let api_version = obj.get("apiVersion").and_then(|v| v.as_str()).unwrap_or_default();
    if api_version != expected {
        return Err(ConfigError::ApiVersion { index, found: api_version.to_string(), expected });
    }
    let kind = obj.get("kind").and_then(|v| v.as_str()).unwrap_or_default();
    if kind != GPU_CONFIG_KIND {
        return Err(ConfigError::Kind { index, found: kind.to_string() });
    }
    let doc: GpuConfigDoc =
        serde_json::from_value(params.clone()).map_err(|e| ConfigError::Invalid { index, message: e.to_string() })?;
    let sharing = doc.sharing;
    let invalid = |message: &str| ConfigError::Invalid { index, message: message.to_string() };
    if sharing.time_slicing.is_some() && sharing.strategy != Strategy::TimeSlicing {
        return Err(invalid("sharing.timeSlicing is set but sharing.strategy is not TimeSlicing"));
    }
    if sharing.mps.is_some() && sharing.strategy != Strategy::Mps {
        return Err(invalid("sharing.mps is set but sharing.strategy is not MPS"));
    }
    if let Some(p) = sharing.mps.as_ref().and_then(|m| m.default_active_thread_percentage)
        && !(1..=100).contains(&p)
    {
        return Err(invalid("sharing.mps.defaultActiveThreadPercentage must be between 1 and 100"));
    }
    if let Some(mps) = &sharing.mps {
        if let Some(q) = &mps.default_pinned_device_memory_limit {
            pinned_limit_mib(q).map_err(|e| ConfigError::Invalid {
                index,
                message: format!("sharing.mps.defaultPinnedDeviceMemoryLimit {e}"),
            })?;
        }
        let per_device = mps.default_per_device_pinned_memory_limit.iter().flatten();
        if per_device.clone().count() > MAX_PER_DEVICE_LIMITS {
            return Err(invalid(&format!(
                "sharing.mps.defaultPerDevicePinnedMemoryLimit names more than {MAX_PER_DEVICE_LIMITS} devices"
            )));
        }
        for (device, q) in per_device {
            pinned_limit_mib(q).map_err(|e| ConfigError::Invalid {
                index,
                message: format!("sharing.mps.defaultPerDevicePinnedMemoryLimit[{device:?}] {e}"),
            })?;
        }
    }
    Ok(GpuConfig { sharing })
}

/// Most entries in `sharing.mps.defaultPerDevicePinnedMemoryLimit`.
pub const MAX_PER_DEVICE_LIMITS: usize = 64;

/// A pinned device memory limit (a quantity, `"10Gi"`) in whole MiB, as the MPS control
/// daemon takes it (`<N>M`): at least 1 MiB, at most 1 PiB.
pub fn pinned_limit_mib(quantity: &str) -> Result<u64, String> {
    let bytes = crate::config::source::parse_bytes(quantity)?;
    if !((1 << 20)..=(1 << 50)).contains(&bytes) {
        return Err(format!("must be from 1Mi to 1024Ti, found {quantity:?}"));
    }
    Ok(bytes >> 20)
}

/// Request names (`req` and `req/sub`) defined by the claim's spec.
pub fn claim_requests(claim: &ResourceClaim) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for r in claim.spec.iter().flat_map(|s| s.devices.iter()).flat_map(|d| d.requests.iter().flatten()) {
        out.insert(r.name.clone());
        for sub in r.first_available.iter().flatten() {
            out.insert(format!("{}/{}", r.name, sub.name));
        }
    }
    out
}

/// Resolves the config of each of `requests` (full names of our allocation results), in
/// order. Every entry for `driver` is decoded and checked, even one that applies to nothing.
pub fn resolve(driver: &str, claim: &ResourceClaim, requests: &[&str]) -> Result<Vec<GpuConfig>, ConfigError> {
    let known = claim_requests(claim);
    let entries: &[DeviceAllocationConfiguration] = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.config.as_deref())
        .unwrap_or(&[]);
    let mut decoded: Vec<(u8, usize, &[String], GpuConfig)> = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let Some(opaque) = entry.opaque.as_ref().filter(|o| o.driver == driver) else { continue };
        let rank = match entry.source.as_str() {
            "FromClass" => 0,
            "FromClaim" => 1,
            other => return Err(ConfigError::Source { index, found: other.to_string() }),
        };
        let names = entry.requests.as_deref().unwrap_or(&[]);
        if let Some(bad) = names.iter().find(|n| !known.contains(n.as_str())) {
            return Err(ConfigError::UnknownRequest { index, request: bad.clone() });
        }
        decoded.push((rank, index, names, decode(driver, index, &opaque.parameters.0)?));
    }
    decoded.sort_by_key(|(rank, index, ..)| (*rank, *index));
    Ok(requests
        .iter()
        .map(|req| {
            let base = base_request(req);
            decoded
                .iter()
                .rev()
                .find(|(_, _, names, _)| names.is_empty() || names.iter().any(|n| n == req || n == base))
                .map(|(.., c)| c.clone())
                .unwrap_or_default()
        })
        .collect())
}

/// `req/sub` → `req`; `req` stays.
pub fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(base, _)| base)
}

#[cfg(test)]
mod tests;
