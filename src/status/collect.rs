//! The running agent's view of its node, taken from what it holds: the state store's
//! claims and MPS daemons, the inventory, the health snapshot, the MIG instances edra
//! owns, the pod watch's claims in use, the registration and publishing status.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;

use super::{
    ClaimDeviceStatus, ClaimStatus, ConditionStatus, GpuStatus, MigStatus, MpsStatus, NodeStatus, TaintStatus,
};
use crate::dynamic_mig::OwnedInstances;
use crate::health::HealthSnapshot;
use crate::inventory::{DeviceBackend, DeviceKind, Inventory};
use crate::plugin::RegistrationState;
use crate::prepare::in_use::PodsInUse;
use crate::publish::status::PublishStatus;
use crate::state::{ClaimRecord, MpsDaemonRecord, Store};

/// Where the view comes from: handles the agent holds anyway.
#[derive(Clone)]
pub struct StatusSources {
    pub node: String,
    pub driver: String,
    pub backend: Arc<dyn DeviceBackend>,
    pub store: Store,
    pub inventory: watch::Receiver<Arc<Inventory>>,
    pub health: watch::Receiver<Arc<HealthSnapshot>>,
    pub owned_mig: watch::Receiver<Arc<OwnedInstances>>,
    pub registration: watch::Receiver<RegistrationState>,
    pub publish: watch::Receiver<PublishStatus>,
    pub pods: Arc<PodsInUse>,
    /// When the agent started, Unix seconds.
    pub started_at: i64,
}

/// The view now (blocking: reads the store and asks the backend for compute modes).
pub fn collect(s: &StatusSources) -> NodeStatus {
    let inv = s.inventory.borrow().clone();
    let health = s.health.borrow().clone();
    let publish = s.publish.borrow().clone();
    let mut claims = s.store.claims().unwrap_or_default();
    claims.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let daemons = s.store.mps_daemons().unwrap_or_default();
    let owned = s.owned_mig.borrow().clone();
    let mut gpus = gpus(s, &inv, &health, &owned, &claims);
    attach_claims(&mut gpus, &claims, &daemons);
    NodeStatus {
        schema: super::SCHEMA.into(),
        version: crate::VERSION.into(),
        node: s.node.clone(),
        backend: s.backend.name().into(),
        started_at: s.started_at,
        now: crate::health::view::unix_secs(std::time::SystemTime::now()),
        kubelet_registered: s.registration.borrow().is_registered(),
        slices_in_sync: publish.in_sync,
        publish_error: publish.last_error,
        pods_known: s.pods.is_current(),
        gpus: gpus.into_values().collect(),
        claims: claims.iter().map(|c| claim(s, c, &inv)).collect(),
    }
}

/// Every GPU by name, with health, taints, compute mode and MIG instances.
fn gpus(
    s: &StatusSources,
    inv: &Inventory,
    health: &HealthSnapshot,
    owned: &OwnedInstances,
    claims: &[ClaimRecord],
) -> BTreeMap<String, GpuStatus> {
    let taints = crate::publish::taints::device_taints(inv, health, &s.driver, true);
    let whole = inv.devices.iter().filter(|d| d.kind == DeviceKind::Gpu);
    let mut out = BTreeMap::new();
    for d in whole.chain(inv.mig_gpus.iter().map(|g| &g.device)) {
        let conditions: Vec<crate::health::Condition> =
            health.gpus.get(&d.uuid).map(|h| h.conditions.values().cloned().collect()).unwrap_or_default();
        let state = health.device_state(d).0;
        let mut gpu_taints: Vec<TaintStatus> = inv
            .devices
            .iter()
            .filter(|dev| crate::health::gpu_of(dev) == d.uuid)
            .flat_map(|dev| taints.get(&dev.name).cloned().unwrap_or_default())
            .map(|t| TaintStatus {
                taint: format!("{}={}:{}", t.key, t.value.unwrap_or_default(), t.effect),
                since: t.time_added.map_or(0, |t| t.0.as_second()),
            })
            .collect();
        gpu_taints.sort_by(|a, b| a.taint.cmp(&b.taint));
        gpu_taints.dedup();
        let mig_gpu = inv.mig_gpus.iter().find(|g| g.uuid == d.uuid);
        out.insert(
            d.name.clone(),
            GpuStatus {
                name: d.name.clone(),
                uuid: d.uuid.clone(),
                product: product(d),
                memory: d.capacity.get("memory").copied().unwrap_or(0),
                health: state.as_str().into(),
                conditions: conditions
                    .into_iter()
                    .map(|c| ConditionStatus {
                        kind: c.kind.key().into(),
                        value: c.value,
                        fatal: c.fatal,
                        since: c.since,
                        message: c.message,
                    })
                    .collect(),
                taints: gpu_taints,
                compute_mode: match s.backend.compute_mode(&d.uuid) {
                    _ if crate::inventory::tegra::is_integrated(d) => "integrated".into(),
                    Ok(m) => format!("{m:?}"),
                    Err(e) => format!("unreadable: {e}"),
                },
                mig_mode: mig_gpu.is_some()
                    || inv.devices.iter().any(|x| matches!(&x.kind, DeviceKind::Mig(m) if m.parent_uuid == d.uuid)),
                mig_instances: mig_gpu.map(|g| mig_instances(g, owned, claims)).unwrap_or_default(),
                mps_daemons: Vec::new(),
                memory_shared: 0,
                shares: 0,
                held_by: Vec::new(),
            },
        );
    }
    out
}

