//! Lazy releases: a claim without hardware side effects is unprepared without waiting for
//! the disk, and a record that a crash brought back (or a claim deleted while the node was
//! down) does not refuse a later claim of its devices once the API server says it is gone.

use super::*;
use crate::state::tests::as_on_disk;
use crate::test_support::captured_logs::CapturedLogs;

fn spec_path(f: &Fixture, uid: &str) -> PathBuf {
    f.cdi_dir().join(format!("k8s.gpu.edra.dev-claim_{uid}.json"))
}

/// A fixture where claim c1 holds gpu-0, prepared, and claim c2 (not prepared) wants it.
async fn gpu0_prepared_for_c1_and_wanted_by_c2() -> Fixture {
    let f = Fixture::new();
    f.claims.put(claim(UID1, "c1", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([])));
    f.claims.put(claim(UID2, "c2", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([])));
    ok(&f.preparer.prepare(vec![cref(UID1, "c1")]).await, UID1);
    f
}

#[tokio::test]
async fn an_unprepare_waits_for_no_flush_and_the_next_prepare_makes_it_durable() {
    let f = Fixture::new().restart_without_flusher();
    let state = f.root.join("state");
    f.claims.put(claim(UID1, "c1", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([])));
    f.claims.put(claim(UID2, "c2", &[("gpu", DRIVER, NODE, "gpu-1", false)], json!([])));
    ok(&f.preparer.prepare(vec![cref(UID1, "c1")]).await, UID1);
    let flushes = f.preparer.store().flushes();
    assert_eq!(f.preparer.unprepare(vec![cref(UID1, "c1")]).await[UID1], Ok(()));
    assert_eq!(f.preparer.store().flushes(), flushes, "the release waited for no flush");
    assert!(!spec_path(&f, UID1).exists());
    assert!(f.preparer.store().claim(UID1).unwrap().is_none());
    let (_copy, crashed) = as_on_disk(&state);
    assert!(crashed.claim(UID1).unwrap().is_some(), "a kill -9 now would bring the record back");
    drop(crashed);
    // The next durable change carries the release to the disk.
    ok(&f.preparer.prepare(vec![cref(UID2, "c2")]).await, UID2);
    let (_copy, crashed) = as_on_disk(&state);
    assert_eq!((crashed.claim(UID1).unwrap(), crashed.holder("gpu-0").unwrap()), (None, None));
    assert!(crashed.claim(UID2).unwrap().is_some());
}

