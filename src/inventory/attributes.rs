//! What edra publishes about a device, shared by every backend.
//!
//! Backends gather raw facts ([`GpuFacts`], [`MigFacts`]); this module turns them into
//! [`Device`]s with one attribute vocabulary, normalises values to what the API server
//! accepts (semantic versions without leading zeros, lower-case PCI addresses), derives
//! NVIDIA's MIG profile names, and enforces the ResourceSlice limits on a device
//! (strings ≤64 bytes, qualified names, ≤32 attributes and capacities).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{AttributeValue, Device, DeviceKind, MigInfo};

/// Longest `string` or `version` attribute value, in bytes.
pub const MAX_VALUE_BYTES: usize = 64;
/// Most attributes plus capacities one device may have.
pub const MAX_ENTRIES: usize = 32;
/// The standard PCI bus ID attribute.
pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// The standard PCIe root complex attribute.
pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";

/// Facts about one whole GPU, however they were found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuFacts {
    /// Enumeration index.
    pub index: u32,
    /// Minor number of `/dev/nvidia<minor>`.
    pub minor: u32,
    /// `GPU-...` UUID.
    pub uuid: String,
    /// Product name, e.g. `NVIDIA A100-SXM4-80GB`.
    pub product_name: String,
    /// Brand, e.g. `Nvidia` or `Tesla`.
    pub brand: Option<String>,
    /// Architecture, e.g. `Ampere`.
    pub architecture: Option<String>,
    /// CUDA compute capability as reported, e.g. `8.0`.
    pub cuda_compute_capability: Option<String>,
    /// Kernel driver version as reported, e.g. `535.104.05`.
    pub driver_version: Option<String>,
    /// CUDA driver version, e.g. `12.4`.
    pub cuda_driver_version: Option<String>,
    /// PCI bus ID, any case, 4- or 8-digit domain.
    pub pci_bus_id: Option<String>,
    /// PCIe root complex, e.g. `pci0000:00`.
    pub pcie_root: Option<String>,
    /// NUMA node, when known.
    pub numa_node: Option<i64>,
    /// Total memory in bytes.
    pub memory: u64,
    /// Streaming multiprocessors, when known.
    pub multiprocessors: Option<u32>,
}

/// Facts about one MIG device.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MigFacts {
    /// GPU instance ID.
    pub gi: u32,
    /// Compute instance ID.
    pub ci: u32,
    /// `MIG-...` UUID.
    pub uuid: String,
    /// Profile name, e.g. `1g.10gb`.
    pub profile: String,
    /// Memory in bytes.
    pub memory: u64,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
}

/// The device for a whole GPU; its device node is `<dev_root>/nvidia<minor>`.
pub fn gpu_device(g: &GpuFacts, dev_root: &Path) -> Device {
    let mut attributes = common_attributes(g);
    attributes.insert("type".into(), AttributeValue::String("gpu".into()));
    attributes.insert("uuid".into(), AttributeValue::String(g.uuid.clone()));
    if let Some(bus) = &g.pci_bus_id {
        attributes.insert(PCI_BUS_ID.into(), AttributeValue::String(normalize_pci_bus_id(bus)));
    }
    let mut dev = Device {
        name: format!("gpu-{}", g.minor),
        kind: DeviceKind::Gpu,
        uuid: g.uuid.clone(),
        index: g.index,
        minor: g.minor,
        attributes,
        capacity: capacity(g.memory, g.multiprocessors),
        device_nodes: vec![gpu_node(dev_root, g.minor)],
        shared: None,
        consumes: None,
    };
    validate_device(&mut dev);
    dev
}

