use super::platform::{self, Evidence, L4tRelease};
use super::*;
use crate::config::Paths;

const RELEASE: &str = "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8 01:49:37 UTC 2025\n# KERNEL_VARIANT: oot\n";
const COMPATIBLE: &[u8] = b"nvidia,p3737-0000+p3701-0005\0nvidia,p3701-0005\0nvidia,tegra234\0";

fn write(path: &std::path::Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    std::fs::write(path, bytes).expect("write");
}

/// An AGX Orin's files under `dir` (Paths::under's layout).
fn orin(dir: &std::path::Path) -> Paths {
    let paths = Paths::under(dir);
    write(&paths.driver_root.join(platform::TEGRA_RELEASE), RELEASE.as_bytes());
    write(&paths.sys_root.join(platform::SOC_FAMILY), b"Tegra234\n");
    write(&paths.proc_root.join(platform::DT_MODEL), b"NVIDIA Jetson AGX Orin Developer Kit\0");
    write(&paths.proc_root.join(platform::DT_COMPATIBLE), COMPATIBLE);
    write(&paths.proc_root.join(platform::MEMINFO), b"MemTotal:       64335836 kB\nMemFree:  1 kB\n");
    paths
}

fn config(paths: Paths) -> Config {
    let mut cfg = Config::defaults_for("jetson-1");
    cfg.paths = paths;
    // No NVML here: a name the loader cannot find.
    cfg.nvml.library = "libnvidia-ml-absent-for-tests.so.1".into();
    cfg
}

#[test]
fn the_release_line_gives_the_l4t_version_and_jetpack() {
    let r = platform::parse_release(RELEASE).expect("parsed");
    assert_eq!(r, L4tRelease { major: 36, revision: "4.3".into() });
    assert_eq!((r.version().as_deref(), r.jetpack_major()), (Some("36.4.3"), Some(6)));
    let thor = platform::parse_release("# R38 (release), REVISION: 2.0, GCID: 1, BOARD: generic\n").expect("thor");
    assert_eq!((thor.version().as_deref(), thor.jetpack_major()), (Some("38.2.0"), Some(7)));
    for bad in ["", "R36, REVISION: 4.3", "# R (release), REVISION: 4.3", "# R36 (release), REVISION: 4.3;rm", "# R36"]
    {
        assert_eq!(platform::parse_release(bad), None, "{bad:?}");
    }
    assert_eq!(L4tRelease { major: 99, revision: "1".into() }.jetpack_major(), None);
}

#[test]
fn compatible_and_meminfo_are_parsed_within_bounds() {
    assert_eq!(platform::parse_compatible(COMPATIBLE)[2], "nvidia,tegra234");
    assert_eq!(platform::parse_compatible(b"a\x1b[2J\0b\0"), vec!["b".to_string()]);
    assert_eq!(platform::parse_mem_total("MemTotal: 7 kB\n"), Some(7168));
    assert_eq!(platform::parse_mem_total("MemTotal: 99999999999999999 kB\n"), None, "overflow");
    assert_eq!(platform::parse_mem_total("MemFree: 7 kB\n"), None);
    assert!(platform::is_integrated_name("Orin (nvgpu)") && platform::is_integrated_name("NVIDIA Thor"));
    assert!(!platform::is_integrated_name("NVIDIA A100-SXM4-80GB"));
}

#[test]
fn a_jetson_is_detected_by_its_release_file_or_its_soc_family() {
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = Paths::under(dir.path());
    assert_eq!(platform::detect(&paths), None);
    write(&paths.sys_root.join(platform::SOC_FAMILY), b"x86\n");
    assert_eq!(platform::detect(&paths), None);
    write(&paths.sys_root.join(platform::SOC_FAMILY), b"Tegra234\n");
    assert_eq!(platform::detect(&paths), Some(Evidence::SocFamily("Tegra234".into())));
    write(&paths.driver_root.join(platform::TEGRA_RELEASE), b"");
    assert!(matches!(platform::detect(&paths), Some(Evidence::ReleaseFile(_))));
}

