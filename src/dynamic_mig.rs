//! Dynamic MIG as published: GPUs selected by `[mig] dynamic` are offered as every MIG
//! device they can be carved into, and the scheduler picks one per claim.
//!
//! Kubernetes models this with partitionable devices (KEP-4815): each dynamic GPU gets one
//! counter set `gpu-<minor>-counters` holding its MIG capacity (`multiprocessors`,
//! `copy-engines`, `decoders`, `encoders`, `jpeg-engines`, `ofa-engines`, `memory`, each
//! the largest any profile takes) and one counter per memory slice (`memory-slice-<i>` = 1).
//! Every (profile, placement) the GPU supports is a device, named
//! `gpu-<minor>-mig-<profile>-<profile ID>-<placement start>` (e.g. `gpu-0-mig-3g40gb-9-4`),
//! consuming its profile's capacity and the memory slices of its placement; the whole GPU
//! `gpu-<minor>` consumes all of them. So two devices whose placements overlap, or the GPU
//! and any of its MIG devices, are never allocated together. Names depend only on the
//! GPU's minor number and NVIDIA's profile table, so they are stable across restarts.
//!
//! The MIG devices do not exist until a claim that was allocated one is prepared
//! ([`crate::prepare`] creates and records them). MIG instances on the GPU that edra did
//! not create (foreign ones) are never touched: the devices whose placement overlaps one,
//! and the whole GPU, are not published while it exists.
//!
//! A GPU selected for dynamic MIG that is not in MIG mode, or a server without
//! partitionable devices, gets today's static publishing.

use std::collections::{BTreeMap, BTreeSet};

use crate::gpu::mig_control::{MigInstance, MigProfile, Placement};
use crate::inventory::MigGpu;
use crate::inventory::{AttributeValue, CounterSet, CounterUse, Device, DeviceKind, Inventory, MigSlot};
use crate::sharing::GpuSelection;

/// The feature gate partitionable devices need on the API server and scheduler.
pub const FEATURE_GATE: &str = "DRAPartitionableDevices";

/// Most counters in one counter set (`ResourceSliceMaxCountersPerCounterSet`).
pub const MAX_COUNTERS_PER_SET: usize = 32;

/// The capacity counters of a counter set.
/// A capacity of a profile: (counter name, device capacity name, the profile's value).
type Capacity = (&'static str, &'static str, fn(&MigProfile) -> u64);

const CAPACITIES: [Capacity; 7] = [
    ("multiprocessors", "multiprocessors", |p| u64::from(p.multiprocessors)),
    ("copy-engines", "copyEngines", |p| u64::from(p.copy_engines)),
    ("decoders", "decoders", |p| u64::from(p.decoders)),
    ("encoders", "encoders", |p| u64::from(p.encoders)),
    ("jpeg-engines", "jpegEngines", |p| u64::from(p.jpeg_engines)),
    ("ofa-engines", "ofaEngines", |p| u64::from(p.ofa_engines)),
    ("memory", "memory", |p| p.memory),
];

pub use crate::config::settings::MigSettings;

/// The MIG instances edra created (or is about to create) for claims, as recorded in its
/// state: (GPU UUID, placement). Every other instance on a dynamic GPU is foreign.
pub type OwnedInstances = BTreeSet<(String, Placement)>;

/// What [`MigSettings::published`] made of an inventory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Carved {
    /// The devices and counter sets to publish.
    pub inventory: Inventory,
    /// Dynamic GPUs (device names) published carved up.
    pub dynamic: Vec<String>,
    /// Foreign MIG instances on dynamic GPUs: (GPU device name, instance). Their space is
    /// not published.
    pub foreign: Vec<(String, MigInstance)>,
    /// GPUs selected for dynamic MIG that are not in MIG mode (or whose MIG capability
    /// could not be read, or has more memory slices than a counter set can hold): published
    /// whole, statically.
    pub not_carved: Vec<String>,
}

