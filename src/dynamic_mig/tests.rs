//! Tests of what dynamic MIG publishes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::*;
use crate::gpu::mig_control::profiles;
use crate::inventory::attributes::{GpuFacts, gpu_device};

const GI: u64 = 1 << 30;

fn facts(index: u32, product: &str, memory: u64) -> GpuFacts {
    GpuFacts {
        index,
        minor: index,
        uuid: format!("GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd"),
        product_name: product.into(),
        brand: Some("Nvidia".into()),
        architecture: Some("Ampere".into()),
        cuda_compute_capability: Some("8.0".into()),
        driver_version: Some("550.54.15".into()),
        cuda_driver_version: Some("12.4.0".into()),
        pci_bus_id: Some(format!("0000:{:02x}:00.0", 0x10 + index)),
        pcie_root: Some("pci0000:00".into()),
        numa_node: None,
        memory,
        multiprocessors: Some(108),
    }
}

fn mig_gpu(index: u32, instances: Vec<MigInstance>) -> MigGpu {
    let f = facts(index, "NVIDIA A100-SXM4-80GB", 80 * GI);
    let device = gpu_device(&f, Path::new("/dev"));
    MigGpu {
        uuid: f.uuid.clone(),
        device,
        capability: profiles::for_model(&f.product_name, f.memory).expect("A100 80GB table"),
        instances,
    }
}

/// `n` A100 80GB GPUs in MIG mode, none carved yet.
pub(crate) fn inventory(n: u32) -> Inventory {
    let mig_gpus: Vec<MigGpu> = (0..n).map(|i| mig_gpu(i, Vec::new())).collect();
    Inventory { devices: mig_gpus.iter().map(|g| g.device.clone()).collect(), mig_gpus, ..Inventory::default() }
}

fn all() -> MigSettings {
    MigSettings { dynamic: GpuSelection::All }
}

fn names(inv: &Inventory) -> Vec<&str> {
    inv.devices.iter().map(|d| d.name.as_str()).collect()
}

pub(crate) fn instance(gi: u32, profile_id: u32, start: u32, size: u32) -> MigInstance {
    MigInstance { gi, profile_id, placement: Placement { start, size }, ci: Some(0), uuid: Some(format!("MIG-{gi}")) }
}

#[test]
fn static_by_default_nothing_changes() {
    let inv = inventory(2);
    let out = MigSettings::default().published(&inv, &OwnedInstances::new(), true);
    assert_eq!(out.inventory, inv);
    assert!(out.dynamic.is_empty() && out.not_carved.is_empty());
}

#[test]
fn a_dynamic_a100_80gb_is_one_counter_set_its_whole_gpu_and_every_profile_placement() {
    let out = all().published(&inventory(1), &OwnedInstances::new(), true);
    assert_eq!(out.dynamic, ["gpu-0"]);
    let sets = &out.inventory.counter_sets;
    assert_eq!(sets.len(), 1);
    assert_eq!(sets[0].name, "gpu-0-counters");
    assert_eq!(sets[0].counters.len(), 7 + 8, "7 capacities and 8 memory slices");
    assert_eq!(sets[0].counters["memory"], 80640 << 20, "the largest profile's memory");
    assert_eq!(sets[0].counters["multiprocessors"], 98);
    assert_eq!(sets[0].counters["memory-slice-7"], 1);
    // 7g (1) + 4g (1) + 3g (2) + 2g (3) + 1g.20gb (4) + 1g.10gb (7) + 1g.10gb+me (7), and the GPU.
    assert_eq!(out.inventory.devices.len(), 1 + 1 + 2 + 3 + 4 + 7 + 7 + 1);
    let whole = out.inventory.device("gpu-0").expect("the whole GPU");
    assert_eq!(whole.kind, DeviceKind::Gpu);
    assert_eq!(whole.consumes.as_ref().map(|c| &c.counters), Some(&sets[0].counters), "the GPU takes everything");
    let three = out.inventory.device("gpu-0-mig-3g40gb-9-4").expect("3g.40gb at slice 4");
    let used = &three.consumes.as_ref().expect("consumes").counters;
    assert_eq!(used["memory"], 40192 << 20);
    let slices: Vec<&str> = used.keys().filter(|k| k.starts_with("memory-slice-")).map(String::as_str).collect();
    assert_eq!(slices, ["memory-slice-4", "memory-slice-5", "memory-slice-6", "memory-slice-7"]);
    assert_eq!(three.capacity["memory"], 40192 << 20);
    assert_eq!(three.capacity["copyEngines"], 3);
    assert_eq!(three.attributes["type"], AttributeValue::String("mig".into()));
    assert_eq!(three.attributes["profile"], AttributeValue::String("3g.40gb".into()));
    assert!(!three.attributes.contains_key("uuid"), "a MIG device that does not exist has no UUID");
    assert_eq!(three.device_nodes, [Path::new("/dev/nvidia0")]);
    assert!(out.inventory.device("gpu-0-mig-1g10gbme-20-6").is_some(), "+me profiles are offered");
    for d in &out.inventory.devices {
        assert!(crate::config::validate_dns_label(&d.name).is_ok(), "{}", d.name);
        for k in d.consumes.as_ref().expect("every device consumes").counters.keys() {
            assert!(sets[0].counters.contains_key(k), "{} consumes a counter the set lacks: {k}", d.name);
        }
    }
}

