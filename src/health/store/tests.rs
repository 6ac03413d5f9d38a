use super::super::view::{Condition, ConditionKind};
use super::*;

#[test]
fn conditions_round_trip_through_the_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    assert!(load(dir.path()).expect("absent file").is_empty());
    let mut g = GpuHealth { first_seen: 5, ..GpuHealth::default() };
    g.conditions.insert(
        ConditionKind::Xid,
        Condition {
            kind: ConditionKind::Xid,
            value: Some("79".into()),
            fatal: true,
            since: 1_800_000_000,
            last_event_ms: 1_800_000_000_123,
            message: "NVML reported critical XID 79".into(),
        },
    );
    let gpus: BTreeMap<String, GpuHealth> = [("GPU-1".to_string(), g)].into();
    save(dir.path(), &gpus).expect("save");
    assert_eq!(load(dir.path()).expect("load"), gpus);
    assert!(!dir.path().join(".health.json.tmp").exists());
}

#[test]
fn a_damaged_file_is_reported() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(path(dir.path()), "{not json").expect("write");
    let e = load(dir.path()).expect_err("damaged");
    assert!(e.to_string().contains("is not a health file edra can read"), "{e}");
}
