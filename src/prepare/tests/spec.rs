//! CDI naming, minimum versions, the validator, driver file discovery, and generated specs
//! checked against the CDI project's JSON schema (src/test_support/cdi-schema).

use super::*;
use crate::prepare::cdi::{CdiDevice, ContainerEdits, DeviceNode, Hook, Mount, Spec};
use crate::prepare::cdi_validate::{minimum_version, validate};

const VENDOR: &str = "k8s.gpu.edra.dev";

pub(super) fn schema_validator() -> jsonschema::Validator {
    struct Local;
    impl jsonschema::Retrieve for Local {
        fn retrieve(
            &self,
            uri: &jsonschema::Uri<String>,
        ) -> Result<serde_json::Value, Box<dyn std::error::Error + Send + Sync>> {
            if uri.as_str().ends_with("defs.json") {
                Ok(serde_json::from_str(include_str!("../../test_support/cdi-schema/defs.json"))?)
            } else {
                Err(format!("unexpected schema reference {uri}").into())
            }
        }
    }
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../../test_support/cdi-schema/schema.json")).unwrap();
    jsonschema::options().with_retriever(Local).build(&schema).unwrap()
}

pub(super) fn schema_errors(v: &jsonschema::Validator, spec: &serde_json::Value) -> Vec<String> {
    v.iter_errors(spec).map(|e| e.to_string()).collect()
}

#[tokio::test]
async fn generated_spec_has_the_expected_edits_and_passes_validator_and_schema() {
    let f = Fixture::new();
    f.claims.put(claim(
        UID1,
        "c1",
        &[("gpu", DRIVER, NODE, "gpu-0", false), ("alt/one", DRIVER, NODE, "gpu-1", false)],
        json!([]),
    ));
    ok(&f.preparer.prepare(vec![cref(UID1, "c1")]).await, UID1);
    let raw: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.cdi_dir().join(format!("{VENDOR}-claim_{UID1}.json"))).unwrap())
            .unwrap();
    let spec: Spec = serde_json::from_value(raw.clone()).unwrap();
    assert_eq!(validate(&spec), Vec::<String>::new());
    assert_eq!(schema_errors(&schema_validator(), &raw), Vec::<String>::new());

    assert_eq!(spec.cdi_version, "0.5.0", "hostPath and digit-leading names need 0.5.0");
    assert_eq!(spec.kind, "k8s.gpu.edra.dev/claim");
    let dev = f.root.join("dev");
    let common = &spec.container_edits;
    assert_eq!(common.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
    let control: Vec<_> = common.device_nodes.iter().map(|n| (n.path.as_str(), n.host_path.clone())).collect();
    assert_eq!(
        control,
        [
            ("/dev/nvidiactl", Some(dev.join("nvidiactl").display().to_string())),
            ("/dev/nvidia-uvm", Some(dev.join("nvidia-uvm").display().to_string())),
        ],
        "only control nodes that exist"
    );
    let d0 = &spec.devices[0];
    assert_eq!(d0.name, format!("{UID1}-gpu-0"));
    assert_eq!(d0.container_edits.device_nodes[0].path, "/dev/nvidia0");
    assert_eq!(d0.container_edits.env, ["EDRA_DEVICE_GPU_0_UUID=GPU-00000000-aaaa-bbbb-cccc-000000000000"]);
    let mounts: Vec<_> = common.mounts.iter().map(|m| m.container_path.as_str()).collect();
    assert_eq!(
        mounts,
        [
            "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
            "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15",
            "/usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.550.54.15",
            "/usr/bin/nvidia-smi",
            "/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin",
        ]
    );
    let drv = f.root.join("driver");
    assert_eq!(
        common.mounts[0].host_path,
        drv.join("usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15").display().to_string()
    );
    assert_eq!(common.mounts[0].options, ["ro", "nosuid", "nodev", "rbind", "rprivate"]);
    let commands: Vec<&str> = common.hooks.iter().map(|h| h.args[2].as_str()).collect();
    assert_eq!(commands, ["create-symlinks", "update-ldcache"]);
    assert_eq!(
        common.hooks[0].args[3..],
        [
            "--link",
            "libcuda.so.550.54.15::/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "--link",
            "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so"
        ][..]
    );
    let hook = &common.hooks[1];
    assert_eq!((hook.hook_name.as_str(), hook.path.as_str()), ("createContainer", "/usr/bin/edra"));
    assert_eq!(
        hook.args,
        [
            "/usr/bin/edra",
            "hook",
            "update-ldcache",
            "--folder",
            "/usr/lib/x86_64-linux-gnu",
            "--folder",
            "/usr/lib/x86_64-linux-gnu/vdpau",
        ]
    );
}