/// The product name, and for a Jetson's integrated GPU the module's model too.
fn product(d: &crate::inventory::Device) -> String {
    let name = d.text("productName");
    match (crate::inventory::tegra::is_integrated(d), d.text("model")) {
        (true, model) if !model.is_empty() => format!("{name} (integrated, {model})"),
        (true, _) => format!("{name} (integrated)"),
        _ => name,
    }
}

fn mig_instances(gpu: &crate::inventory::MigGpu, owned: &OwnedInstances, claims: &[ClaimRecord]) -> Vec<MigStatus> {
    gpu.instances
        .iter()
        .map(|i| {
            let ours = owned.contains(&(gpu.uuid.clone(), i.placement));
            let claim = claims
                .iter()
                .find(|c| c.migs().any(|(_, m)| m.gpu == gpu.uuid && m.placement == i.placement))
                .map(|c| format!("{}/{}", c.namespace, c.name));
            MigStatus {
                gi: i.gi,
                ci: i.ci,
                profile: gpu
                    .capability
                    .profile(i.profile_id)
                    .map_or_else(|| i.profile_id.to_string(), |p| p.name.clone()),
                placement: format!("{}+{}", i.placement.start, i.placement.size),
                uuid: i.uuid.clone(),
                owner: if ours { "edra" } else { "foreign" }.into(),
                claim: claim.filter(|_| ours),
            }
        })
        .collect()
}

/// Shares, whole holders and MPS daemons onto their GPUs.
fn attach_claims(gpus: &mut BTreeMap<String, GpuStatus>, claims: &[ClaimRecord], daemons: &[MpsDaemonRecord]) {
    for c in claims {
        let who = format!("{}/{}", c.namespace, c.name);
        for (_, share) in c.shares() {
            if let Some(g) = gpus.get_mut(&share.gpu) {
                g.memory_shared = g.memory_shared.saturating_add(share.memory);
                g.shares += 1;
            }
        }
        for device in c.held_devices() {
            if let Some(g) = gpus.get_mut(device) {
                g.held_by.push(who.clone());
            }
        }
    }
    let name_of = |uid: &str| {
        claims.iter().find(|c| c.uid == uid).map_or_else(|| uid.to_string(), |c| format!("{}/{}", c.namespace, c.name))
    };
    for d in daemons {
        let claim = if d.claim.starts_with("shared:") { "shared".to_string() } else { name_of(&d.claim) };
        let status = MpsStatus {
            claim,
            pid: d.daemon.map(|(pid, _)| pid),
            uptime: d.daemon.and_then(|(pid, start)| uptime(pid, start)),
            restarts: d.restarts,
        };
        for g in gpus.values_mut().filter(|g| d.gpus.contains(&g.uuid)) {
            g.mps_daemons.push(status.clone());
        }
    }
}

/// Seconds since process `pid` started, if it still runs with start time `start` (clock
/// ticks after boot).
fn uptime(pid: u32, start: u64) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let started: u64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    if started != start {
        return None;
    }
    let booted: f64 = std::fs::read_to_string("/proc/uptime").ok()?.split_whitespace().next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok().filter(|h| *h > 0)?;
    Some((booted as u64).saturating_sub(started / hz))
}

fn claim(s: &StatusSources, c: &ClaimRecord, inv: &Inventory) -> ClaimStatus {
    let gpu_of = |device: &str| {
        inv.device(device).map(|d| crate::health::gpu_of(d).to_string()).and_then(|uuid| {
            inv.devices
                .iter()
                .chain(inv.mig_gpus.iter().map(|g| &g.device))
                .find(|d| d.uuid == uuid && d.kind == DeviceKind::Gpu)
                .map(|d| d.name.clone())
        })
    };
    ClaimStatus {
        namespace: c.namespace.clone(),
        name: c.name.clone(),
        uid: c.uid.clone(),
        phase: format!("{:?}", c.phase),
        pods: s.pods.pods_of(&c.namespace, &c.name),
        devices: c
            .devices
            .iter()
            .map(|d| ClaimDeviceStatus {
                device: d.device.clone(),
                gpu: d.share.as_ref().map(|sh| sh.gpu.clone()).or_else(|| gpu_of(&d.device)).unwrap_or_default(),
                request: d.request.clone(),
                share_id: d.share_id.clone(),
                memory: d.share.as_ref().map(|sh| sh.memory),
                strategy: d.config.sharing.strategy.to_string(),
                admin_access: d.admin_access,
            })
            .collect(),
        prepared_at: i64::try_from(c.created_at).unwrap_or(i64::MAX),
    }
}
