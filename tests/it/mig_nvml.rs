//! Dynamic MIG through the real nvml-wrapper and raw NVML calls against the stand-in
//! library: the capability read from NVML against edra's own profile tables, creating and
//! destroying GPU and compute instances with occupancy, instances seen by discovery as
//! static MIG devices, injected errors, missing functions, and instances that outlive the
//! process until the stand-in's state file is gone (a reboot).

use std::path::Path;
use std::process::Command;

use edra::config::Config;
use edra::gpu::mig_control::{MigControl, MigError, MigProfile, Placement, profiles};
use edra::inventory::MigGpu;
use edra::inventory::nvml::NvmlBackend;
use edra::inventory::{DeviceBackend, DeviceKind};

use crate::support::nvml::{StubNvml, gpu, uuid};

const A100_40: &str = "NVIDIA A100-SXM4-40GB";
const A100_80: &str = "NVIDIA A100-SXM4-80GB";
const H100_80: &str = "NVIDIA H100 80GB HBM3";

fn config(stub: &StubNvml) -> Config {
    let mut cfg = stub.config();
    cfg.paths.dev_root = stub.dir.path().join("dev");
    cfg.paths.proc_root = stub.dir.path().join("proc");
    cfg.paths.sys_root = stub.dir.path().join("sys");
    cfg
}

fn load(stub: &StubNvml) -> NvmlBackend {
    NvmlBackend::load(&config(stub)).expect("load the stand-in")
}

/// The MIG GPU `uuid` as discovery reports it.
fn mig_gpu(backend: &NvmlBackend, uuid: &str) -> MigGpu {
    let inv = backend.discover().expect("discover");
    inv.mig_gpus.into_iter().find(|g| g.uuid == uuid).unwrap_or_else(|| panic!("{uuid} has MIG capability"))
}

fn profile(gpu: &MigGpu, name: &str) -> MigProfile {
    gpu.capability.profiles.iter().find(|p| p.name == name).cloned().unwrap_or_else(|| panic!("profile {name}"))
}

/// What NVML says is left of profile `id` on GPU `uuid` (edra itself does not ask).
fn remaining(backend: &NvmlBackend, uuid: &str, id: u32) -> u32 {
    let dev = backend.nvml().device_by_uuid(uuid).expect("the GPU");
    let lib = backend.nvml().lib();
    let f = lib.nvmlDeviceGetGpuInstanceRemainingCapacity.as_ref().expect("the stand-in has the function");
    let mut count = 0u32;
    // SAFETY: the handle belongs to this loaded library; `count` is a valid out-pointer.
    let rc = unsafe { f(dev.handle(), id, &mut count) };
    assert_eq!(rc, 0, "nvmlDeviceGetGpuInstanceRemainingCapacity");
    count
}

fn at(start: u32, size: u32) -> Placement {
    Placement { start, size }
}

#[test]
fn capability_read_through_nvml_matches_the_profile_tables() {
    // Memory as NVML reports it for these boards; the H100 is found by name and memory,
    // the A100 40GB by its model key, the A30 has no table (model=none).
    let stub = StubNvml::new(&format!(
        "{}{}{}{}{}",
        gpu(0, A100_40, 40960, true, ";model=a100-40gb"),
        gpu(1, A100_80, 81920, true, ""),
        gpu(2, H100_80, 81559, true, ""),
        gpu(3, "NVIDIA A30", 24576, true, ";model=none"),
        gpu(4, A100_80, 81920, false, ""),
    ));
    let backend = load(&stub);
    let inv = backend.discover().expect("discovery survives a GPU without MIG profiles");
    let uuids: Vec<&str> = inv.mig_gpus.iter().map(|g| g.uuid.as_str()).collect();
    assert_eq!(uuids, [uuid(0), uuid(1), uuid(2)], "GPU 3 has no profiles, GPU 4 is not in MIG mode");
    for (i, (name, mib)) in [(A100_40, 40960u64), (A100_80, 81920), (H100_80, 81559)].into_iter().enumerate() {
        let want = profiles::for_model(name, mib << 20).expect("a known model");
        assert_eq!(inv.mig_gpus[i].capability, want, "{name}: NVML's answers against edra's table");
        assert!(inv.mig_gpus[i].instances.is_empty());
    }
    let names: Vec<&str> = inv.mig_gpus[1].capability.profiles.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["7g.80gb", "4g.40gb", "3g.40gb", "2g.20gb", "1g.20gb", "1g.10gb", "1g.10gb+me"]);
    assert_eq!(inv.mig_gpus[1].capability.memory_slices, 8);
    // Static MIG enumeration is unchanged: GPUs in MIG mode without MIG devices are whole.
    assert_eq!(inv.devices.len(), 5);
}

