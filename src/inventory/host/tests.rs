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
    assert_eq!(drm_nodes(&sys, &dev, "0000:3b:00.0"), [dri.join("card1"), dri.join("renderD128")], "card9 is absent");
    assert!(drm_nodes(&sys, &dev, "0000:99:00.0").is_empty(), "no sysfs entry, no links");
    std::os::unix::fs::symlink("../renderD129", dri.join("by-path/pci-0000:5e:00.0-render")).expect("symlink");
    std::os::unix::fs::symlink("../card2", dri.join("by-path/pci-0000:5e:00.0-card")).expect("symlink");
    assert_eq!(drm_nodes(&sys, &dev, "0000:5e:00.0"), [dri.join("card2"), dri.join("renderD129")]);
    assert!(drm_nodes(&sys, &dev, "../5e").is_empty());
    assert_eq!(drm_node_order("card10"), Some((0, 10)));
    assert_eq!(drm_node_order("renderD"), None);
    assert_eq!(drm_node_order("cardx"), None);
}
