//! The loop that keeps this node's ResourceSlices published.
//!
//! It watches the slices of this node and driver (field selectors `spec.nodeName` and
//! `spec.driver`, the only kind of list the node authorizer allows), keeps what it sees in
//! memory, and whenever that or the inventory changes it applies
//! [`plan`](super::plan::plan): deletes with preconditions, updates, creates. Its own
//! writes update the in-memory view at once, so their watch echoes cause no further
//! writes; at steady state it makes none. A slice
//! deleted by the kubelet or edited by someone else is repaired after a short debounce.
//! Before creating slices it re-reads the Node, so a Node deleted and registered again
//! (which takes the slices with it) gets slices owned by its new uid.
//! Errors are retried with jittered backoff; a Forbidden answer is logged with the
//! server's message and what to fix. Shutting down never deletes slices and does not wait
//! for a write in flight (the next start adopts whatever it left).
//!
//! The decisions are [`Machine`]'s (see [`super::machine`]); this driver only feeds it
//! inputs, sleeps until its timer and performs the API calls it asks for.

use std::sync::Arc;

use futures_util::StreamExt;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::debug;

use super::desired::NodeIdentity;
use super::machine::{Action, Applied, Input, Machine, Seen};
use super::plan::Plan;
use super::status::PublishStatus;
use crate::health::HealthSnapshot;
use crate::inventory::Inventory;
use crate::kube::{Client, ResourceApi};
use crate::util::{stopped, until_stopped};

/// Keeps the pool published until `shutdown` turns true.
pub struct Publisher {
    client: Client,
    api: ResourceApi,
    inventory: watch::Receiver<Arc<Inventory>>,
    status: watch::Sender<PublishStatus>,
    machine: Machine,
    health: Option<watch::Receiver<Arc<HealthSnapshot>>>,
    held_shares: Option<watch::Receiver<Arc<std::collections::BTreeSet<String>>>>,
    owned_mig: Option<watch::Receiver<Arc<crate::dynamic_mig::OwnedInstances>>>,
}

impl Publisher {
    /// A publisher for `node`'s pool; `status` receives progress.
    pub fn new(
        client: Client,
        api: ResourceApi,
        driver: String,
        node: NodeIdentity,
        mut inventory: watch::Receiver<Arc<Inventory>>,
        status: watch::Sender<PublishStatus>,
    ) -> Self {
        let machine = Machine::new(driver, node, inventory.borrow_and_update().clone());
        Self { client, api, inventory, status, machine, health: None, held_shares: None, owned_mig: None }
    }

    /// Publishes the taints of GPU health from `health` as it changes; informational
    /// taints (effect `None`) only with `none_effect` (see [`accepts_none_effect`]).
    pub fn with_health(mut self, mut health: watch::Receiver<Arc<HealthSnapshot>>, none_effect: bool) -> Self {
        self.machine = self.machine.with_health(health.borrow_and_update().clone(), none_effect);
        self.health = Some(health);
        self
    }

    /// Publishes full GPUs as `[sharing]` says (without it, every GPU is exclusive).
    pub fn with_sharing(mut self, sharing: crate::sharing::SharingSettings) -> Self {
        self.machine = self.machine.with_sharing(sharing);
        self
    }

    /// Keeps the published sharing of the GPUs `held` names (those with shares prepared),
    /// and publishes the new one when they are gone.
    pub fn with_held_shares(mut self, mut held: watch::Receiver<Arc<std::collections::BTreeSet<String>>>) -> Self {
        self.machine = self.machine.with_held_shares(held.borrow_and_update().clone());
        self.held_shares = Some(held);
        self
    }

    /// Carves the GPUs `[mig] dynamic` selects into MIG devices when `supported` (see
    /// [`accepts_partitions`]); the MIG instances `owned` lists are edra's, any other one on
    /// those GPUs is foreign and its space is not offered.
    pub fn with_mig(
        mut self,
        mig: crate::dynamic_mig::MigSettings,
        supported: Result<(), String>,
        mut owned: watch::Receiver<Arc<crate::dynamic_mig::OwnedInstances>>,
    ) -> Self {
        self.machine = self.machine.with_mig(mig, supported).with_owned_mig(owned.borrow_and_update().clone());
        self.owned_mig = Some(owned);
        self
    }

    /// The field selector that limits lists and watches to this node's slices.
    pub fn field_selector(&self) -> String {
        format!("spec.nodeName={},spec.driver={}", self.machine.node().name, self.machine.driver())
    }

