//! Table-driven tests of how GPUs are offered.

use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::inventory::MigInfo;
use crate::publish::desired::api_device;

const GI: u64 = 1 << 30;
const MI: u64 = 1 << 20;

fn gpu(name: &str, memory: u64) -> Device {
    Device {
        name: name.into(),
        kind: DeviceKind::Gpu,
        uuid: format!("GPU-{name}"),
        index: 0,
        minor: 0,
        attributes: BTreeMap::from([("uuid".to_string(), AttributeValue::String(format!("GPU-{name}")))]),
        capacity: BTreeMap::from([("memory".to_string(), memory)]),
        device_nodes: vec![format!("/dev/nvidia-{name}").into()],
        shared: None,
        consumes: None,
    }
}

fn mig(name: &str) -> Device {
    let kind = DeviceKind::Mig(MigInfo {
        parent_uuid: "GPU-gpu-1".into(),
        parent_minor: 1,
        parent_index: 1,
        gi: 1,
        ci: 0,
        profile: "1g.10gb".into(),
    });
    Device { kind, ..gpu(name, 10 * GI) }
}

fn inventory() -> Inventory {
    Inventory {
        devices: vec![gpu("gpu-0", 80 * GI), mig("gpu-1-mig-1-0"), gpu("gpu-2", 23034 * MI)],
        ..Inventory::default()
    }
}

fn names(inv: &Inventory) -> Vec<&str> {
    inv.devices.iter().map(|d| d.name.as_str()).collect()
}

#[test]
fn by_default_every_full_gpu_is_shareable_and_a_claim_without_a_request_takes_it_whole() {
    let out = SharingSettings::default().published(&inventory(), true);
    assert_eq!(names(&out), ["gpu-0", "gpu-1-mig-1-0", "gpu-2"]);
    assert_eq!(out.devices[0].shared, Some(SharePolicy { default: 80 * GI, step: GI }));
    assert_eq!(out.devices[1].shared, None, "MIG devices are never multi-allocatable");
    // 22.49 GiB: the default is rounded down to the step, so (default - min) % step == 0.
    assert_eq!(out.devices[2].shared, Some(SharePolicy { default: 22 * GI, step: GI }));
    assert_eq!(out.devices[2].capacity["memory"], 23034 * MI, "the capacity itself is the GPU's");
}

#[test]
fn a_shareable_gpu_is_written_as_the_api_validates_it() {
    let out = SharingSettings { memory_step: 256 * MI, ..SharingSettings::default() }.published(&inventory(), true);
    let written = serde_json::to_value(api_device(&out.devices[2])).unwrap();
    assert_eq!(written["allowMultipleAllocations"], json!(true));
    assert_eq!(
        written["capacity"]["memory"],
        json!({"value": "23034Mi", "requestPolicy": {"default": "22784Mi", "validRange": {"min": "256Mi", "step": "256Mi"}}})
    );
    // The API's rules (validRange without max): default >= min, (default - min) % step == 0, min + step <= value.
    let p = out.devices[2].shared.unwrap();
    assert!(p.default >= p.step && (p.default - p.step).is_multiple_of(p.step) && 2 * p.step <= 23034 * MI);
    let mut with_sms = out.devices[0].clone();
    with_sms.capacity.insert("multiprocessors".into(), 108);
    let written = serde_json::to_value(api_device(&with_sms)).unwrap();
    assert_eq!(
        written["capacity"]["multiprocessors"],
        json!({"value": "108", "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1"}}}),
        "a share that names only memory takes no multiprocessors"
    );
    let whole = serde_json::to_value(api_device(&out.devices[1])).unwrap();
    assert!(whole.get("allowMultipleAllocations").is_none(), "{whole}");
    assert!(whole["capacity"]["memory"].get("requestPolicy").is_none(), "{whole}");
}