#[test]
fn an_orin_is_one_integrated_gpu_with_the_platforms_attributes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(orin(dir.path()));
    let backend = TegraBackend::load(&cfg).expect("a Jetson");
    let inv = backend.discover().expect("discovered");
    assert_eq!(inv.devices.len(), 1);
    let d = &inv.devices[0];
    assert!(is_integrated(d));
    assert_eq!(d.name, "gpu-0");
    assert!(d.uuid.starts_with("GPU-"), "{}", d.uuid);
    let text = |k: &str| d.text(k);
    assert_eq!(text("type"), "gpu");
    assert_eq!(text("productName"), "Orin");
    assert_eq!(text("model"), "NVIDIA Jetson AGX Orin Developer Kit");
    assert_eq!(text("soc"), "tegra234");
    assert_eq!(text("architecture"), "Ampere");
    assert_eq!(text("cudaComputeCapability"), "8.7.0");
    assert_eq!(text("l4tRelease"), "36.4.3");
    assert_eq!(d.attributes.get("jetpackMajor"), Some(&AttributeValue::Int(6)));
    assert_eq!(d.capacity.get("memory"), Some(&(64_335_836 * 1024)));
    assert!(d.device_nodes.is_empty());
    // The UUID is stable across restarts.
    assert_eq!(TegraBackend::load(&cfg).expect("again").discover().expect("again").devices[0].uuid, d.uuid);
    // No compute modes: Default is fine, anything else is refused with the reason.
    assert_eq!(backend.compute_mode(&d.uuid).expect("mode"), ComputeMode::Default);
    backend.set_compute_mode(&d.uuid, ComputeMode::Default).expect("default");
    let e = backend.set_compute_mode(&d.uuid, ComputeMode::ExclusiveProcess).expect_err("refused");
    assert!(e.to_string().contains("no compute modes"), "{e}");
}

#[test]
fn nvml_facts_win_and_a_thor_is_named_as_nvml_names_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = orin(dir.path());
    write(&paths.proc_root.join(platform::DT_COMPATIBLE), b"nvidia,tegra264\0");
    let p = platform::read(&paths);
    assert_eq!(p.soc.map(|s| s.family), Some("Thor"));
    let n = NvmlFacts {
        name: Some("NVIDIA Thor".into()),
        uuid: Some("GPU-12345678-1234-1234-1234-123456789abc".into()),
        compute_capability: Some("11.0".into()),
        driver_version: Some("580.00".into()),
        cuda_driver_version: Some("13.0.0".into()),
    };
    let d = integrated_device("n", &paths, &p, &n);
    assert_eq!(
        (d.text("productName"), d.uuid.as_str()),
        ("NVIDIA Thor".into(), "GPU-12345678-1234-1234-1234-123456789abc")
    );
    assert_eq!((d.text("architecture"), d.text("cudaComputeCapability")), ("Blackwell".into(), "11.0.0".into()));
    assert_eq!(d.text("driverVersion"), "580.0.0");
}

#[test]
fn hostile_platform_files_are_left_out_not_followed_or_read_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = orin(dir.path());
    let secret = dir.path().join("secret");
    write(&secret, b"NVIDIA Jetson from a link\n");
    let model = paths.proc_root.join(platform::DT_MODEL);
    std::fs::remove_file(&model).expect("rm");
    std::os::unix::fs::symlink(&secret, &model).expect("link");
    write(&paths.proc_root.join(platform::MEMINFO), &vec![b'9'; (platform::MAX_FILE + 1) as usize]);
    write(&paths.proc_root.join(platform::DT_COMPATIBLE), b"nvidia,tegra999\0");
    let p = platform::read(&paths);
    assert_eq!((p.model, p.memory, p.soc), (None, None, None));
    assert_eq!(p.soc_name.as_deref(), Some("tegra999"));
    let d = integrated_device("n", &paths, &platform::read(&paths), &NvmlFacts::default());
    assert_eq!((d.text("productName"), d.text("architecture")), ("Tegra".into(), String::new()));
    write(&paths.proc_root.join(platform::DT_MODEL), b"Jetson\x1b]0;owned\x07\n");
    assert_eq!(platform::read(&paths).model, None, "control characters");
}

#[test]
fn the_tegra_backend_on_a_host_that_is_no_jetson_says_what_it_looked_for() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = TegraBackend::load(&config(Paths::under(dir.path()))).expect_err("not a Jetson");
    let text = e.to_string();
    assert!(
        text.contains("not a Jetson") && text.contains("nv_tegra_release") && text.contains("soc0/family"),
        "{text}"
    );
}

#[test]
fn auto_picks_tegra_on_a_jetson_and_tegra_is_forced_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(orin(dir.path()));
    cfg.backend = crate::config::BackendKind::Auto;
    assert_eq!(crate::inventory::backend_from_config(&cfg).expect("auto").name(), "tegra");
    cfg.backend = crate::config::BackendKind::Tegra;
    assert_eq!(crate::inventory::backend_from_config(&cfg).expect("tegra").name(), "tegra");
    let other = tempfile::tempdir().expect("tempdir");
    cfg.paths = Paths::under(other.path());
    cfg.backend = crate::config::BackendKind::Auto;
    let e = crate::inventory::backend_from_config(&cfg).err().expect("no backend");
    assert!(e.to_string().contains("found no usable NVML"), "{e}");
}
