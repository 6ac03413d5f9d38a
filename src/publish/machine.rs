//! The publisher's decisions as a state machine, in the manner of kube-rs's watcher: a
//! [`State`], the [`Input`]s that move it (watch events, a new inventory, the timer, the
//! outcome of an API call) and [`Machine::step`], which applies one input and names the
//! [`Action`] the driver ([`super::reconcile`]) takes next. It does no I/O, so debounce,
//! backoff and the owner refresh are tested in paused time without an API server; new
//! reasons to publish (counters, taints, shares) come in as inputs and transitions here.
//!
//! The cycle: the watch lists (`Unsynced` → due) → after the debounce the plan
//! ([`plan_tainted`]) runs; an empty plan means the API matches (`Idle`); a plan that
//! creates slices first re-reads the Node (a Node re-created under a new uid takes its
//! slices with it, and new slices must name the new owner); then the writes are applied
//! and the pool re-planned at once. A failure backs off with jitter; changes while backing
//! off do not hurry the retry. GPU health comes in as [`Input::Health`]: it is urgent (no
//! debounce: a new taint keeps claims off a failing GPU), its taints are planned with the
//! inventory, and a server that drops them (the answer to a write
//! carrying taints has none) is written without them from then on, logged once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::desired::NodeIdentity;
use super::plan::{Plan, plan_tainted};
use super::status::PublishStatus;
use super::taints::{DeviceTaints, device_taints, has_taints};
use crate::dynamic_mig::{FEATURE_GATE, MigSettings, OwnedInstances};
use crate::health::HealthSnapshot;
use crate::inventory::Inventory;
use crate::kube::{self, backoff::Backoff, watcher};
use crate::sharing::{SharingMode, SharingSettings};
use crate::util::error_chain;
use published::{MigLog, dropped_capacity, dropped_counters, warn_capacity_dropped};

/// How long changes are collected before reconciling, so a burst (a kubelet wiping the
/// pool) is answered with one plan.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// Retry delays after a failed reconcile: the n-th is between half and all of
/// `RETRY_BASE·2ⁿ`, at most `RETRY_MAX`.
pub const RETRY_BASE: Duration = Duration::from_secs(1);
pub const RETRY_MAX: Duration = Duration::from_secs(45);

/// Where the publisher is between inputs.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// The watch has not listed yet: without the API's view there is nothing to plan from.
    Unsynced,
    /// The API matched at the last reconcile; waiting for a change.
    Idle,
    /// Something changed: reconcile at `at`. Changes meanwhile join that reconcile (the
    /// debounce); after writes it is due at once, to confirm the pool converged.
    Due { at: Instant },
    /// The last reconcile failed: reconcile again at `at`; changes do not hurry it.
    BackingOff { at: Instant },
    /// The Node is being re-read before `plan` creates slices naming it as their owner.
    RefreshingOwner { plan: Plan },
    /// The writes of pool generation `generation` are being applied; `tainted` when they
    /// carry device taints (so an answer without them shows the server drops them).
    Applying { generation: i64, tainted: bool },
}

/// What moves the machine.
// Inputs live one at a time, moved straight into `step`: boxing the slices would only
// add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Input {
    /// An event of the watch on this node's slices.
    Watch(watcher::Event),
    /// The device inventory changed.
    Inventory(Arc<Inventory>),
    /// The GPUs' health changed (taints may change).
    Health(Arc<HealthSnapshot>),
    /// The GPUs with shares prepared changed (their published sharing stays as it is).
    Shares(Arc<BTreeSet<String>>),
    /// The MIG instances edra created for claims changed (the others are foreign).
    MigOwned(Arc<OwnedInstances>),
    /// The time of [`Machine::timer`] has come.
    Timer,
    /// The Node's uid as re-read for [`Action::RefreshOwner`].
    OwnerRefreshed(Result<Option<String>, kube::Error>),
    /// The outcome of [`Action::Apply`].
    Applied(Applied),
}

/// What applying a plan did.
#[derive(Debug)]
pub struct Applied {
    /// Writes attempted (including the failed one).
    pub writes: u64,
    /// The slices as the server answered, in order; they become the machine's view at
    /// once, so the watch echoes of its own writes change nothing.
    pub seen: Vec<Seen>,
    /// `Err` with the first failed write; the writes after it were not attempted.
    pub result: Result<(), kube::Error>,
}

/// One write's effect on the view of the API.
#[allow(clippy::large_enum_variant)] // short-lived, as `Input`
#[derive(Debug)]
pub enum Seen {
    /// Created or updated: the object the server returned.
    Written(ResourceSlice),
    /// Deleted, or found already gone.
    Removed(String),
}

