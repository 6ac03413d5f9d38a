//! The pure part of preparing a claim: from a fetched ResourceClaim and the inventory to
//! the device records to store, or the reason the claim cannot be prepared here.

use std::collections::BTreeSet;

use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};

use super::PrepareError;
use super::config::{self, Strategy};
use super::{AllocationError, ClaimError, RequestError};
use super::{PrepareSettings, cdi};
use crate::device_config::Interval;
use crate::inventory::tegra::is_integrated;
use crate::inventory::{DeviceKind, Inventory};
use crate::plugin::handler::ClaimRef;
use crate::sharing::{Enforcement, Offer, Resolved, SharingMode};
use crate::state::{DeviceRecord, MigRecord, MigState, ShareRecord};

/// Checks the claim is the one the kubelet means and allocated, takes the results of this
/// driver on this node's pool, checks the devices exist, and resolves their configs.
///
/// `held_shares` names the GPUs with shares prepared: they stay published as shares (the
/// publisher keeps their sharing) even when `[sharing]` no longer offers them so.
pub fn plan(
    settings: &PrepareSettings,
    claim_ref: &ClaimRef,
    claim: &ResourceClaim,
    inventory: &Inventory,
    held_shares: &BTreeSet<String>,
) -> Result<Vec<DeviceRecord>, PrepareError> {
    let results = allocated_results(settings, claim_ref, claim)?;
    check_unique(&results)?;
    let mut resolved = Vec::with_capacity(results.len());
    for r in &results {
        let found = settings
            .sharing
            .resolve(inventory, &r.device)
            .or_else(|| settings.mig.resolve(inventory, &r.device).map(|gpu| Resolved { gpu, replica: None }));
        let found = found.ok_or_else(|| unresolved(settings, inventory, &r.device))?;
        if r.share_id.is_some() && !r.admin_access.unwrap_or(false) {
            check_offered_as_shares(settings, &r.device, &found, held_shares)?;
        }
        resolved.push(found);
    }
    let requests: Vec<&str> = results.iter().map(|r| r.request.as_str()).collect();
    let configs = config::resolve(&settings.driver, claim, &requests).map_err(RequestError::Config)?;
    let vendor = settings.cdi_vendor();
    let mut out = Vec::with_capacity(results.len());
    for ((r, found), cfg) in results.into_iter().zip(resolved).zip(configs) {
        let share = share_of(r, &found, settings.sharing.memory_step)?;
        let record = DeviceRecord {
            request: r.request.clone(),
            request_names: vec![config::base_request(&r.request).to_string()],
            device: r.device.clone(),
            pool: r.pool.clone(),
            cdi_ids: Vec::new(),
            admin_access: r.admin_access.unwrap_or(false),
            share_id: r.share_id.clone(),
            config: cfg,
            share,
            mig: mig_intent(&found.gpu),
        };
        check_device(settings, &out, r, &found, &record)?;
        let cdi_ids = vec![cdi::device_id(&vendor, &claim_ref.uid, &record.cdi_device())];
        out.push(DeviceRecord { cdi_ids, ..record });
    }
    Ok(out)
}

/// The allocation results of this driver on this node's pool in `claim`, once it is the
/// claim the kubelet means (`claim_ref`'s UID) and allocated.
fn allocated_results<'a>(
    settings: &PrepareSettings,
    claim_ref: &ClaimRef,
    claim: &'a ResourceClaim,
) -> Result<Vec<&'a DeviceRequestAllocationResult>, PrepareError> {
    let found_uid = claim.metadata.uid.as_deref().unwrap_or_default();
    if found_uid != claim_ref.uid {
        return Err(ClaimError::Replaced {
            claim: format!("{}/{}", claim_ref.namespace, claim_ref.name),
            expected: claim_ref.uid.clone(),
            found: found_uid.to_string(),
        }
        .into());
    }
    let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Err(ClaimError::NotAllocated { claim: format!("{}/{}", claim_ref.namespace, claim_ref.name) }.into());
    };
    let results: Vec<_> = allocation
        .devices
        .iter()
        .flat_map(|d| d.results.iter().flatten())
        .filter(|r| r.driver == settings.driver && r.pool == settings.node)
        .collect();
    if results.is_empty() {
        return Err(AllocationError::NoDevices { driver: settings.driver.clone(), pool: settings.node.clone() }.into());
    }
    Ok(results)
}

