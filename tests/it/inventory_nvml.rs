//! The NVML backend against the stand-in library, through the real nvml-wrapper: GPU
//! enumeration, static MIG, failing calls, and libraries that are missing or not NVML.

use std::path::{Path, PathBuf};

use edra::config::{BackendKind, Config, LoadContext, Overrides};
use edra::inventory::{AttributeValue, DeviceKind, InventoryError, backend_from_config};

use crate::support::nvml::{StubNvml, a100, empty_library};

/// Defaults for node `n1`, NVML from `library`, host roots under `roots`.
fn config(library: &Path, roots: &Path) -> Config {
    let ctx = LoadContext {
        explicit_file: None,
        default_file: roots.join("absent.toml"),
        env: vec![],
        overrides: Overrides::default(),
        hostname: Some("n1".into()),
    };
    let mut cfg = Config::load(&ctx).expect("default configuration");
    cfg.backend = BackendKind::Nvml;
    cfg.nvml.library = library.to_path_buf();
    cfg.paths.dev_root = roots.join("dev");
    cfg.paths.proc_root = roots.join("proc");
    cfg.paths.sys_root = roots.join("sys");
    cfg
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::String(v.into())
}

#[test]
fn enumerates_gpus_with_attributes_and_capacity() {
    let stub = StubNvml::new(&format!(
        "driver;version=535.104.05;cuda=12020\n{}{}",
        a100(0, 3, "00000000:3B:00.0", false),
        a100(1, 1, "00000000:86:00.0", false)
    ));
    let roots = tempfile::tempdir().expect("tempdir");
    let sys = roots.path().join("sys");
    let real = sys.join("devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0");
    std::fs::create_dir_all(&real).expect("mkdir");
    std::fs::write(real.join("numa_node"), "1\n").expect("numa_node");
    for node in ["card1", "renderD128"] {
        std::fs::create_dir_all(real.join("drm").join(node)).expect("mkdir");
        std::fs::create_dir_all(roots.path().join("dev/dri")).expect("mkdir");
        std::fs::write(roots.path().join("dev/dri").join(node), b"").expect("device node");
    }
    std::fs::create_dir_all(sys.join("bus/pci/devices")).expect("mkdir");
    std::os::unix::fs::symlink(
        "../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0",
        sys.join("bus/pci/devices/0000:3b:00.0"),
    )
    .expect("symlink");

    let mut cfg = config(&stub.library, roots.path());
    cfg.backend = BackendKind::Auto;
    let backend = backend_from_config(&cfg).expect("auto loads the stand-in");
    assert_eq!(backend.name(), "nvml");
    let inv = backend.discover().expect("discover");
    assert_eq!(inv.driver_version.as_deref(), Some("535.104.05"));
    assert_eq!(inv.cuda_driver_version.as_deref(), Some("12.2.0"));
    let names: Vec<&str> = inv.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["gpu-1", "gpu-3"], "named by minor, sorted");

    let d = inv.device("gpu-3").expect("gpu-3");
    assert_eq!(d.kind, DeviceKind::Gpu);
    assert_eq!((d.index, d.minor), (0, 3));
    assert_eq!(d.uuid, "GPU-00000000-0000-0000-0000-000000000000");
    let want = [
        ("type", s("gpu")),
        ("uuid", s("GPU-00000000-0000-0000-0000-000000000000")),
        ("productName", s("NVIDIA A100-SXM4-80GB")),
        ("brand", s("Tesla")),
        ("architecture", s("Ampere")),
        ("index", AttributeValue::Int(0)),
        ("minor", AttributeValue::Int(3)),
        ("cudaComputeCapability", AttributeValue::Version("8.0.0".into())),
        ("driverVersion", AttributeValue::Version("535.104.5".into())),
        ("cudaDriverVersion", AttributeValue::Version("12.2.0".into())),
        ("resource.kubernetes.io/pciBusID", s("0000:3b:00.0")),
        ("resource.kubernetes.io/pcieRoot", s("pci0000:3a")),
        ("numaNode", AttributeValue::Int(1)),
    ];
    for (k, v) in &want {
        assert_eq!(d.attributes.get(*k), Some(v), "attribute {k}");
    }
    assert_eq!(d.attributes.len(), want.len(), "{:?}", d.attributes);
    assert_eq!(d.capacity["memory"], 80 << 30);
    assert_eq!(d.capacity["multiprocessors"], 108);
    let dev = roots.path().join("dev");
    assert_eq!(d.device_nodes, [dev.join("nvidia3"), dev.join("dri/card1"), dev.join("dri/renderD128")]);

    let other = inv.device("gpu-1").expect("gpu-1");
    assert_eq!(other.attributes["resource.kubernetes.io/pciBusID"], s("0000:86:00.0"));
    assert!(!other.attributes.contains_key("resource.kubernetes.io/pcieRoot"), "no sysfs entry, no root");
    assert!(!other.attributes.contains_key("numaNode"));
    assert_eq!(other.device_nodes, [dev.join("nvidia1")], "no sysfs entry, no DRM nodes");
}