/// What the driver does next.
#[derive(Debug, PartialEq)]
pub enum Action {
    /// Nothing: wait for the next input, or for [`Machine::timer`].
    Wait,
    /// Re-read the Node named [`Machine::node`] and step with [`Input::OwnerRefreshed`].
    RefreshOwner,
    /// Apply the plan (deletes, updates, creates; stop at the first error) and step with
    /// [`Input::Applied`].
    Apply(Plan),
}

/// The publisher's state and what it knows: the API's slices as seen, the inventory, the
/// highest generation written, writes made and the retry backoff.
#[derive(Debug)]
pub struct Machine {
    state: State,
    driver: String,
    node: NodeIdentity,
    inventory: Arc<Inventory>,
    observed: BTreeMap<String, ResourceSlice>,
    min_generation: i64,
    writes: u64,
    backoff: Backoff,
    report: Option<PublishStatus>,
    sharing: SharingSettings,
    capacity_supported: bool,
    /// GPUs (device names) with shares prepared: their sharing is published as it is.
    held_shares: Arc<BTreeSet<String>>,
    /// GPUs whose published sharing is being kept, to log the change once.
    frozen: BTreeSet<String>,
    /// GPUs published with another sharing than `[sharing]` gives them, as of the last
    /// reconcile: only a change of their held shares can change what is published.
    unsettled: BTreeSet<String>,
    health: Arc<HealthSnapshot>,
    /// The server accepts the `None` taint effect (resource.k8s.io/v1, Kubernetes 1.35+).
    none_effect: bool,
    /// The server keeps device taints; false once it dropped them (gate off, too old).
    taints_kept: bool,
    mig: MigSettings,
    /// The MIG instances edra created (or is creating) for claims.
    owned_mig: Arc<OwnedInstances>,
    /// The server takes partitionable devices in split slices (Kubernetes 1.35+, gate on);
    /// false when its version says otherwise or once it dropped the counters.
    partitions_supported: bool,
    /// What was last logged about dynamic MIG, to log changes once.
    mig_logged: MigLog,
}

impl Machine {
    /// A machine for `node`'s pool of `driver`, waiting for the watch's first list.
    pub fn new(driver: String, node: NodeIdentity, inventory: Arc<Inventory>) -> Self {
        Machine {
            state: State::Unsynced,
            driver,
            node,
            inventory,
            observed: BTreeMap::new(),
            min_generation: 0,
            writes: 0,
            backoff: Backoff::new(RETRY_BASE, RETRY_MAX),
            report: None,
            sharing: SharingSettings { mode: SharingMode::Exclusive, ..SharingSettings::default() },
            capacity_supported: true,
            held_shares: Arc::default(),
            frozen: BTreeSet::new(),
            unsettled: BTreeSet::new(),
            health: Arc::default(),
            none_effect: false,
            taints_kept: true,
            mig: MigSettings::default(),
            owned_mig: Arc::default(),
            partitions_supported: true,
            mig_logged: MigLog::default(),
        }
    }

    /// Carves the GPUs `mig` selects into MIG devices (dynamic MIG) when `supported` (the
    /// server's version allows partitionable devices; see
    /// [`super::reconcile::accepts_partitions`]), otherwise publishes them statically and
    /// says why once.
    pub fn with_mig(mut self, mig: MigSettings, supported: Result<(), String>) -> Self {
        if let Err(why) = &supported
            && mig.any()
        {
            warn!(
                "dynamic MIG needs partitionable devices (Kubernetes 1.35 or newer with the {FEATURE_GATE} feature \
                gate; on by default from 1.36), and {why}: the GPUs [mig] dynamic selects are published statically \
                (their existing MIG devices, or whole)"
            );
        }
        self.partitions_supported = supported.is_ok();
        self.mig = mig;
        self
    }

    /// False when the server cannot take dynamic MIG's counters (version, or it dropped them).
    pub fn partitions_supported(&self) -> bool {
        self.partitions_supported
    }

    /// Treats the MIG instances in `owned` as edra's (see [`Input::MigOwned`]).
    pub fn with_owned_mig(mut self, owned: Arc<OwnedInstances>) -> Self {
        self.owned_mig = owned;
        self
    }

    /// Publishes full GPUs as `sharing` says (the default is every GPU exclusive).
    pub fn with_sharing(mut self, sharing: SharingSettings) -> Self {
        self.sharing = sharing;
        self
    }

    /// False once the API server was seen dropping consumable capacity from a written slice.
    pub fn capacity_supported(&self) -> bool {
        self.capacity_supported
    }

    /// Keeps the published sharing of `held` GPUs (those with shares prepared).
    pub fn with_held_shares(mut self, held: Arc<BTreeSet<String>>) -> Self {
        self.held_shares = held;
        self
    }

    /// Publishes taints for `health`; informational ones (effect `None`) only with
    /// `none_effect`.
    pub fn with_health(mut self, health: Arc<HealthSnapshot>, none_effect: bool) -> Self {
        self.health = health;
        self.none_effect = none_effect;
        self
    }

