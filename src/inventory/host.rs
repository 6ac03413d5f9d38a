//! Host facts NVML does not give: where the NVML library is, the PCIe root, NUMA node and
//! DRM device nodes of a GPU (sysfs, `/dev/dri`), and the MIG capability device minors
//! (procfs). Every root comes from
//! configuration so tests point them at temp dirs.

use std::path::{Component, Path, PathBuf};

/// Library folders searched under a driver root other than `/`, in order.
pub const DRIVER_ROOT_LIB_DIRS: [&str; 5] =
    ["usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "lib64", "usr/lib"];

/// The files or names to try for `nvml.library`, in order. A bare name is handed to the
/// dynamic loader, after any copies found in the driver root's library folders (when the
/// driver root is not `/`); a path is taken relative to the driver root.
pub fn library_candidates(library: &Path, driver_root: &Path) -> Vec<PathBuf> {
    let bare = library.components().count() == 1 && matches!(library.components().next(), Some(Component::Normal(_)));
    if !bare {
        let rel = library.strip_prefix("/").unwrap_or(library);
        return vec![driver_root.join(rel)];
    }
    let mut out = Vec::new();
    if driver_root != Path::new("/") {
        out.extend(DRIVER_ROOT_LIB_DIRS.iter().map(|d| driver_root.join(d).join(library)).filter(|p| p.exists()));
    }
    out.push(library.to_path_buf());
    out
}

/// The PCIe root complex of a PCI device (`pci0000:00`), from the target of the
/// `<sys>/bus/pci/devices/<bus id>` link; `None` when the link or the component is absent.
pub fn pcie_root(sys_root: &Path, bus_id: &str) -> Option<String> {
    let target = std::fs::read_link(sys_root.join("bus/pci/devices").join(bus_id)).ok()?;
    target.components().find_map(|c| match c {
        Component::Normal(s) => s.to_str().filter(|s| is_pci_root(s)).map(str::to_string),
        _ => None,
    })
}

/// `pci<domain>:<bus>`: `pci` then hex digits, one colon, hex digits.
fn is_pci_root(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("pci") else { return false };
    let Some((domain, bus)) = rest.split_once(':') else { return false };
    let hex = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_hexdigit());
    hex(domain) && hex(bus)
}

/// The NUMA node of a PCI device from `<sys>/bus/pci/devices/<bus id>/numa_node`; `None`
/// when unknown (absent, or -1 on machines without NUMA).
pub fn numa_node(sys_root: &Path, bus_id: &str) -> Option<i64> {
    let text = std::fs::read_to_string(sys_root.join("bus/pci/devices").join(bus_id).join("numa_node")).ok()?;
    text.trim().parse::<i64>().ok().filter(|n| *n >= 0)
}

/// The DRM nodes of a PCI device, cards then render nodes: `<dev>/dri/cardN` and
/// `<dev>/dri/renderDN`, named by `<sys>/bus/pci/devices/<bus id>/drm/`, or when sysfs does
/// not list them by the `<dev>/dri/by-path/pci-<bus id>-{card,render}` links. Only nodes that
/// exist under `dev_root` are returned (a GPU without display engine may have none).
pub fn drm_nodes(sys_root: &Path, dev_root: &Path, bus_id: &str) -> Vec<PathBuf> {
    if bus_id.is_empty() || bus_id.contains('/') || bus_id.starts_with('.') {
        return Vec::new();
    }
    let mut names: Vec<String> = std::fs::read_dir(sys_root.join("bus/pci/devices").join(bus_id).join("drm"))
        .map(|rd| rd.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
        .unwrap_or_default();
    if !names.iter().any(|n| drm_node_order(n).is_some()) {
        let by_path = dev_root.join("dri/by-path");
        names = ["card", "render"]
            .iter()
            .filter_map(|kind| std::fs::read_link(by_path.join(format!("pci-{bus_id}-{kind}"))).ok())
            .filter_map(|target| target.file_name()?.to_str().map(str::to_string))
            .collect();
    }
    let mut nodes: Vec<(u8, u32, String)> =
        names.into_iter().filter_map(|n| drm_node_order(&n).map(|(kind, num)| (kind, num, n))).collect();
    nodes.sort();
    nodes.dedup();
    nodes.into_iter().map(|(_, _, n)| dev_root.join("dri").join(n)).filter(|p| p.exists()).collect()
}

/// `cardN` → (0, N), `renderDN` → (1, N); other names (`controlD64`, `card0-DP-1`) → None.
fn drm_node_order(name: &str) -> Option<(u8, u32)> {
    let (kind, num) = match name.strip_prefix("renderD") {
        Some(n) => (1, n),
        None => (0, name.strip_prefix("card")?),
    };
    (!num.is_empty() && num.bytes().all(|b| b.is_ascii_digit())).then_some(())?;
    Some((kind, num.parse().ok()?))
}

/// The `nvidia-cap<N>` device minor for a MIG GPU instance (`ci = None`) or compute
/// instance, from `<proc>/driver/nvidia/capabilities/gpu<minor>/mig/gi<gi>[/ci<ci>]/access`.
pub fn mig_cap_minor(proc_root: &Path, gpu_minor: u32, gi: u32, ci: Option<u32>) -> Option<u32> {
    let mut p = proc_root.join(format!("driver/nvidia/capabilities/gpu{gpu_minor}/mig/gi{gi}"));
    if let Some(ci) = ci {
        p.push(format!("ci{ci}"));
    }
    p.push("access");
    let text = std::fs::read_to_string(&p).ok()?;
    text.lines().find_map(|l| l.strip_prefix("DeviceFileMinor:").and_then(|n| n.trim().parse().ok()))
}

#[cfg(test)]
mod tests;