/// The device for a MIG instance of `parent`; `cap_nodes` are its GI and CI capability
/// device nodes (added after the parent's `/dev/nvidia<minor>`).
pub fn mig_device(parent: &GpuFacts, m: &MigFacts, dev_root: &Path, cap_nodes: Vec<PathBuf>) -> Device {
    let mut attributes = common_attributes(parent);
    attributes.insert("type".into(), AttributeValue::String("mig".into()));
    attributes.insert("uuid".into(), AttributeValue::String(m.uuid.clone()));
    attributes.insert("parentUUID".into(), AttributeValue::String(parent.uuid.clone()));
    attributes.insert("profile".into(), AttributeValue::String(m.profile.clone()));
    let mut device_nodes = vec![gpu_node(dev_root, parent.minor)];
    device_nodes.extend(cap_nodes);
    let mut dev = Device {
        name: format!("gpu-{}-mig-{}-{}", parent.minor, m.gi, m.ci),
        kind: DeviceKind::Mig(MigInfo {
            parent_uuid: parent.uuid.clone(),
            parent_minor: parent.minor,
            parent_index: parent.index,
            gi: m.gi,
            ci: m.ci,
            profile: m.profile.clone(),
        }),
        uuid: m.uuid.clone(),
        index: parent.index,
        minor: parent.minor,
        attributes,
        capacity: capacity(m.memory, Some(m.multiprocessors)),
        device_nodes,
        shared: None,
        consumes: None,
    };
    validate_device(&mut dev);
    dev
}

fn gpu_node(dev_root: &Path, minor: u32) -> PathBuf {
    dev_root.join(format!("nvidia{minor}"))
}

fn capacity(memory: u64, multiprocessors: Option<u32>) -> BTreeMap<String, u64> {
    let mut c = BTreeMap::from([("memory".to_string(), memory)]);
    if let Some(n) = multiprocessors {
        c.insert("multiprocessors".to_string(), u64::from(n));
    }
    c
}

/// Attributes a GPU and its MIG devices share.
fn common_attributes(g: &GpuFacts) -> BTreeMap<String, AttributeValue> {
    let mut a = BTreeMap::new();
    a.insert("productName".into(), AttributeValue::String(g.product_name.clone()));
    a.insert("index".into(), AttributeValue::Int(i64::from(g.index)));
    a.insert("minor".into(), AttributeValue::Int(i64::from(g.minor)));
    if let Some(b) = &g.brand {
        a.insert("brand".into(), AttributeValue::String(b.clone()));
    }
    if let Some(arch) = &g.architecture {
        a.insert("architecture".into(), AttributeValue::String(arch.clone()));
    }
    let versions = [
        ("cudaComputeCapability", &g.cuda_compute_capability),
        ("driverVersion", &g.driver_version),
        ("cudaDriverVersion", &g.cuda_driver_version),
    ];
    for (key, value) in versions {
        let Some(raw) = value else { continue };
        match normalize_version(raw) {
            Some(v) => {
                a.insert(key.into(), AttributeValue::Version(v));
            }
            None => tracing::warn!(attribute = key, value = %raw, gpu = g.index, "not a version; attribute skipped"),
        }
    }
    if let Some(root) = &g.pcie_root {
        a.insert(PCIE_ROOT.into(), AttributeValue::String(root.clone()));
    }
    if let Some(n) = g.numa_node {
        a.insert("numaNode".into(), AttributeValue::Int(n));
    }
    a
}

/// A version as semver 2.0.0: `9.0` → `9.0.0`, `535.104.05` → `535.104.5`; `None` when the
/// text is not one to three dot-separated numbers.
pub fn normalize_version(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.trim().split('.').collect();
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    let mut nums = Vec::with_capacity(3);
    for p in &parts {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        nums.push(p.parse::<u64>().ok()?);
    }
    nums.resize(3, 0);
    Some(format!("{}.{}.{}", nums[0], nums[1], nums[2]))
}

/// NVML's integer CUDA driver version (`12040`) as a semantic version (`12.4.0`).
pub fn cuda_version_text(v: i32) -> String {
    format!("{}.{}.0", v / 1000, (v % 1000) / 10)
}

/// A PCI bus ID as sysfs spells it: lower case, 4-digit domain (`0000:3b:00.0`).
pub fn normalize_pci_bus_id(s: &str) -> String {
    let lower = s.trim().to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 && domain[..domain.len() - 4].bytes().all(|b| b == b'0') => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => lower,
    }
}

