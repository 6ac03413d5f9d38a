//! Control and observation helpers of the [`TestApiServer`] handle: fault injection,
//! authorization knobs, history compaction, connection control (refuse, stop, graceful
//! stop, restart on the same port), the request log and `wait_for`.

use std::sync::PoisonError;
use std::time::Duration;

use super::{ApiServerError, Fault, ForbidRule, RequestRecord, State, TestApiServer, server};

impl TestApiServer {
    /// Adds a fault (see [`Fault::next`]); faults are consulted in the order added, after
    /// authentication. `times: usize::MAX` makes it permanent (e.g. a fixed latency).
    pub fn inject(&self, fault: Fault) {
        self.shared.mutate(|s| s.faults.push(fault));
    }

    /// Forbids `verb` on `resource` (plural, e.g. `resourceslices`) for `user`.
    pub fn forbid(&self, user: &str, verb: &str, resource: &str) {
        let rule = ForbidRule { user: user.to_owned(), verb: verb.to_owned(), resource: resource.to_owned() };
        self.shared.mutate(|s| s.forbid.push(rule));
    }

    /// Grants node identities claim status writes for every driver (the opt-in RBAC).
    pub fn grant_claim_status(&self) {
        self.shared.mutate(|s| s.claim_status_rbac = true);
    }

    /// Drops `status.devices` of claims, as a server with `DRAResourceClaimDeviceStatus` off.
    pub fn drop_device_status(&self) {
        self.shared.mutate(|s| s.device_status = false);
    }

    /// Applies another manager's `status.devices` entries to claim `namespace/name`, as an
    /// other driver would (no authorization).
    pub fn put_device_status(&self, namespace: &str, name: &str, manager: &str, entry: serde_json::Value) {
        self.shared.mutate(|s| {
            let id = (namespace.to_owned(), name.to_owned());
            let key = ["driver", "pool", "device", "shareID"]
                .map(|k| entry[k].as_str().unwrap_or_default().to_owned())
                .join("/");
            if let Some(claim) = s.claims.get_mut(&id) {
                let devices =
                    claim["status"].as_object_mut().map(|st| st.entry("devices").or_insert(serde_json::json!([])));
                if let Some(serde_json::Value::Array(list)) = devices {
                    list.push(entry);
                }
            }
            s.status_owners.entry(id).or_default().insert(key, manager.to_owned());
        });
    }

    pub fn set_node_authorizer(&self, enabled: bool) {
        self.shared.mutate(|s| s.node_authorizer = enabled);
    }

    pub fn set_gone_as_http_status(&self, enabled: bool) {
        self.shared.mutate(|s| s.gone_as_http_status = enabled);
    }

    /// Serves device taints (the default) or drops them from written slices, as a server
    /// with the `DRADeviceTaints` feature gate off does.
    pub fn set_device_taints(&self, served: bool) {
        self.shared.mutate(|s| s.device_taints = served);
    }

    /// Serves consumable capacity (the default) or drops `allowMultipleAllocations` and
    /// capacity request policies from written slices, as a server with the
    /// `DRAConsumableCapacity` feature gate off (or older than 1.34) does.
    pub fn set_consumable_capacity(&self, served: bool) {
        self.shared.mutate(|s| s.consumable_capacity = served);
    }

    /// Serves partitionable devices (the default) or drops `sharedCounters` and
    /// `consumesCounters` from written slices, as a server with the `DRAPartitionableDevices`
    /// feature gate off does.
    pub fn set_partitionable_devices(&self, served: bool) {
        self.shared.mutate(|s| s.partitionable_devices = served);
    }

    /// Drops the event history: watches from any older resourceVersion get 410.
    pub fn compact(&self) {
        self.shared.mutate(State::compact);
    }

    /// Ends every open watch stream cleanly (as an API server restart or timeout would).
    pub fn close_watches(&self) {
        self.shared.close_watches.send_modify(|g| *g += 1);
    }

    /// Stops accepting connections: once this returns, new connects are refused (the
    /// listening socket is closed); open connections stay.
    pub async fn refuse_connections(&self) {
        let task = self.accept.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(task) = task {
            task.abort();
            // The listener is dropped with the task; wait for that.
            let _ = task.await;
        }
    }

    /// Accepts connections again on the same port (after refuse/stop).
    pub fn accept_connections(&self) -> Result<(), ApiServerError> {
        let mut accept = self.accept.lock().unwrap_or_else(PoisonError::into_inner);
        if accept.is_some() {
            return Ok(());
        }
        let listener = server::bind(self.addr).map_err(|source| ApiServerError::Bind { addr: self.addr, source })?;
        *accept = Some(server::spawn_accept(listener, self.shared.clone(), self.tls.clone(), self.kill.subscribe()));
        Ok(())
    }

    /// Stops serving (state is kept): once this returns, new connects are refused and every
    /// open connection, watches included, has been closed.
    pub async fn stop(&self) {
        self.refuse_connections().await;
        self.shut_down_connections(false).await;
    }

    /// Stops serving like an API server that shuts down cleanly: refuses new connections,
    /// ends watches, sends HTTP/2 GOAWAY (HTTP/1.1 `Connection: close`) and lets in-flight
    /// requests finish; returns when every connection is closed. State is kept.
    pub async fn stop_gracefully(&self) {
        self.refuse_connections().await;
        self.close_watches();
        self.shut_down_connections(true).await;
    }

    async fn shut_down_connections(&self, graceful: bool) {
        self.kill.send_modify(|k| {
            k.generation += 1;
            k.graceful = graceful;
        });
        let mut changed = self.shared.changed.subscribe();
        loop {
            changed.borrow_and_update();
            if self.shared.lock().open_connections == 0 || changed.changed().await.is_err() {
                return;
            }
        }
    }

    /// Serves again on the same port with the same state and certificates.
    pub fn restart(&self) -> Result<(), ApiServerError> {
        self.accept_connections()
    }

    /// Current end of the request log (see [`Self::writes_since`]).
    pub fn request_mark(&self) -> usize {
        self.shared.lock().request_mark()
    }

    /// Write requests (create/update/patch/delete) logged at or after `mark`.
    pub fn writes_since(&self, mark: usize) -> usize {
        self.shared.lock().writes_since(mark)
    }

    /// A snapshot of the request log.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.lock().requests().to_vec()
    }

    /// Runs `f` on the current state (read-only).
    pub fn with_state<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.shared.lock())
    }

    /// Waits until `f(state)` holds, re-checking after every change of the state (objects,
    /// request log, gauges); fails with [`ApiServerError::Timeout`] after `timeout`. `f` runs
    /// under the state lock: it must not call back into the handle.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&State) -> bool,
    ) -> Result<(), ApiServerError> {
        let mut changed = self.shared.changed.subscribe();
        let check = async {
            loop {
                changed.borrow_and_update();
                if f(&self.shared.lock()) {
                    return;
                }
                if changed.changed().await.is_err() {
                    // The sender lives in `shared`, which we hold: unreachable, but never spin.
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(timeout, check)
            .await
            .map_err(|_| ApiServerError::Timeout { what: what.to_owned(), timeout })
    }
}
