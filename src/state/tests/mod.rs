//! Tests of the store on real sled in temp dirs.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::time::Instant;

use super::db::META_SCHEMA;
use super::db::{db_err, plain_io};
use super::*;
use crate::device_config::GpuConfig;

pub(super) fn device(name: &str, admin: bool) -> DeviceRecord {
    DeviceRecord {
        request: "gpu".into(),
        request_names: vec!["gpu".into()],
        device: name.into(),
        pool: "node-a".into(),
        cdi_ids: vec![format!("k8s.gpu.edra.dev/claim=x-{name}")],
        admin_access: admin,
        share_id: None,
        share: None,
        mig: None,
        config: GpuConfig::default(),
    }
}

pub(super) fn record(uid: &str, devices: Vec<DeviceRecord>) -> ClaimRecord {
    ClaimRecord {
        schema: SCHEMA_VERSION,
        uid: uid.into(),
        namespace: "ns".into(),
        name: format!("claim-{uid}"),
        phase: Phase::PrepareStarted,
        devices,
        cdi_spec_path: format!("/run/cdi/{uid}.json").into(),
        created_at: 1,
        boot_id: "b".into(),
    }
}

#[test]
fn open_creates_a_private_directory_and_reopens_with_data() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a/state");
    {
        let s = Store::open(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        s.put_claim(&record("u1", vec![device("gpu-0", false)])).unwrap();
        s.set_boot_id("boot-1").unwrap();
    }
    let s = Store::open(&dir).unwrap();
    assert_eq!(s.claim("u1").unwrap().unwrap().devices[0].device, "gpu-0");
    assert_eq!(s.holder("gpu-0").unwrap().as_deref(), Some("u1"));
    assert_eq!(s.boot_id().unwrap().as_deref(), Some("boot-1"));
    assert!(dir.join("db").exists() && dir.join("conf").exists(), "sled's files are where make_durable syncs them");
}

#[test]
fn exclusive_devices_name_the_holder_and_admin_access_is_exempt() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Store::open(tmp.path()).unwrap();
    s.put_claim(&record("u1", vec![device("gpu-0", false)])).unwrap();
    let err = s.put_claim(&record("u2", vec![device("gpu-1", false), device("gpu-0", false)])).unwrap_err();
    assert!(matches!(&err, StateError::DeviceHeld { device, holder, .. } if device == "gpu-0" && holder == "u1"));
    assert!(err.to_string().contains("claim ns/claim-u1, UID u1"), "{err}");
    // The failed transaction left nothing behind.
    assert!(s.claim("u2").unwrap().is_none());
    assert!(s.holder("gpu-1").unwrap().is_none());
    // Admin access neither conflicts nor holds.
    s.put_claim(&record("u3", vec![device("gpu-0", true)])).unwrap();
    assert_eq!(s.holder("gpu-0").unwrap().as_deref(), Some("u1"));
    // The same claim again (e.g. PrepareCompleted) is fine.
    let mut again = record("u1", vec![device("gpu-0", false)]);
    again.phase = Phase::PrepareCompleted;
    s.put_claim(&again).unwrap();
    assert_eq!(s.claim("u1").unwrap().unwrap().phase, Phase::PrepareCompleted);
}

#[test]
fn rewriting_a_claim_releases_devices_it_no_longer_has() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Store::open(tmp.path()).unwrap();
    s.put_claim(&record("u1", vec![device("gpu-0", false), device("gpu-1", false)])).unwrap();
    s.put_claim(&record("u1", vec![device("gpu-1", false)])).unwrap();
    assert!(s.holder("gpu-0").unwrap().is_none());
    assert_eq!(s.holder("gpu-1").unwrap().as_deref(), Some("u1"));
}

#[test]
fn remove_releases_devices_and_is_idempotent() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Store::open(tmp.path()).unwrap();
    s.put_claim(&record("u1", vec![device("gpu-0", false)])).unwrap();
    s.put_claim(&record("u2", vec![device("gpu-0", true)])).unwrap();
    assert_eq!(s.remove_claim("u1").unwrap().unwrap().uid, "u1");
    assert!(s.holder("gpu-0").unwrap().is_none());
    assert!(s.remove_claim("u1").unwrap().is_none());
    // Removing the admin-access claim does not touch another claim's holding.
    s.put_claim(&record("u4", vec![device("gpu-0", false)])).unwrap();
    s.remove_claim("u2").unwrap();
    assert_eq!(s.holder("gpu-0").unwrap().as_deref(), Some("u4"));
    assert_eq!(s.claims().unwrap().iter().map(|r| r.uid.as_str()).collect::<Vec<_>>(), ["u4"]);
}