#[tokio::test]
async fn a_time_sliced_claim_is_still_released_durably() {
    let f = Fixture::new().restart_without_flusher();
    let config = json!([{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters":
        {"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig",
         "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}}}}}]);
    f.claims.put(claim(UID1, "ts", &[("gpu", DRIVER, NODE, "gpu-0", false)], config));
    ok(&f.preparer.prepare(vec![cref(UID1, "ts")]).await, UID1);
    let flushes = f.preparer.store().flushes();
    assert_eq!(f.preparer.unprepare(vec![cref(UID1, "ts")]).await[UID1], Ok(()));
    assert!(f.preparer.store().flushes() > flushes);
    let (_copy, crashed) = as_on_disk(&f.root.join("state"));
    assert_eq!(crashed.claim(UID1).unwrap(), None, "recovery would set the GPU up again for it");
    assert_eq!(crashed.gpu_changes().unwrap(), Vec::new());
}

#[tokio::test]
async fn a_holder_gone_from_the_api_server_is_released_for_the_claim_that_needs_its_device() {
    let (logs, _guard) = CapturedLogs::start_at("info");
    let f = Fixture::new();
    f.claims.put(claim(UID1, "c1", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([])));
    ok(&f.preparer.prepare(vec![cref(UID1, "c1")]).await, UID1);
    // Deleted while its record stays: an unprepare lost to a crash, or a node that was down.
    f.claims.delete("ns", "c1");
    f.claims.put(claim(UID2, "c2", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([])));
    ok(&f.preparer.prepare(vec![cref(UID2, "c2")]).await, UID2);
    assert!(f.preparer.store().claim(UID1).unwrap().is_none());
    assert!(!spec_path(&f, UID1).exists());
    assert_eq!(f.preparer.store().holder("gpu-0").unwrap().as_deref(), Some(UID2));
    let text = logs.text();
    let said = format!(
        "released claim ns/c1 (UID {UID1}), prepared on this node but gone: the ResourceClaim no longer exists; \
         its devices are free again for claim ns/c2"
    );
    assert!(text.contains(&said) && text.contains("WARN"), "{text}");
}

#[tokio::test]
async fn a_holder_still_reserved_refuses_the_claim_and_is_named() {
    let f = gpu0_prepared_for_c1_and_wanted_by_c2().await;
    let e = err(&f.preparer.prepare(vec![cref(UID2, "c2")]).await, UID2);
    assert!(e.contains(&format!("device gpu-0 is already prepared for claim ns/c1, UID {UID1}")), "{e}");
    assert!(
        e.contains(&format!("the API server says claim ns/c1 (UID {UID1}) is still allocated and reserved for a pod")),
        "{e}"
    );
    assert_eq!(f.preparer.store().holder("gpu-0").unwrap().as_deref(), Some(UID1));
    assert!(spec_path(&f, UID1).exists() && !spec_path(&f, UID2).exists());
}

#[tokio::test]
async fn a_refusal_means_gone_only_to_a_node_identity() {
    let f = gpu0_prepared_for_c1_and_wanted_by_c2().await;
    f.claims.delete("ns", "c1");
    f.claims.refuse_missing.store(true, Ordering::SeqCst);
    // Who edra is was not learned yet: a refusal says nothing.
    let e = err(&f.preparer.prepare(vec![cref(UID2, "c2")]).await, UID2);
    assert!(e.contains(&format!("whether claim ns/c1 (UID {UID1}) is gone is unknown")), "{e}");
    assert!(f.preparer.store().claim(UID1).unwrap().is_some());
    // As this node, a refusal means no pod of the node uses the claim.
    f.preparer.learn_node_identity(true);
    ok(&f.preparer.prepare(vec![cref(UID2, "c2")]).await, UID2);
    assert!(f.preparer.store().claim(UID1).unwrap().is_none());
}

#[tokio::test]
async fn holdings_left_by_a_release_a_crash_cut_short_are_dropped_at_recovery() {
    use super::shares::{SHARE1, fixture, shared_claim};
    let (logs, _guard) = CapturedLogs::start_at("info");
    let f = fixture();
    f.claims.put(shared_claim(UID1, "share", &[("gpu", "gpu-0", SHARE1, "80Gi")], json!([])));
    f.claims.put(claim(UID2, "whole", &[("gpu", DRIVER, NODE, "gpu-1", false)], json!([])));
    let r = f.preparer.prepare(vec![cref(UID1, "share"), cref(UID2, "whole")]).await;
    ok(&r, UID1);
    ok(&r, UID2);
    // A lazy release removes the record first; a crash before its holdings leaves them.
    f.preparer.store().raw_remove("claims", UID1.as_bytes());
    f.preparer.store().raw_remove("claims", UID2.as_bytes());
    let f = f.restart();
    f.preparer.recover().unwrap();
    let store = f.preparer.store();
    assert_eq!(store.holder("gpu-1").unwrap(), None);
    assert!(store.shares_of("gpu-0").unwrap().is_empty());
    assert!(!spec_path(&f, UID1).exists() && !spec_path(&f, UID2).exists(), "specs without a record go too");
    let text = logs.text();
    assert!(text.contains("dropped the holdings of gpu-0, gpu-1 left by a release that a crash cut short"), "{text}");
    // The whole of both GPUs is there for the next claims.
    f.claims.put(shared_claim(UID3, "next", &[("gpu", "gpu-0", SHARE1, "80Gi")], json!([])));
    ok(&f.preparer.prepare(vec![cref(UID3, "next")]).await, UID3);
}

#[tokio::test]
async fn a_holder_whose_lock_stays_taken_is_kept_and_named_after_the_wait() {
    let f = gpu0_prepared_for_c1_and_wanted_by_c2().await;
    f.claims.delete("ns", "c1");
    // c1 is being unprepared right now (say nvidia-smi hangs): its lock stays taken.
    let busy = f.preparer.inner.locks.lock(UID1).await;
    let started = std::time::Instant::now();
    let e = err(&f.preparer.prepare(vec![cref(UID2, "c2")]).await, UID2);
    assert!(started.elapsed() >= stale::HOLDER_LOCK_WAIT, "waited {:?}", started.elapsed());
    assert!(
        e.contains(&format!(
            "claim UID {UID1} is being prepared or unprepared right now (its lock stayed taken for 5s)"
        )),
        "{e}"
    );
    assert!(f.preparer.store().claim(UID1).unwrap().is_some(), "not released under its owner's feet");
    drop(busy);
    // Once the lock is free, the kubelet's retry finds c1 gone and releases it.
    ok(&f.preparer.prepare(vec![cref(UID2, "c2")]).await, UID2);
    assert!(f.preparer.store().claim(UID1).unwrap().is_none());
}

#[tokio::test]
async fn a_holding_without_its_record_does_not_hide_the_verdict_on_a_live_holder() {
    let f = Fixture::new();
    f.claims.put(claim(UID1, "c1", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([])));
    f.claims.put(claim(UID3, "c3", &[("gpu", DRIVER, NODE, "gpu-1", false)], json!([])));
    let both = [("gpu", DRIVER, NODE, "gpu-0", false), ("gpu", DRIVER, NODE, "gpu-1", false)];
    f.claims.put(claim(UID2, "c2", &both, json!([])));
    let r = f.preparer.prepare(vec![cref(UID1, "c1"), cref(UID3, "c3")]).await;
    ok(&r, UID1);
    ok(&r, UID3);
    // c3's release was cut short between its record and its holding of gpu-1.
    f.preparer.store().raw_remove("claims", UID3.as_bytes());
    let e = err(&f.preparer.prepare(vec![cref(UID2, "c2")]).await, UID2);
    assert!(
        e.contains(&format!("the API server says claim ns/c1 (UID {UID1}) is still allocated and reserved for a pod")),
        "{e}"
    );
    assert!(!e.contains(UID3), "the orphaned holding is in nobody's way: {e}");
    assert_eq!(f.preparer.store().holder("gpu-0").unwrap().as_deref(), Some(UID1));
}
