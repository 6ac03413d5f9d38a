//! What the GPUs are used for, read at scrape time: shares and the memory they take per
//! GPU (the state store's share lists, the GPUs' memory from the inventory), MIG instances
//! per GPU by owner (the preparer's recorded instances against the inventory's), and
//! whether the state store is usable. Nothing is kept between scrapes.

use std::collections::BTreeMap;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;
use tokio::sync::watch;

use crate::dynamic_mig::OwnedInstances;
use crate::inventory::{DeviceKind, Inventory};
use crate::state::Store;

/// Shares and memory in use per GPU, and MIG instances per GPU.
#[derive(Debug)]
pub(super) struct GpuUseCollector {
    pub(super) inventory: watch::Receiver<Arc<Inventory>>,
    pub(super) store: Store,
    pub(super) owned_mig: watch::Receiver<Arc<OwnedInstances>>,
}

/// One GPU's shares: how many, and the memory they take in bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct GpuShares {
    pub(super) shares: u64,
    pub(super) memory: u64,
}

/// MIG instances on one GPU: those edra recorded for claims, and the others.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct MigCount {
    pub(super) edra: u64,
    pub(super) foreign: u64,
}

/// The shares per GPU (device name): every whole GPU of `inv` (none: zero), and every GPU
/// the store holds shares on. `None` when the store cannot be read (it is poisoned, or a
/// share list is unreadable): no guess is shown then.
pub(super) fn shares_per_gpu(inv: &Inventory, store: &Store) -> Option<BTreeMap<String, GpuShares>> {
    let mut out: BTreeMap<String, GpuShares> = inv
        .devices
        .iter()
        .filter(|d| d.kind == DeviceKind::Gpu)
        .map(|d| (d.name.clone(), GpuShares::default()))
        .collect();
    for gpu in store.gpus_with_shares().ok()? {
        let holdings = store.shares_of(&gpu).ok()?;
        let entry = out.entry(gpu).or_default();
        entry.shares = u64::try_from(holdings.len()).unwrap_or(u64::MAX);
        entry.memory = holdings.iter().fold(0u64, |sum, h| sum.saturating_add(h.memory));
    }
    Some(out)
}

/// MIG instances per parent GPU (device name). On each GPU edra watches in MIG mode
/// (`inv.mig_gpus`, zero included), `edra` counts the instances edra recorded for claims
/// and `foreign` the instances found there that it did not; a static MIG device of another
/// GPU is foreign.
pub(super) fn mig_per_gpu(inv: &Inventory, owned: &OwnedInstances) -> BTreeMap<String, MigCount> {
    let mut out: BTreeMap<String, MigCount> = BTreeMap::new();
    let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    for g in &inv.mig_gpus {
        let edra = owned.iter().filter(|(uuid, _)| *uuid == g.uuid).count();
        let foreign = g.instances.iter().filter(|i| !owned.contains(&(g.uuid.clone(), i.placement))).count();
        out.insert(g.device.name.clone(), MigCount { edra: count(edra), foreign: count(foreign) });
    }
    for d in &inv.devices {
        let DeviceKind::Mig(m) = &d.kind else { continue };
        if inv.mig_gpus.iter().any(|g| g.uuid == m.parent_uuid) {
            continue;
        }
        // The parent's name as the inventory gives a whole GPU's (`gpu-<minor>`).
        let entry = out.entry(format!("gpu-{}", m.parent_minor)).or_default();
        entry.foreign = entry.foreign.saturating_add(1);
    }
    out
}

fn gauge_of(v: u64) -> ConstGauge<i64> {
    ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX))
}

impl Collector for GpuUseCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let inv = self.inventory.borrow().clone();
        let owned = self.owned_mig.borrow().clone();
        let shares = shares_per_gpu(&inv, &self.store).unwrap_or_default();
        let g = ConstGauge::new(0i64);

        let mut family = encoder.encode_descriptor(
            "edra_gpu_shares",
            "Shares of the GPU held by prepared claims (memory shares and replicas)",
            None,
            g.metric_type(),
        )?;
        for (gpu, s) in &shares {
            gauge_of(s.shares).encode(family.encode_family(&[("device", gpu.clone())])?)?;
        }
        let mut family = encoder.encode_descriptor(
            "edra_gpu_memory_shared",
            "GPU memory taken by the shares of prepared claims",
            Some(&Unit::Bytes),
            g.metric_type(),
        )?;
        for (gpu, s) in &shares {
            gauge_of(s.memory).encode(family.encode_family(&[("device", gpu.clone())])?)?;
        }
        let mut family = encoder.encode_descriptor(
            "edra_gpu_memory",
            "The GPU's memory as discovered (the most its shares may take)",
            Some(&Unit::Bytes),
            g.metric_type(),
        )?;
        for d in inv.devices.iter().filter(|d| d.kind == DeviceKind::Gpu) {
            let memory = d.capacity.get("memory").copied().unwrap_or(0);
            gauge_of(memory).encode(family.encode_family(&[("device", d.name.clone())])?)?;
        }
        let mut family = encoder.encode_descriptor(
            "edra_mig_instances",
            "MIG instances on the GPU: owner edra (made for prepared claims) or foreign (made by others)",
            None,
            g.metric_type(),
        )?;
        for (gpu, m) in mig_per_gpu(&inv, &owned) {
            for (owner, n) in [("edra", m.edra), ("foreign", m.foreign)] {
                let labels = [("device", gpu.clone()), ("owner", owner.to_string())];
                gauge_of(n).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// Whether the state store is usable ([`Store::health`]).
#[derive(Debug)]
pub(super) struct StoreCollector(pub(super) watch::Receiver<Option<String>>);

impl Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let usable = self.0.borrow().is_none();
        let g = ConstGauge::new(i64::from(usable));
        g.encode(encoder.encode_descriptor(
            "edra_state_store_usable",
            "1 while the state store is usable, 0 while a change could not be made durable (no claim is prepared or released)",
            None,
            g.metric_type(),
        )?)
    }
}

#[cfg(test)]
mod tests;