/// Checks `record` (allocation result `r`, resolved as `found`) against the node's sharing
/// and the devices of the claim planned before it (`out`).
fn check_device(
    settings: &PrepareSettings,
    out: &[DeviceRecord],
    r: &DeviceRequestAllocationResult,
    found: &Resolved,
    record: &DeviceRecord,
) -> Result<(), PrepareError> {
    let strategy = record.config.sharing.strategy;
    if strategy != Strategy::Exclusive && record.is_partial_share() {
        return Err(RequestError::SharingOnShare {
            strategy: match strategy {
                Strategy::TimeSlicing => "TimeSlicing",
                _ => "MPS",
            },
            request: r.request.clone(),
            device: r.device.clone(),
            gpu: found.gpu.name.clone(),
            enforcement: settings.sharing.enforcement.name(),
        }
        .into());
    }
    if settings.sharing.enforcement == Enforcement::Mps
        && strategy == Strategy::Exclusive
        && !record.admin_access
        && let Some(share) = &record.share
        && let Some(other) = out.iter().find(|d: &&DeviceRecord| {
            d.config.sharing.strategy == Strategy::Exclusive
                && !d.admin_access
                && d.share.as_ref().is_some_and(|s| s.gpu != share.gpu)
        })
    {
        return Err(RequestError::MpsSharesOnTwoGpus {
            first: other.request.clone(),
            first_gpu: other.gpu().to_string(),
            second: r.request.clone(),
            second_gpu: share.gpu.clone(),
        }
        .into());
    }
    if is_integrated(&found.gpu) {
        check_integrated(settings, r, record)?;
    }
    if strategy == Strategy::TimeSlicing && matches!(found.gpu.kind, DeviceKind::Mig(_) | DeviceKind::MigSlot(_)) {
        return Err(RequestError::TimeSlicingOnMig { request: r.request.clone(), device: r.device.clone() }.into());
    }
    if let Some(other) = out.iter().find(|d: &&DeviceRecord| d.gpu() == record.gpu() && d.config != record.config) {
        return Err(RequestError::ConflictingConfigs {
            device: r.device.clone(),
            first: other.request.clone(),
            second: r.request.clone(),
        }
        .into());
    }
    Ok(())
}

/// Why MPS is refused on a Jetson.
pub const MPS_ON_JETSON: &str = "CUDA supports MPS on Tegra only from CUDA 12.5 and without compute modes or \
     multi-user mode, and edra runs MPS with the GPU in EXCLUSIVE_PROCESS compute mode, which a Jetson does not \
     have; the GPU is time-shared by every claim on it, so use Exclusive (the default) or TimeSlicing without an \
     interval";

/// Refuses what a Jetson's integrated GPU cannot do: MPS (edra's needs compute modes),
/// a time-slice interval (no compute policy to set it with), and shares enforced by an
/// MPS daemon or a time-slice. Time-slicing without an interval is what the GPU does
/// anyway, so it changes nothing.
fn check_integrated(
    settings: &PrepareSettings,
    r: &DeviceRequestAllocationResult,
    record: &DeviceRecord,
) -> Result<(), PrepareError> {
    let sharing = &record.config.sharing;
    let interval = sharing.time_slicing.as_ref().and_then(|t| t.interval).filter(|i| *i != Interval::Default);
    let refused = if sharing.strategy == Strategy::Mps {
        Some(("MPS".to_string(), MPS_ON_JETSON))
    } else if let (Strategy::TimeSlicing, Some(i)) = (sharing.strategy, interval) {
        Some((
            format!("time-slice interval {i:?}"),
            "a Jetson has no compute policy to set a time-slice with; drop the interval (the GPU is time-shared as it is)",
        ))
    } else if record.share.is_some() && !record.admin_access && settings.sharing.enforcement != Enforcement::None {
        Some((
            format!("a share enforced by sharing.enforcement = \"{}\"", settings.sharing.enforcement.name()),
            "a Jetson's shares are advisory (time-shared, no memory isolation); set sharing.enforcement = \"none\" on this node",
        ))
    } else {
        None
    };
    match refused {
        Some((what, why)) => {
            Err(RequestError::NotOnJetson { request: r.request.clone(), device: r.device.clone(), what, why }.into())
        }
        None => Ok(()),
    }
}

