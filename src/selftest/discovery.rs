//! The self-test's first step: what the backend reports per GPU, and the ResourceSlices
//! edra would publish from it, checked against the limits the API server enforces.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::resource::v1::ResourceSlice;
use serde::Serialize;

use super::{Check, Context, Status};
use crate::inventory::{Device, DeviceBackend, DeviceKind, Inventory};
use crate::publish::desired::{NodeIdentity, desired_slices, quantity};

/// What discovery found about one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GpuFacts {
    /// Device name (`gpu-0`).
    pub name: String,
    pub uuid: String,
    pub product: String,
    /// Memory in bytes.
    pub memory: u64,
    pub architecture: String,
    pub compute_capability: String,
    pub driver_version: String,
    pub cuda_driver_version: String,
    /// PCI bus ID, e.g. `0000:00:06.0`.
    pub pci_bus_id: String,
    /// `Default`, `ExclusiveProcess`, `Prohibited`, or why it could not be read.
    pub compute_mode: String,
    /// Persistence mode, when the backend can read it.
    pub persistence: Option<bool>,
    /// MIG mode is on, when the backend can read it.
    pub mig_enabled: Option<bool>,
    /// The GPU can be put in MIG mode, when the backend can read it.
    pub mig_capable: Option<bool>,
    /// Processes using the GPU now (pid and GPU memory in bytes), when readable.
    pub processes: Option<Vec<(u32, u64)>>,
    /// The devices edra publishes for this GPU.
    pub published: Vec<String>,
}

/// Discovers with `backend` on a blocking thread; a failure is the `backend` check.
pub async fn discover(backend: &Arc<dyn DeviceBackend>) -> Result<Inventory, Check> {
    let started = Instant::now();
    let b = backend.clone();
    let found = tokio::task::spawn_blocking(move || b.discover()).await;
    let fix = "check that the NVIDIA kernel driver is loaded (nvidia-smi works) and that nvml.library / \
               paths.driver_root match it";
    match found {
        Ok(Ok(inv)) if inv.devices.is_empty() => {
            Err(Check::fail("backend", None, started, format!("{} found no GPU", backend.name()), fix))
        }
        Ok(Ok(inv)) => Ok(inv),
        Ok(Err(e)) => Err(Check::fail("backend", None, started, crate::util::error_chain(&e), fix)),
        Err(e) => Err(Check::fail("backend", None, started, format!("discovery panicked: {e}"), fix)),
    }
}

/// `driver 580.159.04, CUDA 13.0.0`.
pub fn versions(inv: &Inventory) -> String {
    format!(
        "driver {}, CUDA {}",
        inv.driver_version.as_deref().unwrap_or("unknown"),
        inv.cuda_driver_version.as_deref().unwrap_or("unknown")
    )
}

/// The facts of every GPU of `inv` (MIG devices and slots are listed as published devices
/// of their parent).
pub fn facts(ctx: &Context, backend: &Arc<dyn DeviceBackend>, inv: &Inventory) -> Vec<GpuFacts> {
    let published = published(&ctx.config, inv);
    let nvml = (backend.name() == "nvml").then(|| crate::inventory::nvml::NvmlBackend::load(&ctx.config).ok());
    let mut out = Vec::new();
    for (name, _) in super::gpus(inv) {
        let mig = inv.mig_gpus.iter().map(|g| &g.device);
        let Some(d) = inv.devices.iter().chain(mig).find(|d| d.name == name) else { continue };
        let mut f = GpuFacts {
            name: d.name.clone(),
            uuid: d.uuid.clone(),
            product: d.text("productName"),
            memory: d.capacity.get("memory").copied().unwrap_or(0),
            architecture: d.text("architecture"),
            compute_capability: d.text("cudaComputeCapability"),
            driver_version: inv.driver_version.clone().unwrap_or_default(),
            cuda_driver_version: inv.cuda_driver_version.clone().unwrap_or_default(),
            pci_bus_id: d.text(crate::inventory::attributes::PCI_BUS_ID),
            compute_mode: match backend.compute_mode(&d.uuid) {
                Ok(m) => format!("{m:?}"),
                Err(e) => format!("unreadable: {}", crate::util::error_chain(&e)),
            },
            published: published_for(&published, d),
            ..GpuFacts::default()
        };
        match &nvml {
            Some(Some(n)) => nvml_facts(n, &mut f),
            Some(None) => {}
            // An integrated GPU has no PCI slot, persistence mode or MIG to report.
            None if backend.name() == "tegra" => f.mig_capable = Some(false),
            None => mock_facts(ctx, inv, &mut f),
        }
        out.push(f);
    }
    out
}

fn published_for(published: &Inventory, gpu: &Device) -> Vec<String> {
    let parent = |d: &Device| match &d.kind {
        DeviceKind::Gpu => d.uuid.clone(),
        DeviceKind::Mig(m) => m.parent_uuid.clone(),
        DeviceKind::MigSlot(s) => s.parent_uuid.clone(),
    };
    published.devices.iter().filter(|d| parent(d) == gpu.uuid).map(|d| d.name.clone()).collect()
}

fn nvml_facts(nvml: &crate::inventory::nvml::NvmlBackend, f: &mut GpuFacts) {
    let Ok(dev) = nvml.nvml().device_by_uuid(f.uuid.as_str()) else { return };
    f.persistence = dev.is_in_persistent_mode().ok();
    match dev.mig_mode() {
        Ok(m) => {
            f.mig_enabled = Some(m.current == 1);
            f.mig_capable = Some(true);
        }
        Err(nvml_wrapper::error::NvmlError::NotSupported) => {
            f.mig_enabled = Some(false);
            f.mig_capable = Some(false);
        }
        Err(_) => {}
    }
    f.processes = dev.running_compute_processes().ok().map(|ps| {
        ps.iter()
            .map(|p| {
                let used = match p.used_gpu_memory {
                    nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => b,
                    nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => 0,
                };
                (p.pid, used)
            })
            .collect()
    });
}

