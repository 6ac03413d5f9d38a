//! TimeSlicing: compute mode and interval set through the stand-ins, recorded before they
//! are changed, restored on unprepare, rollback and recovery; bad input fails one claim.

use super::*;
use crate::gpu::ComputeMode;
use crate::inventory::MigInfo;

const GPU0: &str = "GPU-00000000-aaaa-bbbb-cccc-000000000000";

fn time_slicing(requests: &[&str], interval: &str) -> serde_json::Value {
    json!({"source": "FromClaim", "requests": requests, "opaque": {"driver": DRIVER, "parameters":
        {"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig",
         "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}}}}})
}

#[tokio::test]
async fn time_slicing_sets_compute_mode_and_interval_and_unprepare_restores_them() {
    let f = Fixture::new();
    f.modes.set_compute_mode(GPU0, ComputeMode::ExclusiveProcess).unwrap();
    f.claims.put(claim(
        UID1,
        "ts",
        &[("gpu", DRIVER, NODE, "gpu-0", false), ("alt/one", DRIVER, NODE, "gpu-1", false)],
        json!([time_slicing(&["gpu"], "Long")]),
    ));
    ok(&f.preparer.prepare(vec![cref(UID1, "ts")]).await, UID1);
    assert_eq!(f.modes.mode(GPU0), ComputeMode::Default);
    assert_eq!(f.smi.calls(), [format!("compute-policy -i {GPU0} --set-timeslice=3")]);
    assert_eq!(f.modes.sets().len(), 2, "gpu-1 (Exclusive) is not touched: {:?}", f.modes.sets());
    let changes = f.preparer.store().gpu_changes().unwrap();
    assert_eq!(changes.len(), 1);
    assert_eq!((changes[0].uuid.as_str(), changes[0].claim.as_str()), (GPU0, UID1));
    assert_eq!(changes[0].previous_compute_mode, ComputeMode::ExclusiveProcess);
    assert_eq!(changes[0].timeslice, Some(3));
    // A repeated prepare answers from state and changes nothing more.
    ok(&f.preparer.prepare(vec![cref(UID1, "ts")]).await, UID1);
    assert_eq!(f.smi.calls().len(), 1);

    assert_eq!(f.preparer.unprepare(vec![cref(UID1, "ts")]).await[UID1], Ok(()));
    assert_eq!(f.modes.mode(GPU0), ComputeMode::ExclusiveProcess, "the previous mode is back");
    let counted = f.preparer.gpu_change_counts().snapshot();
    assert_eq!(
        counted,
        [("compute_mode", "ok", 2), ("compute_mode", "failed", 0), ("timeslice", "ok", 2), ("timeslice", "failed", 0)]
    );
    assert_eq!(f.smi.calls().last().unwrap(), &format!("compute-policy -i {GPU0} --set-timeslice=0"));
    assert!(f.preparer.store().gpu_changes().unwrap().is_empty());
    assert!(f.preparer.store().claim(UID1).unwrap().is_none());
}

#[tokio::test]
async fn a_failing_nvidia_smi_fails_the_claim_and_rolls_the_gpu_back() {
    let f = Fixture::new();
    f.modes.set_compute_mode(GPU0, ComputeMode::Prohibited).unwrap();
    f.smi.fail("--set-timeslice=2", "Unable to set timeslice: Insufficient Permissions");
    f.claims.put(claim(UID1, "ts", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([time_slicing(&[], "Medium")])));
    f.claims.put(claim(UID2, "plain", &[("gpu", DRIVER, NODE, "gpu-1", false)], json!([])));
    let r = f.preparer.prepare(vec![cref(UID1, "ts"), cref(UID2, "plain")]).await;
    let e = err(&r, UID1);
    let command = format!("{} compute-policy -i {GPU0} --set-timeslice=2", f.smi.path.display());
    assert!(e.contains(&command), "{e}");
    assert!(e.contains("exit status 4") && e.contains("Insufficient Permissions"), "{e}");
    ok(&r, UID2);
    assert_eq!(f.modes.mode(GPU0), ComputeMode::Prohibited, "the compute mode is put back");
    assert_eq!(f.preparer.gpu_change_counts().snapshot()[3], ("timeslice", "failed", 1));
    assert_eq!(f.smi.calls().last().unwrap(), &format!("compute-policy -i {GPU0} --set-timeslice=0"));
    let store = f.preparer.store();
    assert!(store.claim(UID1).unwrap().is_none() && store.holder("gpu-0").unwrap().is_none());
    assert!(store.gpu_changes().unwrap().is_empty());
    assert!(!f.preparer.settings().spec_path(UID1).exists());

    // NVML refusing the compute mode fails the claim before nvidia-smi runs.
    f.smi.heal();
    *f.modes.fail_for.lock().unwrap() = Some(GPU0.into());
    let calls = f.smi.calls().len();
    let e = err(&f.preparer.prepare(vec![cref(UID1, "ts")]).await, UID1);
    assert!(e.contains("nvmlDeviceGetComputeMode") && e.contains(GPU0), "{e}");
    assert_eq!(f.smi.calls().len(), calls);
    assert!(store.gpu_changes().unwrap().is_empty());
}

#[tokio::test]
async fn bad_sharing_input_fails_only_its_claim_and_leaves_the_gpu_alone() {
    let f = Fixture::new();
    let mps_block = json!([{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters":
        {"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig",
         "sharing": {"strategy": "TimeSlicing", "mps": {"defaultActiveThreadPercentage": 50}}}}}]);
    f.claims.put(claim(UID1, "mps-block", &[("gpu", DRIVER, NODE, "gpu-0", false)], mps_block));
    // One device reached through two requests whose configs disagree.
    f.claims.put(claim(
        UID2,
        "disagree",
        &[("gpu", DRIVER, NODE, "gpu-0", true), ("alt/one", DRIVER, NODE, "gpu-0", true)],
        json!([time_slicing(&["alt"], "Short")]),
    ));
    f.claims.put(claim(UID3, "fine", &[("gpu", DRIVER, NODE, "gpu-1", false)], json!([])));
    let r = f.preparer.prepare(vec![cref(UID1, "mps-block"), cref(UID2, "disagree"), cref(UID3, "fine")]).await;
    let e = err(&r, UID1);
    assert!(e.contains("sharing.mps is set but sharing.strategy is not MPS"), "{e}");
    let e = err(&r, UID2);
    assert!(e.contains("device gpu-0 is allocated to requests gpu and alt/one with different GpuConfigs"), "{e}");
    ok(&r, UID3);

    // TimeSlicing on a MIG device.
    let mut inv = (**f.inventory_tx.borrow()).clone();
    let mut mig = inv.devices[0].clone();
    mig.name = "gpu-0-mig-1-0".into();
    mig.uuid = "MIG-11111111-2222-3333-4444-555555555555".into();
    mig.kind = DeviceKind::Mig(MigInfo {
        parent_uuid: GPU0.into(),
        parent_minor: 0,
        parent_index: 0,
        gi: 1,
        ci: 0,
        profile: "1g.10gb".into(),
    });
    inv.devices.push(mig);
    f.inventory_tx.send_replace(Arc::new(inv));
    let uid4 = "4a4a4a4a-4a4a-4a4a-8a4a-4a4a4a4a4a4a";
    f.claims.put(claim(
        uid4,
        "mig",
        &[("gpu", DRIVER, NODE, "gpu-0-mig-1-0", false)],
        json!([time_slicing(&[], "Long")]),
    ));
    let e = err(&f.preparer.prepare(vec![cref(uid4, "mig")]).await, uid4);
    assert!(e.contains("TimeSlicing (request gpu) cannot apply to MIG device gpu-0-mig-1-0"), "{e}");

    // nvidia-smi missing: the error names the path looked at and the key that sets it.
    std::fs::remove_file(&f.smi.path).unwrap();
    f.claims.put(claim(UID1, "ts", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([time_slicing(&[], "Long")])));
    let e = err(&f.preparer.prepare(vec![cref(UID1, "ts")]).await, UID1);
    assert!(e.contains(&f.smi.path.display().to_string()) && e.contains("paths.nvidia_smi"), "{e}");

    assert!(f.modes.sets().is_empty(), "no compute mode was changed: {:?}", f.modes.sets());
    assert!(f.smi.calls().is_empty(), "nvidia-smi never ran: {:?}", f.smi.calls());
    let store = f.preparer.store();
    assert!(store.gpu_changes().unwrap().is_empty());
    assert_eq!(store.claims().unwrap().iter().map(|c| c.uid.as_str()).collect::<Vec<_>>(), [UID3]);
}

#[tokio::test]
async fn a_gpu_time_sliced_for_one_claim_is_refused_to_another() {
    let f = Fixture::new();
    // Admin access does not hold the GPU, but its settings are one claim's at a time.
    f.claims.put(claim(UID1, "a", &[("gpu", DRIVER, NODE, "gpu-0", true)], json!([time_slicing(&[], "Short")])));
    f.claims.put(claim(UID2, "b", &[("gpu", DRIVER, NODE, "gpu-0", true)], json!([time_slicing(&[], "Long")])));
    ok(&f.preparer.prepare(vec![cref(UID1, "a")]).await, UID1);
    let e = err(&f.preparer.prepare(vec![cref(UID2, "b")]).await, UID2);
    assert!(e.contains(&format!("GPU {GPU0} has its compute mode or time-slice set for claim UID {UID1}")), "{e}");
    assert_eq!(f.smi.calls(), [format!("compute-policy -i {GPU0} --set-timeslice=1")], "b changed nothing");
    assert_eq!(f.preparer.store().gpu_changes().unwrap()[0].claim, UID1);
}

#[tokio::test]
async fn recovery_sets_a_prepared_claims_gpu_settings_again() {
    let f = Fixture::new();
    f.modes.set_compute_mode(GPU0, ComputeMode::ExclusiveProcess).unwrap();
    f.claims.put(claim(UID1, "ts", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([time_slicing(&[], "Short")])));
    ok(&f.preparer.prepare(vec![cref(UID1, "ts")]).await, UID1);
    // A reboot: the driver forgets compute modes and intervals.
    std::fs::remove_file(&f.modes.path).unwrap();
    let f = f.restart();
    f.modes.set_compute_mode(GPU0, ComputeMode::ExclusiveProcess).unwrap();
    let report = f.preparer.recover().unwrap();
    assert_eq!(report.gpus_reapplied, [UID1]);
    assert_eq!(f.modes.mode(GPU0), ComputeMode::Default);
    assert_eq!(f.smi.calls().last().unwrap(), &format!("compute-policy -i {GPU0} --set-timeslice=1"));
    // The mode recorded before the first change is the one restored.
    assert_eq!(f.preparer.unprepare(vec![cref(UID1, "ts")]).await[UID1], Ok(()));
    assert_eq!(f.modes.mode(GPU0), ComputeMode::ExclusiveProcess);
}

#[tokio::test]
async fn a_gpu_that_is_gone_does_not_block_the_unprepare() {
    let f = Fixture::new();
    f.claims.put(claim(UID1, "ts", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([time_slicing(&[], "Short")])));
    ok(&f.preparer.prepare(vec![cref(UID1, "ts")]).await, UID1);
    let calls = f.smi.calls().len();
    // gpu-0 falls off the bus: nvidia-smi would fail for it from now on.
    f.smi.fail(GPU0, "No devices were found");
    let mut inv = (**f.inventory_tx.borrow()).clone();
    inv.devices.retain(|d| d.name != "gpu-0");
    f.inventory_tx.send_replace(Arc::new(inv));
    assert_eq!(f.preparer.unprepare(vec![cref(UID1, "ts")]).await[UID1], Ok(()));
    assert_eq!(f.smi.calls().len(), calls, "nothing is run for a GPU that is gone");
    assert!(f.preparer.store().gpu_changes().unwrap().is_empty() && f.preparer.store().claims().unwrap().is_empty());
}
