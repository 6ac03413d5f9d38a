//! The ResourceSlices edra wants published for its node: a pure function of the
//! inventory, plus the helpers the reconcile loop uses to match them against what the API
//! server has.
//!
//! Layout, as the upstream resourceslice controller (Kubernetes 1.36) does it: one pool per
//! node named after the node; slices of at most 128 devices (64 when a slice holds a device
//! with taints or counter consumption), devices sorted by name; every slice carries the
//! pool's generation and slice count; names come from `metadata.generateName` =
//! `<index as 5+ lower-case hex digits>-<driver>-<node>-`, so the index can be read back
//! from a slice's name. An empty inventory still yields one empty slice ("driver up, no
//! devices"). Capacities are written in the canonical Quantity form the API server returns
//! (see [`quantity`]), so a read-back slice compares equal to the desired one.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet as ApiCounterSet, Device as ApiDevice,
    DeviceAttribute, DeviceCapacity, DeviceCounterConsumption, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::taints::DeviceTaints;
use crate::inventory::{AttributeValue, Device, Inventory};

/// Most devices in one slice.
pub const MAX_DEVICES: usize = 128;
/// Most devices in a slice holding a device with taints or `consumesCounters`.
pub const MAX_DEVICES_TAINTED: usize = 64;
/// Most counter sets in one slice.
pub const MAX_COUNTER_SETS: usize = 8;
/// Longest generateName prefix the API server keeps (63 minus its 5 random characters).
pub const MAX_GENERATE_NAME: usize = 58;

/// What one slice holds: counter sets or devices.
type SliceContent = (Option<Vec<ApiCounterSet>>, Option<Vec<ApiDevice>>);

/// The node that owns the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    /// The Node's name (also the pool name and `spec.nodeName`).
    pub name: String,
    /// The Node's UID; `None` leaves out the owner reference (offline output).
    pub uid: Option<String>,
}

/// The slices for `inv` on `node`, in index order, each with `metadata.generateName`
/// (no name), the owner reference to the Node when its UID is known, and `pool.generation`
/// = `generation`. Never empty.
pub fn desired_slices(inv: &Inventory, node: &NodeIdentity, driver: &str, generation: i64) -> Vec<ResourceSlice> {
    desired_tainted_slices(inv, &DeviceTaints::new(), node, driver, generation)
}

/// [`desired_slices`] with `taints` on the devices they name.
pub fn desired_tainted_slices(
    inv: &Inventory,
    taints: &DeviceTaints,
    node: &NodeIdentity,
    driver: &str,
    generation: i64,
) -> Vec<ResourceSlice> {
    let mut devices: Vec<ApiDevice> = inv
        .devices
        .iter()
        .map(|d| {
            let mut api = api_device(d);
            api.taints = taints.get(&d.name).filter(|t| !t.is_empty()).cloned();
            api
        })
        .collect();
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    // Counter sets go in slices of their own (Kubernetes 1.35+: a slice holds counters or
    // devices, not both), before the devices, at most eight to a slice.
    let counter_sets: Vec<ApiCounterSet> = inv.counter_sets.iter().map(api_counter_set).collect();
    let mut specs: Vec<SliceContent> =
        counter_sets.chunks(MAX_COUNTER_SETS).map(|c| (Some(c.to_vec()), None)).collect();
    if specs.is_empty() || !devices.is_empty() {
        specs.extend(split(devices).into_iter().map(|d| (None, Some(d))));
    }
    let count = specs.len() as i64;
    specs
        .into_iter()
        .enumerate()
        .map(|(index, (shared_counters, devices))| ResourceSlice {
            metadata: ObjectMeta {
                generate_name: Some(generate_name(index, driver, &node.name)),
                owner_references: node.uid.as_ref().map(|uid| vec![node_owner(&node.name, uid)]),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                driver: driver.to_string(),
                node_name: Some(node.name.clone()),
                pool: ResourcePool { name: node.name.clone(), generation, resource_slice_count: count },
                devices,
                shared_counters,
                ..ResourceSliceSpec::default()
            },
        })
        .collect()
}