#[test]
fn create_occupy_destroy_and_create_again() {
    let stub = StubNvml::new(&gpu(0, A100_80, 81920, true, ""));
    let backend = load(&stub);
    let mig = backend.mig().expect("the NVML backend controls MIG");
    let gpu0 = mig_gpu(&backend, &uuid(0));
    let three = profile(&gpu0, "3g.40gb");
    let seven = profile(&gpu0, "7g.80gb");

    let one = profile(&gpu0, "1g.10gb");
    let left = |p: &MigProfile| remaining(&backend, &uuid(0), p.id);
    assert_eq!((left(&three), left(&seven), left(&one)), (2, 1, 7));
    let first = mig.create_mig(&uuid(0), &three, at(0, 4)).expect("3g.40gb at 0");
    assert_eq!((left(&three), left(&seven), left(&one)), (1, 0, 3));
    let second = mig.create_mig(&uuid(0), &three, at(4, 4)).expect("3g.40gb at 4");
    assert_eq!((first.placement, second.placement), (at(0, 4), at(4, 4)));
    assert_eq!((first.profile_id, first.ci), (9, Some(0)));
    assert_ne!(first.gi, second.gi);
    let (u1, u2) = (first.uuid.clone().expect("MIG UUID"), second.uuid.clone().expect("MIG UUID"));
    assert!(u1.starts_with("MIG-") && u1 != u2, "{u1} {u2}");

    assert_eq!((left(&three), left(&seven), left(&one)), (0, 0, 0));
    for taken in [at(0, 4), at(4, 4)] {
        let err = mig.create_mig(&uuid(0), &three, taken).expect_err("a third 3g.40gb does not fit");
        assert!(
            matches!(&err, MigError::Occupied { placement, profile, .. } if *placement == taken && profile == "3g.40gb"),
            "{err:?}"
        );
    }
    let err = mig.create_mig(&uuid(0), &seven, at(0, 8)).expect_err("7g.80gb over two 3g.40gb");
    assert!(err.to_string().contains("7g.80gb") && err.to_string().contains("insufficient resources"), "{err}");

    assert_eq!(mig.mig_instances(&uuid(0)).expect("list"), [first.clone(), second.clone()]);
    // Discovery sees them as static MIG devices with their UUIDs, and as instances.
    let inv = backend.discover().expect("discover");
    let migs: Vec<(String, String)> = inv
        .devices
        .iter()
        .filter(|d| matches!(d.kind, DeviceKind::Mig(_)))
        .map(|d| (d.name.clone(), d.uuid.clone()))
        .collect();
    assert_eq!(
        migs,
        [(format!("gpu-0-mig-{}-0", first.gi), u1.clone()), (format!("gpu-0-mig-{}-0", second.gi), u2.clone())]
    );
    let device = inv.devices.iter().find(|d| d.uuid == u1).expect("first MIG device");
    assert_eq!(device.attributes["profile"], edra::inventory::AttributeValue::String("3g.40gb".into()));
    assert_eq!(inv.mig_gpus[0].instances, [first.clone(), second.clone()]);

    mig.destroy_mig(&uuid(0), first.gi, first.ci).expect("destroy the first");
    assert!(matches!(mig.create_mig(&uuid(0), &seven, at(0, 8)), Err(MigError::Occupied { .. })), "one is left");
    mig.destroy_mig(&uuid(0), second.gi, second.ci).expect("destroy the second");
    assert!(mig.mig_instances(&uuid(0)).expect("list").is_empty());
    let whole = mig.create_mig(&uuid(0), &seven, at(0, 8)).expect("7g.80gb on the empty GPU");
    mig.destroy_mig(&uuid(0), whole.gi, whole.ci).expect("destroy 7g.80gb");
    // Destroying what is gone is done: a missing GPU instance, one destroyed before.
    mig.destroy_mig(&uuid(0), 42, Some(0)).expect("missing GPU instance");
    mig.destroy_mig(&uuid(0), first.gi, first.ci).expect("destroyed before");
    let again = mig.create_mig(&uuid(0), &three, at(0, 4)).expect("3g.40gb at 0 again");
    assert_ne!(again.uuid, first.uuid, "a new instance has a new UUID");
    // GPU instance IDs are reused, as NVML reuses them: an ID says nothing about which
    // instance it was.
    assert_eq!(again.gi, first.gi);
    // A missing compute instance is skipped; its GPU instance still holds another.
    mig.destroy_mig(&uuid(0), again.gi, Some(7)).expect_err("GPU instance still holds compute instance 0");
    mig.destroy_mig(&uuid(0), again.gi, again.ci).expect("destroy");
    assert!(mig.mig_instances(&uuid(0)).expect("list").is_empty());
}

