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
mod tests {
    use super::*;

    #[test]
    fn library_search_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let lib = dir.path().join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&lib).expect("mkdir");
        std::fs::write(lib.join("libnvidia-ml.so.1"), b"").expect("write");
        let name = Path::new("libnvidia-ml.so.1");
        assert_eq!(library_candidates(name, dir.path()), vec![lib.join("libnvidia-ml.so.1"), name.to_path_buf()]);
        assert_eq!(library_candidates(name, Path::new("/")), vec![name.to_path_buf()]);
        assert_eq!(
            library_candidates(Path::new("/opt/nv/libnvidia-ml.so"), Path::new("/run/nvidia/driver")),
            vec![PathBuf::from("/run/nvidia/driver/opt/nv/libnvidia-ml.so")]
        );
        assert_eq!(
            library_candidates(Path::new("/usr/lib/libnvidia-ml.so.1"), Path::new("/")),
            vec![PathBuf::from("/usr/lib/libnvidia-ml.so.1")]
        );
    }

    #[test]
    fn sysfs_and_procfs_facts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sys = dir.path().join("sys");
        let real = sys.join("devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0");
        std::fs::create_dir_all(&real).expect("mkdir");
        std::fs::write(real.join("numa_node"), "1\n").expect("write");
        std::fs::create_dir_all(sys.join("bus/pci/devices")).expect("mkdir");
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0",
            sys.join("bus/pci/devices/0000:3b:00.0"),
        )
        .expect("symlink");
        assert_eq!(pcie_root(&sys, "0000:3b:00.0").as_deref(), Some("pci0000:3a"));
        assert_eq!(numa_node(&sys, "0000:3b:00.0"), Some(1));
        assert_eq!(pcie_root(&sys, "0000:99:00.0"), None);
        assert_eq!(numa_node(&sys, "0000:99:00.0"), None);

        let proc = dir.path().join("proc");
        let gi = proc.join("driver/nvidia/capabilities/gpu0/mig/gi7");
        std::fs::create_dir_all(gi.join("ci0")).expect("mkdir");
        std::fs::write(gi.join("access"), "DeviceFileMinor: 66\nDeviceFileMode: 292\n").expect("write");
        std::fs::write(gi.join("ci0/access"), "DeviceFileMinor: 67\n").expect("write");
        assert_eq!(mig_cap_minor(&proc, 0, 7, None), Some(66));
        assert_eq!(mig_cap_minor(&proc, 0, 7, Some(0)), Some(67));
        assert_eq!(mig_cap_minor(&proc, 0, 8, None), None);
    }

    #[test]
    fn drm_nodes_from_sysfs_then_by_path_links_only_existing_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sys, dev) = (dir.path().join("sys"), dir.path().join("dev"));
        let dri = dev.join("dri");
        std::fs::create_dir_all(dri.join("by-path")).expect("mkdir");
        for n in ["card1", "renderD128", "card2", "renderD129"] {
            std::fs::write(dri.join(n), b"").expect("write");
        }
        let drm = sys.join("bus/pci/devices/0000:3b:00.0/drm");
        for n in ["renderD128", "card1", "card1-DP-1", "controlD64", "card9"] {
            std::fs::create_dir_all(drm.join(n)).expect("mkdir");
        }
        assert_eq!(
            drm_nodes(&sys, &dev, "0000:3b:00.0"),
            [dri.join("card1"), dri.join("renderD128")],
            "card9 is absent"
        );
        assert!(drm_nodes(&sys, &dev, "0000:99:00.0").is_empty(), "no sysfs entry, no links");
        std::os::unix::fs::symlink("../renderD129", dri.join("by-path/pci-0000:5e:00.0-render")).expect("symlink");
        std::os::unix::fs::symlink("../card2", dri.join("by-path/pci-0000:5e:00.0-card")).expect("symlink");
        assert_eq!(drm_nodes(&sys, &dev, "0000:5e:00.0"), [dri.join("card2"), dri.join("renderD129")]);
        assert!(drm_nodes(&sys, &dev, "../5e").is_empty());
        assert_eq!(drm_node_order("card10"), Some((0, 10)));
        assert_eq!(drm_node_order("renderD"), None);
        assert_eq!(drm_node_order("cardx"), None);
    }
}
