//! Shares of one GPU: consumable-capacity allocations (share ID and consumed memory) and
//! replicas, accounted in the state; per-claim errors for what does not fit.

use super::*;

const GI: u64 = 1 << 30;
pub(super) const SHARE1: &str = "6de5d941-c79d-4a8a-ba10-668351620525";
pub(super) const SHARE2: &str = "1b4e28ba-2fa1-41d2-883f-0016d3cca427";
pub(super) const SHARE3: &str = "f47ac10b-58cc-4372-a567-0e02b2c3d479";
const UID4: &str = "3c2b1a09-8f7e-4d6c-9b5a-493827160504";

/// The fixture with gpu-0 and gpu-1 of 80Gi, and gpu-3 (published as four replicas by the
/// fixture's settings).
pub(super) fn fixture() -> Fixture {
    let f = Fixture::new();
    let dev = f.root.join("dev");
    std::fs::write(dev.join("nvidia3"), b"x").unwrap();
    let mut inv = (**f.inventory_tx.borrow()).clone();
    inv.devices.push(super::gpu(3, &dev));
    for d in &mut inv.devices {
        d.capacity.insert("memory".into(), 80 * GI);
    }
    f.inventory_tx.send_replace(Arc::new(inv));
    f
}

/// A claim whose results carry share IDs and consumed memory:
/// (request, device, share ID, consumed memory).
pub(super) fn shared_claim(
    uid: &str,
    name: &str,
    results: &[(&str, &str, &str, &str)],
    config: serde_json::Value,
) -> ResourceClaim {
    let results: Vec<_> = results
        .iter()
        .map(|(req, device, share, memory)| {
            json!({"request": req, "driver": DRIVER, "pool": NODE, "device": device, "shareID": share,
                   "consumedCapacity": {"memory": memory}})
        })
        .collect();
    let mut c = claim(uid, name, &[], json!([]));
    let alloc = c.status.as_mut().and_then(|s| s.allocation.as_mut()).unwrap();
    *alloc = serde_json::from_value(json!({"devices": {"results": results, "config": config}})).unwrap();
    c
}

