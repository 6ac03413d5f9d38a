//! The health view's rules on an injected clock.

use super::*;

const GPU: &str = "GPU-1";

fn rules() -> Rules {
    Rules { ignored_xids: DEFAULT_IGNORED_XIDS.into_iter().collect(), quiet_period: Duration::from_secs(300) }
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
}

fn view() -> HealthView {
    let mut v = HealthView::default();
    v.saw([GPU.to_string()], at(0));
    v
}

fn xid(x: u64) -> Event {
    Event::Xid { gpu: GPU.into(), xid: x }
}

#[test]
fn a_fatal_xid_becomes_a_condition_with_its_time() {
    let mut v = view();
    let changes = v.apply(xid(79), at(10), &rules());
    assert!(matches!(&changes[..], [Change::Raised { condition, .. }] if condition.value.as_deref() == Some("79")));
    let c = &v.gpus[GPU].conditions[&ConditionKind::Xid];
    assert!(c.fatal);
    assert_eq!(c.since, unix_secs(at(10)));
    assert_eq!(v.gpus[GPU].last_critical_ms, Some(unix_ms(at(10))));
    assert_eq!(v.xids_seen[&(GPU.to_string(), 79)], 1);
}

#[test]
fn ignored_xids_are_counted_but_change_nothing() {
    let mut v = view();
    for x in DEFAULT_IGNORED_XIDS {
        assert_eq!(v.apply(xid(x), at(1), &rules()), vec![Change::Ignored { gpu: GPU.into(), xid: x }]);
    }
    assert!(v.gpus[GPU].conditions.is_empty());
    assert_eq!(v.xids_seen[&(GPU.to_string(), 13)], 1);
}

#[test]
fn repeated_and_later_xids_keep_the_first_value_and_time() {
    let mut v = view();
    v.apply(xid(79), at(10), &rules());
    assert!(v.apply(xid(79), at(20), &rules()).is_empty(), "a repeat changes nothing published");
    assert!(v.apply(xid(94), at(30), &rules()).is_empty());
    let c = &v.gpus[GPU].conditions[&ConditionKind::Xid];
    assert_eq!((c.value.as_deref(), c.since), (Some("79"), unix_secs(at(10))));
    assert_eq!(c.last_event_ms, unix_ms(at(30)), "the quiet period restarts at the latest event");
}

#[test]
fn a_fatal_condition_is_never_downgraded() {
    let fatal = Condition {
        kind: ConditionKind::Xid,
        value: Some("79".into()),
        fatal: true,
        since: 10,
        last_event_ms: 10_000,
        message: "m".into(),
    };
    let mut c = fatal.clone();
    let lesser =
        Condition { value: Some("13".into()), fatal: false, since: 20, last_event_ms: 20_000, ..fatal.clone() };
    assert!(!merge(&mut c, lesser));
    assert_eq!(c, fatal, "a lesser event neither downgrades nor restarts the quiet period");

    // Informational → fatal is an upgrade, with a new time (the effect changed).
    let mut info = Condition { fatal: false, ..fatal.clone() };
    let upgraded = Condition { since: 30, last_event_ms: 30_000, ..fatal.clone() };
    assert!(merge(&mut info, upgraded.clone()));
    assert_eq!(info, upgraded);
}

#[test]
fn double_bit_ecc_is_xid_48() {
    let mut v = view();
    v.apply(Event::DoubleBitEcc { gpu: GPU.into() }, at(1), &rules());
    assert_eq!(v.gpus[GPU].conditions[&ConditionKind::Xid].value.as_deref(), Some("48"));
}

#[test]
fn a_lost_gpu_without_a_name_loses_every_gpu() {
    let mut v = view();
    v.saw(["GPU-2".to_string()], at(0));
    let changes = v.apply(Event::Lost { gpu: None }, at(5), &rules());
    assert_eq!(changes.len(), 2);
    for g in v.gpus.values() {
        assert!(g.conditions[&ConditionKind::GpuLost].fatal);
        assert!(!g.reachable);
    }
}

