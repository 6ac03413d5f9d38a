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
    assert_eq!((with["gpu-1"][0].key.as_str(), with["gpu-1"][0].effect.as_str()), ("gpu.edra.dev/unmonitored", "None"));
    assert!(device_taints(&inv, &health, "gpu.edra.dev", false).is_empty());
    let _ = SystemTime::now();
}