    /// Whether the server keeps the device taints edra writes (false once it dropped them).
    pub fn taints_kept(&self) -> bool {
        self.taints_kept
    }

    /// The taints to publish now.
    fn taints(&self, published: &Inventory) -> DeviceTaints {
        if !self.taints_kept {
            return DeviceTaints::new();
        }
        device_taints(published, &self.health, &self.driver, self.none_effect)
    }

    /// The current state.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The Node whose pool this is (its uid as last read).
    pub fn node(&self) -> &NodeIdentity {
        &self.node
    }

    /// The driver name.
    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// When the driver must step with [`Input::Timer`], if the state waits for a time.
    pub fn timer(&self) -> Option<Instant> {
        match self.state {
            State::Due { at } | State::BackingOff { at } => Some(at),
            _ => None,
        }
    }

    /// The status to publish, once, after a reconcile decided it (`None` in between).
    pub fn take_report(&mut self) -> Option<PublishStatus> {
        self.report.take()
    }

    /// Applies one input at time `now` and says what to do next.
    pub fn step(&mut self, input: Input, now: Instant) -> Action {
        match input {
            Input::Watch(event) => {
                self.on_watch(event, now);
                Action::Wait
            }
            Input::Inventory(inventory) => {
                self.inventory = inventory;
                self.changed(now);
                Action::Wait
            }
            Input::Health(health) => {
                self.health = health;
                self.urgent(now);
                Action::Wait
            }
            Input::Shares(held) => {
                // Shares come and go with every prepare of one; what is published changes
                // only for a GPU whose sharing is kept for its shares, or now can be.
                let matters = self.held_shares.symmetric_difference(&held).any(|g| self.unsettled.contains(g));
                self.held_shares = held;
                if matters {
                    self.changed(now);
                }
                Action::Wait
            }
            Input::MigOwned(owned) => {
                self.owned_mig = owned;
                self.changed(now);
                Action::Wait
            }
            Input::Timer => self.on_timer(now),
            Input::OwnerRefreshed(uid) => self.on_owner(uid, now),
            Input::Applied(applied) => self.on_applied(applied, now),
        }
    }

    fn on_watch(&mut self, event: watcher::Event, now: Instant) {
        match event {
            watcher::Event::Restarted(items) => {
                self.observed = items.into_iter().filter_map(|s| Some((s.metadata.name.clone()?, s))).collect();
                if self.state == State::Unsynced {
                    // The first list is the whole picture and the inventory is known:
                    // nothing to collect, so the first publish goes out at once.
                    self.state = State::Due { at: now };
                } else {
                    self.changed(now);
                }
            }
            watcher::Event::Applied(s) => {
                if let Some(name) = s.metadata.name.clone() {
                    self.observed.insert(name, s);
                    self.changed(now);
                }
            }
            watcher::Event::Deleted(s) => {
                if let Some(name) = &s.metadata.name {
                    self.observed.remove(name);
                    self.changed(now);
                }
            }
            watcher::Event::Error(e) => warn!(error = %e, "watching own ResourceSlices failed; reconnecting"),
        }
    }

    /// Something the plan depends on changed: an idle machine reconciles after the debounce.
    fn changed(&mut self, now: Instant) {
        if self.state == State::Idle {
            self.state = State::Due { at: now + DEBOUNCE };
        }
    }

    /// A change that must reach the API server without the debounce (a GPU's health: its
    /// taint keeps new claims off it): an idle machine, or one waiting out the debounce,
    /// reconciles now. Changes that come while writes are applied still join the one plan
    /// that follows them, and a machine backing off from a failure is not hurried.
    fn urgent(&mut self, now: Instant) {
        match self.state {
            State::Idle => self.state = State::Due { at: now },
            State::Due { at } if at > now => self.state = State::Due { at: now },
            _ => {}
        }
    }

    fn on_timer(&mut self, now: Instant) -> Action {
        match self.timer() {
            Some(at) if at <= now => {}
            _ => return Action::Wait,
        }
        let current: Vec<ResourceSlice> = self.observed.values().cloned().collect();
        let carved = self.carved();
        self.log_mig(&carved);
        let (published, frozen, unsettled) = self.published_from(&carved);
        self.unsettled = unsettled;
        self.log_frozen(frozen);
        let taints = self.taints(&published);
        let p = plan_tainted(&current, &published, &taints, &self.node, &self.driver, self.min_generation);
        if p.is_empty() {
            self.backoff.reset();
            self.state = State::Idle;
            self.report(true, None);
            return Action::Wait;
        }
        // Slices are missing: the Node may have been deleted (taking them with it) and
        // registered again under a new uid the owner reference must name.
        if !p.creates.is_empty() && self.node.uid.is_some() {
            self.state = State::RefreshingOwner { plan: p };
            return Action::RefreshOwner;
        }
        self.apply(p)
    }

