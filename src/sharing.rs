//! How full GPUs are offered to claims: whole, as shares of their memory (consumable
//! capacity), or as replicas — a pure function of the inventory and `[sharing]`.
//!
//! - **Shares** (`sharing.mode = "shares"`, the default): the GPU is published with
//!   `allowMultipleAllocations: true` and a `memory` capacity whose request policy defaults
//!   to the whole memory (rounded down to the step), with a range from one step upwards in
//!   steps of `sharing.memory_step`. A claim that asks for no memory gets the whole GPU; one
//!   that asks for `10Gi` gets a share, and the scheduler places several shares on one GPU
//!   while their sum fits. The allocation carries a `shareID` and the consumed memory.
//! - **Replicas** (`"replicas"`, or the fallback where the API server drops consumable
//!   capacity): `sharing.replicas` devices per GPU, `gpu-0-replica-0` …, each with the
//!   GPU's UUID, a `replica` attribute and `memory` = total / N, as the NVIDIA device
//!   plugin's time-slicing replicas do. The whole GPU is not published then.
//! - **Exclusive**: the GPU as one device, one claim at a time.
//!
//! MIG devices are always exclusive. Sharing is accounting: the scheduler and edra's state
//! keep the sum of the shares within the GPU's memory. `sharing.enforcement` adds what edra
//! sets on a shared GPU while it has shares: nothing (`none`), a time-slice
//! (`timeslicing`), or one MPS daemon per GPU with each share's pinned memory limited
//! (`mps`); docs/sharing.md says what each mode isolates.

use crate::inventory::{AttributeValue, Device, DeviceKind, Inventory};

pub use crate::config::settings::{Enforcement, Fallback, GpuSelection, MemoryLimit, SharingMode, SharingSettings};

impl GpuSelection {
    /// Whether `d` is selected.
    pub fn selects(&self, d: &Device) -> bool {
        match self {
            GpuSelection::All => true,
            GpuSelection::Listed(names) => names.iter().any(|n| *n == d.name || *n == d.uuid),
        }
    }
}

pub use crate::inventory::SharePolicy;

/// How one device is offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// One device, one claim.
    Whole,
    /// One multi-allocatable device with this memory policy.
    Shares(SharePolicy),
    /// This many replica devices.
    Replicas(u32),
}

/// The attribute that numbers a replica.
pub const REPLICA_ATTRIBUTE: &str = "replica";

impl SharingSettings {
    /// How `d` is offered; `capacity_supported` is false once the API server was seen to
    /// drop consumable capacity.
    pub fn offer(&self, d: &Device, capacity_supported: bool) -> Offer {
        if d.kind != DeviceKind::Gpu || d.consumes.is_some() || !self.gpus.selects(d) {
            return Offer::Whole;
        }
        match self.mode {
            SharingMode::Exclusive => Offer::Whole,
            SharingMode::Replicas => Offer::Replicas(self.replicas),
            SharingMode::Shares if !capacity_supported => match self.fallback {
                Fallback::Exclusive => Offer::Whole,
                Fallback::Replicas => Offer::Replicas(self.replicas),
            },
            SharingMode::Shares => match d.capacity.get("memory") {
                Some(&memory) if memory >= self.memory_step && self.memory_step > 0 => Offer::Shares(SharePolicy {
                    default: memory / self.memory_step * self.memory_step,
                    step: self.memory_step,
                }),
                _ => Offer::Whole,
            },
        }
    }

    /// The replicas `name` may be, whatever the server supports: replicas mode, or shares
    /// with the replicas fallback.
    fn replica_count(&self, d: &Device) -> Option<u32> {
        match (self.offer(d, true), self.offer(d, false)) {
            (Offer::Replicas(n), _) | (_, Offer::Replicas(n)) => Some(n),
            _ => None,
        }
    }

    /// The devices to publish for `inv`: shareable GPUs carry their policy, replicated ones
    /// are replaced by their replicas; the result is sorted by name.
    pub fn published(&self, inv: &Inventory, capacity_supported: bool) -> Inventory {
        let mut out = Inventory { devices: Vec::with_capacity(inv.devices.len()), ..inv.clone() };
        for d in &inv.devices {
            match self.offer(d, capacity_supported) {
                Offer::Whole => out.devices.push(d.clone()),
                Offer::Shares(policy) => out.devices.push(Device { shared: Some(policy), ..d.clone() }),
                Offer::Replicas(n) => out.devices.extend((0..n).map(|k| replica(d, k, n))),
            }
        }
        out.devices.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The device an allocation result names: a device of `inv`, or a replica of one of its
    /// GPUs that the settings publish as replicas (then with the GPU's name in
    /// [`Resolved::gpu`]).
    pub fn resolve(&self, inv: &Inventory, name: &str) -> Option<Resolved> {
        if let Some(d) = inv.device(name) {
            return Some(Resolved { gpu: d.clone(), replica: None });
        }
        let (gpu, k) = replica_name(name)?;
        let d = inv.device(gpu)?;
        let n = self.replica_count(d)?;
        (k < n).then(|| Resolved { replica: Some(replica(d, k, n)), gpu: d.clone() })
    }
}

/// A resolved allocation result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The physical device (the GPU of a replica).
    pub gpu: Device,
    /// The replica, when the result names one.
    pub replica: Option<Device>,
}

/// `gpu-0-replica-3` → (`gpu-0`, 3).
pub fn replica_name(name: &str) -> Option<(&str, u32)> {
    let (gpu, k) = name.rsplit_once("-replica-")?;
    if k.is_empty() || !k.bytes().all(|b| b.is_ascii_digit()) || (k.len() > 1 && k.starts_with('0')) {
        return None;
    }
    Some((gpu, k.parse().ok()?))
}

/// Replica `k` of `n` of GPU `d`: its name, a `replica` attribute, `memory` = total / n.
fn replica(d: &Device, k: u32, n: u32) -> Device {
    let mut r = d.clone();
    r.name = format!("{}-replica-{k}", d.name);
    if r.attributes.len() + r.capacity.len() < crate::inventory::attributes::MAX_ENTRIES {
        r.attributes.insert(REPLICA_ATTRIBUTE.into(), AttributeValue::Int(i64::from(k)));
    }
    if let Some(m) = r.capacity.get_mut("memory") {
        *m /= u64::from(n.max(1));
    }
    r
}

#[cfg(test)]
mod tests;
