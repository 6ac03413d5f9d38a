//! What the machine publishes: the inventory with dynamic MIG applied ([`Carved`]), then
//! `[sharing]`, except that a GPU with shares prepared keeps the sharing it is published
//! with; the logs of what changed about either (once per change); and the checks that the
//! server kept what edra wrote (consumable capacity, dynamic MIG's counters).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::ResourceSlice;
use tracing::{info, warn};

use super::Machine;
use crate::dynamic_mig::Carved;
use crate::inventory::Inventory;
use crate::sharing::{Fallback, SharePolicy, SharingSettings};

/// The dynamic-MIG facts logged last.
#[derive(Debug, Default, PartialEq)]
pub(super) struct MigLog {
    dynamic: Vec<String>,
    foreign: Vec<(String, crate::gpu::mig_control::MigInstance)>,
    not_carved: Vec<String>,
}

impl Machine {
    /// The inventory with dynamic MIG applied.
    pub(super) fn carved(&self) -> Carved {
        self.mig.published(&self.inventory, &self.owned_mig, self.partitions_supported)
    }

    /// Logs what changed about dynamic MIG since the last reconcile.
    pub(super) fn log_mig(&mut self, carved: &Carved) {
        let now = MigLog {
            dynamic: carved.dynamic.clone(),
            foreign: carved.foreign.clone(),
            not_carved: carved.not_carved.clone(),
        };
        if now == self.mig_logged {
            return;
        }
        for gpu in now.dynamic.iter().filter(|g| !self.mig_logged.dynamic.contains(g)) {
            info!(device = %gpu, "publishing {gpu} for dynamic MIG: MIG devices are created when claims are prepared");
        }
        for (gpu, i) in now.foreign.iter().filter(|f| !self.mig_logged.foreign.contains(f)) {
            warn!(
                device = %gpu,
                gi = i.gi,
                placement = %i.placement,
                "{gpu} has a MIG instance edra did not create (GPU instance {} at placement {}): edra leaves it \
                alone and does not offer its memory slices, nor the whole GPU, until it is gone \
                (nvidia-smi mig -dci -gi {} -i <gpu>; nvidia-smi mig -dgi -gi {} -i <gpu>)",
                i.gi,
                i.placement,
                i.gi,
                i.gi
            );
        }
        for gpu in now.not_carved.iter().filter(|g| !self.mig_logged.not_carved.contains(g)) {
            if self.partitions_supported {
                warn!(
                    device = %gpu,
                    "{gpu} is selected for dynamic MIG ([mig] dynamic) but is not a MIG-capable GPU in MIG mode \
                    whose profiles edra can read; it is published whole. Enable MIG mode with \
                    `nvidia-smi -i <gpu> -mig 1` (Ampere needs a GPU reset) and restart edra"
                );
            }
        }
        self.mig_logged = now;
    }

    /// The devices as published: the inventory with `[sharing]` applied, except that a GPU
    /// with shares prepared keeps the sharing it is published with (the scheduler's view of
    /// the shares must not change under them); the new one follows when the last share is
    /// gone. Also returns the GPUs whose sharing is kept that way.
    pub(super) fn published(&self) -> (Inventory, BTreeSet<String>) {
        let (out, kept, _) = self.published_from(&self.carved());
        (out, kept)
    }

    /// [`Self::published`] of an inventory with dynamic MIG applied, and the GPUs whose
    /// published sharing differs from the one `[sharing]` gives them (held or not).
    pub(super) fn published_from(&self, carved: &Carved) -> (Inventory, BTreeSet<String>, BTreeSet<String>) {
        let mut out = self.sharing.published(&carved.inventory, self.capacity_supported);
        let mut seen = BTreeMap::new();
        for o in self.observed.values().flat_map(|s| s.spec.devices.iter().flatten()) {
            seen.entry(o.name.as_str()).or_insert(o);
        }
        let (mut kept, mut unsettled) = (BTreeSet::new(), BTreeSet::new());
        for d in &mut out.devices {
            let Some(seen) = seen.get(d.name.as_str()) else { continue };
            let published = published_policy(seen);
            if published == d.shared {
                continue;
            }
            unsettled.insert(d.name.clone());
            if self.held_shares.contains(&d.name) {
                d.shared = published;
                kept.insert(d.name.clone());
            }
        }
        (out, kept, unsettled)
    }

