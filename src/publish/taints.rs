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
mod tests {
    use super::*;
    use crate::health::view::{Event, HealthView, Rules};
    use crate::inventory::{Device, DeviceKind, MigInfo};
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    fn device(name: &str, uuid: &str, parent: Option<&str>) -> Device {
        Device {
            name: name.into(),
            kind: match parent {
                None => DeviceKind::Gpu,
                Some(p) => DeviceKind::Mig(MigInfo {
                    parent_uuid: p.into(),
                    parent_minor: 0,
                    parent_index: 0,
                    gi: 1,
                    ci: 0,
                    profile: "1g.10gb".into(),
                }),
            },
            uuid: uuid.into(),
            index: 0,
            minor: 0,
            attributes: BTreeMap::new(),
            capacity: BTreeMap::new(),
            device_nodes: Vec::new(),
            shared: None,
            consumes: None,
        }
    }

    fn snapshot(events: Vec<Event>) -> HealthSnapshot {
        let mut v = HealthView::default();
        let rules = Rules { ignored_xids: [13].into(), quiet_period: Duration::from_secs(60) };
        let t = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        for e in events {
            v.apply(e, t, &rules);
        }
        HealthSnapshot { gpus: v.gpus, xids_seen: v.xids_seen }
    }

    #[test]
    fn a_gpu_condition_taints_the_gpu_and_its_mig_devices() {
        let inv = Inventory {
            devices: vec![
                device("gpu-0-mig-1-0", "MIG-a", Some("GPU-0")),
                device("gpu-0-mig-2-0", "MIG-b", Some("GPU-0")),
                device("gpu-1", "GPU-1", None),
            ],
            ..Inventory::default()
        };
        let health = snapshot(vec![Event::Xid { gpu: "GPU-0".into(), xid: 79 }]);
        let taints = device_taints(&inv, &health, "gpu.example.com", true);
        assert_eq!(taints.keys().collect::<Vec<_>>(), ["gpu-0-mig-1-0", "gpu-0-mig-2-0"]);
        let t = &taints["gpu-0-mig-1-0"][0];
        assert_eq!(
            (t.key.as_str(), t.value.as_deref(), t.effect.as_str()),
            ("gpu.example.com/xid", Some("79"), "NoSchedule")
        );
        assert_eq!(t.time_added.as_ref().map(|t| t.0.as_second()), Some(1_800_000_000));
    }

    #[test]
    fn informational_taints_need_the_none_effect() {
        let inv = Inventory { devices: vec![device("gpu-1", "GPU-1", None)], ..Inventory::default() };
        let health = snapshot(vec![
            Event::Unmonitored { gpu: "GPU-1".into(), reason: "none".into() },
            Event::Xid { gpu: "GPU-1".into(), xid: 13 },
        ]);
        let with = device_taints(&inv, &health, "gpu.edra.dev", true);
        assert_eq!(with["gpu-1"].len(), 1);
        assert_eq!(
            (with["gpu-1"][0].key.as_str(), with["gpu-1"][0].effect.as_str()),
            ("gpu.edra.dev/unmonitored", "None")
        );
        assert!(device_taints(&inv, &health, "gpu.edra.dev", false).is_empty());
        let _ = SystemTime::now();
    }
}