fn mock_facts(ctx: &Context, inv: &Inventory, f: &mut GpuFacts) {
    let in_mig = inv.mig_gpus.iter().any(|g| g.uuid == f.uuid);
    f.mig_enabled = Some(in_mig || ctx.config.mock.mig_mode);
    f.mig_capable = Some(in_mig || ctx.config.mock.mig_mode);
    f.persistence = Some(true);
    f.processes = Some(Vec::new());
}

/// One `discovery` check per GPU: what NVML (or the mock) reported.
pub fn check_facts(facts: &[GpuFacts]) -> Vec<Check> {
    facts
        .iter()
        .map(|f| {
            let started = Instant::now();
            let yes_no = |b: Option<bool>| b.map_or("unknown", |b| if b { "on" } else { "off" });
            let pci = if f.pci_bus_id.is_empty() { "no PCI slot".to_string() } else { format!("PCI {}", f.pci_bus_id) };
            let mig = match (f.mig_enabled, f.mig_capable) {
                (None, Some(false)) => "MIG not capable".to_string(),
                (enabled, capable) => {
                    format!("MIG {}{}", yes_no(enabled), if capable == Some(false) { " (not capable)" } else { "" })
                }
            };
            let detail = format!(
                "{} {}, {} memory, {} (compute capability {}), {pci}, compute mode {}, persistence {}, {mig}; \
                 publishes {}",
                f.product,
                f.uuid,
                quantity(f.memory),
                f.architecture,
                f.compute_capability,
                f.compute_mode,
                yes_no(f.persistence),
                f.published.join(", ")
            );
            if f.uuid.is_empty() || f.published.is_empty() {
                Check::fail(
                    "discovery",
                    Some(&f.name),
                    started,
                    detail,
                    "the GPU has no UUID or nothing is published for it: check sharing.gpus and mig.gpus",
                )
            } else {
                Check::pass("discovery", Some(&f.name), started, detail)
            }
        })
        .collect()
}

/// `inv` as edra publishes it to a server with every feature: carved for dynamic MIG,
/// then offered whole, as shares or as replicas.
pub fn published(config: &crate::config::Config, inv: &Inventory) -> Inventory {
    let carved = config.mig.published(inv, &Default::default(), true).inventory;
    config.sharing.published(&carved, true)
}

/// The `slices` check: the ResourceSlices edra would publish, within the API's limits.
pub fn check_slices(config: &crate::config::Config, inv: &Inventory) -> Check {
    let started = Instant::now();
    let node = NodeIdentity { name: config.node_name.clone(), uid: None };
    let published = published(config, inv);
    let slices = desired_slices(&published, &node, &config.driver_name, 1);
    let problems: Vec<String> = slices.iter().flat_map(slice_problems).collect();
    let devices: usize = slices.iter().map(|s| s.spec.devices.as_ref().map_or(0, Vec::len)).sum();
    if problems.is_empty() {
        Check::pass(
            "slices",
            None,
            started,
            format!("{} ResourceSlice(s) with {devices} device(s), within the API's limits", slices.len()),
        )
    } else {
        Check::new(
            "slices",
            None,
            Status::Fail,
            started,
            problems.join("; "),
            "the API server would refuse these slices: report this with `edra inventory -o json`",
        )
    }
}

fn dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// What the API server's validation (resource.k8s.io v1, Kubernetes 1.36) would refuse.
pub fn slice_problems(slice: &ResourceSlice) -> Vec<String> {
    let mut out = Vec::new();
    let devices = slice.spec.devices.as_deref().unwrap_or_default();
    let constrained = devices.iter().any(|d| d.taints.is_some() || d.consumes_counters.is_some());
    let limit = if constrained { 64 } else { 128 };
    if devices.len() > limit {
        out.push(format!("{} devices in one slice (at most {limit})", devices.len()));
    }
    let mut names = std::collections::BTreeSet::new();
    for d in devices {
        if !dns_label(&d.name) {
            out.push(format!("device name {:?} is not a DNS label", d.name));
        }
        if !names.insert(d.name.as_str()) {
            out.push(format!("device name {} twice", d.name));
        }
        let entries = d.attributes.as_ref().map_or(0, |a| a.len()) + d.capacity.as_ref().map_or(0, |c| c.len());
        if entries > 32 {
            out.push(format!("{}: {entries} attributes and capacities (at most 32)", d.name));
        }
        for (k, v) in d.attributes.iter().flatten() {
            let long = [v.string.as_ref(), v.version.as_ref()].into_iter().flatten().any(|s| s.len() > 64);
            if long {
                out.push(format!("{}: attribute {k} is longer than 64 bytes", d.name));
            }
            if !crate::inventory::attributes::is_qualified_name(k) {
                out.push(format!("{}: attribute name {k:?} is not a qualified name", d.name));
            }
        }
        if d.taints.as_ref().is_some_and(|t| t.len() > 16) {
            out.push(format!("{}: more than 16 taints", d.name));
        }
    }
    if slice.spec.shared_counters.as_ref().is_some_and(|c| c.len() > 8) {
        out.push("more than 8 counter sets".into());
    }
    out
}
