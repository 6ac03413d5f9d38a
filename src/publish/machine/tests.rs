//! The publisher's decisions in paused time: the debounce that joins a burst into one plan,
//! the jittered backoff after failures (and its reset), the Node re-read before slices are
//! created, and zero writes once the pool matches. The server is the plan tests' model of
//! one (`apply`), so every plan is checked against what it would leave behind.

use std::time::Duration;

use tokio::time::{Instant, advance, sleep_until};

use super::*;
use crate::publish::plan::tests::{DRIVER, apply, inventory, node};

/// A machine for `uid` (the Node's uid as first read) with `gpus` devices.
fn machine(uid: Option<&str>, gpus: usize) -> Machine {
    let node = NodeIdentity { uid: uid.map(String::from), ..node() };
    Machine::new(DRIVER.into(), node, Arc::new(inventory(gpus, "A100")))
}

/// Sleeps (in paused time) until the machine's timer, then steps with it.
async fn fire(m: &mut Machine) -> Action {
    let at = m.timer().expect("the machine waits for a time");
    sleep_until(at).await;
    m.step(Input::Timer, Instant::now())
}

/// The slices the machine has seen (what it would plan from).
fn seen_by(m: &Machine) -> Vec<ResourceSlice> {
    m.observed.values().cloned().collect()
}

/// What the server answers to `plan`: every write succeeds, as `apply` models it.
fn server_applies(m: &Machine, plan: &Plan, counter: &mut u64) -> Applied {
    let after = apply(&seen_by(m), plan, counter);
    let removed = plan.deletes.iter().map(|d| Seen::Removed(d.name.clone()));
    let seen = removed.chain(after.into_iter().map(Seen::Written)).collect();
    Applied { writes: plan.writes() as u64, seen, result: Ok(()) }
}

fn refused() -> kube::Error {
    kube::Error::from_status("POST resourceslices".into(), 500, b"etcd is unavailable", None)
}

fn devices_in(plan: &Plan) -> usize {
    plan.creates.iter().chain(&plan.updates).map(|s| s.spec.devices.as_ref().map_or(0, Vec::len)).sum()
}

/// Publishes the first pool and confirms it: ends `Idle` with the pool as the server has it.
async fn publish_first(m: &mut Machine, counter: &mut u64) {
    m.step(Input::Watch(watcher::Event::Restarted(Vec::new())), Instant::now());
    let Action::Apply(p) = fire(m).await else { panic!("the first plan writes") };
    let applied = server_applies(m, &p, counter);
    assert_eq!(m.step(Input::Applied(applied), Instant::now()), Action::Wait);
    assert_eq!(fire(m).await, Action::Wait, "the confirming plan is empty");
    assert_eq!(m.state(), &State::Idle);
}