#[test]
fn recovery_waits_for_the_quiet_period_and_a_reachable_gpu() {
    let mut v = view();
    let r = rules();
    v.apply(xid(79), at(10), &r);
    assert!(v.recover(at(309), &r).is_empty(), "quiet period not over");
    let cleared = v.recover(at(310), &r);
    assert_eq!(
        cleared,
        vec![Change::Cleared { gpu: GPU.into(), kind: ConditionKind::Xid, lasted: Duration::from_secs(300) }]
    );
    assert!(v.gpus[GPU].conditions.is_empty());

    // Lost: stays while the probe fails, clears a quiet period after it answers again.
    v.apply(Event::Lost { gpu: Some(GPU.into()) }, at(400), &r);
    v.apply(Event::Probe { gpu: GPU.into(), ok: false }, at(500), &r);
    assert!(v.recover(at(900), &r).is_empty(), "unreachable GPUs do not recover");
    v.apply(Event::Probe { gpu: GPU.into(), ok: true }, at(901), &r);
    assert!(v.recover(at(799), &r).is_empty());
    let cleared = v.recover(at(901), &r);
    assert!(
        matches!(&cleared[..], [Change::Cleared { kind: ConditionKind::GpuLost, lasted, .. }] if lasted.as_secs() == 501)
    );
}

#[test]
fn unmonitored_is_informational_and_clears_when_monitored() {
    let mut v = view();
    let r = rules();
    v.apply(Event::Unmonitored { gpu: GPU.into(), reason: "no event types".into() }, at(1), &r);
    let c = &v.gpus[GPU].conditions[&ConditionKind::Unmonitored];
    assert!(!c.fatal);
    assert!(v.gpus[GPU].fatal().is_none());
    assert!(v.recover(at(10_000), &r).is_empty(), "not a fatal condition: the quiet period does not clear it");
    assert_eq!(v.apply(Event::Monitored { gpu: GPU.into() }, at(2), &r).len(), 1);
    assert!(v.gpus[GPU].conditions.is_empty());
}

#[test]
fn persisted_conditions_survive_a_round_trip() {
    let mut v = view();
    v.apply(xid(79), at(10), &rules());
    let text = serde_json::to_string(&v.gpus).expect("encode");
    let back: BTreeMap<String, GpuHealth> = serde_json::from_str(&text).expect("decode");
    assert_eq!(back, v.gpus);
}

#[test]
fn nvml_saying_no_recovery_is_needed_clears_an_xid_at_once() {
    let mut v = view();
    let r = rules();
    v.apply(xid(79), at(10), &r);
    v.apply(Event::Lost { gpu: Some(GPU.into()) }, at(11), &r);
    assert!(v.apply(Event::NoRecoveryNeeded { gpu: GPU.into() }, at(12), &r).is_empty(), "not while unreachable");
    v.apply(Event::Probe { gpu: GPU.into(), ok: true }, at(13), &r);
    let changes = v.apply(Event::NoRecoveryNeeded { gpu: GPU.into() }, at(14), &r);
    assert_eq!(changes, vec![Change::ClearedByNvml { gpu: GPU.into(), lasted: Duration::from_secs(4) }]);
    assert!(v.gpus[GPU].conditions.contains_key(&ConditionKind::GpuLost), "lost waits for the quiet period");
    assert!(v.apply(Event::NoRecoveryNeeded { gpu: GPU.into() }, at(15), &r).is_empty());
}

#[test]
fn a_gpu_gone_from_discovery_for_the_quiet_period_is_forgotten_with_its_conditions() {
    let mut v = view();
    v.saw([GPU.to_string(), "GPU-2".to_string()], at(0));
    v.apply(Event::Xid { gpu: "GPU-2".into(), xid: 79 }, at(5), &rules());
    // GPU-2 leaves; back within the quiet period, it is kept with its condition.
    v.saw([GPU.to_string()], at(100));
    assert_eq!(v.gpus["GPU-2"].absent_since_ms, Some(unix_ms(at(100))));
    assert!(v.recover(at(250), &rules()).is_empty());
    v.saw([GPU.to_string(), "GPU-2".to_string()], at(250));
    assert!(v.gpus["GPU-2"].conditions.contains_key(&ConditionKind::Xid), "kept with its condition");
    assert!(v.recover(at(450), &rules()).iter().all(|c| !matches!(c, Change::Forgotten { .. })), "present again");
    assert_eq!(v.gpus["GPU-2"].absent_since_ms, None);
    // Removed for good: forgotten once absent for the quiet period (300 s), not before.
    v.saw([GPU.to_string()], at(1_000));
    v.saw([GPU.to_string()], at(1_200));
    assert!(v.recover(at(1_299), &rules()).iter().all(|c| !matches!(c, Change::Forgotten { .. })));
    let changes = v.recover(at(1_300), &rules());
    assert_eq!(changes, [Change::Forgotten { gpu: "GPU-2".into(), absent: Duration::from_secs(300) }]);
    assert_eq!(v.gpus.keys().collect::<Vec<_>>(), [GPU]);
    assert!(v.xids_seen.keys().all(|(g, _)| g == GPU), "{:?}", v.xids_seen);
}