#[test]
fn selection_mode_and_fallback_decide_each_gpu() {
    let listed = GpuSelection::Listed(vec!["GPU-gpu-2".into()]);
    let cases = [
        (SharingSettings { mode: SharingMode::Exclusive, ..SharingSettings::default() }, true, [false, false]),
        (SharingSettings { gpus: listed, ..SharingSettings::default() }, true, [false, true]),
        (SharingSettings::default(), false, [false, false]),
        (SharingSettings { memory_step: 100 * GI, ..SharingSettings::default() }, true, [false, false]),
    ];
    for (settings, supported, want) in cases {
        let out = settings.published(&inventory(), supported);
        let got = [out.devices[0].shared.is_some(), out.devices[2].shared.is_some()];
        assert_eq!(got, want, "{settings:?} supported={supported}");
        assert_eq!(names(&out), ["gpu-0", "gpu-1-mig-1-0", "gpu-2"]);
    }
}

#[test]
fn replicas_replace_the_gpu_with_numbered_devices_sharing_its_uuid() {
    let settings = SharingSettings { mode: SharingMode::Replicas, replicas: 3, ..SharingSettings::default() };
    let out = settings.published(&inventory(), true);
    assert_eq!(
        names(&out),
        [
            "gpu-0-replica-0",
            "gpu-0-replica-1",
            "gpu-0-replica-2",
            "gpu-1-mig-1-0",
            "gpu-2-replica-0",
            "gpu-2-replica-1",
            "gpu-2-replica-2"
        ]
    );
    let r = &out.devices[1];
    assert_eq!(r.uuid, "GPU-gpu-0");
    assert_eq!(r.attributes["uuid"], AttributeValue::String("GPU-gpu-0".into()));
    assert_eq!(r.attributes[REPLICA_ATTRIBUTE], AttributeValue::Int(1));
    assert_eq!(r.capacity["memory"], 80 * GI / 3);
    assert_eq!(r.shared, None);
    // The same on a server without consumable capacity, when replicas are the fallback.
    let fallback = SharingSettings { fallback: Fallback::Replicas, replicas: 3, ..SharingSettings::default() };
    assert_eq!(names(&fallback.published(&inventory(), false)), names(&out));
    assert_eq!(names(&fallback.published(&inventory(), true)), ["gpu-0", "gpu-1-mig-1-0", "gpu-2"]);
}

#[test]
fn replica_names_resolve_only_where_replicas_can_be_published() {
    let inv = inventory();
    let replicas = SharingSettings { mode: SharingMode::Replicas, replicas: 2, ..SharingSettings::default() };
    let r = replicas.resolve(&inv, "gpu-2-replica-1").expect("a replica of gpu-2");
    assert_eq!(r.gpu.name, "gpu-2");
    assert_eq!(r.replica.as_ref().map(|d| d.name.as_str()), Some("gpu-2-replica-1"));
    assert_eq!(r.replica.as_ref().map(|d| d.capacity["memory"]), Some(23034 * MI / 2));
    for bad in ["gpu-2-replica-2", "gpu-2-replica-01", "gpu-2-replica-", "gpu-9-replica-0", "gpu-1-mig-1-0-replica-0"] {
        assert_eq!(replicas.resolve(&inv, bad), None, "{bad}");
    }
    let plain = replicas.resolve(&inv, "gpu-0").expect("the GPU itself");
    assert_eq!((plain.gpu.name.as_str(), plain.replica), ("gpu-0", None));
    // Shares mode with the exclusive fallback never publishes replicas.
    assert_eq!(SharingSettings::default().resolve(&inv, "gpu-0-replica-0"), None);
    let fallback = SharingSettings { fallback: Fallback::Replicas, replicas: 2, ..SharingSettings::default() };
    assert!(fallback.resolve(&inv, "gpu-0-replica-1").is_some());
}

#[test]
fn replica_name_parsing() {
    assert_eq!(replica_name("gpu-0-replica-12"), Some(("gpu-0", 12)));
    assert_eq!(replica_name("gpu-0-replica-0"), Some(("gpu-0", 0)));
    for bad in ["gpu-0", "gpu-0-replica-x", "gpu-0-replica-007", "gpu-0-replica-99999999999"] {
        assert_eq!(replica_name(bad), None, "{bad}");
    }
}
