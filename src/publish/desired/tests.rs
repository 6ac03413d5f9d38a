//! Table-driven tests for the desired ResourceSlices.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::DeviceTaint;
use serde_json::json;

use super::*;
use crate::inventory::DeviceKind;

fn device(name: &str) -> Device {
    Device {
        name: name.into(),
        kind: DeviceKind::Gpu,
        uuid: format!("GPU-{name}"),
        index: 0,
        minor: 0,
        attributes: BTreeMap::from([("uuid".to_string(), AttributeValue::String(format!("GPU-{name}")))]),
        capacity: BTreeMap::from([("memory".to_string(), 80u64 << 30)]),
        device_nodes: vec![],
        shared: None,
        consumes: None,
    }
}

fn inventory(n: usize) -> Inventory {
    Inventory { devices: (0..n).map(|i| device(&format!("gpu-{i}"))).collect(), ..Inventory::default() }
}

fn node() -> NodeIdentity {
    NodeIdentity { name: "n1".into(), uid: Some("0b1c-uid".into()) }
}

fn sizes(slices: &[ResourceSlice]) -> Vec<usize> {
    slices.iter().map(|s| s.spec.devices.as_ref().map_or(0, Vec::len)).collect()
}

#[test]
fn splitting_respects_the_limits() {
    let cases: [(usize, &[usize]); 5] = [(0, &[0]), (1, &[1]), (128, &[128]), (129, &[128, 1]), (300, &[128, 128, 44])];
    for (n, want) in cases {
        let slices = desired_slices(&inventory(n), &node(), "gpu.edra.dev", 3);
        assert_eq!(sizes(&slices), want, "{n} devices");
        for (i, s) in slices.iter().enumerate() {
            assert_eq!(s.spec.pool.resource_slice_count, want.len() as i64);
            assert_eq!(s.spec.pool.generation, 3);
            assert_eq!(s.spec.pool.name, "n1");
            assert_eq!(s.spec.node_name.as_deref(), Some("n1"));
            assert_eq!(s.spec.driver, "gpu.edra.dev");
            assert_eq!(s.metadata.name, None);
            let gen_name = s.metadata.generate_name.as_deref().unwrap_or_default();
            assert_eq!(slice_index(gen_name), Some(i as u64));
        }
        let all: Vec<String> =
            slices.iter().flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone())).collect();
        let mut sorted = all.clone();
        sorted.sort();
        assert_eq!(all, sorted, "devices are sorted across slices");
        assert_eq!(all.len(), n);
    }
}

#[test]
fn tainted_devices_halve_the_limit() {
    let mut devices: Vec<ApiDevice> = (0..200).map(|i| api_device(&device(&format!("d{i:03}")))).collect();
    devices[100].taints =
        Some(vec![DeviceTaint { key: "k".into(), effect: "NoSchedule".into(), ..Default::default() }]);
    let chunks = split(devices);
    let lens: Vec<usize> = chunks.iter().map(Vec::len).collect();
    // 100 untainted fit in 128, the tainted 101st would make a 64-limit slice overflow.
    assert_eq!(lens, [100, 64, 36]);
    assert!(chunks[1][0].taints.is_some());
}

#[test]
fn names_follow_upstream_and_fit() {
    assert_eq!(generate_name(0, "gpu.edra.dev", "n1"), "00000-gpu.edra.dev-n1-");
    assert_eq!(generate_name(26, "gpu.edra.dev", "n1"), "0001a-gpu.edra.dev-n1-");
    assert_eq!(generate_name(0x123456, "gpu.edra.dev", "n1"), "123456-gpu.edra.dev-n1-");
    let long_node = format!("{}.example.com", "a".repeat(60));
    let g = generate_name(1, "gpu.edra.dev", &long_node);
    assert!(g.len() <= MAX_GENERATE_NAME, "{g}");
    assert!(g.ends_with('-') && !g.ends_with("--") && !g.ends_with(".-"), "{g}");
    // The cut would end on a '.': it is removed.
    let node = format!("{}.b", "a".repeat(37)); // base is 57 chars up to and including the '.'
    let g = generate_name(0, "gpu.edra.dev", &node);
    assert_eq!(g, format!("00000-gpu.edra.dev-{}-", "a".repeat(37)));
    let named = with_stable_name(desired_slices(&inventory(1), &node_n1_offline(), "gpu.edra.dev", 1).remove(0));
    let name = named.metadata.name.clone().unwrap_or_default();
    assert!(name.starts_with("00000-gpu.edra.dev-n1-") && name.len() == 27, "{name}");
    assert_eq!(named.metadata.generate_name, None);
    assert_eq!(slice_index(&name), Some(0));
    assert_eq!(with_stable_name(named.clone()).metadata.name, named.metadata.name, "stable");
    assert!(crate::config::validate_dns_subdomain(&name).is_ok());
}

fn node_n1_offline() -> NodeIdentity {
    NodeIdentity { name: "n1".into(), uid: None }
}