#[test]
fn specs_on_a_real_dev_root_need_no_host_path() {
    let device = Device { device_nodes: vec!["/dev/nvidia3".into()], ..gpu(3, Path::new("/dev")) };
    let layout = cdi::SpecLayout {
        vendor: VENDOR,
        dev_root: Path::new("/dev"),
        hook_binary: Path::new("/usr/bin/edra"),
        host_driver_root: None,
    };
    let files = driver_files::DriverFiles::default();
    let spec = cdi::build_spec(&layout, UID1, &[&device], &files);
    let node = &spec.devices[0].container_edits.device_nodes[0];
    assert_eq!((node.path.as_str(), node.host_path.as_deref()), ("/dev/nvidia3", None));
    assert!(spec.container_edits.hooks.is_empty() && spec.container_edits.mounts.is_empty());
    assert_eq!(spec.cdi_version, "0.5.0", "the name starts with a digit");
    let letter_uid = "a0c9a28b-4a35-4d0e-9f3e-0f2b1d7c1a11";
    let spec = cdi::build_spec(&layout, letter_uid, &[&device], &files);
    assert_eq!(spec.cdi_version, "0.3.0");
    assert!(validate(&spec).is_empty());
    assert!(schema_errors(&schema_validator(), &serde_json::to_value(&spec).unwrap()).is_empty());
}

fn edits() -> ContainerEdits {
    ContainerEdits {
        env: vec!["A=1".into()],
        device_nodes: vec![DeviceNode { path: "/dev/x".into(), host_path: None, permissions: Some("rw".into()) }],
        mounts: vec![Mount { host_path: "/a".into(), container_path: "/b".into(), options: vec![], mount_type: None }],
        hooks: vec![Hook {
            hook_name: "createContainer".into(),
            path: "/bin/h".into(),
            args: vec![],
            env: vec![],
            timeout: None,
        }],
    }
}

fn base_spec() -> Spec {
    Spec {
        cdi_version: "0.3.0".into(),
        kind: "k8s.gpu.edra.dev/claim".into(),
        annotations: Default::default(),
        devices: vec![CdiDevice { name: "dev-a".into(), annotations: Default::default(), container_edits: edits() }],
        container_edits: edits(),
    }
}

#[test]
fn minimum_version_follows_the_features() {
    type Tweak = fn(&mut Spec);
    let cases: [(&str, Tweak, &str); 6] = [
        ("plain", |_| {}, "0.3.0"),
        ("mount type", |s| s.container_edits.mounts[0].mount_type = Some("bind".into()), "0.4.0"),
        ("hostPath", |s| s.devices[0].container_edits.device_nodes[0].host_path = Some("/h".into()), "0.5.0"),
        ("digit name", |s| s.devices[0].name = "0dev".into(), "0.5.0"),
        ("annotations", |s| _ = s.annotations.insert("a".into(), "b".into()), "0.6.0"),
        ("dotted class", |s| s.kind = "k8s.gpu.edra.dev/claim.v2".into(), "0.6.0"),
    ];
    for (name, tweak, want) in cases {
        let mut s = base_spec();
        tweak(&mut s);
        assert_eq!(minimum_version(&s), want, "{name}");
    }
}