/// Refuses a share of a device edra does not publish as shares (`device`, resolved as
/// `found`): a MIG device, a replica, a GPU `[sharing]` offers whole or as replicas, unless
/// shares of it are held, which keeps it published as shares until the last one is gone.
fn check_offered_as_shares(
    settings: &PrepareSettings,
    device: &str,
    found: &Resolved,
    held_shares: &BTreeSet<String>,
) -> Result<(), PrepareError> {
    let (gpu, sharing) = (&found.gpu, &settings.sharing);
    let why = if let Some(replica) = &found.replica {
        format!("{} is a replica of {}, one claim's alone", replica.name, gpu.name)
    } else if matches!(gpu.kind, DeviceKind::Mig(_) | DeviceKind::MigSlot(_)) {
        "MIG devices are always exclusive".to_string()
    } else if matches!(sharing.offer(gpu, true), Offer::Shares(_)) || held_shares.contains(&gpu.name) {
        return Ok(());
    } else if sharing.mode == SharingMode::Exclusive {
        "sharing.mode is \"exclusive\": GPUs are published whole".to_string()
    } else if !sharing.gpus.selects(gpu) {
        format!("sharing.gpus does not select {}, so it is published whole", gpu.name)
    } else if sharing.mode == SharingMode::Replicas {
        format!("sharing.mode is \"replicas\": {} is published as {0}-replica-0 …, not as shares", gpu.name)
    } else {
        format!(
            "{} has less memory than one sharing.memory_step ({}), so it is published whole",
            gpu.name,
            crate::util::quantity(sharing.memory_step)
        )
    };
    Err(AllocationError::NotOfferedAsShares { device: device.to_string(), why }.into())
}

/// The MIG instance to create for a dynamic MIG device, as an intent.
fn mig_intent(device: &crate::inventory::Device) -> Option<MigRecord> {
    let DeviceKind::MigSlot(slot) = &device.kind else { return None };
    Some(MigRecord {
        gpu: slot.parent_uuid.clone(),
        gpu_minor: slot.parent_minor,
        profile_id: slot.profile.id,
        profile: slot.profile.name.clone(),
        placement: slot.placement,
        state: MigState::Intent,
        gi: None,
        ci: None,
        uuid: None,
        lost: None,
    })
}

/// Why an allocated device name is not a device here: for a dynamic MIG device name of a
/// GPU on this node, what keeps the GPU from being carved; otherwise an unknown device.
fn unresolved(settings: &PrepareSettings, inventory: &Inventory, name: &str) -> PrepareError {
    let unknown: PrepareError = AllocationError::UnknownDevice { device: name.to_string() }.into();
    let Some((minor, _, _)) = crate::dynamic_mig::parse_slot_name(name) else { return unknown };
    let whole = inventory.mig_gpus.iter().map(|g| &g.device).chain(&inventory.devices);
    let Some(gpu) = whole.filter(|d| d.kind == DeviceKind::Gpu).find(|d| d.minor == minor) else { return unknown };
    let reason = if !settings.mig.dynamic.selects(gpu) {
        format!("GPU {} is not selected for dynamic MIG ([mig] dynamic)", gpu.name)
    } else if !inventory.mig_gpus.iter().any(|g| g.uuid == gpu.uuid) {
        format!("GPU {} ({}) is not in MIG mode", gpu.name, gpu.uuid)
    } else {
        return unknown;
    };
    AllocationError::MigUnavailable { device: name.to_string(), reason }.into()
}