#[test]
fn instance_limits_and_the_other_models() {
    let stub = StubNvml::new(&format!("{}{}", gpu(0, H100_80, 81559, true, ""), gpu(1, A100_40, 40960, true, "")));
    let backend = load(&stub);
    let mig = backend.mig().expect("MIG control");
    let h100 = mig_gpu(&backend, &uuid(0));
    // One media-extension instance per GPU, wherever it goes.
    let me = profile(&h100, "1g.10gb+me");
    mig.create_mig(&uuid(0), &me, at(0, 1)).expect("1g.10gb+me");
    let err = mig.create_mig(&uuid(0), &me, at(3, 1)).expect_err("a second +me instance");
    assert!(matches!(err, MigError::Occupied { .. }), "{err:?}");
    let one = profile(&h100, "1g.10gb");
    for start in 1..7 {
        mig.create_mig(&uuid(0), &one, at(start, 1)).unwrap_or_else(|e| panic!("1g.10gb at {start}: {e}"));
    }
    assert_eq!(mig.mig_instances(&uuid(0)).expect("list").len(), 7);

    let a100 = mig_gpu(&backend, &uuid(1));
    let two = profile(&a100, "2g.10gb");
    let made = mig.create_mig(&uuid(1), &two, at(2, 2)).expect("2g.10gb at 2");
    assert_eq!(made.placement, at(2, 2));
    let err = mig.create_mig(&uuid(1), &profile(&a100, "1g.10gb"), at(2, 2)).expect_err("overlaps");
    assert!(matches!(err, MigError::Occupied { .. }), "{err:?}");
    assert!(mig.mig_instances(&uuid(0)).expect("list").iter().all(|i| i.uuid.is_some()));
}

#[test]
fn a_gpu_not_in_mig_mode_or_unknown_is_refused() {
    let stub = StubNvml::new(&format!("{}{}", gpu(0, A100_80, 81920, true, ""), gpu(1, A100_80, 81920, false, "")));
    let backend = load(&stub);
    let mig = backend.mig().expect("MIG control");
    let three = profile(&mig_gpu(&backend, &uuid(0)), "3g.40gb");
    let err = mig.create_mig(&uuid(1), &three, at(0, 4)).expect_err("MIG mode off");
    assert!(matches!(err, MigError::MigModeOff { .. }) && err.to_string().contains("-mig 1"), "{err}");
    assert!(matches!(mig.mig_instances("GPU-gone"), Err(MigError::UnknownGpu { .. })));
    mig.destroy_mig(&uuid(1), 1, Some(0)).expect("nothing exists on a GPU not in MIG mode");
}

