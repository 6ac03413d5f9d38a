//! Tests of a claim's first record made without a transaction ([`crate::state::fresh`]), on real
//! sled in temp dirs.

use std::sync::{Arc, Barrier};

use super::{as_on_disk, device, record, share_of};
use crate::state::*;

/// A completed record of claim `uid` holding `devices` exclusively.
fn completed_on(uid: &str, devices: &[&str]) -> ClaimRecord {
    let devices = devices.iter().map(|d| device(d, false)).collect();
    ClaimRecord { phase: Phase::PrepareCompleted, ..record(uid, devices) }
}

#[test]
fn a_first_completed_record_takes_its_devices_and_is_on_disk_when_put_returns() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let s = Store::open_without_flusher(&dir).unwrap();
    let flushes = s.flushes();
    let a = completed_on("a", &["gpu-0", "gpu-1"]);
    s.put_claim(&a).unwrap();
    assert_eq!(s.flushes(), flushes + 1, "one durable step");
    let (_copy, crashed) = as_on_disk(&dir);
    assert_eq!(crashed.claim("a").unwrap(), Some(a.clone()));
    for gpu in ["gpu-0", "gpu-1"] {
        assert_eq!(crashed.holder(gpu).unwrap().as_deref(), Some("a"), "{gpu}");
    }
    assert!(crashed.holds_devices(&a).unwrap());
}

#[test]
fn a_device_held_by_a_recorded_claim_is_refused_and_nothing_of_the_refused_claim_stays() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let s = Store::open_without_flusher(&dir).unwrap();
    s.put_claim(&completed_on("a", &["gpu-1"])).unwrap();
    // gpu-0 is free and taken first; gpu-1 is a's, so gpu-0 is given back.
    let err = s.put_claim(&completed_on("b", &["gpu-0", "gpu-1"])).expect_err("gpu-1 is a's");
    match &err {
        StateError::DeviceHeld { device, holder, holder_name } => {
            assert_eq!((device.as_str(), holder.as_str()), ("gpu-1", "a"));
            assert_eq!(holder_name.as_deref(), Some("ns/claim-a"));
        }
        other => panic!("expected DeviceHeld, got {other:?}"),
    }
    assert_eq!(s.claim("b").unwrap(), None);
    assert_eq!(s.holder("gpu-0").unwrap(), None, "the device taken first was given back");
    assert_eq!(s.holder("gpu-1").unwrap().as_deref(), Some("a"));
    // The next durable change carries the roll-back too.
    s.put_claim(&completed_on("c", &["gpu-0"])).unwrap();
    let (_copy, crashed) = as_on_disk(&dir);
    assert_eq!(crashed.claim("b").unwrap(), None);
    assert_eq!(crashed.holder("gpu-0").unwrap().as_deref(), Some("c"));
}

#[test]
fn a_holding_whose_claim_has_no_record_is_taken_over() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Store::open(tmp.path()).unwrap();
    s.put_claim(&completed_on("a", &["gpu-0"])).unwrap();
    // What a crash between the steps of a lazy removal leaves: the holding without its record.
    s.raw_remove("claims", b"a");
    let b = completed_on("b", &["gpu-0"]);
    s.put_claim(&b).unwrap();
    assert_eq!(s.holder("gpu-0").unwrap().as_deref(), Some("b"));
    assert!(s.holds_devices(&b).unwrap());
}

#[test]
fn a_gpu_with_shares_of_another_claim_is_refused_as_a_transaction_refuses_it() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Store::open(tmp.path()).unwrap();
    let mut a = record("a", vec![share_of("aaaaaaaa", "gpu-0", 10 << 30)]);
    a.phase = Phase::PrepareCompleted;
    s.put_claim(&a).unwrap();
    let err = s.put_claim(&completed_on("b", &["gpu-0"])).expect_err("gpu-0 has a share of a");
    assert!(
        matches!(&err, StateError::DeviceHeld { device, holder, .. } if device == "gpu-0" && holder == "a"),
        "{err:?}"
    );
    assert_eq!((s.claim("b").unwrap(), s.holder("gpu-0").unwrap()), (None, None), "nothing of b stays");
    // An unreadable share list refuses the GPU until it is rebuilt.
    s.raw_insert("shares", b"gpu-1", b"{not a list");
    let err = s.put_claim(&completed_on("c", &["gpu-1"])).expect_err("an unknown list");
    assert!(matches!(err, StateError::SharesRecord { ref gpu, .. } if gpu == "gpu-1"), "{err:?}");
    assert_eq!((s.claim("c").unwrap(), s.holder("gpu-1").unwrap()), (None, None));
}

#[test]
fn a_completed_record_without_its_holdings_is_told_apart_and_recorded_again_takes_them() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Store::open(tmp.path()).unwrap();
    let a = completed_on("a", &["gpu-0", "gpu-1"]);
    // What a crash after the record and the first holding leaves.
    s.raw_insert("claims", b"a", &record::encode_claim(&a));
    s.raw_insert_device("gpu-0", "a");
    assert!(!s.holds_devices(&a).unwrap(), "gpu-1 is not held");
    // Recorded again (the claim has a record: a transaction), it takes what it lacks.
    s.put_claim(&a).unwrap();
    assert!(s.holds_devices(&a).unwrap());
    assert_eq!(s.holder("gpu-1").unwrap().as_deref(), Some("a"));
    // Admin access holds nothing, so it is never missing.
    let admin = ClaimRecord { phase: Phase::PrepareCompleted, ..record("d", vec![device("gpu-0", true)]) };
    assert!(s.holds_devices(&admin).unwrap());
}