/// Refuses a claim whose results name a device twice, as the scheduler never allocates: a
/// device appears once per claim, or, as shares of it, each with its own share ID. Results
/// with admin access are left out (the API lets them repeat a device).
fn check_unique(results: &[&DeviceRequestAllocationResult]) -> Result<(), PrepareError> {
    let mut seen: std::collections::HashMap<&str, Vec<(Option<&str>, &str)>> =
        std::collections::HashMap::with_capacity(results.len());
    for r in results.iter().filter(|r| !r.admin_access.unwrap_or(false)) {
        let share = r.share_id.as_deref();
        let earlier = seen.entry(r.device.as_str()).or_default();
        // Two shares with their own IDs may name one device; anything else is a repeat.
        if let Some((_, first)) = earlier.iter().find(|(s, _)| share.is_none() || s.is_none() || *s == share) {
            return Err(AllocationError::DuplicateAllocation {
                device: r.device.clone(),
                share_id: share.map(str::to_string),
                first: first.to_string(),
                second: r.request.clone(),
            }
            .into());
        }
        earlier.push((share, r.request.as_str()));
    }
    Ok(())
}

/// The share of its GPU an allocation result takes: for a consumable-capacity allocation
/// (it carries a share ID) the consumed memory, which must be one edra publishes (at least
/// `step` and a multiple of it, `sharing.memory_step`), for a replica its part of the memory.
fn share_of(
    r: &DeviceRequestAllocationResult,
    found: &Resolved,
    step: u64,
) -> Result<Option<ShareRecord>, PrepareError> {
    let gpu_memory = found.gpu.capacity.get("memory").copied().unwrap_or(0);
    if let Some(replica) = &found.replica {
        let memory = replica.capacity.get("memory").copied().unwrap_or(0);
        return Ok(Some(ShareRecord { gpu: found.gpu.name.clone(), memory, gpu_memory }));
    }
    let Some(id) = &r.share_id else { return Ok(None) };
    if !cdi::is_valid_uid(id) {
        return Err(AllocationError::InvalidShareId { device: r.device.clone(), share_id: id.clone() }.into());
    }
    // Every capacity of the device is listed (0 included); without one, the share counts as
    // the whole GPU.
    let memory = match r.consumed_capacity.as_ref().and_then(|c| c.get("memory")) {
        None => gpu_memory,
        Some(q) => crate::config::source::parse_bytes(&q.0).ok().filter(|m| *m <= gpu_memory).ok_or_else(|| {
            AllocationError::InvalidConsumedMemory {
                device: r.device.clone(),
                found: q.0.chars().take(64).collect(),
                gpu_memory: crate::util::quantity(gpu_memory),
            }
        })?,
    };
    if let Some(q) = r.consumed_capacity.as_ref().and_then(|c| c.get("memory"))
        && (memory < step.max(1) || memory % step.max(1) != 0)
    {
        return Err(AllocationError::UnpublishedShare {
            device: r.device.clone(),
            found: q.0.chars().take(64).collect(),
            step: crate::util::quantity(step),
        }
        .into());
    }
    Ok(Some(ShareRecord { gpu: found.gpu.name.clone(), memory, gpu_memory }))
}

/// A full GPU a claim time-slices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeSlicedGpu {
    /// The device name.
    pub device: String,
    /// The GPU's UUID.
    pub uuid: String,
    /// The interval asked for.
    pub interval: Interval,
}