#[test]
fn a_newer_store_schema_is_refused_with_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let s = Store::open(tmp.path()).unwrap();
        s.raw_insert("meta", META_SCHEMA, b"7");
    }
    let err = Store::open(tmp.path()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StateError::NewerSchema { found: 7, .. }));
    assert!(msg.contains(&tmp.path().display().to_string()) && msg.contains("upgrade edra"), "{msg}");
}

#[test]
fn a_newer_record_is_refused_and_current_ones_decode() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Store::open(tmp.path()).unwrap();
    let mut v = serde_json::to_value(record("u9", vec![])).unwrap();
    v["schema"] = 2.into();
    s.raw_insert("claims", b"u9", &serde_json::to_vec(&v).unwrap());
    let err = s.claim("u9").unwrap_err();
    assert!(matches!(&err, StateError::Record { source: RecordError::Newer { found: 2 }, .. }), "{err:?}");
    assert!(s.claims().is_err());
    // A record without a schema field predates version 1: no migration exists for it.
    v.as_object_mut().unwrap().remove("schema");
    assert!(matches!(
        record::decode_claim(&serde_json::to_vec(&v).unwrap()),
        Err(RecordError::NoMigration { found: 0 })
    ));
    let current = record::encode_claim(&record("u1", vec![device("gpu-0", false)]));
    assert_eq!(record::decode_claim(&current).unwrap().devices.len(), 1);
}

#[test]
fn open_errors_name_the_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let err = Store::open(&file.join("state")).unwrap_err();
    assert!(matches!(err, StateError::CreateDir { .. }));
    assert!(err.to_string().contains("not-a-dir/state"), "{err}");
    // A second open of a directory in use is refused by sled's file lock.
    let _held = Store::open(&tmp.path().join("s")).unwrap();
    let err = Store::open(&tmp.path().join("s")).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("another edra process"), "{msg}");
}

#[test]
fn corrupt_database_gives_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    {
        let s = Store::open(&dir).unwrap();
        s.put_claim(&record("u1", vec![device("gpu-0", false)])).unwrap();
    }
    std::fs::write(dir.join("conf"), b"garbage that is not sled's config").unwrap();
    let err = Store::open(&dir).unwrap_err();
    let msg = crate::util::error_chain(&err);
    assert!(msg.contains(&dir.display().to_string()) && msg.contains("move the state directory aside"), "{msg}");
}

/// Measures one durable commit (a two-tree transaction, flush, fsync). Run with
/// `--nocapture` to see the numbers.
#[test]
fn durable_commit_cost() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Store::open(tmp.path()).unwrap();
    let n = 50u32;
    let mut times = Vec::new();
    for i in 0..n {
        let r = record(&format!("u{i}"), vec![device(&format!("gpu-{i}"), false)]);
        let t = Instant::now();
        s.put_claim(&r).unwrap();
        times.push(t.elapsed());
    }
    times.sort();
    eprintln!(
        "durable commit over {n}: p50 {:?}, p90 {:?}, max {:?}",
        times[times.len() / 2],
        times[times.len() * 9 / 10],
        times[times.len() - 1]
    );
    assert_eq!(s.claims().unwrap().len(), n as usize);
}