#[test]
fn mig_devices_replace_their_parent() {
    let stub = StubNvml::new(&format!(
        "{}{}{}\
         mig;gpu=0;slot=0;gi=1;ci=0;uuid=MIG-aaaa;mem={};sms=14;gislices=1;cislices=1;memmb=9728\n\
         mig;gpu=0;slot=3;gi=2;ci=0;uuid=MIG-bbbb;mem={};sms=42;gislices=3;cislices=1;memmb=40192\n",
        a100(0, 0, "00000000:3B:00.0", true),
        a100(1, 1, "00000000:86:00.0", false),
        a100(2, 2, "00000000:AF:00.0", true),
        9728u64 << 20,
        40192u64 << 20,
    ));
    let roots = tempfile::tempdir().expect("tempdir");
    let gi1 = roots.path().join("proc/driver/nvidia/capabilities/gpu0/mig/gi1");
    std::fs::create_dir_all(gi1.join("ci0")).expect("mkdir");
    std::fs::write(gi1.join("access"), "DeviceFileMinor: 12\nDeviceFileMode: 292\n").expect("write");
    std::fs::write(gi1.join("ci0/access"), "DeviceFileMinor: 13\n").expect("write");

    let cfg = config(&stub.library, roots.path());
    let inv = backend_from_config(&cfg).expect("load").discover().expect("discover");
    let names: Vec<&str> = inv.devices.iter().map(|d| d.name.as_str()).collect();
    // GPU 2 is in MIG mode without MIG devices: published whole.
    assert_eq!(names, ["gpu-0-mig-1-0", "gpu-0-mig-2-0", "gpu-1", "gpu-2"]);

    let m = inv.device("gpu-0-mig-1-0").expect("first MIG device");
    assert_eq!(m.uuid, "MIG-aaaa");
    assert_eq!(m.attributes["type"], s("mig"));
    assert_eq!(m.attributes["profile"], s("1g.10gb"));
    assert_eq!(m.attributes["parentUUID"], s("GPU-00000000-0000-0000-0000-000000000000"));
    assert_eq!(m.attributes["minor"], AttributeValue::Int(0));
    assert_eq!(m.capacity["memory"], 9728 << 20);
    assert_eq!(m.capacity["multiprocessors"], 14);
    let dev = roots.path().join("dev");
    assert_eq!(
        m.device_nodes,
        vec![dev.join("nvidia0"), dev.join("nvidia-caps/nvidia-cap12"), dev.join("nvidia-caps/nvidia-cap13")]
    );
    let DeviceKind::Mig(info) = &m.kind else { panic!("a MIG device") };
    assert_eq!((info.gi, info.ci, info.parent_minor), (1, 0, 0));

    let m2 = inv.device("gpu-0-mig-2-0").expect("second MIG device");
    assert_eq!(m2.attributes["profile"], s("1c.3g.40gb"));
    assert_eq!(m2.device_nodes, vec![dev.join("nvidia0")], "capabilities absent from procfs are skipped");
}

#[test]
fn a_failing_call_names_the_call_and_the_device() {
    let gpus = format!("{}{}", a100(0, 0, "0000:3B:00.0", false), a100(1, 1, "0000:86:00.0", false));
    let stub = StubNvml::new(&format!("{gpus}fail;call=nvmlDeviceGetMemoryInfo_v2;device=1;code=15\n"));
    let roots = tempfile::tempdir().expect("tempdir");
    let backend = backend_from_config(&config(&stub.library, roots.path())).expect("load");
    let err = backend.discover().expect_err("GPU 1 is lost");
    assert!(
        matches!(&err, InventoryError::Call { call: "nvmlDeviceGetMemoryInfo_v2", device, .. } if device.starts_with("GPU 1 (GPU-")),
        "{err:?}"
    );
    let text = edra::util::error_chain(&err);
    assert!(text.contains("nvmlDeviceGetMemoryInfo_v2") && text.contains("GPU 1"), "{text}");
    assert!(text.contains("driver is loaded") && text.contains("paths.driver_root"), "{text}");

    // An optional getter that is merely unsupported drops its attribute.
    let stub = StubNvml::new(&format!("{gpus}fail;call=nvmlDeviceGetBrand;code=3\n"));
    let inv = backend_from_config(&config(&stub.library, roots.path())).expect("load").discover().expect("discover");
    assert!(inv.devices.iter().all(|d| !d.attributes.contains_key("brand")));
    assert!(inv.devices.iter().all(|d| d.attributes.contains_key("architecture")));
}