#[test]
fn names_are_stable_and_resolve_back_to_the_published_device() {
    let inv = inventory(2);
    let a = all().published(&inv, &OwnedInstances::new(), true);
    let mut owned = OwnedInstances::new();
    owned.insert((inv.mig_gpus[1].uuid.clone(), Placement { start: 0, size: 4 }));
    let mut carved = inv.clone();
    carved.mig_gpus[1].instances.push(instance(1, 9, 0, 4));
    let b = all().published(&carved, &owned, true);
    assert_eq!(names(&a.inventory), names(&b.inventory), "an instance edra created changes no name");
    for d in &a.inventory.devices {
        let resolved = all().resolve(&inv, &d.name).unwrap_or_else(|| panic!("{} does not resolve", d.name));
        if d.kind == DeviceKind::Gpu {
            assert_eq!(resolved, Device { consumes: None, ..d.clone() }, "the whole GPU as discovered");
        } else {
            assert_eq!(&resolved, d);
        }
    }
    for bad in ["gpu-0-mig-3g40gb-9-04", "gpu-0-mig-3g40gb-9-1", "gpu-0-mig-3g40gb-8-0", "gpu-9-mig-3g40gb-9-0"] {
        assert_eq!(all().resolve(&inv, bad), None, "{bad}");
    }
    assert_eq!(all().resolve(&inv, "gpu-0-mig-1-0"), None, "a static MIG name is not a slot");
    assert_eq!(MigSettings::default().resolve(&inv, "gpu-0-mig-3g40gb-9-4"), None, "not selected");
}

#[test]
fn foreign_instances_keep_their_space_and_the_whole_gpu_off_the_slices() {
    let mut inv = inventory(1);
    inv.mig_gpus[0].instances.push(instance(2, 9, 4, 4));
    let out = all().published(&inv, &OwnedInstances::new(), true);
    assert_eq!(out.foreign, [("gpu-0".to_string(), instance(2, 9, 4, 4))]);
    assert!(out.inventory.device("gpu-0").is_none(), "the GPU is not whole any more");
    assert!(out.inventory.device("gpu-0-mig-3g40gb-9-4").is_none());
    assert!(out.inventory.device("gpu-0-mig-1g10gb-19-6").is_none());
    assert!(out.inventory.device("gpu-0-mig-7g80gb-0-0").is_none());
    assert!(out.inventory.device("gpu-0-mig-3g40gb-9-0").is_some(), "the free half is offered");
    assert!(out.inventory.device("gpu-0-mig-1g10gb-19-3").is_some());
    let mut owned = OwnedInstances::new();
    owned.insert((inv.mig_gpus[0].uuid.clone(), Placement { start: 4, size: 4 }));
    let out = all().published(&inv, &owned, true);
    assert!(out.foreign.is_empty());
    assert!(out.inventory.device("gpu-0").is_some() && out.inventory.device("gpu-0-mig-3g40gb-9-4").is_some());
}

#[test]
fn static_mig_devices_of_a_dynamic_gpu_are_not_published_and_other_gpus_are_untouched() {
    let mut inv = inventory(2);
    let static_mig = Device {
        name: "gpu-0-mig-1-0".into(),
        kind: DeviceKind::Mig(crate::inventory::MigInfo {
            parent_uuid: inv.mig_gpus[0].uuid.clone(),
            parent_minor: 0,
            parent_index: 0,
            gi: 1,
            ci: 0,
            profile: "3g.40gb".into(),
        }),
        ..inv.devices[0].clone()
    };
    inv.devices.retain(|d| d.name != "gpu-0");
    inv.devices.push(static_mig);
    inv.mig_gpus[0].instances.push(instance(1, 9, 0, 4));
    let only_1 = MigSettings { dynamic: GpuSelection::Listed(vec!["gpu-1".into()]) };
    let out = only_1.published(&inv, &OwnedInstances::new(), true);
    assert_eq!(out.dynamic, ["gpu-1"]);
    assert!(out.inventory.device("gpu-0-mig-1-0").is_some(), "gpu-0 stays static");
    assert_eq!(out.inventory.counter_sets.len(), 1);
    let out = all().published(&inv, &OwnedInstances::new(), true);
    assert!(out.inventory.device("gpu-0-mig-1-0").is_none(), "a dynamic GPU's instances are not devices");
    assert_eq!(out.inventory.counter_sets.len(), 2);
}

