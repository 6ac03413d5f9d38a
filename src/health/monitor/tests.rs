//! The monitor task on the mock backend's health (its events file), real threads and a
//! real state directory, on the real clock with short periods; every wait is on the
//! published snapshot, with a deadline.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::*;
use crate::health::MockHealth;
use crate::health::view::{ConditionKind, Rules};
use crate::inventory::{DeviceBackend, Inventory};

const NODE: &str = "n1";
const DEADLINE: Duration = Duration::from_secs(20);

fn mock_inventory(gpus: u32) -> Inventory {
    let mut cfg = crate::config::Config::defaults_for(NODE);
    cfg.mock.gpus = gpus;
    crate::inventory::mock::MockBackend::new(&cfg).discover().expect("discover")
}

fn uuid(i: u32) -> String {
    crate::inventory::mock::gpu_uuid(NODE, i)
}

fn inject(events: &Path, line: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(events).expect("open the events file");
    writeln!(f, "{line}").expect("append an event");
}

/// A monitor of 4 mock GPUs whose events come from `<dir>/events`.
struct Setup {
    dir: tempfile::TempDir,
    events: std::path::PathBuf,
    inventory: watch::Sender<Arc<Inventory>>,
    backend: MockHealth,
    monitor: HealthMonitor,
    _shutdown: watch::Sender<bool>,
}

async fn start(quiet: Duration, probe_interval: Duration) -> Setup {
    let dir = tempfile::tempdir().expect("temp dir");
    let events = dir.path().join("events");
    std::fs::write(&events, "").expect("create the events file");
    let backend = MockHealth::new(NODE, 4, Some(events.clone()));
    let (inventory, inventory_rx) = watch::channel(Arc::new(mock_inventory(4)));
    let (shutdown, shutdown_rx) = watch::channel(false);
    let settings =
        HealthSettings { rules: Rules { ignored_xids: BTreeSet::new(), quiet_period: quiet }, probe_interval };
    let state = dir.path().join("state");
    let monitor = HealthMonitor::start(Arc::new(backend.clone()), inventory_rx, settings, state, shutdown_rx).await;
    Setup { dir, events, inventory, backend, monitor, _shutdown: shutdown }
}

/// Waits for a snapshot for which `ready` holds.
async fn until(
    monitor: &mut HealthMonitor,
    what: &str,
    ready: impl Fn(&HealthSnapshot) -> bool,
) -> Arc<HealthSnapshot> {
    let started = Instant::now();
    loop {
        let snapshot = monitor.snapshot.borrow_and_update().clone();
        if ready(&snapshot) {
            return snapshot;
        }
        let left = DEADLINE.saturating_sub(started.elapsed());
        let changed = tokio::time::timeout(left, monitor.snapshot.changed()).await;
        assert!(matches!(changed, Ok(Ok(()))), "{what}: not within {DEADLINE:?}; last snapshot {snapshot:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_removed_for_good_is_forgotten_in_health_json_after_the_quiet_period() {
    let mut s = start(Duration::from_millis(500), Duration::from_millis(50)).await;
    inject(&s.events, "xid 3 79");
    until(&mut s.monitor, "the XID condition", |h| h.gpus.get(&uuid(3)).is_some_and(|g| g.fatal().is_some())).await;
    let persisted = store::load(&s.dir.path().join("state")).expect("health.json");
    assert!(persisted[&uuid(3)].fatal().is_some());
    // Discovery no longer finds GPU 3.
    s.inventory.send_replace(Arc::new(mock_inventory(3)));
    let removed_at = Instant::now();
    until(&mut s.monitor, "GPU 3 forgotten", |h| !h.gpus.contains_key(&uuid(3))).await;
    assert!(removed_at.elapsed() >= Duration::from_millis(500), "not before the quiet period");
    let persisted = store::load(&s.dir.path().join("state")).expect("health.json");
    assert!(!persisted.contains_key(&uuid(3)), "{persisted:?}");
    assert_eq!(persisted.len(), 3);
}

/// Lets a hung GPU's probe go when the test ends, however it ends.
struct Unhang<'a>(&'a Path, u32);

impl Drop for Unhang<'_> {
    fn drop(&mut self) {
        inject(self.0, &format!("unhang {}", self.1));
    }
}

fn condition(h: &HealthSnapshot, gpu: u32, kind: ConditionKind) -> Option<&crate::health::Condition> {
    h.gpus.get(&uuid(gpu)).and_then(|g| g.conditions.get(&kind))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_probe_leaves_its_gpu_unknown_and_the_others_watched_until_it_answers() {
    let mut s = start(Duration::from_millis(300), Duration::from_millis(50)).await;
    let hung_at = Instant::now();
    inject(&s.events, "hang 1");
    let _unhang = Unhang(&s.events, 1);
    let h =
        until(&mut s.monitor, "GPU 1 unresponsive", |h| condition(h, 1, ConditionKind::Unresponsive).is_some()).await;
    let waited = hung_at.elapsed();
    println!("a hung probe marked its GPU unknown after {} ms", waited.as_millis());
    assert!(waited < super::super::probe::hung_after(Duration::from_millis(50)) + Duration::from_secs(5), "{waited:?}");
    let c = condition(&h, 1, ConditionKind::Unresponsive).expect("the condition");
    assert!(!c.fatal && c.message.starts_with("not answering the health probe for 3s (an NVML call hangs)"), "{c:?}");
    let gpu1 = mock_inventory(4).devices.into_iter().find(|d| d.uuid == uuid(1)).expect("gpu-1");
    assert_eq!(h.device_state(&gpu1).0, crate::health::DeviceState::Unknown);

    // The monitor goes on: an XID on GPU 2 is raised, and cleared after the quiet period
    // by the probe's pass (GPU 2 answers its probe).
    inject(&s.events, "xid 2 79");
    until(&mut s.monitor, "GPU 2 tainted", |h| condition(h, 2, ConditionKind::Xid).is_some()).await;
    until(&mut s.monitor, "GPU 2 recovered", |h| condition(h, 2, ConditionKind::Xid).is_none()).await;
    assert_eq!(s.backend.probes_blocked(), 1, "one probe waits on the hung GPU, never more");
    assert!(condition(&s.monitor.snapshot.borrow(), 1, ConditionKind::Unresponsive).is_some());

    inject(&s.events, "unhang 1");
    until(&mut s.monitor, "GPU 1 answers again", |h| h.gpus.get(&uuid(1)).is_some_and(|g| g.conditions.is_empty()))
        .await;
    assert_eq!(s.backend.probes_blocked(), 0);
}