impl MigSettings {
    /// Whether any GPU is selected for dynamic MIG.
    pub fn any(&self) -> bool {
        !matches!(&self.dynamic, GpuSelection::Listed(l) if l.is_empty())
    }

    /// The MIG GPUs of `inv` that are selected and can be carved.
    fn carvable<'a>(&'a self, inv: &'a Inventory) -> impl Iterator<Item = &'a MigGpu> + 'a {
        inv.mig_gpus.iter().filter(|g| {
            g.device.kind == DeviceKind::Gpu
                && self.dynamic.selects(&g.device)
                && !g.capability.profiles.is_empty()
                && (g.capability.memory_slices as usize).saturating_add(CAPACITIES.len()) <= MAX_COUNTERS_PER_SET
        })
    }

    /// `inv` as published. With `supported` (the server has partitionable devices), each
    /// selected GPU in MIG mode is replaced by its counter set, the whole GPU consuming all
    /// of it, and its MIG devices ([module docs](self)); its static MIG devices (instances
    /// edra created for claims, or foreign ones) are not published. Devices come back
    /// sorted by name, counter sets by name.
    pub fn published(&self, inv: &Inventory, owned: &OwnedInstances, supported: bool) -> Carved {
        let mut out = Carved { inventory: inv.clone(), ..Carved::default() };
        if !self.any() {
            return out;
        }
        let carvable: Vec<&MigGpu> = if supported { self.carvable(inv).collect() } else { Vec::new() };
        let carved_uuids: BTreeSet<&str> = carvable.iter().map(|g| g.uuid.as_str()).collect();
        out.not_carved = inv
            .devices
            .iter()
            .chain(inv.mig_gpus.iter().map(|g| &g.device))
            .filter(|d| d.kind == DeviceKind::Gpu && self.dynamic.selects(d) && !carved_uuids.contains(d.uuid.as_str()))
            .map(|d| d.name.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if carvable.is_empty() {
            return out;
        }
        let devices = &mut out.inventory.devices;
        devices.retain(|d| !carved_uuids.contains(crate::inventory::gpu_of(d)));
        for gpu in carvable {
            let set = counter_set(gpu);
            let foreign: Vec<&MigInstance> =
                gpu.instances.iter().filter(|i| !owned.contains(&(gpu.uuid.clone(), i.placement))).collect();
            if foreign.is_empty() {
                devices.push(Device {
                    consumes: Some(CounterUse { counter_set: set.name.clone(), counters: set.counters.clone() }),
                    shared: None,
                    ..gpu.device.clone()
                });
            }
            for profile in &gpu.capability.profiles {
                for placement in &profile.placements {
                    if foreign.iter().any(|i| i.placement.overlaps(placement)) {
                        continue;
                    }
                    devices.push(slot_device(gpu, profile, *placement, &set.name));
                }
            }
            out.foreign.extend(foreign.into_iter().map(|i| (gpu.device.name.clone(), i.clone())));
            out.dynamic.push(gpu.device.name.clone());
            out.inventory.counter_sets.push(set);
        }
        devices.sort_by(|a, b| a.name.cmp(&b.name));
        out.inventory.counter_sets.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The device an allocation result names, when `name` is a (profile, placement) of a GPU
    /// of `inv` selected for dynamic MIG and in MIG mode, or such a GPU itself (listed here
    /// even while the last discovery still saw MIG devices on it).
    pub fn resolve(&self, inv: &Inventory, name: &str) -> Option<Device> {
        if let Some(gpu) = self.carvable(inv).find(|g| g.device.name == name) {
            return Some(gpu.device.clone());
        }
        let (minor, profile_id, start) = parse_slot_name(name)?;
        let gpu = self.carvable(inv).find(|g| g.device.minor == minor)?;
        let profile = gpu.capability.profile(profile_id)?;
        let placement = *profile.placements.iter().find(|p| p.start == start)?;
        let device = slot_device(gpu, profile, placement, &counter_set_name(minor));
        (device.name == name).then_some(device)
    }
}

/// `gpu-<minor>-counters`.
pub fn counter_set_name(minor: u32) -> String {
    format!("gpu-{minor}-counters")
}

/// `gpu-<minor>-mig-<profile>-<profile ID>-<start>`, the profile name in lower-case letters
/// and digits only (`1g.10gb+me` → `1g10gbme`).
pub fn slot_name(minor: u32, profile: &MigProfile, placement: Placement) -> String {
    let label: String =
        profile.name.chars().filter(char::is_ascii_alphanumeric).map(|c| c.to_ascii_lowercase()).collect();
    format!("gpu-{minor}-mig-{label}-{}-{}", profile.id, placement.start)
}

/// (minor, profile ID, placement start) of a slot name; `None` for any other name
/// (static MIG devices are `gpu-<minor>-mig-<gi>-<ci>`).
pub fn parse_slot_name(name: &str) -> Option<(u32, u32, u32)> {
    let rest = name.strip_prefix("gpu-")?;
    let (minor, rest) = rest.split_once("-mig-")?;
    let mut parts = rest.rsplitn(3, '-');
    let start = parts.next()?;
    let id = parts.next()?;
    let label = parts.next()?;
    let number = |s: &str| -> Option<u32> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0')) {
            return None;
        }
        s.parse().ok()
    };
    if label.is_empty() || !label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
        return None;
    }
    Some((number(minor)?, number(id)?, number(start)?))
}