#[test]
fn init_failure_says_what_to_check() {
    let stub = StubNvml::without_config();
    let roots = tempfile::tempdir().expect("tempdir");
    let err = backend_from_config(&config(&stub.library, roots.path())).err().expect("driver not loaded");
    assert!(matches!(err, InventoryError::Call { call: "nvmlInit_v2", .. }), "{err:?}");
    assert!(edra::util::error_chain(&err).to_lowercase().contains("driver"), "{err}");
}

#[test]
fn a_missing_library_is_a_clear_error() {
    let roots = tempfile::tempdir().expect("tempdir");
    let missing = roots.path().join("nowhere/libnvidia-ml.so.1");
    let mut cfg = config(&missing, roots.path());
    let err = backend_from_config(&cfg).err().expect("no library");
    let text = edra::util::error_chain(&err);
    assert!(matches!(err, InventoryError::LoadLibrary { .. }), "{text}");
    assert!(text.contains(&missing.display().to_string()) && text.contains("--backend mock"), "{text}");

    cfg.backend = BackendKind::Auto;
    let err = backend_from_config(&cfg).err().expect("no library");
    let text = edra::util::error_chain(&err);
    assert!(matches!(err, InventoryError::NoBackend { .. }), "{text}");
    // Where "auto" came from: this test's configuration does not set it.
    assert!(text.contains("backend = \"auto\" (the default)") && text.contains("--backend mock"), "{text}");
    assert!(!text.contains("--backend auto"), "{text}");
    assert!(text.contains("nvml.library") && text.contains("paths.driver_root"), "{text}");
}

#[test]
fn a_library_without_nvml_symbols_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lib = empty_library(dir.path());
    let err = backend_from_config(&config(&lib, dir.path())).err().expect("not NVML");
    let text = edra::util::error_chain(&err);
    assert!(matches!(err, InventoryError::NotNvml { .. }), "{text}");
    assert!(text.contains("not a usable NVML library") && text.contains("nvmlInit_v2"), "{text}");
}

#[test]
fn a_bare_name_is_found_under_the_driver_root() {
    let stub = StubNvml::new(&a100(0, 0, "0000:3B:00.0", false));
    let root = tempfile::tempdir().expect("tempdir");
    let libdir = root.path().join("usr/lib64");
    std::fs::create_dir_all(&libdir).expect("mkdir");
    std::fs::copy(&stub.library, libdir.join("libnvidia-ml.so.1")).expect("copy library");
    std::fs::copy(stub.dir.path().join("nvml_stub.conf"), libdir.join("nvml_stub.conf")).expect("copy conf");
    let mut cfg = config(Path::new("libnvidia-ml.so.1"), root.path());
    cfg.paths.driver_root = root.path().to_path_buf();
    let backend = edra::inventory::nvml::NvmlBackend::load(&cfg).expect("found under the driver root");
    assert_eq!(PathBuf::from(backend.library()), libdir.join("libnvidia-ml.so.1"));
    assert_eq!(edra::inventory::DeviceBackend::discover(&backend).expect("discover").devices.len(), 1);
}

#[test]
fn compute_modes_are_read_and_set_through_nvml() {
    use edra::gpu::{ComputeMode, ComputeModes, GpuError};
    let gpus = format!("{}{}", a100(0, 0, "0000:3B:00.0", false), a100(1, 1, "0000:86:00.0", false));
    let stub = StubNvml::new(&format!("{gpus}fail;call=nvmlDeviceSetComputeMode;device=1;code=4\n"));
    let roots = tempfile::tempdir().expect("tempdir");
    let cfg = config(&stub.library, roots.path());
    let backend = edra::inventory::nvml::NvmlBackend::load(&cfg).expect("load");
    let gpu0 = "GPU-00000000-0000-0000-0000-000000000000";
    let gpu1 = "GPU-00000000-0000-0000-0000-000000000001";
    assert_eq!(backend.compute_mode(gpu0).expect("get"), ComputeMode::Default);
    backend.set_compute_mode(gpu0, ComputeMode::ExclusiveProcess).expect("set");
    assert_eq!(backend.compute_mode(gpu0).expect("get"), ComputeMode::ExclusiveProcess);
    // The stand-in keeps modes beside it, as the GPU does across processes.
    let modes = std::fs::read_to_string(stub.dir.path().join("nvml_stub.modes")).expect("modes file");
    assert_eq!(modes, format!("{gpu0} 3\n"));
    let again = edra::inventory::nvml::NvmlBackend::load(&cfg).expect("load again");
    assert_eq!(again.compute_mode(gpu0).expect("get"), ComputeMode::ExclusiveProcess);
    // NVML's refusal names the call and the GPU; an unknown UUID says the GPU is gone.
    let err = backend.set_compute_mode(gpu1, ComputeMode::Default).expect_err("no permission");
    let text = edra::util::error_chain(&err);
    assert!(text.contains("nvmlDeviceSetComputeMode") && text.contains(gpu1) && text.contains("root"), "{text}");
    assert!(matches!(backend.compute_mode("GPU-gone"), Err(GpuError::UnknownGpu { .. })));
}