#[tokio::test]
async fn shares_of_one_gpu_are_prepared_with_share_ids_until_its_memory_is_taken() {
    let f = fixture();
    f.claims.put(shared_claim(UID1, "a", &[("gpu", "gpu-0", SHARE1, "30Gi")], json!([])));
    f.claims.put(shared_claim(UID2, "b", &[("gpu", "gpu-0", SHARE2, "30Gi")], json!([])));
    f.claims.put(shared_claim(UID3, "c", &[("gpu", "gpu-0", SHARE3, "30720Mi")], json!([])));
    f.claims.put(claim(UID4, "whole", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([])));

    let r = f.preparer.prepare(vec![cref(UID1, "a"), cref(UID2, "b")]).await;
    let (a, b) = (ok(&r, UID1), ok(&r, UID2));
    assert_eq!(a[0].share_id.as_deref(), Some(SHARE1));
    assert_eq!(b[0].share_id.as_deref(), Some(SHARE2));
    assert_eq!(a[0].cdi_device_ids, [format!("k8s.gpu.edra.dev/claim={UID1}-gpu-0-{SHARE1}")]);
    assert_ne!(a[0].cdi_device_ids, b[0].cdi_device_ids);
    let spec: cdi::Spec = serde_json::from_slice(
        &std::fs::read(f.cdi_dir().join(format!("k8s.gpu.edra.dev-claim_{UID1}.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(spec.devices.iter().map(|d| d.name.clone()).collect::<Vec<_>>(), [format!("{UID1}-gpu-0-{SHARE1}")]);
    let mut shares: Vec<_> =
        f.preparer.store().shares_of("gpu-0").unwrap().into_iter().map(|s| (s.claim, s.memory)).collect();
    shares.sort();
    assert_eq!(shares, [(UID1.to_string(), 30 * GI), (UID2.to_string(), 30 * GI)]);

    // 20Gi are left: a third 30Gi share fails, naming the holders; so does an exclusive claim.
    let r = f.preparer.prepare(vec![cref(UID3, "c"), cref(UID4, "whole")]).await;
    let e = err(&r, UID3);
    assert!(e.contains("GPU gpu-0 has 20Gi of memory left") && e.contains("asks for 30Gi"), "{e}");
    assert!(e.contains("ns/a (30Gi)") && e.contains("ns/b (30Gi)"), "{e}");
    let e = err(&r, UID4);
    assert!(e.contains("device gpu-0 is already prepared for claim ns/a") || e.contains("for claim ns/b"), "{e}");
    assert!(f.preparer.store().claim(UID3).unwrap().is_none() && f.preparer.store().claim(UID4).unwrap().is_none());
    assert!(!f.cdi_dir().join(format!("k8s.gpu.edra.dev-claim_{UID3}.json")).exists());

    let held = f.preparer.shared_gpus();
    assert_eq!(held.borrow().iter().collect::<Vec<_>>(), ["gpu-0"], "the publisher keeps gpu-0's sharing");

    // Once one share is gone, the third fits; the whole GPU only after every share is gone.
    assert_eq!(f.preparer.unprepare(vec![cref(UID1, "a")]).await.get(UID1), Some(&Ok(())));
    ok(&f.preparer.prepare(vec![cref(UID3, "c")]).await, UID3);
    f.preparer.unprepare(vec![cref(UID2, "b"), cref(UID3, "c")]).await;
    assert!(f.preparer.store().shares_of("gpu-0").unwrap().is_empty());
    assert!(held.borrow().is_empty(), "no share left: the publisher may change gpu-0");
    ok(&f.preparer.prepare(vec![cref(UID4, "whole")]).await, UID4);
    // And a share cannot join an exclusive holder.
    f.claims.put(shared_claim(UID1, "a", &[("gpu", "gpu-0", SHARE1, "1Gi")], json!([])));
    let e = err(&f.preparer.prepare(vec![cref(UID1, "a")]).await, UID1);
    assert!(e.contains("device gpu-0 is already prepared for claim ns/whole"), "{e}");
}

#[tokio::test]
async fn the_shares_survive_a_restart_and_two_shares_of_one_claim_get_two_cdi_devices() {
    let f = fixture();
    let two = [("gpu", "gpu-0", SHARE1, "10Gi"), ("alt/one", "gpu-0", SHARE2, "10Gi")];
    f.claims.put(shared_claim(UID1, "a", &two, json!([])));
    let devices = ok(&f.preparer.prepare(vec![cref(UID1, "a")]).await, UID1);
    let ids: Vec<_> = devices.iter().map(|d| d.cdi_device_ids[0].clone()).collect();
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1]);
    let f = f.restart();
    assert_eq!(ok(&f.preparer.prepare(vec![cref(UID1, "a")]).await, UID1), devices, "answered from the state");
    let held: u64 = f.preparer.store().shares_of("gpu-0").unwrap().iter().map(|s| s.memory).sum();
    assert_eq!(held, 20 * GI);
    f.claims.put(shared_claim(UID2, "b", &[("gpu", "gpu-0", SHARE3, "61Gi")], json!([])));
    let e = err(&f.preparer.prepare(vec![cref(UID2, "b")]).await, UID2);
    assert!(e.contains("60Gi of memory left"), "{e}");
}

#[tokio::test]
async fn replicas_map_to_their_gpu_and_each_replica_has_one_holder() {
    let f = fixture();
    f.claims.put(claim(UID1, "a", &[("gpu", DRIVER, NODE, "gpu-3-replica-0", false)], json!([])));
    f.claims.put(claim(UID2, "b", &[("gpu", DRIVER, NODE, "gpu-3-replica-1", false)], json!([])));
    f.claims.put(claim(UID3, "c", &[("gpu", DRIVER, NODE, "gpu-3-replica-1", false)], json!([])));
    f.claims.put(claim(UID4, "d", &[("gpu", DRIVER, NODE, "gpu-3", false)], json!([])));
    let r = f.preparer.prepare(vec![cref(UID1, "a"), cref(UID2, "b")]).await;
    let a = ok(&r, UID1);
    ok(&r, UID2);
    assert_eq!(a[0].cdi_device_ids, [format!("k8s.gpu.edra.dev/claim={UID1}-gpu-3-replica-0")]);
    let spec: cdi::Spec = serde_json::from_slice(
        &std::fs::read(f.cdi_dir().join(format!("k8s.gpu.edra.dev-claim_{UID1}.json"))).unwrap(),
    )
    .unwrap();
    let nodes: Vec<_> = spec.devices[0].container_edits.device_nodes.iter().map(|n| n.path.clone()).collect();
    assert!(nodes[0].ends_with("/nvidia3"), "the replica is GPU 3: {nodes:?}");
    let r = f.preparer.prepare(vec![cref(UID3, "c"), cref(UID4, "d")]).await;
    assert!(err(&r, UID3).contains("device gpu-3-replica-1 is already prepared for claim ns/b"));
    assert!(err(&r, UID4).contains("device gpu-3 is already prepared for claim"), "{}", err(&r, UID4));
    assert_eq!(f.preparer.store().shares_of("gpu-3").unwrap().iter().map(|s| s.memory).sum::<u64>(), 40 * GI);
    // Replicas beyond sharing.replicas, or of a GPU the settings do not share, do not exist.
    f.claims.put(claim(UID3, "c", &[("gpu", DRIVER, NODE, "gpu-1-replica-4", false)], json!([])));
    assert!(
        err(&f.preparer.prepare(vec![cref(UID3, "c")]).await, UID3)
            .contains("device gpu-1-replica-4 is not on this node")
    );
    let f = f.restart_with(|s| s.sharing.gpus = crate::sharing::GpuSelection::Listed(vec!["gpu-3".into()]));
    f.claims.put(claim(UID3, "c", &[("gpu", DRIVER, NODE, "gpu-1-replica-0", false)], json!([])));
    assert!(
        err(&f.preparer.prepare(vec![cref(UID3, "c")]).await, UID3)
            .contains("device gpu-1-replica-0 is not on this node")
    );
}

#[tokio::test]
async fn bad_shares_fail_their_claim_only() {
    let f = fixture();
    let ts = json!([{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters":
        {"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}}}]);
    f.claims.put(shared_claim(UID1, "bad-id", &[("gpu", "gpu-0", "../../etc", "1Gi")], json!([])));
    f.claims.put(shared_claim(UID2, "bad-memory", &[("gpu", "gpu-0", SHARE2, "81Gi")], json!([])));
    f.claims.put(shared_claim(UID3, "ts-on-share", &[("gpu", "gpu-0", SHARE3, "10Gi")], ts.clone()));
    f.claims.put(shared_claim(UID4, "ts-whole", &[("gpu", "gpu-1", SHARE1, "80Gi")], ts));
    let r = f
        .preparer
        .prepare(vec![
            cref(UID1, "bad-id"),
            cref(UID2, "bad-memory"),
            cref(UID3, "ts-on-share"),
            cref(UID4, "ts-whole"),
        ])
        .await;
    assert!(
        err(&r, UID1).contains("share ID \"../../etc\", which is not a lowercase RFC 4122 UUID"),
        "{}",
        err(&r, UID1)
    );
    assert!(err(&r, UID2).contains("consumes \"81Gi\" of memory") && err(&r, UID2).contains("GPU's 80Gi"));
    let e = err(&r, UID3);
    assert!(
        e.contains("sharing strategy TimeSlicing (request gpu) cannot apply to gpu-0, a share of GPU gpu-0"),
        "{e}"
    );
    // A share of the whole memory is the GPU alone: its strategy is the claim's to choose.
    ok(&r, UID4);
    assert_eq!(f.smi.calls().len(), 1, "time-slice set once, for the whole-GPU share: {:?}", f.smi.calls());
    assert!(f.preparer.store().shares_of("gpu-0").unwrap().is_empty());
}

/// The fixture with `sharing.timeslice = Medium` (timeslicing enforcement); gpu-0's compute mode starts as
/// EXCLUSIVE_PROCESS so its put-back shows.
fn time_sliced_fixture() -> Fixture {
    let f = fixture().restart_with(|s| {
        s.sharing.enforcement = crate::sharing::Enforcement::TimeSlicing(crate::device_config::Interval::Medium)
    });
    f.modes.set_compute_mode(GPU0, ComputeMode::ExclusiveProcess).unwrap();
    f
}

const GPU0: &str = "GPU-00000000-aaaa-bbbb-cccc-000000000000";
use crate::gpu::ComputeMode;

#[tokio::test]
async fn a_shared_gpu_is_time_sliced_by_its_first_share_and_put_back_after_its_last() {
    let f = time_sliced_fixture();
    f.claims.put(shared_claim(UID1, "a", &[("gpu", "gpu-0", SHARE1, "30Gi")], json!([])));
    f.claims.put(shared_claim(UID2, "b", &[("gpu", "gpu-0", SHARE2, "30Gi")], json!([])));
    ok(&f.preparer.prepare(vec![cref(UID1, "a")]).await, UID1);
    ok(&f.preparer.prepare(vec![cref(UID2, "b")]).await, UID2);
    assert_eq!(f.smi.calls(), [format!("compute-policy -i {GPU0} --set-timeslice=2")], "set once, by the first share");
    assert_eq!(f.modes.mode(GPU0), ComputeMode::Default);
    let changes = f.preparer.store().gpu_changes().unwrap();
    assert_eq!(changes.iter().map(|c| c.claim.as_str()).collect::<Vec<_>>(), ["shared:gpu-0"]);

    f.preparer.unprepare(vec![cref(UID1, "a")]).await;
    assert_eq!(f.smi.calls().len(), 1, "a share is left: the GPU stays time-sliced");
    assert_eq!(f.preparer.unprepare(vec![cref(UID2, "b")]).await.get(UID2), Some(&Ok(())));
    assert_eq!(
        f.smi.calls().last().map(String::as_str),
        Some(format!("compute-policy -i {GPU0} --set-timeslice=0").as_str())
    );
    assert_eq!(f.modes.mode(GPU0), ComputeMode::ExclusiveProcess, "the mode before the first share is back");
    assert!(f.preparer.store().gpu_changes().unwrap().is_empty());
}

#[tokio::test]
async fn recovery_puts_back_a_shared_gpu_whose_last_share_went_before_a_crash_and_keeps_a_held_one() {
    let f = time_sliced_fixture();
    f.claims.put(shared_claim(UID1, "a", &[("gpu", "gpu-0", SHARE1, "30Gi")], json!([])));
    f.claims.put(shared_claim(UID2, "b", &[("gpu", "gpu-1", SHARE2, "30Gi")], json!([])));
    ok(&f.preparer.prepare(vec![cref(UID1, "a"), cref(UID2, "b")]).await, UID1);
    // A crash between the release of gpu-0's last share and its put-back.
    f.preparer.store().remove_claim(UID1).unwrap();
    let f = f.restart();
    f.preparer.recover().unwrap();
    assert_eq!(f.modes.mode(GPU0), ComputeMode::ExclusiveProcess, "gpu-0 put back");
    let holders: Vec<_> = f.preparer.store().gpu_changes().unwrap().into_iter().map(|c| c.claim).collect();
    assert_eq!(holders, ["shared:gpu-1"], "gpu-1 still has its share");
    let sets = f.smi.calls().iter().filter(|c| c.contains("GPU-00000001") && c.ends_with("=2")).count();
    assert_eq!(sets, 2, "gpu-1's time-slice set again at recovery: {:?}", f.smi.calls());
}

#[tokio::test]
async fn a_failing_time_slice_fails_the_first_share_and_leaves_the_gpu_as_it_was() {
    let f = time_sliced_fixture();
    f.smi.fail("--set-timeslice=2", "Insufficient Permissions");
    f.claims.put(shared_claim(UID1, "a", &[("gpu", "gpu-0", SHARE1, "30Gi")], json!([])));
    let e = err(&f.preparer.prepare(vec![cref(UID1, "a")]).await, UID1);
    assert!(e.contains("set the time-slice") && e.contains("Insufficient Permissions"), "{e}");
    assert_eq!(f.modes.mode(GPU0), ComputeMode::ExclusiveProcess);
    assert!(f.preparer.store().gpu_changes().unwrap().is_empty());
    assert!(f.preparer.store().shares_of("gpu-0").unwrap().is_empty());
    f.smi.heal();
    ok(&f.preparer.prepare(vec![cref(UID1, "a")]).await, UID1);
}

#[tokio::test]
async fn a_share_of_a_gpu_time_sliced_for_its_shares_is_released_durably() {
    let f = time_sliced_fixture().restart_without_flusher();
    f.claims.put(shared_claim(UID1, "a", &[("gpu", "gpu-0", SHARE1, "30Gi")], json!([])));
    f.claims.put(shared_claim(UID2, "b", &[("gpu", "gpu-0", SHARE2, "30Gi")], json!([])));
    ok(&f.preparer.prepare(vec![cref(UID1, "a"), cref(UID2, "b")]).await, UID1);
    let flushes = f.preparer.store().flushes();
    assert_eq!(f.preparer.unprepare(vec![cref(UID1, "a")]).await.get(UID1), Some(&Ok(())));
    assert!(f.preparer.store().flushes() > flushes, "edra set the GPU up for its shares: the release is durable");
    // On disk at once: a's share coming back after a crash would be counted against gpu-0.
    let (_copy, crashed) = crate::state::tests::as_on_disk(&f.root.join("state"));
    assert_eq!(crashed.claim(UID1).unwrap(), None);
    let holders: Vec<String> = crashed.shares_of("gpu-0").unwrap().into_iter().map(|h| h.claim).collect();
    assert_eq!(holders, [UID2]);
    assert_eq!(f.smi.calls().len(), 1, "b still holds a share: the GPU stays time-sliced");
}

#[tokio::test]
async fn shares_edra_does_not_publish_are_refused_naming_the_device_the_field_and_the_rule() {
    // The fixture publishes gpu-0 with validRange {min: 1Gi, step: 1Gi} (sharing.memory_step).
    let f = fixture();
    let odd = [(UID1, "zero", "0"), (UID2, "small", "100Mi"), (UID3, "between", "1500Mi")];
    for (uid, name, memory) in odd {
        f.claims.put(shared_claim(uid, name, &[("gpu", "gpu-0", SHARE1, memory)], json!([])));
    }
    f.claims.put(shared_claim(UID4, "fits", &[("gpu", "gpu-0", SHARE2, "2048Mi")], json!([])));
    let refs: Vec<_> = odd.iter().map(|(uid, name, _)| cref(uid, name)).chain([cref(UID4, "fits")]).collect();
    let r = f.preparer.prepare(refs).await;
    for (uid, _, memory) in odd {
        let e = err(&r, uid);
        assert!(
            e.contains(&format!("the allocation of device gpu-0 has consumedCapacity memory \"{memory}\""))
                && e.contains("requestPolicy validRange {min: 1Gi, step: 1Gi} (sharing.memory_step)"),
            "{e}"
        );
        assert!(f.preparer.store().claim(uid).unwrap().is_none());
    }
    ok(&r, UID4);
    let held: Vec<_> = f.preparer.store().shares_of("gpu-0").unwrap().into_iter().map(|s| s.memory).collect();
    assert_eq!(held, [2 * GI], "only the published share is held");
}

#[tokio::test]
async fn a_device_or_share_allocated_twice_is_refused_in_one_claim_and_across_claims() {
    let f = fixture();
    // 500 identical whole-GPU results.
    let many = vec![("gpu", DRIVER, NODE, "gpu-1", false); 500];
    f.claims.put(claim(UID1, "many", &many, json!([])));
    // One share ID twice in one claim.
    let twice = [("gpu", "gpu-0", SHARE1, "10Gi"), ("alt/one", "gpu-0", SHARE1, "10Gi")];
    f.claims.put(shared_claim(UID2, "twice", &twice, json!([])));
    // Admin access may name a device more than once, as the API allows.
    let admin = [("gpu", DRIVER, NODE, "gpu-3", true), ("alt/one", DRIVER, NODE, "gpu-3", true)];
    f.claims.put(claim(UID3, "admin", &admin, json!([])));
    let r = f.preparer.prepare(vec![cref(UID1, "many"), cref(UID2, "twice"), cref(UID3, "admin")]).await;
    let e = err(&r, UID1);
    assert!(e.contains("device gpu-1 is allocated twice in the claim (requests gpu and gpu)"), "{e}");
    let e = err(&r, UID2);
    assert!(e.contains(&format!("device gpu-0 with share ID {SHARE1} is allocated twice in the claim")), "{e}");
    assert!(f.preparer.store().claim(UID1).unwrap().is_none() && f.preparer.store().claim(UID2).unwrap().is_none());
    assert_eq!(ok(&r, UID3).len(), 2);

    // The same share ID of gpu-0 in two claims: the second is refused, naming the first.
    f.claims.put(shared_claim(UID1, "first", &[("gpu", "gpu-0", SHARE1, "10Gi")], json!([])));
    f.claims.put(shared_claim(UID2, "second", &[("gpu", "gpu-0", SHARE1, "10Gi")], json!([])));
    ok(&f.preparer.prepare(vec![cref(UID1, "first")]).await, UID1);
    let e = err(&f.preparer.prepare(vec![cref(UID2, "second")]).await, UID2);
    assert!(e.contains(&format!("share {SHARE1} of device gpu-0 is already prepared for claim ns/first")), "{e}");
    let held: Vec<_> = f.preparer.store().shares_of("gpu-0").unwrap().into_iter().map(|s| s.claim).collect();
    assert_eq!(held, [UID1]);
}

#[tokio::test]
async fn a_share_of_a_device_not_offered_as_shares_is_refused_naming_the_device_and_the_rule() {
    let f = fixture();
    let mut inv = (**f.inventory_tx.borrow()).clone();
    let mut mig = inv.devices[0].clone();
    mig.name = "gpu-0-mig-1g.18gb-0".into();
    mig.uuid = "MIG-00000000-aaaa-bbbb-cccc-000000000001".into();
    mig.kind = crate::inventory::DeviceKind::Mig(crate::inventory::MigInfo {
        parent_uuid: inv.devices[0].uuid.clone(),
        parent_minor: 0,
        parent_index: 0,
        gi: 1,
        ci: 0,
        profile: "1g.18gb".into(),
    });
    mig.capacity.insert("memory".into(), 18 * GI);
    inv.devices.push(mig);
    f.inventory_tx.send_replace(Arc::new(inv));
    // gpu-1 is shared no more; gpu-0 keeps its share of claim a while it is held.
    f.claims.put(shared_claim(UID1, "a", &[("gpu", "gpu-0", SHARE1, "10Gi")], json!([])));
    ok(&f.preparer.prepare(vec![cref(UID1, "a")]).await, UID1);
    let f = f.restart_with(|s| s.sharing.gpus = crate::sharing::GpuSelection::Listed(vec!["gpu-3".into()]));
    f.claims.put(shared_claim(UID2, "mig", &[("gpu", "gpu-0-mig-1g.18gb-0", SHARE2, "10Gi")], json!([])));
    f.claims.put(shared_claim(UID3, "off", &[("gpu", "gpu-1", SHARE3, "10Gi")], json!([])));
    f.claims.put(shared_claim(UID4, "replica", &[("gpu", "gpu-3-replica-1", SHARE2, "20Gi")], json!([])));
    let refs = vec![cref(UID2, "mig"), cref(UID3, "off"), cref(UID4, "replica")];
    let r = f.preparer.prepare(refs).await;
    let e = err(&r, UID2);
    assert!(
        e.contains(
            "device gpu-0-mig-1g.18gb-0 is not offered as shares (MIG devices are always exclusive): an allocation \
             with a share ID cannot be prepared"
        ),
        "{e}"
    );
    let e = err(&r, UID3);
    assert!(e.contains("device gpu-1 is not offered as shares (sharing.gpus does not select gpu-1"), "{e}");
    assert!(e.contains("select it with [sharing] (mode = \"shares\", gpus) and restart edra"), "{e}");
    let e = err(&r, UID4);
    assert!(e.contains("device gpu-3-replica-1 is not offered as shares (gpu-3-replica-1 is a replica"), "{e}");
    for uid in [UID2, UID3, UID4] {
        assert!(f.preparer.store().claim(uid).unwrap().is_none());
    }
    assert!(f.preparer.store().shares_of("gpu-1").unwrap().is_empty());
    // gpu-0 still has a share prepared: it stays published as shares, so a new one is prepared.
    f.claims.put(shared_claim(UID3, "b", &[("gpu", "gpu-0", SHARE3, "10Gi")], json!([])));
    ok(&f.preparer.prepare(vec![cref(UID3, "b")]).await, UID3);
    // With sharing off altogether, the rule named is the mode.
    let f = f.restart_with(|s| s.sharing.mode = crate::sharing::SharingMode::Exclusive);
    f.claims.put(shared_claim(UID4, "off", &[("gpu", "gpu-1", SHARE2, "10Gi")], json!([])));
    let e = err(&f.preparer.prepare(vec![cref(UID4, "off")]).await, UID4);
    assert!(e.contains("device gpu-1 is not offered as shares (sharing.mode is \"exclusive\""), "{e}");
}