#[test]
fn a_failed_sync_poisons_the_store_until_it_is_reopened_from_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Store::open(tmp.path()).unwrap();
    let id = s.id().unwrap();
    assert_eq!(id.len(), 32);
    s.put_claim(&record("u1", vec![device("gpu-0", false)])).unwrap();
    let health = s.health();
    assert!(health.borrow().is_none());

    s.fail_syncs_after(Some(0));
    let err = s.put_claim(&record("u2", vec![device("gpu-1", false)])).unwrap_err();
    assert!(matches!(err, StateError::Sync { .. }), "{err}");
    let reason = health.borrow().clone().expect("poisoned");
    assert!(reason.contains("cannot make edra's state durable") && reason.contains("no storage space"), "{reason}");
    // Nothing is answered from memory any more, not even what was durable before.
    for e in [s.claim("u2").unwrap_err(), s.claim("u1").unwrap_err(), s.holder("gpu-0").unwrap_err()] {
        assert!(matches!(e, StateError::Poisoned { .. }), "{e}");
        assert!(e.to_string().contains("free space or fix the disk"), "{e}");
    }
    assert!(matches!(s.remove_claim("u1").unwrap_err(), StateError::Poisoned { .. }));
    // While the disk still refuses, a re-open fails and the store stays poisoned.
    assert!(s.reopen().is_err());
    assert!(health.borrow().is_some());
    assert!(s.claim("u1").is_err());

    s.fail_syncs_after(None);
    s.reopen().unwrap();
    assert!(health.borrow().is_none());
    // What was durable is there; the same identity, because it is kept on disk.
    assert_eq!(s.holder("gpu-0").unwrap().as_deref(), Some("u1"));
    assert_eq!(s.id().unwrap(), id);
    // The change whose sync failed may or may not have reached the disk (sled writes on
    // close); whichever, records and holdings agree (recovery rolls back its phase).
    match s.claim("u2").unwrap() {
        Some(r) => {
            assert_eq!(r.phase, Phase::PrepareStarted);
            assert_eq!(s.holder("gpu-1").unwrap().as_deref(), Some("u2"));
        }
        None => assert!(s.holder("gpu-1").unwrap().is_none()),
    }
    s.put_claim(&record("u3", vec![device("gpu-2", false)])).unwrap();
    drop(s);
    let again = Store::open(tmp.path()).unwrap();
    assert_eq!(again.id().unwrap(), id);
    assert_eq!(again.holder("gpu-2").unwrap().as_deref(), Some("u3"));
}

#[test]
fn os_errors_that_sled_wraps_in_debug_text_read_plainly() {
    let wrapped = io::Error::new(
        io::ErrorKind::StorageFull,
        "Os { code: 28, kind: StorageFull, message: \"No space left on device\" }",
    );
    assert_eq!(plain_io(wrapped).to_string(), "No space left on device (os error 28)");
    let other = io::Error::other("something else");
    assert_eq!(plain_io(other).to_string(), "something else");
    let e = db_err("read a claim")(sled::Error::Io(io::Error::other("Os { code: 5, kind: Uncategorized }")));
    assert!(
        crate::util::error_chain(&e).ends_with("Input/output error (os error 5)"),
        "{}",
        crate::util::error_chain(&e)
    );
}

fn gpu_change(uuid: &str, claim: &str, previous: crate::gpu::ComputeMode) -> GpuChange {
    GpuChange {
        schema: GPU_CHANGE_SCHEMA,
        uuid: uuid.into(),
        device: "gpu-0".into(),
        claim: claim.into(),
        previous_compute_mode: previous,
        compute_mode: crate::gpu::ComputeMode::Default,
        timeslice: Some(2),
    }
}

#[test]
fn gpu_changes_are_one_claims_at_a_time_keep_the_first_mode_and_go_with_the_claim() {
    use crate::gpu::ComputeMode;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    {
        let s = Store::open(&dir).unwrap();
        s.put_claim(&record("u1", vec![device("gpu-0", false)])).unwrap();
        s.put_gpu_change(&gpu_change("GPU-a", "u1", ComputeMode::ExclusiveProcess)).unwrap();
        // A retried prepare of the same claim reads the mode edra itself set: the first is kept.
        let stored = s.put_gpu_change(&gpu_change("GPU-a", "u1", ComputeMode::Default)).unwrap();
        assert_eq!(stored.previous_compute_mode, ComputeMode::ExclusiveProcess);
        let e = s.put_gpu_change(&gpu_change("GPU-a", "u2", ComputeMode::Default)).unwrap_err();
        assert!(matches!(&e, StateError::GpuChanged { holder, .. } if holder == "u1"), "{e}");
        assert!(e.to_string().contains("GPU GPU-a has its compute mode or time-slice set for claim UID u1"), "{e}");
    }
    // Durable: a re-opened store has it.
    let s = Store::open(&dir).unwrap();
    assert_eq!(s.gpu_changes().unwrap(), [gpu_change("GPU-a", "u1", ComputeMode::ExclusiveProcess)]);
    s.put_claim(&record("u2", vec![device("gpu-1", false)])).unwrap();
    s.put_gpu_change(&gpu_change("GPU-b", "u2", ComputeMode::Default)).unwrap();
    // Removing a claim drops its changes only.
    s.remove_claim("u1").unwrap();
    let left: Vec<_> = s.gpu_changes().unwrap().into_iter().map(|c| c.uuid).collect();
    assert_eq!(left, ["GPU-b"]);
}

