use std::collections::BTreeMap;

use super::*;
use crate::inventory::{AttributeValue, Device, DeviceKind};

pub(crate) const DRIVER: &str = "gpu.edra.dev";

pub(crate) fn node() -> NodeIdentity {
    NodeIdentity { name: "edge-1".into(), uid: Some("0b1c-node-uid".into()) }
}

pub(crate) fn inventory(n: usize, product: &str) -> Inventory {
    let devices = (0..n)
        .map(|i| Device {
            name: format!("gpu-{i}"),
            kind: DeviceKind::Gpu,
            uuid: format!("GPU-{i:08}"),
            index: i as u32,
            minor: i as u32,
            attributes: BTreeMap::from([
                ("type".to_string(), AttributeValue::String("gpu".into())),
                ("productName".to_string(), AttributeValue::String(product.into())),
            ]),
            capacity: BTreeMap::from([("memory".to_string(), 80u64 << 30)]),
            device_nodes: vec![format!("/dev/nvidia{i}").into()],
            shared: None,
            consumes: None,
        })
        .collect();
    Inventory { devices, ..Inventory::default() }
}

/// Applies a plan the way the API server would: deletes remove, updates bump the
/// resourceVersion, creates get a name from generateName and a uid. The publisher's
/// machine tests use it as their server too.
pub(crate) fn apply(observed: &[ResourceSlice], p: &Plan, counter: &mut u64) -> Vec<ResourceSlice> {
    let mut out: Vec<ResourceSlice> = observed
        .iter()
        .filter(|s| !p.deletes.iter().any(|d| Some(&d.name) == s.metadata.name.as_ref()))
        .cloned()
        .collect();
    for u in &p.updates {
        let slot = out.iter_mut().find(|s| s.metadata.name == u.metadata.name).expect("update of a missing slice");
        assert_eq!(slot.metadata.resource_version, u.metadata.resource_version, "update must carry the current rv");
        *counter += 1;
        *slot = u.clone();
        slot.metadata.resource_version = Some(counter.to_string());
    }
    for c in &p.creates {
        *counter += 1;
        let mut s = c.clone();
        let prefix = s.metadata.generate_name.take().expect("creates use generateName");
        s.metadata.name = Some(format!("{prefix}x{counter:04}"));
        s.metadata.uid = Some(format!("uid-{counter}"));
        s.metadata.resource_version = Some(counter.to_string());
        out.push(s);
    }
    out
}

fn converge(
    observed: Vec<ResourceSlice>,
    inv: &Inventory,
    min_gen: i64,
    counter: &mut u64,
) -> (Vec<ResourceSlice>, Plan) {
    let p = plan(&observed, inv, &node(), DRIVER, min_gen);
    let after = apply(&observed, &p, counter);
    let again = plan(&after, inv, &node(), DRIVER, min_gen.max(p.generation));
    assert!(again.is_empty(), "a second plan after applying must be empty, got {again:#?}");
    (after, p)
}

fn devices_in(slices: &[ResourceSlice]) -> usize {
    slices.iter().map(|s| s.spec.devices.as_ref().map_or(0, Vec::len)).sum()
}

#[test]
fn first_publish_creates_every_slice_at_generation_one() {
    for (gpus, slices) in [(0, 1), (8, 1), (128, 1), (129, 2), (300, 3)] {
        let inv = inventory(gpus, "A100");
        let mut counter = 0;
        let (after, p) = converge(Vec::new(), &inv, 0, &mut counter);
        assert_eq!((p.creates.len(), p.updates.len(), p.deletes.len()), (slices, 0, 0), "{gpus} GPUs");
        assert_eq!(p.generation, 1);
        assert_eq!(devices_in(&after), gpus);
        assert!(after.iter().all(|s| s.spec.pool.resource_slice_count == slices as i64));
    }
}

#[test]
fn steady_state_makes_no_writes() {
    let inv = inventory(8, "A100");
    let mut counter = 0;
    let (after, p) = converge(Vec::new(), &inv, 0, &mut counter);
    assert_eq!(plan(&after, &inv, &node(), DRIVER, p.generation).writes(), 0);
}

#[test]
fn kubelet_wipe_is_recreated_with_a_newer_generation() {
    let inv = inventory(8, "A100");
    let mut counter = 0;
    let (_, first) = converge(Vec::new(), &inv, 0, &mut counter);
    let p = plan(&[], &inv, &node(), DRIVER, first.generation);
    assert_eq!(p.creates.len(), 1);
    assert_eq!(p.generation, first.generation + 1);
}

#[test]
fn a_foreign_edit_is_reverted_in_place() {
    let inv = inventory(8, "A100");
    let mut counter = 0;
    let (mut after, first) = converge(Vec::new(), &inv, 0, &mut counter);
    let devices = after[0].spec.devices.as_mut().unwrap();
    devices.pop();
    after[0].metadata.resource_version = Some("999".into());
    let p = plan(&after, &inv, &node(), DRIVER, first.generation);
    assert_eq!((p.creates.len(), p.updates.len(), p.deletes.len()), (0, 1, 0));
    assert_eq!(p.generation, first.generation, "one changed slice does not bump the generation");
    assert_eq!(p.updates[0].metadata.resource_version.as_deref(), Some("999"));
    assert_eq!(p.updates[0].metadata.name, after[0].metadata.name);
    assert_eq!(devices_in(&p.updates), 8);
}