#[test]
fn validator_rejects_what_the_cdi_rules_forbid() {
    type Tweak = fn(&mut Spec);
    let cases: [(Tweak, &str); 11] = [
        (|s| s.cdi_version = "0.9.9".into(), "not a known CDI version"),
        (|s| s.devices[0].name = "0dev".into(), "older than 0.5.0"),
        (|s| s.kind = "nokind".into(), "is not vendor/class"),
        (|s| s.kind = "k8s.gpu.edra.dev/-claim".into(), "is not vendor/class"),
        (|s| s.devices.clear(), "no devices"),
        (|s| s.devices.push(s.devices[0].clone()), "appears twice"),
        (|s| s.devices[0].name = "dev/a".into(), "not a valid CDI device name"),
        (|s| s.container_edits.device_nodes[0].path = "dev/x".into(), "is not absolute"),
        (|s| s.container_edits.mounts[0].container_path = "b".into(), "needs absolute paths"),
        (|s| s.container_edits.hooks[0].hook_name = "prestart".into(), "hook name"),
        (|s| s.devices[0].container_edits.env[0] = "NOEQUALS".into(), "not NAME=value"),
    ];
    assert!(validate(&base_spec()).is_empty(), "{:?}", validate(&base_spec()));
    for (tweak, fragment) in cases {
        let mut s = base_spec();
        tweak(&mut s);
        let problems = validate(&s);
        assert!(problems.iter().any(|p| p.contains(fragment)), "{problems:?} lacks {fragment:?}");
    }
}

#[test]
fn the_schema_check_is_live() {
    let v = schema_validator();
    let mut bad = serde_json::to_value(base_spec()).unwrap();
    bad["devices"][0]["containerEdits"]["deviceNodes"][0]["major"] = json!("not a number");
    assert!(!schema_errors(&v, &bad).is_empty());
    let mut bad = serde_json::to_value(base_spec()).unwrap();
    bad.as_object_mut().unwrap().remove("kind");
    assert!(!schema_errors(&v, &bad).is_empty());
}

#[test]
fn names_and_uids() {
    assert_eq!(cdi::spec_file_name(VENDOR, UID1), format!("k8s.gpu.edra.dev-claim_{UID1}.json"));
    assert_eq!(cdi::device_id(VENDOR, UID1, "gpu-0"), format!("k8s.gpu.edra.dev/claim={UID1}-gpu-0"));
    assert_eq!(cdi::uid_from_file_name(VENDOR, &cdi::spec_file_name(VENDOR, UID2)), Some(UID2));
    assert_eq!(cdi::uid_from_file_name(VENDOR, "k8s.gpu.edra.dev-claim_../../etc.json"), None);
    assert_eq!(cdi::uid_from_file_name("k8s.other.dev", &cdi::spec_file_name(VENDOR, UID2)), None);
    for (uid, valid) in [
        (UID1, true),
        ("0B0C9A28-4A35-4D0E-9F3E-0F2B1D7C1A11", false),
        ("../../../../etc/passwd-0000-0000-000000", false),
        ("0b0c9a28-4a35-4d0e-9f3e-0f2b1d7c1a1", false),
        ("0b0c9a28_4a35-4d0e-9f3e-0f2b1d7c1a11", false),
        ("", false),
    ] {
        assert_eq!(cdi::is_valid_uid(uid), valid, "{uid:?}");
    }
}

#[test]
fn spec_writes_are_atomic_and_leave_no_temp_files() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("cdi").join(cdi::spec_file_name(VENDOR, UID1));
    let mut spec = base_spec();
    cdi::write_spec(&path, &spec).unwrap();
    spec.devices[0].name = "dev-b".into();
    cdi::write_spec(&path, &spec).unwrap();
    let back: Spec = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(back, spec);
    assert_eq!(std::fs::read_dir(path.parent().unwrap()).unwrap().count(), 1);
    cdi::remove_spec(&path).unwrap();
    cdi::remove_spec(&path).unwrap();
    assert!(!path.exists());
}