#[test]
fn without_the_feature_or_mig_mode_a_selected_gpu_is_published_statically() {
    let inv = inventory(2);
    let out = all().published(&inv, &OwnedInstances::new(), false);
    assert_eq!(out.inventory, inv, "a server without partitionable devices gets static publishing");
    assert_eq!(out.not_carved, ["gpu-0", "gpu-1"]);
    let mut no_mig = inv.clone();
    no_mig.mig_gpus.remove(1);
    let out = all().published(&no_mig, &OwnedInstances::new(), true);
    assert_eq!(out.dynamic, ["gpu-0"]);
    assert_eq!(out.not_carved, ["gpu-1"], "gpu-1 is not in MIG mode");
    assert_eq!(out.inventory.device("gpu-1").and_then(|d| d.consumes.as_ref()), None);
}

#[test]
fn slot_names_parse_only_in_their_canonical_form() {
    let p = profiles::for_model("NVIDIA H100 80GB HBM3", 80 * GI).expect("H100");
    for profile in &p.profiles {
        for pl in &profile.placements {
            let name = slot_name(3, profile, *pl);
            assert_eq!(parse_slot_name(&name), Some((3, profile.id, pl.start)), "{name}");
        }
    }
    for bad in ["gpu-0-mig-1-0", "gpu-0-mig--9-0", "gpu-00-mig-a-9-0", "gpu-0-mig-A-9-0", "gpu-0-mig-a-9-", "x"] {
        assert_eq!(parse_slot_name(bad), None, "{bad}");
    }
}

/// Every rule of the 1.36 API (and its scheduler) a pool of dynamic-MIG GPUs must keep.
fn assert_valid_pool(slices: &[k8s_openapi::api::resource::v1::ResourceSlice]) {
    use crate::publish::desired::{MAX_COUNTER_SETS, MAX_DEVICES_TAINTED};
    let mut sets: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut device_names = BTreeSet::new();
    for s in slices {
        assert_eq!(s.spec.pool.resource_slice_count, slices.len() as i64);
        let counters = s.spec.shared_counters.as_deref().unwrap_or_default();
        let devices = s.spec.devices.as_deref().unwrap_or_default();
        assert!(counters.is_empty() || devices.is_empty(), "a slice holds counters or devices, not both");
        assert!(counters.len() <= MAX_COUNTER_SETS, "{} counter sets in one slice", counters.len());
        for c in counters {
            assert!(c.counters.len() <= MAX_COUNTERS_PER_SET);
            assert!(crate::config::validate_dns_label(&c.name).is_ok(), "{}", c.name);
            for k in c.counters.keys() {
                assert!(crate::config::validate_dns_label(k).is_ok(), "counter name {k}");
            }
            let fresh = sets.insert(c.name.clone(), c.counters.keys().cloned().collect()).is_none();
            assert!(fresh, "counter set {} twice in the pool", c.name);
        }
        assert!(devices.len() <= MAX_DEVICES_TAINTED, "{} devices with counters in one slice", devices.len());
        for d in devices {
            assert!(device_names.insert(d.name.clone()), "device {} twice", d.name);
            let entries = d.attributes.as_ref().map_or(0, BTreeMap::len) + d.capacity.as_ref().map_or(0, BTreeMap::len);
            assert!(entries <= 32, "{}: {entries} attributes and capacities", d.name);
            let uses = d.consumes_counters.as_deref().unwrap_or_default();
            assert!(uses.len() <= 2);
            for u in uses {
                assert!(u.counters.len() <= MAX_COUNTERS_PER_SET);
            }
        }
    }
    for s in slices {
        for d in s.spec.devices.iter().flatten() {
            for u in d.consumes_counters.iter().flatten() {
                let set = sets.get(&u.counter_set).unwrap_or_else(|| panic!("{}: no set {}", d.name, u.counter_set));
                for k in u.counters.keys() {
                    assert!(set.contains(k), "{} consumes {k}, which {} lacks", d.name, u.counter_set);
                }
            }
        }
    }
}

#[test]
fn pools_of_1_2_8_and_more_gpus_keep_every_api_limit() {
    use crate::publish::desired::{NodeIdentity, desired_slices};
    let node = NodeIdentity { name: "edge-1".into(), uid: Some("uid-1".into()) };
    // (GPUs, counter-set slices, device slices): 26 devices per A100 80GB, 64 per slice.
    for (n, counter_slices, device_slices) in [(1, 1, 1), (2, 1, 1), (8, 1, 4), (9, 2, 4), (16, 2, 7)] {
        let out = all().published(&inventory(n), &OwnedInstances::new(), true);
        let slices = desired_slices(&out.inventory, &node, "gpu.edra.dev", 1);
        assert_valid_pool(&slices);
        let with_counters = slices.iter().take_while(|s| s.spec.shared_counters.is_some()).count();
        assert_eq!((with_counters, slices.len() - with_counters), (counter_slices, device_slices), "{n} GPUs");
        let devices: usize = slices.iter().map(|s| s.spec.devices.as_ref().map_or(0, Vec::len)).sum();
        assert_eq!(devices, 26 * n as usize);
    }
}