#[test]
fn a_newer_gpu_change_record_is_refused_with_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Store::open(&tmp.path().join("state")).unwrap();
    let mut v = serde_json::to_value(gpu_change("GPU-a", "u1", crate::gpu::ComputeMode::Default)).unwrap();
    v["schema"] = 9.into();
    s.raw_insert("gpu_changes", b"GPU-a", &serde_json::to_vec(&v).unwrap());
    let e = s.gpu_changes().unwrap_err();
    let msg = crate::util::error_chain(&e);
    assert!(msg.contains("GPU-a") && msg.contains("schema version 9") && msg.contains("upgrade edra"), "{msg}");
}

pub(super) fn share_of(name: &str, gpu: &str, memory: u64) -> DeviceRecord {
    DeviceRecord {
        share_id: Some(format!("{name}-0000-4000-8000-000000000000")),
        share: Some(ShareRecord { gpu: gpu.into(), memory, gpu_memory: 80 << 30 }),
        ..device(gpu, false)
    }
}

#[test]
fn an_unreadable_share_list_refuses_new_shares_of_its_gpu_until_rebuilt_from_the_claims() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Store::open(tmp.path()).unwrap();
    let mut a = record("a", vec![share_of("aaaaaaaa", "gpu-0", 50 << 30)]);
    a.phase = Phase::PrepareCompleted;
    s.put_claim(&a).unwrap();
    s.raw_insert("shares", b"gpu-0", b"{not a list");
    let err = s.shares_of("gpu-0").expect_err("an unreadable list is not an empty one");
    assert!(err.to_string().contains("share list of GPU gpu-0"), "{err}");
    // 50Gi are taken: a 50Gi share must not fit, whatever the list says.
    let b = record("b", vec![share_of("bbbbbbbb", "gpu-0", 50 << 30)]);
    let err = s.put_claim(&b).expect_err("no share is taken against an unknown list");
    assert!(err.to_string().contains("restart edra, which rebuilds the list"), "{err}");
    assert!(s.claim("b").unwrap().is_none());
    assert_eq!(s.rebuild_share_lists().unwrap(), ["gpu-0"]);
    assert_eq!(s.shares_of("gpu-0").unwrap().len(), 1, "a's share, from its record");
    assert!(matches!(s.put_claim(&b), Err(StateError::SharesExceed { .. })), "and it is accounted again");
    assert!(s.rebuild_share_lists().unwrap().is_empty(), "nothing left to rebuild");
    // A release goes on with an unreadable list (it is rebuilt at the next start).
    s.raw_insert("shares", b"gpu-0", b"[1,2");
    assert!(s.remove_claim("a").unwrap().is_some());
    assert_eq!(s.rebuild_share_lists().unwrap(), ["gpu-0"]);
    assert!(s.shares_of("gpu-0").unwrap().is_empty());
}

#[test]
fn concurrent_changes_share_one_flush_and_all_of_them_are_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Store::open(tmp.path()).unwrap();
    let before = s.flushes();
    let asked = s.durable_requests();
    let writers = s.holding_flushes(|| {
        let writers: Vec<_> = (0..8)
            .map(|i| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let mut r = record(&format!("g{i}"), vec![device(&format!("gpu-{i}"), false)]);
                    r.phase = Phase::PrepareCompleted;
                    s.put_claim(&r)
                })
            })
            .collect();
        // Every change is made and waits for a flush.
        let deadline = Instant::now() + std::time::Duration::from_secs(20);
        while s.durable_requests() < asked + 8 {
            assert!(Instant::now() < deadline, "the writers never asked for a flush");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        writers
    });
    for w in writers {
        w.join().expect("writer").expect("put_claim");
    }
    assert_eq!(s.flushes() - before, 1, "eight changes, one flush");
    // A change after them gets its own.
    let mut r = record("after", vec![device("gpu-9", false)]);
    r.phase = Phase::PrepareCompleted;
    s.put_claim(&r).unwrap();
    assert_eq!(s.flushes() - before, 2);
    drop(s);
    let s = Store::open(tmp.path()).unwrap();
    assert_eq!(s.claims().unwrap().len(), 9, "every change is on disk");
}