/// Splits sorted devices into slices, first-fit in order; a slice's limit drops to 64 as
/// soon as it holds a device with taints or counter consumption.
fn split(devices: Vec<ApiDevice>) -> Vec<Vec<ApiDevice>> {
    let needs_small = |d: &ApiDevice| {
        d.taints.as_ref().is_some_and(|t| !t.is_empty()) || d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
    };
    let mut out: Vec<Vec<ApiDevice>> = vec![Vec::new()];
    let mut small = false;
    for d in devices {
        let d_small = needs_small(&d);
        let Some(cur) = out.last_mut() else { continue };
        let limit = if small || d_small { MAX_DEVICES_TAINTED } else { MAX_DEVICES };
        if cur.len() < limit {
            small |= d_small;
            cur.push(d);
        } else {
            small = d_small;
            out.push(vec![d]);
        }
    }
    out
}

/// `metadata.generateName` of slice `index`: `<index:05x>-<driver>-<node>-`, cut to
/// [`MAX_GENERATE_NAME`] characters at most (the API server would cut it there anyway,
/// possibly before a `.`); a cut never leaves `.-` or `--` before the final `-`.
pub fn generate_name(index: usize, driver: &str, node: &str) -> String {
    let mut base = format!("{index:05x}-{driver}-{node}");
    if base.len() > MAX_GENERATE_NAME - 1 {
        base.truncate(MAX_GENERATE_NAME - 1);
        while base.ends_with(['-', '.']) {
            base.pop();
        }
    }
    base.push('-');
    base
}