/// NVIDIA's name for a MIG profile: `<g>g.<mem>gb`, or `<c>c.<g>g.<mem>gb` when the
/// compute instance uses fewer slices than its GPU instance.
pub fn mig_profile_name(gi_slices: u32, ci_slices: u32, memory_gb: u64) -> String {
    if ci_slices == gi_slices || ci_slices == 0 {
        format!("{gi_slices}g.{memory_gb}gb")
    } else {
        format!("{ci_slices}c.{gi_slices}g.{memory_gb}gb")
    }
}

/// The `<mem>gb` in a MIG profile name, computed as NVIDIA's tools do: the MIG device's
/// share of the parent's memory rounded up to eighths, times the parent's memory in GiB
/// (rounded up), rounded to the nearest integer.
pub fn mig_memory_gb(parent_total_bytes: u64, mig_memory_mib: u64) -> u64 {
    const GIB: u64 = 1 << 30;
    if parent_total_bytes == 0 {
        return mig_memory_mib.div_ceil(1024);
    }
    let fraction = (mig_memory_mib as f64 * (1u64 << 20) as f64) / parent_total_bytes as f64;
    let fraction = (fraction * 8.0).ceil() / 8.0;
    let total_gb = parent_total_bytes.div_ceil(GIB) as f64;
    (fraction * total_gb).round() as u64
}

/// A UUID-shaped hex text (8-4-4-4-12) derived from `seed` with FNV-1a, for devices
/// whose hardware gives no UUID (the mock's, a Jetson's integrated GPU without NVML).
pub fn uuid_text(seed: &str) -> String {
    // FNV-1a, then the splitmix64 finaliser so near-identical seeds give unrelated bits.
    let hash = |basis: u64| {
        let mut z = seed.bytes().fold(basis, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let v = (u128::from(hash(0xcbf2_9ce4_8422_2325)) << 64) | u128::from(hash(0x6c62_272e_07bb_0142));
    let h = format!("{v:032x}");
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// Whether `s` is a QualifiedName: a C identifier of at most 32 characters, optionally
/// prefixed by `<domain>/` where the domain is a DNS subdomain of at most 63 characters.
pub fn is_qualified_name(s: &str) -> bool {
    let (domain, id) = match s.split_once('/') {
        Some((d, id)) => (Some(d), id),
        None => (None, s),
    };
    let c_ident = !id.is_empty()
        && id.len() <= 32
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !id.as_bytes()[0].is_ascii_digit();
    c_ident && domain.is_none_or(|d| d.len() <= 63 && crate::config::validate_dns_subdomain(d).is_ok())
}

/// Makes `dev` publishable: skips entries with invalid names, truncates over-long string
/// values (at a character boundary), skips over-long versions, and drops entries beyond
/// [`MAX_ENTRIES`] (capacities are kept first). Each change is logged as a warning.
pub fn validate_device(dev: &mut Device) {
    let device = dev.name.clone();
    dev.attributes.retain(|k, _| keep_name(&device, k));
    dev.capacity.retain(|k, _| keep_name(&device, k));
    dev.attributes.retain(|k, v| match v {
        AttributeValue::String(s) if s.len() > MAX_VALUE_BYTES => {
            let mut end = MAX_VALUE_BYTES;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            tracing::warn!(%device, attribute = %k, "string attribute longer than 64 bytes; truncated");
            s.truncate(end);
            true
        }
        AttributeValue::Version(v) if v.len() > MAX_VALUE_BYTES => {
            tracing::warn!(%device, attribute = %k, "version attribute longer than 64 bytes; skipped");
            false
        }
        _ => true,
    });
    let room = MAX_ENTRIES.saturating_sub(dev.capacity.len());
    if dev.attributes.len() > room {
        let dropped: Vec<String> = dev.attributes.keys().skip(room).cloned().collect();
        tracing::warn!(%device, ?dropped, "more than 32 attributes and capacities; extra attributes skipped");
        for k in dropped {
            dev.attributes.remove(&k);
        }
    }
}

fn keep_name(device: &str, key: &str) -> bool {
    let ok = is_qualified_name(key);
    if !ok {
        tracing::warn!(%device, name = %key, "not a valid qualified name; skipped");
    }
    ok
}

#[cfg(test)]
mod tests;
