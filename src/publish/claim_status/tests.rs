//! The claim status writer in paused time against a server that answers every status write
//! as told: how often one claim is written in a minute for each answer (a claim gone or
//! replaced is not written again; a failing server is tried after a growing delay), what it
//! forgets when a claim is unprepared, and the `Healthy` condition's transition times.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::device_config::GpuConfig;
use crate::health::{Condition, ConditionKind, GpuHealth};
use crate::state::{SCHEMA_VERSION, Store};

const UID: &str = "0c1f5a2e-7d3b-4e8a-9f6c-1b2d3e4f5a60";
const DRIVER: &str = "gpu.edra.dev";

fn settings() -> ClaimStatusSettings {
    ClaimStatusSettings { driver: DRIVER.into(), mps_pipe_dir: "/run/mps" }
}

fn record(uid: &str, created_at: u64) -> ClaimRecord {
    let device = DeviceRecord {
        request: "gpu".into(),
        request_names: vec!["gpu".into()],
        device: "gpu-0".into(),
        pool: "node-a".into(),
        cdi_ids: vec!["k8s.gpu.edra.dev/claim=x-gpu-0".into()],
        admin_access: false,
        share_id: None,
        share: None,
        mig: None,
        config: GpuConfig::default(),
    };
    ClaimRecord {
        schema: SCHEMA_VERSION,
        uid: uid.into(),
        namespace: "default".into(),
        name: "gpu".into(),
        phase: Phase::PrepareCompleted,
        devices: vec![device],
        cdi_spec_path: "/run/cdi/x.json".into(),
        created_at,
        boot_id: "b".into(),
    }
}

/// A server that answers every status write with `code` (200: stores it) and says the
/// claim's UID is `uid` when asked.
struct Answering {
    code: u16,
    uid: String,
    patches: AtomicUsize,
    reads: AtomicUsize,
}

impl Answering {
    fn new(code: u16, uid: &str) -> Arc<Answering> {
        Arc::new(Answering { code, uid: uid.into(), patches: AtomicUsize::new(0), reads: AtomicUsize::new(0) })
    }
}

impl StatusApi for Answering {
    fn resource_api(&self) -> BoxFuture<'_, Result<ResourceApi, kube::Error>> {
        Box::pin(async { Ok(ResourceApi::V1) })
    }

    fn apply_status<'a>(
        &'a self,
        _api: ResourceApi,
        _claim: (&'a str, &'a str),
        _manager: &'a str,
        body: Vec<u8>,
    ) -> BoxFuture<'a, Result<Value, kube::Error>> {
        self.patches.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            match self.code {
                200 => Ok(serde_json::from_slice(&body).expect("an apply body is JSON")),
                code => {
                    let status = json!({"kind": "Status", "code": code, "message": format!("answered {code}")});
                    Err(kube::Error::from_status(
                        "PATCH resourceclaims/status".into(),
                        code,
                        status.to_string().as_bytes(),
                        None,
                    ))
                }
            }
        })
    }

    fn claim_uid<'a>(
        &'a self,
        _api: ResourceApi,
        _claim: (&'a str, &'a str),
    ) -> BoxFuture<'a, Result<String, kube::Error>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(self.uid.clone()) })
    }
}

/// Runs the writer for a minute of paused time with one prepared claim; (PATCHes, reads).
async fn a_minute_of(server: Arc<Answering>) -> (usize, usize) {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path()).unwrap();
    store.put_claim(&record(UID, 1_000)).unwrap();
    let (_inv_tx, inv) = watch::channel(Arc::new(Inventory::default()));
    let (_health_tx, health) = watch::channel(Arc::new(HealthSnapshot::default()));
    let (_changed_tx, changed) = watch::channel(0u64);
    let (stop, shutdown) = watch::channel(false);
    let task = tokio::spawn(keep_claim_status(server.clone(), settings(), store, (inv, health), changed, shutdown));
    tokio::time::sleep(Duration::from_secs(60)).await;
    stop.send(true).unwrap();
    task.await.unwrap();
    let (patches, reads) = (server.patches.load(Ordering::SeqCst), server.reads.load(Ordering::SeqCst));
    eprintln!("answer {}: {patches} PATCHes and {reads} reads of one claim in a minute", server.code);
    (patches, reads)
}

#[tokio::test(start_paused = true)]
async fn a_claim_gone_or_replaced_is_written_once_not_every_pass() {
    assert_eq!(a_minute_of(Answering::new(404, UID)).await, (1, 0), "404: gone");
    let replaced = "9e8d7c6b-5a49-4382-9170-6f5e4d3c2b1a";
    assert_eq!(a_minute_of(Answering::new(409, replaced)).await, (1, 1), "409, and the claim has another UID");
}

