use crate::gpu::mig_control::{MigError, Placement};
use crate::inventory::mock::MockBackend;
use crate::inventory::{DeviceBackend, DeviceKind};

fn backend(runtime: &std::path::Path, product: &str) -> MockBackend {
    let mut cfg = crate::config::Config::defaults_for("n1");
    cfg.paths.dev_root = "/tdev".into();
    cfg.paths.runtime_dir = runtime.to_path_buf();
    cfg.mock.mig_mode = true;
    cfg.mock.product_name = product.into();
    MockBackend::new(&cfg)
}

#[test]
fn instances_are_created_where_free_listed_and_survive_a_new_backend() {
    let dir = tempfile::tempdir().unwrap();
    let b = backend(dir.path(), "NVIDIA A100-SXM4-80GB");
    let inv = b.discover().unwrap();
    assert!(inv.devices.is_empty(), "a GPU in MIG mode without instances has no devices");
    assert_eq!(inv.mig_gpus.len(), 2);
    let gpu = &inv.mig_gpus[0];
    assert_eq!((gpu.device.name.as_str(), gpu.device.kind.clone()), ("gpu-0", DeviceKind::Gpu));
    let three = gpu.capability.profile(9).unwrap().clone();
    let mig = b.mig().expect("MIG control");
    let first = mig.create_mig(&gpu.uuid, &three, Placement { start: 4, size: 4 }).unwrap();
    assert_eq!((first.gi, first.ci), (1, Some(0)));
    let second = mig.create_mig(&gpu.uuid, &three, Placement { start: 0, size: 4 }).unwrap();
    assert_eq!(second.gi, 2, "the lowest free GPU instance ID");
    assert_ne!(first.uuid, second.uuid);
    let one = gpu.capability.profile(19).unwrap().clone();
    let err = mig.create_mig(&gpu.uuid, &one, Placement { start: 5, size: 1 }).unwrap_err();
    assert!(matches!(err, MigError::Occupied { .. }), "{err}");
    let err = mig.create_mig(&gpu.uuid, &three, Placement { start: 2, size: 4 }).unwrap_err();
    assert!(matches!(err, MigError::Nvml { .. }), "not a placement of the profile: {err}");

    // A new backend (edra restarted) sees the same instances, as MIG devices too.
    let again = backend(dir.path(), "NVIDIA A100-SXM4-80GB");
    let inv = again.discover().unwrap();
    let names: Vec<&str> = inv.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["gpu-0-mig-1-0", "gpu-0-mig-2-0"]);
    assert_eq!(inv.devices[0].uuid, first.uuid.clone().unwrap());
    assert_eq!(inv.devices[0].capacity["memory"], 40192 << 20);
    assert_eq!(inv.mig_gpus[0].instances, vec![first.clone(), second.clone()]);

    again.mig().unwrap().destroy_mig(&gpu.uuid, first.gi, first.ci).unwrap();
    again.mig().unwrap().destroy_mig(&gpu.uuid, first.gi, first.ci).expect("a missing instance is destroyed");
    assert_eq!(again.mig().unwrap().mig_instances(&gpu.uuid).unwrap(), vec![second]);
    let freed = again.mig().unwrap().create_mig(&gpu.uuid, &one, Placement { start: 5, size: 1 }).unwrap();
    assert_eq!(freed.gi, 1);
    // A reboot clears the runtime directory, and the instances with it.
    std::fs::remove_file(dir.path().join(super::STATE_FILE)).unwrap();
    assert!(again.mig().unwrap().mig_instances(&gpu.uuid).unwrap().is_empty());
}

#[test]
fn instance_limits_unknown_models_and_unreadable_state() {
    let dir = tempfile::tempdir().unwrap();
    let b = backend(dir.path(), "NVIDIA H100 80GB HBM3");
    let gpu = b.discover().unwrap().mig_gpus[0].clone();
    let me = gpu.capability.profile(20).unwrap().clone();
    let mig = b.mig().unwrap();
    mig.create_mig(&gpu.uuid, &me, Placement { start: 0, size: 1 }).unwrap();
    let err = mig.create_mig(&gpu.uuid, &me, Placement { start: 3, size: 1 }).unwrap_err();
    assert!(matches!(err, MigError::Occupied { .. }), "1g.10gb+me allows one instance: {err}");
    assert!(matches!(mig.mig_instances("GPU-nope"), Err(MigError::UnknownGpu { .. })));
    std::fs::write(dir.path().join(super::STATE_FILE), b"{not json").unwrap();
    let err = mig.destroy_mig(&gpu.uuid, 1, Some(0)).unwrap_err();
    assert!(err.to_string().contains("mock-mig.json"), "{err}");
    assert!(b.discover().is_err(), "an unreadable state is an error, not an empty GPU");

    let t4 = backend(dir.path(), "Tesla T4");
    assert!(t4.mig().is_none(), "no profile table, no MIG");
    assert_eq!(t4.discover().unwrap().devices.len(), 2, "whole GPUs");
}