#[test]
fn slice_index_parsing() {
    let cases = [
        ("00000-gpu.edra.dev-n1-x7k2p", Some(0)),
        ("0001f-gpu.edra.dev-n1-abcde", Some(31)),
        ("100000-d-n-abcde", Some(0x100000)),
        ("0001F-d-n-x", None),
        ("001f-d-n-x", None),
        ("n1-gpu.edra.dev-abcde", None),
        ("00000", None),
    ];
    for (name, want) in cases {
        assert_eq!(slice_index(name), want, "{name}");
    }
}

#[test]
fn attribute_values_serialize_as_the_api_expects() {
    let mut d = device("gpu-0");
    d.attributes = BTreeMap::from([
        ("s".to_string(), AttributeValue::String("x".into())),
        ("i".into(), AttributeValue::Int(-3)),
        ("v".into(), AttributeValue::Version("1.2.3".into())),
        ("b".into(), AttributeValue::Bool(true)),
    ]);
    d.capacity = BTreeMap::from([("memory".into(), 80u64 << 30), ("multiprocessors".into(), 108)]);
    let v = serde_json::to_value(api_device(&d)).expect("serialize");
    assert_eq!(
        v,
        json!({
            "name": "gpu-0",
            "attributes": {"s": {"string": "x"}, "i": {"int": -3}, "v": {"version": "1.2.3"}, "b": {"bool": true}},
            "capacity": {"memory": {"value": "80Gi"}, "multiprocessors": {"value": "108"}},
        })
    );
}

#[test]
fn quantities_are_canonical() {
    let cases = [
        (0, "0"),
        (108, "108"),
        (1000, "1k"),
        (1023, "1023"),
        (1024, "1Ki"),
        (1536, "1536"),
        (85_899_345_920, "80Gi"),
        (81_559_437_312, "79647888Ki"),
        (81_559_437_313, "81559437313"),
        (85_000_000_000, "85G"),
        (10_737_418_240, "10Gi"),
        (1_024_000, "1000Ki"),
    ];
    for (v, want) in cases {
        assert_eq!(quantity(v), want, "{v}");
    }
}

#[test]
fn owner_reference_points_at_the_node() {
    let s = desired_slices(&inventory(1), &node(), "gpu.edra.dev", 1).remove(0);
    let v = serde_json::to_value(&s.metadata).expect("serialize");
    assert_eq!(
        v["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "0b1c-uid", "controller": true}])
    );
    let offline = desired_slices(&inventory(1), &node_n1_offline(), "gpu.edra.dev", 1).remove(0);
    assert_eq!(offline.metadata.owner_references, None);
}

#[test]
fn content_comparison_ignores_server_metadata_and_generation() {
    let desired = desired_slices(&inventory(3), &node(), "gpu.edra.dev", 2).remove(0);
    let mut existing = with_stable_name(desired.clone());
    existing.metadata.uid = Some("slice-uid".into());
    existing.metadata.resource_version = Some("42".into());
    existing.spec.pool.generation = 1;
    assert!(same_content(&existing, &desired));
    let mut changed = existing.clone();
    if let Some(devs) = changed.spec.devices.as_mut() {
        devs.pop();
    }
    assert!(!same_content(&changed, &desired));
    let mut orphan = existing.clone();
    orphan.metadata.owner_references = None;
    assert!(!same_content(&orphan, &desired));
    let mut recount = existing;
    recount.spec.pool.resource_slice_count = 2;
    assert!(!same_content(&recount, &desired));
    // The server fills in a taint's timeAdded; another taint is another content.
    let mut tainted = desired.clone();
    let taint = |t: &mut Vec<_>| {
        t.push(k8s_openapi::api::resource::v1::DeviceTaint {
            effect: "NoSchedule".into(),
            key: "gpu.edra.dev/xid".into(),
            value: Some("79".into()),
            time_added: None,
        })
    };
    taint(tainted.spec.devices.as_mut().unwrap()[0].taints.get_or_insert_default());
    let mut stamped = with_stable_name(tainted.clone());
    let added = k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap();
    stamped.spec.devices.as_mut().unwrap()[0].taints.as_mut().unwrap()[0].time_added =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(added));
    assert!(same_content(&stamped, &tainted));
    assert!(!same_content(&stamped, &desired));
    stamped.spec.devices.as_mut().unwrap()[0].taints.as_mut().unwrap()[0].value = Some("48".into());
    assert!(!same_content(&stamped, &tainted));
    // An empty slice read back without `devices` equals an empty desired slice.
    let empty = desired_slices(&inventory(0), &node(), "gpu.edra.dev", 1).remove(0);
    let mut read_back = empty.clone();
    read_back.spec.devices = None;
    assert!(same_content(&read_back, &empty));
}

#[test]
fn generation_rule() {
    let cases = [
        ((None, 1, 0, 0), 1),
        ((Some(4), 0, 0, 0), 4),
        ((Some(4), 0, 1, 0), 4),
        ((Some(4), 0, 2, 0), 5),
        ((Some(4), 1, 0, 0), 5),
        ((Some(4), 0, 0, 9), 9),
        ((Some(4), 1, 0, 3), 5),
    ];
    for ((max, created, changed, requested), want) in cases {
        assert_eq!(next_generation(max, created, changed, requested), want, "{max:?} {created} {changed} {requested}");
    }
}