    /// Runs until `shutdown` becomes true.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut events = Box::pin(self.client.watch_slices(self.api, &self.field_selector()));
        loop {
            let timer = self.machine.timer();
            let input = tokio::select! {
                () = stopped(&mut shutdown) => break,
                event = events.next() => match event {
                    Some(event) => Input::Watch(event),
                    None => break,
                },
                changed = self.inventory.changed() => match changed {
                    Ok(()) => Input::Inventory(self.inventory.borrow_and_update().clone()),
                    Err(_) => break,
                },
                health = changed(&mut self.health) => match health {
                    Some(h) => Input::Health(h),
                    None => {
                        self.health = None;
                        continue;
                    }
                },
                held = changed(&mut self.held_shares) => match held {
                    Some(h) => Input::Shares(h),
                    None => {
                        self.held_shares = None;
                        continue;
                    }
                },
                owned = changed(&mut self.owned_mig) => match owned {
                    Some(o) => Input::MigOwned(o),
                    None => {
                        self.owned_mig = None;
                        continue;
                    }
                },
                () = tokio::time::sleep_until(timer.unwrap_or_else(Instant::now)), if timer.is_some() => Input::Timer,
            };
            let action = self.machine.step(input, Instant::now());
            if self.perform(action, &mut shutdown).await.is_none() {
                break;
            }
        }
        debug!("publisher stopped; slices stay published");
    }

    /// Whether the server keeps the device taints edra writes.
    pub fn taints_kept(&self) -> bool {
        self.machine.taints_kept()
    }

    /// Performs the machine's actions until it waits again; `None` when shutdown came first
    /// (a write in flight can hang as long as the request timeout; shutting down must not).
    async fn perform(&mut self, mut action: Action, shutdown: &mut watch::Receiver<bool>) -> Option<()> {
        loop {
            if let Some(report) = self.machine.take_report() {
                self.status.send_if_modified(|s| {
                    let changed = *s != report;
                    *s = report;
                    changed
                });
            }
            let input = match action {
                Action::Wait => return Some(()),
                Action::RefreshOwner => {
                    let read = self.client.get_node(&self.machine.node().name);
                    Input::OwnerRefreshed(until_stopped(read, shutdown).await?.map(|n| n.metadata.uid))
                }
                Action::Apply(plan) => Input::Applied(until_stopped(self.apply(&plan), shutdown).await?),
            };
            action = self.machine.step(input, Instant::now());
        }
    }

    /// Applies a plan: deletes, then updates, then creates; stops at the first error.
    async fn apply(&self, p: &Plan) -> Applied {
        let mut applied = Applied { writes: 0, seen: Vec::new(), result: Ok(()) };
        for d in &p.deletes {
            applied.writes += 1;
            match self.client.delete_slice(self.api, &d.name, &d.uid, &d.resource_version).await {
                Ok(()) => applied.seen.push(Seen::Removed(d.name.clone())),
                Err(e) if e.is_not_found() => applied.seen.push(Seen::Removed(d.name.clone())),
                Err(e) => {
                    applied.result = Err(e);
                    return applied;
                }
            }
        }
        let writes = p.updates.iter().map(|s| (s, true)).chain(p.creates.iter().map(|s| (s, false)));
        for (slice, existing) in writes {
            applied.writes += 1;
            let written = if existing {
                self.client.update_slice(self.api, slice).await
            } else {
                self.client.create_slice(self.api, slice).await
            };
            match written {
                Ok(s) => applied.seen.push(Seen::Written(s)),
                Err(e) => {
                    applied.result = Err(e);
                    return applied;
                }
            }
        }
        applied
    }
}

/// Whether a server speaking `api` with `/version` `git_version` (e.g. `v1.36.2+k3s1`)
/// accepts the `None` taint effect: resource.k8s.io/v1 from Kubernetes 1.35 on. An
/// unreadable version counts as new enough when the server speaks v1.
pub fn accepts_none_effect(api: ResourceApi, git_version: Option<&str>) -> bool {
    if api != ResourceApi::V1 {
        return false;
    }
    server_minor(git_version).is_none_or(|(major, minor)| major > 1 || minor >= 35)
}

/// Whether a server speaking `api` with `/version` `git_version` takes dynamic MIG's
/// partitionable devices as edra writes them (counter sets in slices of their own):
/// resource.k8s.io/v1 from Kubernetes 1.35 on. `Err` says why not. An unreadable version
/// counts as new enough when the server speaks v1 (a server that drops the counters is
/// caught from its answers).
pub fn accepts_partitions(api: ResourceApi, git_version: Option<&str>) -> Result<(), String> {
    if api != ResourceApi::V1 {
        return Err(format!("the API server serves resource.k8s.io/{} only", api.version()));
    }
    match server_minor(git_version) {
        Some((major, minor)) if major == 1 && minor < 35 => {
            Err(format!("the API server is {}", git_version.unwrap_or_default()))
        }
        _ => Ok(()),
    }
}

/// (major, minor) of a `/version` gitVersion such as `v1.36.2+k3s1`.
fn server_minor(git_version: Option<&str>) -> Option<(u32, u32)> {
    let rest = git_version?.trim_start_matches('v');
    let mut parts = rest.split('.');
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next()?.chars().take_while(char::is_ascii_digit).collect::<String>().parse().ok()?;
    Some((major, minor))
}

/// The next value of `rx`; `None` when its sender is gone; pending forever without one.
async fn changed<T>(rx: &mut Option<watch::Receiver<Arc<T>>>) -> Option<Arc<T>> {
    match rx {
        Some(rx) => match rx.changed().await {
            Ok(()) => Some(rx.borrow_and_update().clone()),
            Err(_) => None,
        },
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