#[test]
fn growing_past_a_slice_bumps_the_generation_and_rewrites_the_pool() {
    let mut counter = 0;
    let (after, first) = converge(Vec::new(), &inventory(128, "A100"), 0, &mut counter);
    let bigger = inventory(130, "A100");
    let (after2, p) = converge(after, &bigger, first.generation, &mut counter);
    assert_eq!(p.generation, first.generation + 1);
    assert_eq!((p.creates.len(), p.updates.len(), p.deletes.len()), (1, 1, 0));
    assert!(after2.iter().all(|s| s.spec.pool.generation == p.generation));
    assert_eq!(devices_in(&after2), 130);
}

#[test]
fn shrinking_deletes_obsolete_slices_with_preconditions() {
    let mut counter = 0;
    let (after, first) = converge(Vec::new(), &inventory(300, "A100"), 0, &mut counter);
    let (after2, p) = converge(after.clone(), &inventory(10, "A100"), first.generation, &mut counter);
    assert_eq!(p.deletes.len(), 2);
    for d in &p.deletes {
        let gone = after.iter().find(|s| s.metadata.name.as_deref() == Some(d.name.as_str())).unwrap();
        assert_eq!(Some(&d.uid), gone.metadata.uid.as_ref());
        assert_eq!(Some(&d.resource_version), gone.metadata.resource_version.as_ref());
    }
    assert_eq!(after2.len(), 1);
    assert_eq!(after2[0].spec.pool.resource_slice_count, 1);
}

#[test]
fn strangers_in_the_pool_are_deleted() {
    let inv = inventory(4, "A100");
    let mut counter = 0;
    let (mut after, first) = converge(Vec::new(), &inv, 0, &mut counter);
    // A slice with an undecodable name, one duplicating index 0, one of an old generation.
    let mut odd = after[0].clone();
    odd.metadata.name = Some("handmade".into());
    odd.metadata.uid = Some("u-odd".into());
    let mut dup = after[0].clone();
    dup.metadata.name = Some(format!("{}z", after[0].metadata.name.as_deref().unwrap()));
    dup.metadata.uid = Some("u-dup".into());
    let mut old = after[0].clone();
    old.metadata.name = Some("00000-old".into());
    old.spec.pool.generation = 0;
    old.metadata.uid = Some("u-old".into());
    after.extend([odd, dup, old]);
    let p = plan(&after, &inv, &node(), DRIVER, first.generation);
    let mut deleted: Vec<&str> = p.deletes.iter().map(|d| d.uid.as_str()).collect();
    deleted.sort();
    assert_eq!(deleted, ["u-dup", "u-odd", "u-old"]);
    assert!(p.creates.is_empty() && p.updates.is_empty());
}

#[test]
fn inventory_change_updates_one_slice_without_a_bump() {
    let mut counter = 0;
    let (after, first) = converge(Vec::new(), &inventory(8, "A100"), 0, &mut counter);
    let (_, p) = converge(after, &inventory(8, "H100"), first.generation, &mut counter);
    assert_eq!((p.creates.len(), p.updates.len(), p.deletes.len()), (0, 1, 0));
    assert_eq!(p.generation, first.generation);
}

#[test]
fn a_taint_confined_to_one_slice_is_one_update_in_the_same_generation() {
    use crate::publish::taints::DeviceTaints;
    use k8s_openapi::api::resource::v1::DeviceTaint;
    let inv = inventory(100, "A100");
    let mut counter = 0;
    // 100 devices in two slices of at most 64 (as they are once any device is tainted).
    let mut taints = DeviceTaints::new();
    let unmonitored =
        DeviceTaint { key: format!("{DRIVER}/unmonitored"), effect: "None".into(), ..DeviceTaint::default() };
    taints.insert("gpu-0".into(), vec![unmonitored]);
    let first = plan_tainted(&[], &inv, &taints, &node(), DRIVER, 0);
    assert_eq!(first.creates.len(), 2);
    let observed = apply(&[], &first, &mut counter);

    let xid = DeviceTaint {
        key: format!("{DRIVER}/xid"),
        value: Some("79".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    };
    taints.insert("gpu-99".into(), vec![xid]);
    let p = plan_tainted(&observed, &inv, &taints, &node(), DRIVER, first.generation);
    assert_eq!((p.updates.len(), p.creates.len(), p.deletes.len()), (1, 0, 0), "{p:#?}");
    assert_eq!(p.generation, first.generation, "no pool generation bump for one slice");
    let after = apply(&observed, &p, &mut counter);
    assert!(plan_tainted(&after, &inv, &taints, &node(), DRIVER, p.generation).is_empty());

    // The time the server (or edra) put on a taint is not a difference.
    let mut stamped = after.clone();
    for d in stamped.iter_mut().flat_map(|s| s.spec.devices.iter_mut().flatten()) {
        for t in d.taints.iter_mut().flatten() {
            t.time_added = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).expect("time"),
            ));
        }
    }
    assert!(plan_tainted(&stamped, &inv, &taints, &node(), DRIVER, p.generation).is_empty());
}