#[tokio::test(start_paused = true)]
async fn nothing_is_planned_before_the_first_list() {
    let mut m = machine(None, 2);
    assert_eq!(m.step(Input::Inventory(Arc::new(inventory(3, "A100"))), Instant::now()), Action::Wait);
    assert_eq!(m.state(), &State::Unsynced);
    assert_eq!(m.timer(), None, "no view of the API yet, so no reconcile is scheduled");
    assert_eq!(m.step(Input::Timer, Instant::now()), Action::Wait);

    let t0 = Instant::now();
    m.step(Input::Watch(watcher::Event::Restarted(Vec::new())), t0);
    assert_eq!(m.timer(), Some(t0), "the first list is planned at once: nothing to debounce");
    let Action::Apply(p) = m.step(Input::Timer, t0) else { panic!("the first plan writes") };
    assert_eq!(devices_in(&p), 3);
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_changes_is_answered_with_one_plan_after_the_debounce() {
    let mut m = machine(None, 2);
    publish_first(&mut m, &mut 0).await;
    m.take_report();
    let t0 = Instant::now();
    m.step(Input::Inventory(Arc::new(inventory(2, "H100"))), t0);
    advance(Duration::from_millis(60)).await;
    m.step(Input::Inventory(Arc::new(inventory(3, "A100"))), Instant::now());
    advance(Duration::from_millis(30)).await;
    m.step(Input::Inventory(Arc::new(inventory(4, "A100"))), Instant::now());
    assert_eq!(m.timer(), Some(t0 + DEBOUNCE), "changes within the debounce do not push it back");

    let early = m.step(Input::Timer, Instant::now());
    assert_eq!(early, Action::Wait, "a timer input before its time does nothing");
    let Action::Apply(p) = fire(&mut m).await else { panic!("a plan with writes") };
    assert_eq!(t0.elapsed(), DEBOUNCE);
    assert_eq!(devices_in(&p), 4, "the plan is for the newest inventory");
    assert_eq!(m.state(), &State::Applying { generation: p.generation, tainted: false });
    assert_eq!(m.take_report(), None, "nothing is reported before the writes' outcome");
}

#[tokio::test(start_paused = true)]
async fn a_converged_pool_makes_no_writes_and_reports_in_sync() {
    let mut m = machine(None, 2);
    let mut counter = 0;
    m.step(Input::Watch(watcher::Event::Restarted(Vec::new())), Instant::now());
    let Action::Apply(p) = fire(&mut m).await else { panic!("the first plan writes") };
    let written = apply(&[], &p, &mut 0);
    let applied = server_applies(&m, &p, &mut counter);
    let after_write = Instant::now();
    m.step(Input::Applied(applied), after_write);
    assert_eq!(m.timer(), Some(after_write), "re-planned at once to confirm");
    assert_eq!(fire(&mut m).await, Action::Wait);
    assert_eq!(m.state(), &State::Idle);
    let report = m.take_report().expect("a reconcile reports");
    assert_eq!(report, PublishStatus { in_sync: true, devices: 2, writes: p.writes() as u64, last_error: None });

    // The watch echoes our own writes: due again after the debounce, with nothing to write.
    for s in written {
        m.step(Input::Watch(watcher::Event::Applied(s)), Instant::now());
    }
    assert_eq!(fire(&mut m).await, Action::Wait, "own echoes cause no writes");
    assert_eq!(m.state(), &State::Idle);
}

#[tokio::test(start_paused = true)]
async fn a_wiped_pool_is_recreated_with_a_newer_generation_after_the_debounce() {
    let mut m = machine(None, 2);
    let mut counter = 0;
    publish_first(&mut m, &mut counter).await;
    let first_generation = seen_by(&m)[0].spec.pool.generation;

    let t0 = Instant::now();
    for s in seen_by(&m) {
        m.step(Input::Watch(watcher::Event::Deleted(s)), Instant::now());
    }
    assert_eq!(m.timer(), Some(t0 + DEBOUNCE));
    let Action::Apply(p) = fire(&mut m).await else { panic!("the wiped pool is re-created") };
    assert_eq!(t0.elapsed(), DEBOUNCE);
    assert!(!p.creates.is_empty());
    assert!(p.generation > first_generation, "generation {} after {first_generation}", p.generation);
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_with_growing_jittered_delays_until_a_success_resets_them() {
    let mut m = machine(None, 2);
    m.step(Input::Watch(watcher::Event::Restarted(Vec::new())), Instant::now());
    let Action::Apply(p) = fire(&mut m).await else { panic!("the first plan writes") };
    let mut plan = p;
    for n in 0..8u32 {
        let failed_at = Instant::now();
        let applied = Applied { writes: 1, seen: Vec::new(), result: Err(refused()) };
        assert_eq!(m.step(Input::Applied(applied), failed_at), Action::Wait);
        let State::BackingOff { at } = *m.state() else { panic!("backing off, not {:?}", m.state()) };
        let delay = at - failed_at;
        let exp = RETRY_BASE.saturating_mul(1 << n).min(RETRY_MAX);
        assert!(delay >= exp / 2 && delay <= exp, "retry {n}: {delay:?} outside [{:?}, {exp:?}]", exp / 2);
        let report = m.take_report().expect("a failure is reported");
        assert!(!report.in_sync);
        assert_eq!(report.writes, u64::from(n) + 1, "failed writes count");
        assert!(report.last_error.as_deref().is_some_and(|e| e.contains("etcd is unavailable")), "{report:?}");

        // A change while backing off does not hurry the retry.
        m.step(Input::Inventory(Arc::new(inventory(2, "A100"))), Instant::now());
        assert_eq!(m.timer(), Some(at));
        let Action::Apply(again) = fire(&mut m).await else { panic!("the retry writes again") };
        assert!(Instant::now() - at < Duration::from_millis(1), "retried at its time (timer granularity 1 ms)");
        plan = again;
    }

    let mut counter = 0;
    let applied = server_applies(&m, &plan, &mut counter);
    m.step(Input::Applied(applied), Instant::now());
    assert_eq!(fire(&mut m).await, Action::Wait);
    assert_eq!(m.take_report().map(|r| r.last_error), Some(None), "the error clears once in sync");

    // The next failure starts from the first delay again.
    m.step(Input::Inventory(Arc::new(inventory(3, "A100"))), Instant::now());
    let Action::Apply(_) = fire(&mut m).await else { panic!("the new device is published") };
    let failed_at = Instant::now();
    m.step(Input::Applied(Applied { writes: 1, seen: Vec::new(), result: Err(refused()) }), failed_at);
    let delay = m.timer().expect("backing off") - failed_at;
    assert!(delay <= RETRY_BASE, "after a success the backoff starts over: {delay:?}");
}

#[tokio::test(start_paused = true)]
async fn a_recreated_node_is_read_before_creating_and_its_new_uid_is_the_owner() {
    let mut m = machine(Some("uid-old"), 2);
    m.step(Input::Watch(watcher::Event::Restarted(Vec::new())), Instant::now());
    assert_eq!(fire(&mut m).await, Action::RefreshOwner, "creates wait for the Node to be read");
    assert!(matches!(m.state(), State::RefreshingOwner { .. }));

    let read_at = Instant::now();
    let action = m.step(Input::OwnerRefreshed(Ok(Some("uid-new".into()))), read_at);
    assert_eq!(action, Action::Wait);
    assert_eq!(m.node().uid.as_deref(), Some("uid-new"));
    assert_eq!(m.timer(), Some(read_at), "planned again at once with the new owner");

    assert_eq!(fire(&mut m).await, Action::RefreshOwner);
    let Action::Apply(p) = m.step(Input::OwnerRefreshed(Ok(Some("uid-new".into()))), Instant::now()) else {
        panic!("an unchanged owner goes on to write")
    };
    for s in &p.creates {
        let owners = s.metadata.owner_references.as_deref().unwrap_or_default();
        assert_eq!(owners.iter().map(|o| o.uid.as_str()).collect::<Vec<_>>(), ["uid-new"]);
    }
    assert_eq!(read_at.elapsed(), Duration::ZERO, "no debounce between the reads and the writes");
}

#[tokio::test(start_paused = true)]
async fn a_failed_node_read_backs_off_and_updates_do_not_read_the_node() {
    let mut m = machine(Some("uid-1"), 2);
    m.step(Input::Watch(watcher::Event::Restarted(Vec::new())), Instant::now());
    assert_eq!(fire(&mut m).await, Action::RefreshOwner);
    let failed_at = Instant::now();
    assert_eq!(m.step(Input::OwnerRefreshed(Err(refused())), failed_at), Action::Wait);
    let delay = m.timer().expect("backing off") - failed_at;
    assert!(matches!(m.state(), State::BackingOff { .. }) && delay <= RETRY_BASE, "{:?}", m.state());
    assert_eq!(m.take_report().map(|r| r.in_sync), Some(false));

    assert_eq!(fire(&mut m).await, Action::RefreshOwner, "retried after the backoff");
    let Action::Apply(p) = m.step(Input::OwnerRefreshed(Ok(Some("uid-1".into()))), Instant::now()) else {
        panic!("same owner: write")
    };
    let mut counter = 0;
    let applied = server_applies(&m, &p, &mut counter);
    m.step(Input::Applied(applied), Instant::now());
    assert_eq!(fire(&mut m).await, Action::Wait);

    // A changed device only updates the existing slice: no Node read.
    m.step(Input::Inventory(Arc::new(inventory(2, "H100"))), Instant::now());
    let Action::Apply(p) = fire(&mut m).await else { panic!("an update without reading the Node") };
    assert!(p.creates.is_empty() && !p.updates.is_empty(), "{p:?}");
}

/// A snapshot in which GPU `uuid` had a fatal XID 79.
fn sick(uuid: &str) -> Arc<HealthSnapshot> {
    use crate::health::view::{Event, HealthView, Rules};
    let mut v = HealthView::default();
    let rules = Rules { ignored_xids: Default::default(), quiet_period: Duration::from_secs(60) };
    v.apply(Event::Xid { gpu: uuid.into(), xid: 79 }, std::time::SystemTime::now(), &rules);
    Arc::new(HealthSnapshot { gpus: v.gpus, xids_seen: v.xids_seen })
}

#[tokio::test(start_paused = true)]
async fn a_health_change_is_one_tainted_update_at_once() {
    let mut m = machine(None, 2).with_health(Arc::default(), true);
    let mut counter = 0;
    publish_first(&mut m, &mut counter).await;
    let t0 = Instant::now();
    m.step(Input::Health(sick("GPU-00000001")), t0);
    let Action::Apply(p) = fire(&mut m).await else { panic!("the taint is written") };
    assert_eq!(t0.elapsed(), Duration::ZERO, "no debounce for health");
    assert_eq!(p.updates.len(), 1);
    assert_eq!(m.state(), &State::Applying { generation: p.generation, tainted: true });
    let device = p.updates[0].spec.devices.iter().flatten().find(|d| d.name == "gpu-1").expect("gpu-1");
    assert_eq!(device.taints.as_ref().map(|t| t[0].key.as_str()), Some("gpu.edra.dev/xid"));
    let applied = server_applies(&m, &p, &mut counter);
    m.step(Input::Applied(applied), Instant::now());
    assert_eq!(fire(&mut m).await, Action::Wait, "converged");
    assert!(m.taints_kept());
}

#[tokio::test(start_paused = true)]
async fn health_changes_during_a_write_join_one_plan_and_hurry_a_debounced_change() {
    let mut m = machine(None, 2).with_health(Arc::default(), true);
    let mut counter = 0;
    publish_first(&mut m, &mut counter).await;
    // A debounced change (a slice event) is pulled in by a health change.
    let t0 = Instant::now();
    let mut other = seen_by(&m)[0].clone();
    other.metadata.labels = Some([("edited".to_string(), "yes".to_string())].into());
    m.step(Input::Watch(watcher::Event::Applied(other)), t0);
    assert_eq!(m.timer(), Some(t0 + DEBOUNCE));
    m.step(Input::Health(sick("GPU-00000000")), t0);
    assert_eq!(m.timer(), Some(t0), "health does not wait for the debounce");
    let Action::Apply(p) = fire(&mut m).await else { panic!("the taint is written") };
    // Three more health changes while the write is applied: one plan after it, with all.
    let mut both = (*sick("GPU-00000000")).clone();
    both.gpus.extend(sick("GPU-00000001").gpus.clone());
    for _ in 0..3 {
        m.step(Input::Health(Arc::new(both.clone())), Instant::now());
    }
    assert!(matches!(m.state(), State::Applying { .. }), "a write in flight is not interrupted");
    let applied = server_applies(&m, &p, &mut counter);
    m.step(Input::Applied(applied), Instant::now());
    let Action::Apply(p) = fire(&mut m).await else { panic!("the second taint is written") };
    let tainted: Vec<&str> = p
        .updates
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .filter(|d| d.taints.is_some())
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(tainted, ["gpu-0", "gpu-1"]);
    let applied = server_applies(&m, &p, &mut counter);
    m.step(Input::Applied(applied), Instant::now());
    assert_eq!(fire(&mut m).await, Action::Wait, "converged after two writes");
}

#[tokio::test(start_paused = true)]
async fn taints_the_server_drops_are_not_written_again() {
    let mut m = machine(None, 2).with_health(Arc::default(), false);
    let mut counter = 0;
    publish_first(&mut m, &mut counter).await;
    m.step(Input::Health(sick("GPU-00000000")), Instant::now());
    let Action::Apply(p) = fire(&mut m).await else { panic!("the taint is written") };
    // The server stores the slice without the taints (DRADeviceTaints off).
    let mut applied = server_applies(&m, &p, &mut counter);
    for seen in &mut applied.seen {
        if let Seen::Written(s) = seen {
            for d in s.spec.devices.iter_mut().flatten() {
                d.taints = None;
            }
        }
    }
    m.step(Input::Applied(applied), Instant::now());
    assert!(!m.taints_kept());
    assert_eq!(fire(&mut m).await, Action::Wait, "what the server kept is what edra wants now: no loop");
    m.step(Input::Health(sick("GPU-00000001")), Instant::now());
    assert_eq!(fire(&mut m).await, Action::Wait, "later health changes write nothing either");
}

#[tokio::test(start_paused = true)]
async fn a_gpu_with_shares_keeps_its_published_sharing_until_the_last_share_is_gone() {
    let step = |s: &ResourceSlice, gpu: &str| -> Option<String> {
        let d = s.spec.devices.iter().flatten().find(|d| d.name == gpu)?;
        let range = d.capacity.as_ref()?.get("memory")?.request_policy.as_ref()?.valid_range.as_ref()?;
        range.step.as_ref().map(|q| q.0.clone())
    };
    let mut counter = 0;
    let mut m = machine(None, 2).with_sharing(SharingSettings::default());
    publish_first(&mut m, &mut counter).await;
    let before = seen_by(&m);
    assert_eq!(
        (step(&before[0], "gpu-0").as_deref(), step(&before[0], "gpu-1").as_deref()),
        (Some("1Gi"), Some("1Gi"))
    );

    // Restarted with a new step while gpu-0 holds shares: only gpu-1 changes.
    let wider = SharingSettings { memory_step: 2 << 30, ..SharingSettings::default() };
    let held = Arc::new(BTreeSet::from(["gpu-0".to_string()]));
    let mut m = machine(None, 2).with_sharing(wider).with_held_shares(held);
    m.step(Input::Watch(watcher::Event::Restarted(before)), Instant::now());
    let Action::Apply(p) = fire(&mut m).await else { panic!("gpu-1 gets the new step") };
    let written = &p.updates[0];
    assert_eq!((step(written, "gpu-0").as_deref(), step(written, "gpu-1").as_deref()), (Some("1Gi"), Some("2Gi")));
    let applied = server_applies(&m, &p, &mut counter);
    m.step(Input::Applied(applied), Instant::now());
    assert_eq!(fire(&mut m).await, Action::Wait, "nothing more while the share is held");

    // The last share is gone: gpu-0 follows.
    m.step(Input::Shares(Arc::default()), Instant::now());
    let Action::Apply(p) = fire(&mut m).await else { panic!("gpu-0 gets the new step") };
    assert_eq!(step(&p.updates[0], "gpu-0").as_deref(), Some("2Gi"));
}

#[tokio::test(start_paused = true)]
async fn shares_of_a_gpu_published_as_configured_wake_no_reconcile() {
    let mut counter = 0;
    let mut m = machine(None, 2).with_sharing(SharingSettings::default());
    publish_first(&mut m, &mut counter).await;
    assert_eq!(m.state(), &State::Idle);
    // Every prepare and unprepare of a share changes the held set; the GPUs are published
    // as configured, so nothing is due.
    for held in [BTreeSet::from(["gpu-0".to_string()]), BTreeSet::new()] {
        m.step(Input::Shares(Arc::new(held)), Instant::now());
        assert_eq!(m.state(), &State::Idle, "no reconcile is scheduled");
        assert_eq!(m.timer(), None);
    }

    // [sharing] changed under a held share (a restart): gpu-0 stays published as it was,
    // and the release of its last share is what brings the new sharing.
    let before = seen_by(&m);
    let wider = SharingSettings { memory_step: 2 << 30, ..SharingSettings::default() };
    let held = Arc::new(BTreeSet::from(["gpu-0".to_string()]));
    let mut m = machine(None, 2).with_sharing(wider).with_held_shares(held);
    m.step(Input::Watch(watcher::Event::Restarted(before)), Instant::now());
    let Action::Apply(p) = fire(&mut m).await else { panic!("gpu-1 gets the new step") };
    let applied = server_applies(&m, &p, &mut counter);
    m.step(Input::Applied(applied), Instant::now());
    assert_eq!(fire(&mut m).await, Action::Wait);
    assert_eq!(m.state(), &State::Idle);
    m.step(Input::Shares(Arc::new(BTreeSet::from(["gpu-0".to_string(), "gpu-1".to_string()]))), Instant::now());
    assert_eq!(m.state(), &State::Idle, "gpu-1 is published as configured: a share of it changes nothing");
    m.step(Input::Shares(Arc::new(BTreeSet::from(["gpu-1".to_string()]))), Instant::now());
    assert!(matches!(m.state(), State::Due { .. }), "gpu-0's last share went: its new sharing is due");
}

fn dynamic_mig() -> MigSettings {
    MigSettings { dynamic: crate::sharing::GpuSelection::All }
}

fn counter_sets(slices: &[ResourceSlice]) -> usize {
    slices.iter().map(|s| s.spec.shared_counters.as_ref().map_or(0, Vec::len)).sum()
}

#[tokio::test(start_paused = true)]
async fn counters_the_server_drops_turn_dynamic_mig_static_without_a_write_loop() {
    let inv = Arc::new(crate::dynamic_mig::tests::inventory(2));
    let mut m = Machine::new(DRIVER.into(), NodeIdentity { uid: None, ..node() }, inv).with_mig(dynamic_mig(), Ok(()));
    let mut counter = 0;
    m.step(Input::Watch(watcher::Event::Restarted(Vec::new())), Instant::now());
    let Action::Apply(p) = fire(&mut m).await else { panic!("the first plan writes") };
    assert_eq!(counter_sets(&p.creates), 2, "one counter set per GPU");
    assert_eq!(devices_in(&p), 2 * 26);
    // The server stores the slices without counters (DRAPartitionableDevices off).
    let mut applied = server_applies(&m, &p, &mut counter);
    for seen in &mut applied.seen {
        if let Seen::Written(s) = seen {
            s.spec.shared_counters = None;
            for d in s.spec.devices.iter_mut().flatten() {
                d.consumes_counters = None;
            }
        }
    }
    m.step(Input::Applied(applied), Instant::now());
    assert!(!m.partitions_supported());
    let Action::Apply(p) = fire(&mut m).await else { panic!("the static pool replaces the carved one") };
    assert_eq!(counter_sets(&p.creates) + counter_sets(&p.updates), 0);
    assert_eq!(devices_in(&p), 2, "two whole GPUs");
    let applied = server_applies(&m, &p, &mut counter);
    m.step(Input::Applied(applied), Instant::now());
    assert_eq!(fire(&mut m).await, Action::Wait, "static from now on: no loop");
}

#[tokio::test(start_paused = true)]
async fn an_old_server_gets_static_mig_and_instances_edra_owns_are_not_foreign() {
    let mut inv = crate::dynamic_mig::tests::inventory(1);
    inv.mig_gpus[0].instances.push(crate::dynamic_mig::tests::instance(1, 9, 4, 4));
    let inv = Arc::new(inv);
    let mut m = Machine::new(DRIVER.into(), NodeIdentity { uid: None, ..node() }, inv.clone())
        .with_mig(dynamic_mig(), Err("the API server is v1.34.3".into()));
    m.step(Input::Watch(watcher::Event::Restarted(Vec::new())), Instant::now());
    let Action::Apply(p) = fire(&mut m).await else { panic!("writes") };
    assert_eq!((counter_sets(&p.creates), devices_in(&p)), (0, 1), "static: the GPU as discovered");

    let mut m =
        Machine::new(DRIVER.into(), NodeIdentity { uid: None, ..node() }, inv.clone()).with_mig(dynamic_mig(), Ok(()));
    let mut counter = 0;
    m.step(Input::Watch(watcher::Event::Restarted(Vec::new())), Instant::now());
    let Action::Apply(p) = fire(&mut m).await else { panic!("writes") };
    // A foreign 3g.40gb at memory slices 4-7: neither the whole GPU nor that placement is offered.
    let names: Vec<String> =
        p.creates.iter().flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone())).collect();
    assert!(!names.iter().any(|n| n == "gpu-0" || n == "gpu-0-mig-3g40gb-9-4"), "{names:?}");
    let applied = server_applies(&m, &p, &mut counter);
    m.step(Input::Applied(applied), Instant::now());
    assert_eq!(fire(&mut m).await, Action::Wait);
    // The preparer says the instance is edra's: its space is offered again.
    let owned = OwnedInstances::from([(
        inv.mig_gpus[0].uuid.clone(),
        crate::gpu::mig_control::Placement { start: 4, size: 4 },
    )]);
    m.step(Input::MigOwned(Arc::new(owned)), Instant::now());
    let Action::Apply(p) = fire(&mut m).await else { panic!("the freed devices are written") };
    assert_eq!(devices_in(&p), 26, "all 26 devices of the GPU");
}