#[test]
fn driver_files_are_found_once_per_folder_and_cached() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    for f in [
        format!("usr/lib/libcuda.so.{VERSION}"),
        format!("usr/lib/libcuda.so.1.0.{VERSION}.bak"),
        "usr/lib/libcuda.so.1".into(),
    ] {
        touch(&root.join(f));
    }
    std::os::unix::fs::symlink("usr/lib", root.join("lib")).unwrap();
    std::fs::create_dir_all(root.join("var/run/nvidia-persistenced")).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(root.join("var/run/nvidia-persistenced/socket")).unwrap();
    touch(&root.join("run/nvidia-fabricmanager/socket"));
    let files = driver_files::discover(root, VERSION, &host_roots(root));
    assert_eq!(files.libraries, [root.join(format!("usr/lib/libcuda.so.{VERSION}"))]);
    assert_eq!(files.library_dirs, [root.join("usr/lib")]);
    assert_eq!(files.ipc_paths, [root.join("var/run/nvidia-persistenced/socket")], "only real sockets");
    let layout = cdi::SpecLayout {
        vendor: VENDOR,
        dev_root: Path::new("/dev"),
        hook_binary: Path::new("/usr/bin/edra"),
        host_driver_root: None,
    };
    let spec = cdi::build_spec(&layout, UID1, &[&gpu(0, Path::new("/dev"))], &files);
    let ipc =
        spec.container_edits.mounts.iter().find(|m| m.container_path == "/var/run/nvidia-persistenced/socket").unwrap();
    assert_eq!(ipc.options, ["nosuid", "nodev", "rbind", "rprivate", "noexec"]);
    assert!(driver_files::discover(root, "", &host_roots(root)).libraries.is_empty());
    let cache = driver_files::DriverFilesCache::new(host_roots(root));
    let a = cache.get(root, VERSION);
    touch(&root.join(format!("usr/lib/libnvidia-ml.so.{VERSION}")));
    assert!(Arc::ptr_eq(&a, &cache.get(root, VERSION)), "cached per version");
    assert_eq!(cache.get(root, "999.1").libraries.len(), 0);
}

#[test]
fn a_driver_root_seen_elsewhere_is_named_by_its_host_path() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    touch(&root.join(format!("usr/lib/libcuda.so.{VERSION}")));
    let files = driver_files::discover(root, VERSION, &host_roots(root));
    let layout = |host: Option<&'static Path>| cdi::SpecLayout {
        vendor: VENDOR,
        dev_root: Path::new("/dev"),
        hook_binary: Path::new("/usr/bin/edra"),
        host_driver_root: host,
    };
    let lib = format!("/usr/lib/libcuda.so.{VERSION}");
    let mount = |spec: &Spec| spec.container_edits.mounts.iter().find(|m| m.container_path == lib).unwrap().clone();
    let same = cdi::build_spec(&layout(None), UID1, &[&gpu(0, Path::new("/dev"))], &files);
    assert_eq!(mount(&same).host_path, root.join(&lib[1..]).display().to_string());
    let host = cdi::build_spec(&layout(Some(Path::new("/"))), UID1, &[&gpu(0, Path::new("/dev"))], &files);
    assert_eq!(mount(&host).host_path, lib, "edra sees the host's / at its driver root");
    let moved =
        cdi::build_spec(&layout(Some(Path::new("/run/nvidia/driver"))), UID1, &[&gpu(0, Path::new("/dev"))], &files);
    assert_eq!(mount(&moved).host_path, format!("/run/nvidia/driver{lib}"));
    assert_eq!(mount(&moved).container_path, lib);
}

fn host_roots(root: &Path) -> driver_files::HostRoots {
    driver_files::HostRoots { sys_root: root.join("sys"), proc_root: root.join("proc") }
}
