use std::collections::BTreeMap;
use std::time::Duration;

use super::*;
use crate::health::Condition;

#[test]
fn lists_unhealthy_devices_and_why() {
    let dir = tempfile::tempdir().expect("temp dir");
    let quiet = Duration::from_secs(300);
    assert_eq!(gpu_health(dir.path(), None, quiet).status, Status::Pass);
    let mut g = GpuHealth::default();
    g.conditions.insert(
        ConditionKind::Xid,
        Condition {
            kind: ConditionKind::Xid,
            value: Some("79".into()),
            fatal: true,
            since: 1_800_000_000,
            last_event_ms: 1_800_000_000_000,
            message: "NVML reported critical XID 79".into(),
        },
    );
    store::save(dir.path(), &BTreeMap::from([("GPU-1".to_string(), g)])).expect("save");
    let r = gpu_health(dir.path(), None, quiet);
    assert_eq!(r.status, Status::Warn);
    assert_eq!(r.detail, "GPU-1 unhealthy since 2027-01-15T08:00:00Z: NVML reported critical XID 79 (taint xid=79)");
    assert!(r.fix.contains("for 5m (health.quiet_period)"), "{}", r.fix);

    std::fs::write(store::path(dir.path()), "junk").expect("damage");
    assert_eq!(gpu_health(dir.path(), None, quiet).status, Status::Warn);
}
