//! The loop that keeps this node's ResourceSlices published.
//!
//! It watches the slices of this node and driver (field selectors `spec.nodeName` and
//! `spec.driver`, the only kind of list the node authorizer allows), keeps what it sees in
//! memory, and whenever that or the inventory changes it applies [`plan`]: deletes with
//! preconditions, updates, creates. Its own writes update the in-memory view at once, so
//! their watch echoes cause no further writes; at steady state it makes none. A slice
//! deleted by the kubelet or edited by someone else is repaired after a short debounce.
//! Before creating slices it re-reads the Node, so a Node deleted and registered again
//! (which takes the slices with it) gets slices owned by its new uid.
//! Errors are retried with jittered backoff; a Forbidden answer is logged with the
//! server's message and what to fix. Shutting down never deletes slices and does not wait
//! for a write in flight (the next start adopts whatever it left).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use super::desired::NodeIdentity;
use super::plan::{Plan, plan};
use crate::inventory::Inventory;
use crate::kube::{self, Client, ResourceApi, watcher};

/// How long events are collected before reconciling, so a burst (a kubelet wiping the
/// pool) is answered with one plan.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Retry delays after a failed reconcile.
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// What the publisher reports to the rest of the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishStatus {
    /// The API matched the inventory after the last reconcile.
    pub in_sync: bool,
    /// Devices published.
    pub devices: usize,
    /// Writes made since start.
    pub writes: u64,
    /// The last error, if the last reconcile failed.
    pub last_error: Option<String>,
}

/// Keeps the pool published until `shutdown` turns true.
pub struct Publisher {
    client: Client,
    api: ResourceApi,
    driver: String,
    node: NodeIdentity,
    inventory: watch::Receiver<Arc<Inventory>>,
    status: watch::Sender<PublishStatus>,
}

impl Publisher {
    /// A publisher for `node`'s pool; `status` receives progress.
    pub fn new(
        client: Client,
        api: ResourceApi,
        driver: String,
        node: NodeIdentity,
        inventory: watch::Receiver<Arc<Inventory>>,
        status: watch::Sender<PublishStatus>,
    ) -> Self {
        Self { client, api, driver, node, inventory, status }
    }

    /// The field selector that limits lists and watches to this node's slices.
    pub fn field_selector(&self) -> String {
        format!("spec.nodeName={},spec.driver={}", self.node.name, self.driver)
    }

