//! Device taints from GPU health — a pure function of the inventory and the health
//! snapshot. Every device of a GPU with a condition (the GPU itself, or its MIG devices)
//! carries `<driver>/<condition>`: `xid` with the XID as value, `gpu-lost`, `unmonitored`.
//! Fatal conditions are `NoSchedule`; informational ones are `None` where the server's API
//! version knows that effect and left out otherwise (edra never sets `NoExecute`: eviction
//! stays the administrator's choice, through DeviceTaintRules). `timeAdded` is the time the
//! condition appeared, kept across republishes and restarts, so the server never resets it.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::health::HealthSnapshot;
use crate::inventory::Inventory;

/// Taints per device name.
pub type DeviceTaints = BTreeMap<String, Vec<DeviceTaint>>;

/// The effect of a fatal condition.
pub const FATAL_EFFECT: &str = "NoSchedule";
/// The effect of an informational condition (Kubernetes 1.35+).
pub const INFORMATIONAL_EFFECT: &str = "None";

/// The taints of `inv`'s devices under `health`; `none_effect` when the server accepts
/// the `None` effect.
pub fn device_taints(inv: &Inventory, health: &HealthSnapshot, driver: &str, none_effect: bool) -> DeviceTaints {
    let mut out = DeviceTaints::new();
    for device in &inv.devices {
        let mut taints: Vec<DeviceTaint> = health
            .conditions_of(device)
            .filter(|c| c.fatal || none_effect)
            .map(|c| DeviceTaint {
                key: format!("{driver}/{}", c.kind.key()),
                value: c.value.clone(),
                effect: if c.fatal { FATAL_EFFECT } else { INFORMATIONAL_EFFECT }.to_string(),
                time_added: Timestamp::from_second(c.since).ok().map(Time),
            })
            .collect();
        taints.sort_by(|a, b| a.key.cmp(&b.key));
        if !taints.is_empty() {
            out.insert(device.name.clone(), taints);
        }
    }
    out
}

/// Whether any device of `slice` carries a taint.
pub fn has_taints(slice: &ResourceSlice) -> bool {
    slice.spec.devices.iter().flatten().any(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()))
}

#[cfg(test)]
mod tests;