    /// Logs the GPUs (`frozen`) whose new sharing waits for their shares, and those it is
    /// published for now that they are gone.
    pub(super) fn log_frozen(&mut self, frozen: BTreeSet<String>) {
        for gpu in frozen.difference(&self.frozen) {
            info!(device = %gpu, "keeping the sharing {gpu} is published with while shares of it are prepared; \
                the new [sharing] is published for it when the last share is gone");
        }
        for gpu in self.frozen.difference(&frozen) {
            info!(device = %gpu, "publishing {gpu} with the new [sharing] now that no share of it is prepared");
        }
        self.frozen = frozen;
    }
}

/// The sharing policy a published device carries: its memory request policy when it is
/// multi-allocatable (a policy edra cannot read counts as none).
fn published_policy(d: &k8s_openapi::api::resource::v1::Device) -> Option<SharePolicy> {
    if d.allow_multiple_allocations != Some(true) {
        return None;
    }
    let policy = d.capacity.as_ref()?.get("memory")?.request_policy.as_ref()?;
    let bytes =
        |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| crate::config::source::parse_bytes(&q.0).ok();
    let default = bytes(policy.default.as_ref()?)?;
    let step = bytes(policy.valid_range.as_ref()?.step.as_ref()?)?;
    Some(SharePolicy { default, step })
}

/// Whether the server dropped consumable capacity from a slice edra wrote: a device
/// published as shareable came back without `allowMultipleAllocations` or without its
/// memory request policy.
pub(super) fn dropped_capacity(written: &ResourceSlice, published: &Inventory) -> bool {
    written.spec.devices.iter().flatten().any(|d| {
        let shared = published.device(&d.name).is_some_and(|p| p.shared.is_some());
        let policy = d.capacity.as_ref().and_then(|c| c.get("memory")).is_some_and(|c| c.request_policy.is_some());
        shared && (d.allow_multiple_allocations != Some(true) || !policy)
    })
}

/// Whether the server dropped dynamic MIG's counters from a slice edra wrote: a device
/// published with `consumesCounters` came back without, or a slice came back with neither
/// counters nor devices while edra publishes counter sets.
pub(super) fn dropped_counters(written: &ResourceSlice, published: &Inventory) -> bool {
    if published.counter_sets.is_empty() {
        return false;
    }
    let devices = written.spec.devices.as_deref().unwrap_or_default();
    let counters = written.spec.shared_counters.as_deref().unwrap_or_default();
    (devices.is_empty() && counters.is_empty())
        || devices.iter().any(|d| {
            let consumes = published.device(&d.name).is_some_and(|p| p.consumes.is_some());
            consumes && d.consumes_counters.as_ref().is_none_or(Vec::is_empty)
        })
}

/// Says once that the server dropped consumable capacity, and how GPUs are published instead.
pub(super) fn warn_capacity_dropped(sharing: &SharingSettings) {
    let instead = match sharing.fallback {
        Fallback::Exclusive => "as whole GPUs, one claim each".to_string(),
        Fallback::Replicas => format!("as {} replicas each (sharing.fallback = \"replicas\")", sharing.replicas),
    };
    warn!(
        "the API server dropped consumable capacity (allowMultipleAllocations, requestPolicy) from edra's \
         ResourceSlices: its DRAConsumableCapacity feature gate is off or it is older than Kubernetes 1.34; \
         GPUs are published {instead} instead. To share GPUs, enable the gate on kube-apiserver and \
         kube-scheduler (--feature-gates=DRAConsumableCapacity=true, default on from 1.36) and restart edra"
    );
}