#[tokio::test(start_paused = true)]
async fn a_failing_server_is_tried_after_a_growing_delay() {
    // 409 on the same claim: read afresh and sent once more at once, then as a failure.
    let (patches, reads) = a_minute_of(Answering::new(409, UID)).await;
    assert!((2..=8).contains(&patches) && reads + 1 == patches, "409: {patches} PATCHes, {reads} reads");
    for code in [429, 500, 503] {
        let (patches, reads) = a_minute_of(Answering::new(code, UID)).await;
        assert!((2..=7).contains(&patches) && reads == 0, "{code}: {patches} PATCHes in a minute");
    }
}

#[tokio::test(start_paused = true)]
async fn a_write_refused_for_the_claim_alone_or_accepted_is_made_once() {
    assert_eq!(a_minute_of(Answering::new(422, UID)).await, (1, 0), "422");
    assert_eq!(a_minute_of(Answering::new(200, UID)).await, (1, 0), "written");
}

fn target(devices: usize) -> Target {
    ("default".into(), "gpu".into(), (0..devices).map(|i| json!({"device": format!("gpu-{i}")})).collect())
}

#[test]
fn a_failed_claim_that_is_unprepared_is_forgotten() {
    let mut ledger = Ledger::default();
    let want = Written::from([(UID.to_string(), target(1))]);
    let owed = ledger.targets(&want);
    assert_eq!(owed.len(), 1);
    assert!(ledger.record(UID.into(), target(1), Outcome::Retry));
    assert!(ledger.pending.contains(UID));
    assert_eq!(ledger.targets(&Written::new()), Vec::new(), "never written: nothing to remove");
    assert!(ledger.pending.is_empty(), "an unprepared claim is no longer failing");
}

#[test]
fn a_gone_claim_is_written_again_when_its_entries_change_and_forgotten_when_unprepared() {
    let mut ledger = Ledger::default();
    let want = Written::from([(UID.to_string(), target(1))]);
    ledger.targets(&want);
    assert!(ledger.record(UID.into(), target(1), Outcome::Gone));
    assert!(ledger.targets(&want).is_empty());
    assert!(!ledger.unwritten(&want), "nothing owed: the writer rests");
    let changed = Written::from([(UID.to_string(), target(2))]);
    assert_eq!(ledger.targets(&changed), vec![(UID.to_string(), target(2))]);
    ledger.targets(&Written::new());
    assert!(ledger.gone.is_empty(), "unprepared: forgotten");
    assert_eq!(ledger.targets(&want).len(), 1, "prepared again: written again");
}

/// The Healthy condition's (status, lastTransitionTime) in `want`.
fn healthy(want: &Written) -> (String, String) {
    let entry = &want[UID].2[0];
    let c = entry["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Healthy").unwrap();
    (c["status"].as_str().unwrap().into(), c["lastTransitionTime"].as_str().unwrap().into())
}

fn sick(since: i64, xid: &str) -> HealthSnapshot {
    let condition = Condition {
        kind: ConditionKind::Xid,
        value: Some(xid.into()),
        fatal: true,
        since,
        last_event_ms: 0,
        message: format!("XID {xid}"),
    };
    let gpu = GpuHealth {
        conditions: BTreeMap::from([(ConditionKind::Xid, condition)]),
        first_seen: 0,
        last_critical_ms: None,
        reachable: true,
        absent_since_ms: None,
    };
    HealthSnapshot { gpus: BTreeMap::from([("GPU-00000000".to_string(), gpu)]), ..HealthSnapshot::default() }
}

#[test]
fn the_healthy_conditions_time_moves_with_its_status_and_only_then() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path()).unwrap();
    store.put_claim(&record(UID, 1_000)).unwrap();
    let inv = crate::publish::plan::tests::inventory(1, "A100");
    let mut ledger = Ledger::default();
    let mut pass = |health: &HealthSnapshot, now: i64| {
        let mut want = desired(&settings(), &store, &inv, health);
        ledger.stamp(&mut want, now);
        healthy(&want)
    };
    let well = HealthSnapshot::default();
    let prepared = pass(&well, 1_500);
    assert_eq!(prepared, ("True".into(), rfc3339(1_000)), "healthy since the prepare");
    assert_eq!(pass(&well, 1_600), prepared, "unchanged: the time stays");
    let failed = pass(&sick(2_000, "79"), 2_100);
    assert_eq!(failed, ("False".into(), rfc3339(2_000)), "unhealthy since the XID");
    assert_eq!(pass(&sick(2_050, "48"), 2_200), failed, "still unhealthy (another XID): the time stays");
    let recovered = pass(&well, 3_000);
    assert_eq!(recovered, ("True".into(), rfc3339(3_000)), "healthy again: when the writer saw it");
    assert!(recovered.1 > failed.1 && failed.1 > prepared.1, "each transition is newer");
    assert_eq!(pass(&well, 3_500), recovered);
    let again = pass(&sick(2_500, "79"), 4_000);
    assert_eq!(again, ("False".into(), rfc3339(4_000)), "a start before the last change: the time it was seen");
}