#[test]
fn injected_errors_name_the_call_and_leave_nothing_behind() {
    let a100 = gpu(0, A100_80, 81920, true, "");
    let stub = StubNvml::new(&format!("{a100}fail;call=nvmlGpuInstanceCreateComputeInstance;code=20\n"));
    let backend = load(&stub);
    let mig = backend.mig().expect("MIG control");
    let three = profile(&mig_gpu(&backend, &uuid(0)), "3g.40gb");
    let err = mig.create_mig(&uuid(0), &three, at(0, 4)).expect_err("compute instance creation fails");
    assert!(
        matches!(&err, MigError::Nvml { call: "nvmlGpuInstanceCreateComputeInstance", uuid: gpu, .. } if *gpu == uuid(0)),
        "{err:?}"
    );
    assert!(mig.mig_instances(&uuid(0)).expect("list").is_empty(), "the GPU instance is destroyed again");

    let stub = StubNvml::new(&format!("{a100}fail;call=nvmlDeviceCreateGpuInstanceWithPlacement;code=4\n"));
    let backend = load(&stub);
    let mig = backend.mig().expect("MIG control");
    let err = mig.create_mig(&uuid(0), &three, at(0, 4)).expect_err("no permission");
    assert!(matches!(err, MigError::Nvml { call: "nvmlDeviceCreateGpuInstanceWithPlacement", .. }), "{err:?}");

    let stub = StubNvml::new(&format!("{a100}fail;call=nvmlGpuInstanceDestroy;code=19\n"));
    let backend = load(&stub);
    let mig = backend.mig().expect("MIG control");
    let made = mig.create_mig(&uuid(0), &three, at(4, 4)).expect("create");
    let err = mig.destroy_mig(&uuid(0), made.gi, made.ci).expect_err("GPU instance in use");
    assert!(matches!(err, MigError::Nvml { call: "nvmlGpuInstanceDestroy", .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.starts_with(&format!("NVML nvmlGpuInstanceDestroy failed for GPU {}: ", uuid(0))), "{text}");
    assert!(text.ends_with("currently in use (NVML error 19)"), "{text}");

    // In discovery, a GPU whose MIG capability cannot be read is left out, not fatal.
    let stub = StubNvml::new(&format!(
        "{a100}{}fail;call=nvmlDeviceGetGpuInstancePossiblePlacements_v2;device=0;code=999\n",
        gpu(1, A100_80, 81920, true, "")
    ));
    let inv = load(&stub).discover().expect("discovery goes on");
    let uuids: Vec<&str> = inv.mig_gpus.iter().map(|g| g.uuid.as_str()).collect();
    assert_eq!(uuids, [uuid(1)]);
    assert_eq!(inv.devices.len(), 2);
}

#[test]
fn a_driver_without_the_function_is_unsupported() {
    let stub = StubNvml::variant(&gpu(0, A100_80, 81920, true, ""), "STUB_NO_CREATE_GI");
    let backend = load(&stub);
    let mig = backend.mig().expect("MIG control");
    let three = profile(&mig_gpu(&backend, &uuid(0)), "3g.40gb");
    let err = mig.create_mig(&uuid(0), &three, at(0, 4)).expect_err("no such function");
    assert!(matches!(err, MigError::Unsupported { call: "nvmlDeviceCreateGpuInstanceWithPlacement" }), "{err:?}");
    assert!(err.to_string().contains("update the NVIDIA driver"), "{err}");
    assert!(mig.mig_instances(&uuid(0)).expect("listing needs no creation").is_empty());
}

/// The MIG UUIDs `edra inventory` (a new process) reports for the stand-in's machine.
fn mig_uuids_seen_by_a_new_process(stub: &StubNvml) -> Vec<String> {
    let file = stub.dir.path().join("edra.toml");
    std::fs::write(&file, format!("[nvml]\nlibrary = \"{}\"\n", stub.library.display())).expect("write config");
    let out = Command::new(env!("CARGO_BIN_EXE_edra"))
        .env_clear()
        .arg("--config")
        .arg(&file)
        .args(["inventory", "--backend", "nvml", "--output", "table", "--node-name", "n1"])
        .output()
        .expect("run edra inventory");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().filter(|w| w.starts_with("MIG-")).map(str::to_string).collect()
}

fn state_lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map(|s| s.lines().count()).unwrap_or(0)
}

#[test]
fn instances_outlive_the_process_until_the_state_file_is_gone() {
    let state = tempfile::tempdir().expect("tempdir");
    let path = state.path().join("mig-state");
    let stub = StubNvml::new(&format!("migstate;path={}\n{}", path.display(), gpu(0, A100_80, 81920, true, "")));
    let backend = load(&stub);
    let mig = backend.mig().expect("MIG control");
    let gpu0 = mig_gpu(&backend, &uuid(0));
    let made = mig.create_mig(&uuid(0), &profile(&gpu0, "2g.20gb"), at(2, 2)).expect("create");
    let bare = mig.create_mig(&uuid(0), &profile(&gpu0, "1g.10gb"), at(6, 1)).expect("create");
    assert_eq!(state_lines(&path), 2, "kept where the configuration says");

    // Another process (edra inventory) sees both as static MIG devices with their UUIDs.
    let mut seen = mig_uuids_seen_by_a_new_process(&stub);
    seen.sort();
    let mut want = vec![made.uuid.clone().expect("uuid"), bare.uuid.clone().expect("uuid")];
    want.sort();
    assert_eq!(seen, want);
    // A second backend reads the same instances.
    let again = load(&stub);
    assert_eq!(again.mig_instances(&uuid(0)).expect("list"), [made.clone(), bare.clone()]);
    again.destroy_mig(&uuid(0), bare.gi, bare.ci).expect("destroy through the second backend");
    assert_eq!(
        mig.mig_instances(&uuid(0)).expect("list"),
        std::slice::from_ref(&made),
        "the first backend sees it gone"
    );

    // A reboot: the state file is gone, and so are the instances, for everyone.
    std::fs::remove_file(&path).expect("remove the state file");
    assert!(mig.mig_instances(&uuid(0)).expect("list").is_empty());
    assert!(mig_uuids_seen_by_a_new_process(&stub).is_empty());
    mig.destroy_mig(&uuid(0), made.gi, made.ci).expect("destroying what a reboot took is done");
    let after = mig.create_mig(&uuid(0), &profile(&gpu0, "7g.80gb"), at(0, 8)).expect("the whole GPU is free");
    assert_eq!(after.placement, at(0, 8));
}

#[test]
fn instances_made_one_after_another_at_alternating_placements() {
    let stub = StubNvml::new(&gpu(0, A100_80, 81920, true, ""));
    let mig = load(&stub);
    let three = profile(&mig_gpu(&mig, &uuid(0)), "3g.40gb");
    for k in 0..6 {
        let placement = three.placements[k % 2];
        let made = mig.create_mig(&uuid(0), &three, placement).unwrap_or_else(|e| panic!("round {k}: {e}"));
        assert_eq!(made.placement, placement);
        mig.destroy_mig(&uuid(0), made.gi, made.ci).unwrap_or_else(|e| panic!("round {k}: {e}"));
    }
    assert!(mig.mig_instances(&uuid(0)).expect("list").is_empty());
}