/// The full GPUs among `devices` whose config is TimeSlicing, each once, in device order.
pub fn timeslicing_gpus(devices: &[DeviceRecord], inventory: &Inventory) -> Vec<TimeSlicedGpu> {
    let mut out: Vec<TimeSlicedGpu> = Vec::new();
    for d in devices.iter().filter(|d| d.config.sharing.strategy == Strategy::TimeSlicing) {
        // A Jetson's GPU is time-shared as it is, with nothing to set.
        let Some(dev) = inventory.device(d.gpu()).filter(|dev| dev.kind == DeviceKind::Gpu && !is_integrated(dev))
        else {
            continue;
        };
        if out.iter().any(|g| g.device == d.gpu()) {
            continue;
        }
        let interval = d.config.sharing.time_slicing.as_ref().and_then(|t| t.interval).unwrap_or_default();
        out.push(TimeSlicedGpu { device: d.gpu().to_string(), uuid: dev.uuid.clone(), interval });
    }
    out
}

/// A claim's MPS daemon, as its MPS devices and their (one) config ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsPlan {
    /// The UUIDs the daemon serves, in device order.
    pub gpus: Vec<String>,
    /// The full GPUs among them (device, UUID): their compute mode is set to
    /// EXCLUSIVE_PROCESS. A MIG device's compute mode is its parent's, shared with other
    /// claims' MIG devices, so it is left as it is.
    pub full_gpus: Vec<(String, String)>,
    /// `defaultActiveThreadPercentage`.
    pub active_thread_percentage: Option<u32>,
    /// Pinned device memory limit per UUID, in MiB.
    pub pinned_memory_mib: Vec<(String, u64)>,
}

/// The MPS daemon of a claim whose devices include MPS ones: one daemon per claim, so all
/// of them must carry the same MPS settings; per-device limits must name one of them.
pub fn mps_plan(devices: &[DeviceRecord], inventory: &Inventory) -> Result<Option<MpsPlan>, PrepareError> {
    let mps: Vec<&DeviceRecord> = devices.iter().filter(|d| d.config.sharing.strategy == Strategy::Mps).collect();
    let Some(first) = mps.first() else { return Ok(None) };
    if let Some(other) = mps.iter().find(|d| d.config.sharing.mps != first.config.sharing.mps) {
        return Err(
            RequestError::MpsConfigsDiffer { first: first.request.clone(), second: other.request.clone() }.into()
        );
    }
    let settings = first.config.sharing.mps.clone().unwrap_or_default();
    let mut plan = MpsPlan {
        gpus: Vec::new(),
        full_gpus: Vec::new(),
        active_thread_percentage: settings.default_active_thread_percentage,
        pinned_memory_mib: Vec::new(),
    };
    let mut names = Vec::new();
    for d in &mps {
        let dev =
            inventory.device(d.gpu()).ok_or_else(|| AllocationError::UnknownDevice { device: d.device.clone() })?;
        if plan.gpus.contains(&dev.uuid) {
            continue;
        }
        plan.gpus.push(dev.uuid.clone());
        names.push((dev.name.clone(), dev.uuid.clone()));
        if dev.kind == DeviceKind::Gpu {
            plan.full_gpus.push((dev.name.clone(), dev.uuid.clone()));
        }
    }
    let per_device = settings.default_per_device_pinned_memory_limit.unwrap_or_default();
    if let Some(key) = per_device.keys().find(|k| !names.iter().any(|(n, u)| n == *k || u == *k)) {
        return Err(RequestError::MpsLimitForOtherDevice {
            key: key.clone(),
            devices: names.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>().join(", "),
        }
        .into());
    }
    for (name, uuid) in &names {
        let quantity = per_device
            .get(name)
            .or_else(|| per_device.get(uuid))
            .or(settings.default_pinned_device_memory_limit.as_ref());
        if let Some(q) = quantity {
            // Checked when the config was decoded.
            let mib = config::pinned_limit_mib(q)
                .map_err(|message| RequestError::Config(config::ConfigError::Invalid { index: 0, message }))?;
            plan.pinned_memory_mib.push((uuid.clone(), mib));
        }
    }
    Ok(Some(plan))
}
