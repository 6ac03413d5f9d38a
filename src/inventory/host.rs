//! Host facts NVML does not give: where the NVML library is, the PCIe root and NUMA node of
//! a GPU (sysfs), and the MIG capability device minors (procfs). Every root comes from
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
}