/// What a kill -9 would leave of the store in `dir` now: a copy of its files as they are,
/// opened as a store (without what sled holds in memory only).
pub(crate) fn as_on_disk(dir: &Path) -> (tempfile::TempDir, Store) {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), target).unwrap();
            }
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    copy(dir, &tmp.path().join("state"));
    let store = Store::open(&tmp.path().join("state")).unwrap();
    (tmp, store)
}

fn completed(uid: &str, device_name: &str) -> ClaimRecord {
    ClaimRecord { phase: Phase::PrepareCompleted, ..record(uid, vec![device(device_name, false)]) }
}

#[test]
fn a_lazy_removal_waits_for_no_flush_and_reaches_the_disk_with_the_next_durable_change() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let s = Store::open_without_flusher(&dir).unwrap();
    s.put_claim(&completed("u1", "gpu-0")).unwrap();
    let (flushes, asked) = (s.flushes(), s.durable_requests());
    assert_eq!(s.remove_claim_lazily("u1").unwrap().map(|r| r.uid).as_deref(), Some("u1"));
    assert_eq!((s.flushes(), s.durable_requests()), (flushes, asked), "no flush made or asked for");
    assert_eq!((s.claim("u1").unwrap(), s.holder("gpu-0").unwrap()), (None, None), "gone from memory at once");
    let (_copy, crashed) = as_on_disk(&dir);
    assert!(crashed.claim("u1").unwrap().is_some(), "not on disk yet: a kill -9 now brings the record back");
    assert_eq!(crashed.holder("gpu-0").unwrap().as_deref(), Some("u1"));
    drop(crashed);
    // The next durable change flushes (the lazy one counted for nothing) and carries it.
    s.put_claim(&completed("u2", "gpu-1")).unwrap();
    assert_eq!(s.flushes(), flushes + 1);
    let (_copy, crashed) = as_on_disk(&dir);
    assert_eq!((crashed.claim("u1").unwrap(), crashed.holder("gpu-0").unwrap()), (None, None));
    assert!(crashed.claim("u2").unwrap().is_some());
}

#[test]
fn a_flush_that_starts_after_a_lazy_removal_carries_it_and_later_changes_still_flush() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let s = Store::open_without_flusher(&dir).unwrap();
    s.put_claim(&completed("u1", "gpu-0")).unwrap();
    let (flushes, asked) = (s.flushes(), s.durable_requests());
    // A durable change waits for the flush; meanwhile a claim is removed lazily.
    let writer = s.holding_flushes(|| {
        let w = s.clone();
        let writer = std::thread::spawn(move || w.put_claim(&completed("u2", "gpu-1")));
        let deadline = Instant::now() + std::time::Duration::from_secs(20);
        while s.durable_requests() < asked + 1 {
            assert!(Instant::now() < deadline, "the writer never asked for a flush");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        s.remove_claim_lazily("u1").unwrap();
        writer
    });
    writer.join().expect("writer").expect("put_claim");
    assert_eq!(s.flushes(), flushes + 1);
    let (_copy, crashed) = as_on_disk(&dir);
    assert_eq!(crashed.claim("u1").unwrap(), None, "the writer's flush began after the lazy removal");
    drop(crashed);
    // The lazy removal made no later durable change skip its own flush.
    s.put_claim(&completed("u3", "gpu-2")).unwrap();
    assert_eq!(s.flushes(), flushes + 2);
    let (_copy, crashed) = as_on_disk(&dir);
    assert!(crashed.claim("u3").unwrap().is_some());
}

#[test]
fn a_lazy_removal_of_a_claim_with_gpu_changes_is_durable_all_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let s = Store::open_without_flusher(&dir).unwrap();
    s.put_claim(&completed("u1", "gpu-0")).unwrap();
    s.put_gpu_change(&gpu_change("GPU-a", "u1", crate::gpu::ComputeMode::Default)).unwrap();
    let flushes = s.flushes();
    s.remove_claim_lazily("u1").unwrap();
    assert_eq!(s.flushes(), flushes + 1);
    let (_copy, crashed) = as_on_disk(&dir);
    assert_eq!(crashed.claim("u1").unwrap(), None);
    assert_eq!(crashed.gpu_changes().unwrap(), Vec::new(), "a change record coming back would be set up again");
}

