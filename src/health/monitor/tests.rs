//! The monitor task on the mock backend's health (its events file), real threads and a
//! real state directory, on the real clock with short periods; every wait is on the
//! published snapshot, with a deadline.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::*;
use crate::config::{Config, LoadContext, Overrides};
use crate::health::MockHealth;
use crate::inventory::{DeviceBackend, Inventory};

const NODE: &str = "n1";
const DEADLINE: Duration = Duration::from_secs(20);

fn mock_inventory(gpus: u32) -> Inventory {
    let ctx = LoadContext {
        explicit_file: None,
        default_file: "/nonexistent/edra.toml".into(),
        env: vec![],
        overrides: Overrides::default(),
        hostname: Some(NODE.into()),
    };
    let mut cfg = Config::load(&ctx).expect("defaults are valid");
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
    monitor: HealthMonitor,
    _shutdown: watch::Sender<bool>,
}

async fn start(quiet: Duration, probe_interval: Duration) -> Setup {
    let dir = tempfile::tempdir().expect("temp dir");
    let events = dir.path().join("events");
    std::fs::write(&events, "").expect("create the events file");
    let backend = Arc::new(MockHealth::new(NODE, 4, Some(events.clone())));
    let (inventory, inventory_rx) = watch::channel(Arc::new(mock_inventory(4)));
    let (shutdown, shutdown_rx) = watch::channel(false);
    let settings =
        HealthSettings { rules: Rules { ignored_xids: BTreeSet::new(), quiet_period: quiet }, probe_interval };
    let monitor = HealthMonitor::start(backend, inventory_rx, settings, dir.path().join("state"), shutdown_rx).await;
    Setup { dir, events, inventory, monitor, _shutdown: shutdown }
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