/// The slice index encoded at the start of a slice's name (`0001a-...` → 26); `None` when
/// the name does not start with at least five lower-case hex digits and a `-`.
pub fn slice_index(name: &str) -> Option<u64> {
    let (hex, _) = name.split_once('-')?;
    if hex.len() < 5 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Whether `existing` (as read from the API server) already has `desired`'s content:
/// driver, node, pool name and slice count, devices, and owner references. Ignores
/// server-set metadata, `pool.generation` (see [`next_generation`]) and the `timeAdded`
/// the server fills into taints.
///
/// The publisher asks this of every slice at every reconcile, so nothing is copied but
/// the devices with taints. The spec is taken apart field by field, without `..`: a field
/// a newer API adds does not compile until it is compared here too.
pub fn same_content(existing: &ResourceSlice, desired: &ResourceSlice) -> bool {
    let ResourceSliceSpec {
        all_nodes,
        devices,
        driver,
        node_name,
        node_selector,
        partition_type_attribute,
        per_device_node_selection,
        pool: ResourcePool { generation: _, name: pool_name, resource_slice_count },
        shared_counters,
        skip_node_operations,
    } = &existing.spec;
    let d = &desired.spec;
    let no_devices: &[ApiDevice] = &[];
    let (mine, wanted) = (devices.as_deref().unwrap_or(no_devices), d.devices.as_deref().unwrap_or(no_devices));
    *all_nodes == d.all_nodes
        && *driver == d.driver
        && *node_name == d.node_name
        && *node_selector == d.node_selector
        && *partition_type_attribute == d.partition_type_attribute
        && *per_device_node_selection == d.per_device_node_selection
        && *pool_name == d.pool.name
        && *resource_slice_count == d.pool.resource_slice_count
        && *shared_counters == d.shared_counters
        && *skip_node_operations == d.skip_node_operations
        && mine.len() == wanted.len()
        && mine.iter().zip(wanted).all(|(a, b)| same_device(a, b))
        && existing.metadata.owner_references.as_deref().unwrap_or_default()
            == desired.metadata.owner_references.as_deref().unwrap_or_default()
}

/// Whether two published devices are the same but for the `timeAdded` of their taints.
fn same_device(a: &ApiDevice, b: &ApiDevice) -> bool {
    if a.taints.is_none() && b.taints.is_none() {
        return a == b;
    }
    let untimed = |d: &ApiDevice| {
        let mut d = d.clone();
        for t in d.taints.iter_mut().flatten() {
            t.time_added = None;
        }
        d
    };
    untimed(a) == untimed(b)
}

/// The pool generation to publish, as the upstream controller decides it: start from the
/// highest generation among existing slices (0 when none), add 1 unless nothing new is
/// created and at most one slice changes; a higher `requested` generation wins.
pub fn next_generation(existing_max: Option<i64>, created: usize, changed: usize, requested: i64) -> i64 {
    let mut generation = existing_max.unwrap_or(0);
    if created > 0 || changed > 1 {
        generation += 1;
    }
    generation.max(requested)
}

/// Gives a slice a fixed `metadata.name` (its generateName plus a stable five-character
/// suffix in the API server's alphabet) so `kubectl apply` can create it; the index stays
/// readable with [`slice_index`].
pub fn with_stable_name(mut slice: ResourceSlice) -> ResourceSlice {
    if let Some(prefix) = slice.metadata.generate_name.take() {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut h =
            prefix.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        let mut name = prefix;
        for _ in 0..5 {
            name.push(char::from(ALPHABET[(h % ALPHABET.len() as u64) as usize]));
            h /= ALPHABET.len() as u64;
        }
        slice.metadata.name = Some(name);
    }
    slice
}

/// The controller owner reference to the Node.
fn node_owner(name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// A device in the API's shape.
pub fn api_device(d: &Device) -> ApiDevice {
    let attributes: BTreeMap<String, DeviceAttribute> =
        d.attributes.iter().map(|(k, v)| (k.clone(), api_attribute(v))).collect();
    // On a multi-allocatable device the scheduler charges every capacity a request does not
    // name with the policy's default, or the whole value without a policy: memory defaults
    // to the whole GPU (a claim without a request gets it all), the others to nothing, so a
    // share that names only memory does not take all multiprocessors.
    let policy = |k: &str| {
        let p = d.shared?;
        let (default, min, step) = if k == "memory" { (p.default, p.step, p.step) } else { (0, 0, 1) };
        Some(CapacityRequestPolicy {
            default: Some(Quantity(quantity(default))),
            valid_range: Some(CapacityRequestPolicyRange {
                min: Quantity(quantity(min)),
                max: None,
                step: Some(Quantity(quantity(step))),
            }),
            valid_values: None,
        })
    };
    let capacity: BTreeMap<String, DeviceCapacity> = d
        .capacity
        .iter()
        .map(|(k, v)| (k.clone(), DeviceCapacity { value: Quantity(quantity(*v)), request_policy: policy(k) }))
        .collect();
    ApiDevice {
        name: d.name.clone(),
        attributes: (!attributes.is_empty()).then_some(attributes),
        capacity: (!capacity.is_empty()).then_some(capacity),
        allow_multiple_allocations: d.shared.map(|_| true),
        consumes_counters: d.consumes.as_ref().map(|c| {
            vec![DeviceCounterConsumption {
                counter_set: c.counter_set.clone(),
                counters: api_counters(&c.counters),
                ..DeviceCounterConsumption::default()
            }]
        }),
        ..ApiDevice::default()
    }
}

/// A counter set in the API's shape.
pub fn api_counter_set(s: &crate::inventory::CounterSet) -> ApiCounterSet {
    ApiCounterSet { name: s.name.clone(), counters: api_counters(&s.counters) }
}

fn api_counters(counters: &BTreeMap<String, u64>) -> BTreeMap<String, Counter> {
    counters.iter().map(|(k, v)| (k.clone(), Counter { value: Quantity(quantity(*v)) })).collect()
}

fn api_attribute(v: &AttributeValue) -> DeviceAttribute {
    match v {
        AttributeValue::Int(i) => DeviceAttribute { int: Some(*i), ..Default::default() },
        AttributeValue::Bool(b) => DeviceAttribute { bool: Some(*b), ..Default::default() },
        AttributeValue::String(s) => DeviceAttribute { string: Some(s.clone()), ..Default::default() },
        AttributeValue::Version(s) => DeviceAttribute { version: Some(s.clone()), ..Default::default() },
    }
}

pub use crate::util::quantity;

#[cfg(test)]
mod tests;