#[test]
fn a_lazy_removal_releases_shares_without_a_flush() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let s = Store::open_without_flusher(&dir).unwrap();
    let mut a = record("a", vec![share_of("aaaaaaaa", "gpu-0", 50 << 30), share_of("aaaaaaab", "gpu-0", 10 << 30)]);
    a.phase = Phase::PrepareCompleted;
    let mut b = record("b", vec![share_of("bbbbbbbb", "gpu-0", 20 << 30)]);
    b.phase = Phase::PrepareCompleted;
    s.put_claim(&a).unwrap();
    s.put_claim(&b).unwrap();
    let flushes = s.flushes();
    assert!(s.remove_claim_lazily("a").unwrap().is_some());
    assert_eq!(s.flushes(), flushes, "no flush");
    let left: Vec<String> = s.shares_of("gpu-0").unwrap().into_iter().map(|h| h.claim).collect();
    assert_eq!(left, ["b"], "both of a's shares went, b's stayed");
    // 60Gi are free again.
    let c = record("c", vec![share_of("cccccccc", "gpu-0", 60 << 30)]);
    s.put_claim(&c).unwrap();
    assert!(s.remove_claim_lazily("b").unwrap().is_some());
    assert!(s.remove_claim_lazily("c").unwrap().is_some());
    assert!(s.gpus_with_shares().unwrap().is_empty(), "the last share takes the list with it");
    assert_eq!(s.remove_claim_lazily("c").unwrap(), None, "a second removal finds nothing");
}

#[test]
fn holdings_whose_record_is_gone_hold_nothing_and_recovery_drops_them() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let s = Store::open(&dir).unwrap();
    s.put_claim(&completed("a", "gpu-0")).unwrap();
    let mut b = record("b", vec![share_of("bbbbbbbb", "gpu-1", 70 << 30)]);
    b.phase = Phase::PrepareCompleted;
    s.put_claim(&b).unwrap();
    s.put_claim(&completed("keep", "gpu-2")).unwrap();
    // What a crash between the steps of lazy removals leaves on disk: the records went
    // first, the holdings did not.
    s.with_db(|db| {
        for uid in ["a", "b"] {
            db.claims.remove(uid).map_err(db_err("remove (test)"))?;
        }
        s.durable(db)
    })
    .unwrap();
    drop(s);

    let (_copy, restarted) = as_on_disk(&dir);
    assert_eq!(restarted.holder("gpu-0").unwrap().as_deref(), Some("a"), "still on disk");
    // A new claim takes over both: the orphaned holdings are not in its way.
    restarted.put_claim(&completed("c", "gpu-0")).unwrap();
    let d = record("d", vec![share_of("dddddddd", "gpu-1", 80 << 30)]);
    restarted.put_claim(&d).unwrap();
    assert_eq!(restarted.holder("gpu-0").unwrap().as_deref(), Some("c"));
    let holders: Vec<String> = restarted.shares_of("gpu-1").unwrap().into_iter().map(|h| h.claim).collect();
    assert_eq!(holders, ["d"], "b's orphaned share was dropped from the list");
    drop(restarted);

    let (_copy, restarted) = as_on_disk(&dir);
    assert_eq!(restarted.drop_orphaned_holdings().unwrap(), ["gpu-0", "gpu-1"]);
    assert_eq!(restarted.holder("gpu-0").unwrap(), None);
    assert!(restarted.shares_of("gpu-1").unwrap().is_empty());
    assert_eq!(restarted.holder("gpu-2").unwrap().as_deref(), Some("keep"), "a holding with its record stays");
    assert!(restarted.drop_orphaned_holdings().unwrap().is_empty(), "nothing left to drop");
    let path = restarted.dir().to_path_buf();
    drop(restarted);
    let (_again, reopened) = as_on_disk(&path);
    assert_eq!(reopened.holder("gpu-0").unwrap(), None, "the drop was durable");
}

mod fresh;
mod hooks;