/// The counter set of `gpu`: each capacity at the largest value any profile takes, and one
/// counter per memory slice.
fn counter_set(gpu: &MigGpu) -> CounterSet {
    let mut counters = BTreeMap::new();
    for (counter, _, value) in CAPACITIES {
        let max = gpu.capability.profiles.iter().map(value).max().unwrap_or(0);
        counters.insert(counter.to_string(), max);
    }
    for i in 0..gpu.capability.memory_slices {
        counters.insert(format!("memory-slice-{i}"), 1);
    }
    CounterSet { name: counter_set_name(gpu.device.minor), counters }
}

/// The device for `profile` at `placement` on `gpu`.
fn slot_device(gpu: &MigGpu, profile: &MigProfile, placement: Placement, set: &str) -> Device {
    let parent = &gpu.device;
    let mut attributes = parent.attributes.clone();
    attributes.remove("uuid");
    attributes.insert("type".into(), AttributeValue::String("mig".into()));
    attributes.insert("parentUUID".into(), AttributeValue::String(gpu.uuid.clone()));
    attributes.insert("profile".into(), AttributeValue::String(profile.name.clone()));
    let capacity: BTreeMap<String, u64> =
        CAPACITIES.iter().map(|(_, name, value)| (name.to_string(), value(profile))).collect();
    let mut counters: BTreeMap<String, u64> =
        CAPACITIES.iter().map(|(counter, _, value)| (counter.to_string(), value(profile))).collect();
    for i in placement.start..placement.start.saturating_add(placement.size) {
        counters.insert(format!("memory-slice-{i}"), 1);
    }
    Device {
        name: slot_name(parent.minor, profile, placement),
        kind: DeviceKind::MigSlot(Box::new(MigSlot {
            parent_uuid: gpu.uuid.clone(),
            parent_minor: parent.minor,
            parent_index: parent.index,
            profile: profile.clone(),
            placement,
        })),
        uuid: gpu.uuid.clone(),
        index: parent.index,
        minor: parent.minor,
        attributes,
        capacity,
        device_nodes: parent
            .device_nodes
            .iter()
            .filter(|p| p.file_name().is_some_and(|f| f.to_str() == Some(&format!("nvidia{}", parent.minor))))
            .cloned()
            .collect(),
        shared: None,
        consumes: Some(CounterUse { counter_set: set.to_string(), counters }),
    }
}

#[cfg(test)]
pub(crate) mod tests;
