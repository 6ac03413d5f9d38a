//! Unit tests for attribute normalisation and device validation.

use super::*;

#[test]
fn versions_become_semver() {
    let cases = [
        ("9.0", Some("9.0.0")),
        ("12", Some("12.0.0")),
        ("550.54.15", Some("550.54.15")),
        ("535.104.05", Some("535.104.5")),
        (" 8.6 ", Some("8.6.0")),
        ("1.2.3.4", None),
        ("v1.2", None),
        ("", None),
        ("1..2", None),
    ];
    for (input, want) in cases {
        assert_eq!(normalize_version(input).as_deref(), want, "{input:?}");
    }
    assert_eq!(cuda_version_text(12040), "12.4.0");
    assert_eq!(cuda_version_text(11080), "11.8.0");
}

#[test]
fn pci_bus_ids_are_lower_case_with_short_domain() {
    assert_eq!(normalize_pci_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
    assert_eq!(normalize_pci_bus_id("0000:3B:00.0"), "0000:3b:00.0");
    assert_eq!(normalize_pci_bus_id("00010000:01:00.0"), "00010000:01:00.0");
}

#[test]
fn mig_profiles_are_named_like_nvidia() {
    let a100_80 = 81920u64 << 20;
    assert_eq!(mig_profile_name(1, 1, mig_memory_gb(a100_80, 9728)), "1g.10gb");
    assert_eq!(mig_profile_name(3, 3, mig_memory_gb(a100_80, 40192)), "3g.40gb");
    assert_eq!(mig_profile_name(7, 7, mig_memory_gb(a100_80, 80000)), "7g.80gb");
    assert_eq!(mig_profile_name(3, 1, mig_memory_gb(a100_80, 40192)), "1c.3g.40gb");
    let a100_40 = 40960u64 << 20;
    assert_eq!(mig_profile_name(1, 1, mig_memory_gb(a100_40, 4864)), "1g.5gb");
    assert_eq!(mig_profile_name(2, 2, mig_memory_gb(a100_40, 9984)), "2g.10gb");
}

#[test]
fn qualified_names() {
    for ok in ["uuid", "productName", "resource.kubernetes.io/pciBusID", "_x", "gpu.edra.dev/a1"] {
        assert!(is_qualified_name(ok), "{ok}");
    }
    let long = "a".repeat(33);
    for bad in ["", "1abc", "a-b", "Bad.Domain/x", "/x", "x/", long.as_str(), "a/b/c"] {
        assert!(!is_qualified_name(bad), "{bad}");
    }
}

fn facts() -> GpuFacts {
    GpuFacts {
        index: 1,
        minor: 3,
        uuid: "GPU-1".into(),
        product_name: "NVIDIA A100".into(),
        brand: Some("Nvidia".into()),
        architecture: Some("Ampere".into()),
        cuda_compute_capability: Some("8.0".into()),
        driver_version: Some("535.104.05".into()),
        cuda_driver_version: Some("12.2".into()),
        pci_bus_id: Some("00000000:3B:00.0".into()),
        pcie_root: Some("pci0000:3a".into()),
        numa_node: Some(1),
        memory: 80 << 30,
        multiprocessors: Some(108),
    }
}

#[test]
fn gpu_device_has_every_attribute() {
    let d = gpu_device(&facts(), Path::new("/d"));
    assert_eq!(d.name, "gpu-3");
    assert_eq!(d.device_nodes, vec![PathBuf::from("/d/nvidia3")]);
    let s = |v: &str| AttributeValue::String(v.into());
    let want = BTreeMap::from([
        ("type".to_string(), s("gpu")),
        ("uuid".into(), s("GPU-1")),
        ("productName".into(), s("NVIDIA A100")),
        ("brand".into(), s("Nvidia")),
        ("architecture".into(), s("Ampere")),
        ("index".into(), AttributeValue::Int(1)),
        ("minor".into(), AttributeValue::Int(3)),
        ("cudaComputeCapability".into(), AttributeValue::Version("8.0.0".into())),
        ("driverVersion".into(), AttributeValue::Version("535.104.5".into())),
        ("cudaDriverVersion".into(), AttributeValue::Version("12.2.0".into())),
        (PCI_BUS_ID.into(), s("0000:3b:00.0")),
        (PCIE_ROOT.into(), s("pci0000:3a")),
        ("numaNode".into(), AttributeValue::Int(1)),
    ]);
    assert_eq!(d.attributes, want);
    assert_eq!(d.capacity["memory"], 80 << 30);
    assert_eq!(d.capacity["multiprocessors"], 108);
}

#[test]
fn mig_device_replaces_identity() {
    let m = MigFacts {
        gi: 2,
        ci: 0,
        uuid: "MIG-9".into(),
        profile: "1g.10gb".into(),
        memory: 10 << 30,
        multiprocessors: 14,
    };
    let d = mig_device(&facts(), &m, Path::new("/d"), vec![PathBuf::from("/d/nvidia-caps/nvidia-cap30")]);
    assert_eq!(d.name, "gpu-3-mig-2-0");
    assert_eq!(d.uuid, "MIG-9");
    assert_eq!(d.attributes["type"], AttributeValue::String("mig".into()));
    assert_eq!(d.attributes["parentUUID"], AttributeValue::String("GPU-1".into()));
    assert_eq!(d.attributes["profile"], AttributeValue::String("1g.10gb".into()));
    assert!(!d.attributes.contains_key(PCI_BUS_ID));
    assert_eq!(d.device_nodes, vec![PathBuf::from("/d/nvidia3"), PathBuf::from("/d/nvidia-caps/nvidia-cap30")]);
    assert!(matches!(&d.kind, DeviceKind::Mig(i) if i.gi == 2 && i.parent_uuid == "GPU-1"));
}

#[test]
fn validation_enforces_limits() {
    let mut f = facts();
    f.product_name = "é".repeat(40); // 80 bytes
    let mut d = gpu_device(&f, Path::new("/d"));
    let AttributeValue::String(p) = &d.attributes["productName"] else { panic!("productName is a string") };
    assert!(p.len() <= MAX_VALUE_BYTES && p.len() == 64);
    for i in 0..40 {
        d.attributes.insert(format!("extra{i:02}"), AttributeValue::Bool(true));
    }
    d.attributes.insert("bad-name".into(), AttributeValue::Int(1));
    validate_device(&mut d);
    assert_eq!(d.attributes.len() + d.capacity.len(), MAX_ENTRIES);
    assert!(!d.attributes.contains_key("bad-name"));
    assert_eq!(d.capacity.len(), 2, "capacity is kept first");
}