    fn on_owner(&mut self, uid: Result<Option<String>, kube::Error>, now: Instant) -> Action {
        let p = match std::mem::replace(&mut self.state, State::Idle) {
            State::RefreshingOwner { plan } => plan,
            other => {
                self.state = other;
                return Action::Wait;
            }
        };
        match uid {
            Ok(uid) if uid.is_some() && uid != self.node.uid => {
                info!(node = %self.node.name, old = ?self.node.uid, new = ?uid, "the Node was re-created; slices will name its new uid");
                self.node.uid = uid;
                // Plan again with the new owner.
                self.state = State::Due { at: now };
                Action::Wait
            }
            Ok(_) => self.apply(p),
            Err(e) => {
                self.min_generation = self.min_generation.max(p.generation);
                self.failed(&e, now)
            }
        }
    }

    fn apply(&mut self, p: Plan) -> Action {
        info!(
            generation = p.generation,
            deletes = p.deletes.len(),
            updates = p.updates.len(),
            creates = p.creates.len(),
            "publishing ResourceSlices"
        );
        let tainted = p.updates.iter().chain(&p.creates).any(has_taints);
        self.state = State::Applying { generation: p.generation, tainted };
        Action::Apply(p)
    }

    fn on_applied(&mut self, applied: Applied, now: Instant) -> Action {
        let State::Applying { generation, tainted } = self.state else {
            return Action::Wait;
        };
        let written: Vec<&ResourceSlice> =
            applied.seen.iter().filter_map(|s| if let Seen::Written(s) = s { Some(s) } else { None }).collect();
        if tainted && !written.is_empty() && !written.iter().any(|s| has_taints(s)) {
            // Planning with taints again would rewrite the same slices forever.
            self.taints_kept = false;
            warn!(
                "the API server dropped the device taints edra wrote (its DRADeviceTaints feature gate is off, or it \
                 is older than Kubernetes 1.33): unhealthy GPUs stay allocatable; their health is still in the \
                 metrics, `edra doctor` and the kubelet's health stream"
            );
        }
        if (self.capacity_supported || self.partitions_supported) && !written.is_empty() {
            let (published, _) = self.published();
            if self.capacity_supported && written.iter().any(|s| dropped_capacity(s, &published)) {
                // Planning with request policies again would rewrite the same slices forever.
                self.capacity_supported = false;
                warn_capacity_dropped(&self.sharing);
            }
            if self.partitions_supported && written.iter().any(|s| dropped_counters(s, &published)) {
                // Planning with counters again would rewrite the same slices forever.
                self.partitions_supported = false;
                warn!(
                    "the API server dropped the counters of dynamic MIG (sharedCounters, consumesCounters) from \
                    edra's ResourceSlices: its {FEATURE_GATE} feature gate is off (alpha in 1.35, on by default \
                    from 1.36); the GPUs [mig] dynamic selects are published statically instead. To carve GPUs \
                    on demand, enable the gate on kube-apiserver and kube-scheduler \
                    (--feature-gates={FEATURE_GATE}=true) and restart edra"
                );
            }
        }
        for seen in applied.seen {
            match seen {
                Seen::Written(s) => {
                    if let Some(name) = s.metadata.name.clone() {
                        self.observed.insert(name, s);
                    }
                }
                Seen::Removed(name) => {
                    self.observed.remove(&name);
                }
            }
        }
        self.min_generation = self.min_generation.max(generation);
        self.writes = self.writes.saturating_add(applied.writes);
        match applied.result {
            Ok(()) => {
                self.backoff.reset();
                // Re-plan at once: a converged pool gives an empty plan.
                self.state = State::Due { at: now };
                Action::Wait
            }
            Err(e) => self.failed(&e, now),
        }
    }

    fn failed(&mut self, e: &kube::Error, now: Instant) -> Action {
        log_write_error(e);
        self.report(false, Some(error_chain(e)));
        self.state = State::BackingOff { at: now + self.backoff.next_delay() };
        Action::Wait
    }

    fn report(&mut self, in_sync: bool, last_error: Option<String>) {
        let devices = self.inventory.devices.len();
        self.report = Some(PublishStatus { in_sync, devices, writes: self.writes, last_error });
    }
}

fn log_write_error(e: &kube::Error) {
    if e.is_forbidden() {
        error!(
            error = %e,
            "the API server refused to let edra write its ResourceSlices; with node credentials \
             check that spec.nodeName equals the node name edra uses (node_name), otherwise grant \
             the RBAC in config/rbac.yaml"
        );
    } else if e.is_conflict() {
        debug!(error = %e, "a slice changed under us; re-planning from the newer version");
    } else {
        warn!(error = %e, "publishing ResourceSlices failed; will retry");
    }
}

mod published;
#[cfg(test)]
mod tests;