    /// Runs until `shutdown` becomes true.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut events = Box::pin(self.client.watch_slices(self.api, &self.field_selector()));
        let mut observed: BTreeMap<String, ResourceSlice> = BTreeMap::new();
        let mut synced = false; // the watcher has listed at least once
        let mut dirty = false;
        let mut min_generation = 0i64;
        let mut retry = RETRY_MIN;
        let mut writes = 0u64;
        let mut deadline: Option<tokio::time::Instant> = None;
        loop {
            let sleep_until = deadline.unwrap_or_else(|| kube::backoff::deadline_in(Duration::from_secs(3600)));
            tokio::select! {
                _ = shutdown.changed() => {
                    if *shutdown.borrow() { break; }
                }
                ev = events.next() => {
                    let Some(ev) = ev else { break };
                    match ev {
                        watcher::Event::Restarted(items) => {
                            observed = items.into_iter().filter_map(|s| Some((s.metadata.name.clone()?, s))).collect();
                            synced = true;
                            dirty = true;
                        }
                        watcher::Event::Applied(s) => {
                            if let Some(name) = s.metadata.name.clone() {
                                observed.insert(name, s);
                                dirty = true;
                            }
                        }
                        watcher::Event::Deleted(s) => {
                            if let Some(name) = &s.metadata.name {
                                observed.remove(name);
                                dirty = true;
                            }
                        }
                        watcher::Event::Error(e) => {
                            warn!(error = %e, "watching own ResourceSlices failed; reconnecting");
                        }
                    }
                    if dirty && synced && deadline.is_none() {
                        deadline = Some(tokio::time::Instant::now() + DEBOUNCE);
                    }
                }
                res = self.inventory.changed() => {
                    if res.is_err() { break; }
                    dirty = true;
                    if synced && deadline.is_none() {
                        deadline = Some(tokio::time::Instant::now() + DEBOUNCE);
                    }
                }
                _ = tokio::time::sleep_until(sleep_until), if deadline.is_some() => {
                    deadline = None;
                    if !dirty || !synced { continue; }
                    let inventory = self.inventory.borrow().clone();
                    let current: Vec<ResourceSlice> = observed.values().cloned().collect();
                    let p = plan(&current, &inventory, &self.node, &self.driver, min_generation);
                    if p.is_empty() {
                        dirty = false;
                        retry = RETRY_MIN;
                        self.report(true, inventory.devices.len(), writes, None);
                        continue;
                    }
                    // Writes can hang as long as the request timeout; shutting down must not.
                    let work = async {
                        // Slices are missing: the Node may have been deleted (taking them with
                        // it) and registered again under a new uid the owner reference must name.
                        let refreshed = if p.creates.is_empty() { Ok(false) } else { self.refresh_owner().await };
                        match refreshed {
                            Ok(true) => None,
                            Ok(false) => {
                                info!(
                                    generation = p.generation,
                                    deletes = p.deletes.len(),
                                    updates = p.updates.len(),
                                    creates = p.creates.len(),
                                    "publishing ResourceSlices"
                                );
                                Some(self.apply(&p, &mut observed).await)
                            }
                            Err(e) => Some((0, Err(e))),
                        }
                    };
                    let stop = async {
                        if shutdown.wait_for(|stop| *stop).await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    };
                    let outcome = tokio::select! {
                        outcome = work => outcome,
                        _ = stop => break,
                    };
                    let Some((n, result)) = outcome else {
                        // The owner changed: plan again with it.
                        deadline = Some(tokio::time::Instant::now());
                        continue;
                    };
                    min_generation = min_generation.max(p.generation);
                    writes += n;
                    match result {
                        Ok(()) => {
                            retry = RETRY_MIN;
                            // Re-plan at once: a converged pool gives an empty plan.
                            deadline = Some(tokio::time::Instant::now());
                        }
                        Err(e) => {
                            log_write_error(&e);
                            self.report(false, inventory.devices.len(), writes, Some(crate::app::error_chain(&e)));
                            let jitter = u64::try_from(retry.as_millis() / 2).unwrap_or(u64::MAX);
                            let wait = retry.saturating_add(Duration::from_millis(fastrand::u64(0..=jitter)));
                            deadline = Some(kube::backoff::deadline_in(wait));
                            retry = (retry * 2).min(RETRY_MAX);
                        }
                    }
                }
            }
        }
        debug!("publisher stopped; slices stay published");
    }

    /// Re-reads the Node; `true` if its uid changed (the owner references must follow).
    async fn refresh_owner(&mut self) -> Result<bool, kube::Error> {
        if self.node.uid.is_none() {
            return Ok(false);
        }
        let uid = self.client.get_node(&self.node.name).await?.metadata.uid;
        if uid.is_none() || uid == self.node.uid {
            return Ok(false);
        }
        info!(node = %self.node.name, old = ?self.node.uid, new = ?uid, "the Node was re-created; slices will name its new uid");
        self.node.uid = uid;
        Ok(true)
    }

    fn report(&self, in_sync: bool, devices: usize, writes: u64, last_error: Option<String>) {
        self.status.send_if_modified(|s| {
            let new = PublishStatus { in_sync, devices, writes, last_error };
            if *s == new {
                false
            } else {
                *s = new;
                true
            }
        });
    }

    /// Applies a plan: deletes, then updates, then creates; stops at the first error.
    /// Returns the number of writes attempted and the outcome.
    async fn apply(&self, p: &Plan, observed: &mut BTreeMap<String, ResourceSlice>) -> (u64, Result<(), kube::Error>) {
        let mut n = 0;
        for d in &p.deletes {
            n += 1;
            match self.client.delete_slice(self.api, &d.name, &d.uid, &d.resource_version).await {
                Ok(()) => {
                    observed.remove(&d.name);
                }
                Err(e) if e.is_not_found() => {
                    observed.remove(&d.name);
                }
                Err(e) => return (n, Err(e)),
            }
        }
        // Updates, then creates; the server's answer becomes our view at once, so the
        // watch echo of our own write changes nothing.
        let writes = p.updates.iter().map(|s| (s, true)).chain(p.creates.iter().map(|s| (s, false)));
        for (slice, existing) in writes {
            n += 1;
            let written = if existing {
                self.client.update_slice(self.api, slice).await
            } else {
                self.client.create_slice(self.api, slice).await
            };
            match written {
                Ok(s) => {
                    if let Some(name) = s.metadata.name.clone() {
                        observed.insert(name, s);
                    }
                }
                Err(e) => return (n, Err(e)),
            }
        }
        (n, Ok(()))
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