#[test]
fn a_completed_record_whose_gpu_another_claim_has_shares_of_is_told_apart() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Store::open(tmp.path()).unwrap();
    let mut b = record("b", vec![share_of("bbbbbbbb", "gpu-0", 10 << 30)]);
    b.phase = Phase::PrepareCompleted;
    s.put_claim(&b).unwrap();
    // What a crash leaves when sled's flusher wrote a's record and its holding of gpu-0
    // before a saw b's share and gave gpu-0 back.
    let a = completed_on("a", &["gpu-0"]);
    s.raw_insert("claims", b"a", &record::encode_claim(&a));
    s.raw_insert_device("gpu-0", "a");
    assert!(!s.holds_devices(&a).unwrap(), "b's share of gpu-0 was recorded first");
    // A share list that cannot be read does not count against the holding.
    s.raw_insert("shares", b"gpu-0", b"{not a list");
    assert!(s.holds_devices(&a).unwrap());
}

/// Claims recorded at once, some without a transaction and some in one (a PrepareStarted
/// record always is), each wanting `devices(i)`, named `{prefix}{i}`: returns the claims
/// that got them.
fn race(s: &Store, prefix: &str, claims: usize, devices: impl Fn(usize) -> Vec<&'static str>) -> Vec<String> {
    let start = Arc::new(Barrier::new(claims));
    let threads: Vec<_> = (0..claims)
        .map(|i| {
            let (s, start) = (s.clone(), start.clone());
            let mut r = completed_on(&format!("{prefix}{i}"), &devices(i));
            if i % 2 == 1 {
                r.phase = Phase::PrepareStarted;
            }
            std::thread::spawn(move || {
                start.wait();
                match s.put_claim(&r) {
                    Ok(()) => Some(r.uid),
                    Err(StateError::DeviceHeld { .. }) => None,
                    Err(e) => panic!("{e}"),
                }
            })
        })
        .collect();
    threads.into_iter().filter_map(|t| t.join().unwrap()).collect()
}

#[test]
fn claims_racing_for_a_device_never_both_get_it_however_they_are_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Store::open(tmp.path()).unwrap();
    for round in 0..40 {
        // One device each: exactly one claim gets it.
        let won = race(&s, "one-", 6, |_| vec!["gpu-0"]);
        assert_eq!(won.len(), 1, "round {round}: {won:?}");
        assert_eq!(s.holder("gpu-0").unwrap().as_ref(), Some(&won[0]), "round {round}");
        // Two devices, taken in either order: never two winners of one device, a winner
        // holds all of its devices, and a claim that lost has no record.
        let pairs = race(&s, "two-", 6, |i| if i % 3 == 0 { vec!["gpu-2", "gpu-1"] } else { vec!["gpu-1", "gpu-2"] });
        assert!(pairs.len() <= 1, "round {round}: {pairs:?}");
        for gpu in ["gpu-1", "gpu-2"] {
            assert_eq!(s.holder(gpu).unwrap(), pairs.first().cloned(), "round {round}: {gpu}");
        }
        let recorded: Vec<String> = s.claims().unwrap().into_iter().map(|r| r.uid).collect();
        let mut expected = [won, pairs].concat();
        expected.sort();
        assert_eq!(recorded, expected, "round {round}: only the winners have records");
        for uid in &recorded {
            s.remove_claim(uid).unwrap();
        }
    }
}

#[test]
fn a_claim_refused_for_a_gpu_with_shares_takes_nothing_that_would_refuse_shares_that_fit() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Store::open(tmp.path()).unwrap();
    for round in 0..40 {
        let mut base = record(&format!("base-{round}"), vec![share_of("aaaaaaaa", "gpu-0", 10 << 30)]);
        base.phase = Phase::PrepareCompleted;
        s.put_claim(&base).unwrap();
        // Whole-GPU claims (refused: gpu-0 has a share) and 10Gi shares (which fit) at once.
        let start = Arc::new(Barrier::new(6));
        let threads: Vec<_> = (0..6)
            .map(|i| {
                let (s, start) = (s.clone(), start.clone());
                let r = if i % 2 == 0 {
                    completed_on(&format!("whole-{round}-{i}"), &["gpu-0"])
                } else {
                    let id = format!("{i:08x}");
                    ClaimRecord {
                        phase: Phase::PrepareCompleted,
                        ..record(&format!("share-{round}-{i}"), vec![share_of(&id, "gpu-0", 10 << 30)])
                    }
                };
                std::thread::spawn(move || {
                    start.wait();
                    (r.uid.clone(), s.put_claim(&r))
                })
            })
            .collect();
        for t in threads {
            let (uid, result) = t.join().unwrap();
            match uid.starts_with("whole") {
                true => assert!(matches!(result, Err(StateError::DeviceHeld { .. })), "round {round}: {uid}"),
                false => assert!(result.is_ok(), "round {round}: {uid}: {result:?}"),
            }
        }
        for r in s.claims().unwrap() {
            s.remove_claim(&r.uid).unwrap();
        }
    }
}
