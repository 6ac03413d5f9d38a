//! What the cluster sees of a prepared claim: edra's entries in the ResourceClaim's
//! `status.devices` (KEP-4817), one per device it prepared, with a `Ready` condition, a
//! `Healthy` condition that follows the GPU's health, and `data` naming the GPU (UUID, MIG
//! device and placement, share ID and memory, sharing strategy, MPS pipe directory).
//!
//! Off the prepare path: the preparer bumps a counter after every kubelet call, and this
//! task then reads the state store and applies what changed — coalesced (one pass for a
//! burst of calls or health changes, [`COALESCE`]), at most [`WRITES_PER_PASS`] claims a
//! pass, through the client's own rate limit. Each write is a server-side apply of the
//! `status` subresource as field manager `<driver>` naming the claim's UID, so entries of
//! other drivers (owned by their managers) are never touched, a claim deleted and created
//! again is refused (409), and an unprepared claim's entries go by applying an empty list.
//!
//! Where the server refuses (403: no permission for `resourceclaims/status` or
//! `resourceclaims/driver`; 404/415/400 for the subresource or apply) or drops the field
//! (the DRAResourceClaimDeviceStatus gate off), edra logs one warning saying what to do and
//! writes nothing more until it restarts. A claim found gone (404) or replaced (409, and a
//! fresh read shows another UID) is not written again until its entries change or it is
//! unprepared; a 409 on the same claim is sent once more at once. Other failures (429, 5xx,
//! no answer) are tried again after a growing delay, up to [`RESYNC`].
//!
//! A `Healthy` condition's `lastTransitionTime` is when its status last changed: the start
//! of the health condition that turned it, or when the writer saw the GPU recover; while
//! the status stays, the time stays.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::health::{HealthSnapshot, gpu_of};
use crate::inventory::{Device, Inventory};
use crate::kube::{self, Cluster, ResourceApi};
use crate::state::{ClaimRecord, DeviceRecord, Phase, Store};
use crate::util::error_chain;

/// How long changes are gathered before a pass.
pub const COALESCE: Duration = Duration::from_millis(200);
/// Most claims written in one pass; the rest wait for the next.
pub const WRITES_PER_PASS: usize = 20;
/// A pass is made this often without a change, to retry failed writes.
pub const RESYNC: Duration = Duration::from_secs(60);

/// What the writer needs to know.
#[derive(Debug, Clone)]
pub struct ClaimStatusSettings {
    /// The driver name: the entries' `driver` and the field manager.
    pub driver: String,
    /// The MPS pipe directory inside containers, for the `data` of MPS devices.
    pub mps_pipe_dir: &'static str,
}

/// One claim's entries: (namespace, name, entries).
type Target = (String, String, Vec<Value>);
/// The entries last written, by claim UID.
type Written = BTreeMap<String, Target>;

/// What to do when the server refuses the writes for want of permission.
const PERMISSION: &str = "edra may not write ResourceClaim status: grant patch on resourceclaims/status, and \
     associated-node:patch (a DaemonSet's service account) or arbitrary-node:patch (a node identity) on \
     resourceclaims/driver named after this driver (config/rbac.yaml, config/rbac-claim-status-nodes.yaml)";

/// Why every write would fail, for a status code that says so.
fn refusal(code: u16) -> Option<&'static str> {
    match code {
        403 => Some(PERMISSION),
        405 | 415 => Some("the API server does not serve server-side apply of ResourceClaim status"),
        _ => None,
    }
}

/// The `Healthy` condition of a device of GPU `gpu` (UUID).
fn health_condition(health: &HealthSnapshot, gpu: &str, prepared: &str) -> Value {
    let conditions: Vec<_> = health.gpus.get(gpu).map(|h| h.conditions.values().collect()).unwrap_or_default();
    let fatal: Vec<_> = conditions.iter().filter(|c| c.fatal).collect();
    let (status, reason, message, since) = match (fatal.first(), conditions.first()) {
        (Some(c), _) => ("False", reason(c.kind.key()), c.message.clone(), rfc3339(c.since)),
        (None, Some(c)) => ("Unknown", reason(c.kind.key()), c.message.clone(), rfc3339(c.since)),
        (None, None) => ("True", "Healthy".to_string(), "no XID, ECC or lost-GPU event".into(), prepared.to_string()),
    };
    json!({"type": "Healthy", "status": status, "reason": reason, "message": message,
           "lastTransitionTime": since})
}

/// `xid` → `Xid`, `gpu-lost` → `GpuLost`: a condition reason (CamelCase).
fn reason(key: &str) -> String {
    key.split('-').map(|w| w[..1].to_uppercase() + &w[1..]).collect()
}

fn rfc3339(unix: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(unix)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// The entry of one prepared device.
fn entry(
    s: &ClaimStatusSettings,
    c: &ClaimRecord,
    d: &DeviceRecord,
    inv: &Inventory,
    health: &HealthSnapshot,
) -> Value {
    let prepared = rfc3339(i64::try_from(c.created_at).unwrap_or(0));
    let device: Option<&Device> = inv.device(&d.device).or_else(|| d.share.as_ref().and_then(|sh| inv.device(&sh.gpu)));
    let gpu = match (&d.mig, device) {
        (Some(m), _) => m.gpu.clone(),
        (None, Some(dev)) => gpu_of(dev).to_string(),
        (None, None) => String::new(),
    };
    let mut data = serde_json::Map::new();
    data.insert("gpuUUID".into(), json!(gpu));
    if let Some(m) = &d.mig {
        data.insert("migDeviceUUID".into(), json!(m.uuid));
        data.insert("migProfile".into(), json!(m.profile));
        data.insert("migPlacement".into(), json!({"start": m.placement.start, "size": m.placement.size}));
    } else if let Some(dev) = device.filter(|dev| dev.uuid.starts_with("MIG-")) {
        data.insert("migDeviceUUID".into(), json!(dev.uuid));
    }
    if let Some(sh) = &d.share {
        data.insert("memory".into(), json!(crate::util::quantity(sh.memory)));
    }
    if let Some(id) = &d.share_id {
        data.insert("shareID".into(), json!(id));
    }
    let strategy = d.config.sharing.strategy;
    data.insert("sharingStrategy".into(), json!(strategy.to_string()));
    if strategy == crate::device_config::Strategy::Mps {
        data.insert("mpsPipeDirectory".into(), json!(s.mps_pipe_dir));
    }
    let mut e = json!({
        "driver": s.driver, "pool": d.pool, "device": d.device,
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Prepared",
             "message": "prepared by edra; its CDI devices are in the container", "lastTransitionTime": prepared},
            health_condition(health, &gpu, &prepared),
        ],
        "data": data,
    });
    if let Some(id) = &d.share_id {
        e["shareID"] = json!(id);
    }
    e
}

/// The entries edra wants now, by claim UID.
fn desired(s: &ClaimStatusSettings, store: &Store, inv: &Inventory, health: &HealthSnapshot) -> Written {
    let claims = store.claims().unwrap_or_default();
    claims
        .iter()
        .filter(|c| c.phase == Phase::PrepareCompleted)
        .map(|c| {
            let entries = c.devices.iter().map(|d| entry(s, c, d, inv, health)).collect();
            (c.uid.clone(), (c.namespace.clone(), c.name.clone(), entries))
        })
        .collect()
}

/// The apply body for claim `uid` with `entries`.
fn body(api_version: &str, uid: &str, namespace: &str, name: &str, entries: &[Value]) -> Vec<u8> {
    let doc = json!({"apiVersion": api_version, "kind": "ResourceClaim",
                     "metadata": {"name": name, "namespace": namespace, "uid": uid},
                     "status": {"devices": entries}});
    doc.to_string().into_bytes()
}

/// The calls the writer makes: the [`Cluster`] makes them over HTTPS; tests answer as told.
pub trait StatusApi: Send + Sync + 'static {
    /// The resource.k8s.io version to talk.
    fn resource_api(&self) -> BoxFuture<'_, Result<ResourceApi, kube::Error>>;
    /// Server-side apply of `body` to claim `namespace/name`'s status as `manager`: the
    /// stored claim.
    fn apply_status<'a>(
        &'a self,
        api: ResourceApi,
        claim: (&'a str, &'a str),
        manager: &'a str,
        body: Vec<u8>,
    ) -> BoxFuture<'a, Result<Value, kube::Error>>;
    /// The UID of claim `namespace/name` as the server has it now.
    fn claim_uid<'a>(
        &'a self,
        api: ResourceApi,
        claim: (&'a str, &'a str),
    ) -> BoxFuture<'a, Result<String, kube::Error>>;
}

impl StatusApi for Cluster {
    fn resource_api(&self) -> BoxFuture<'_, Result<ResourceApi, kube::Error>> {
        Box::pin(self.api())
    }

    fn apply_status<'a>(
        &'a self,
        api: ResourceApi,
        (namespace, name): (&'a str, &'a str),
        manager: &'a str,
        body: Vec<u8>,
    ) -> BoxFuture<'a, Result<Value, kube::Error>> {
        Box::pin(self.client().apply_claim_status(api, namespace, name, manager, body))
    }

    fn claim_uid<'a>(
        &'a self,
        api: ResourceApi,
        (namespace, name): (&'a str, &'a str),
    ) -> BoxFuture<'a, Result<String, kube::Error>> {
        Box::pin(async move {
            let claim = self.client().get_claim(api, namespace, name).await?;
            Ok(claim.metadata.uid.unwrap_or_default())
        })
    }
}

/// What a pass did to one claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Written as wanted (or refused for this claim alone: not tried again until it changes).
    Written,
    /// The claim is gone or was replaced: not written again until its entries change.
    Gone,
    /// The server could not be asked, or failed: tried again after a growing delay.
    Retry,
    /// The server refuses every claim status write: edra writes no more.
    Stop,
}

/// Writes claim `uid`'s entries (empty: removes edra's). A conflict (409) is the claim's
/// UID no longer matching, or a write that crossed another: the claim is read afresh, and
/// if it is still the same claim the write is sent once more (`first`: not already failing).
async fn write<A: StatusApi>(api: &A, s: &ClaimStatusSettings, uid: &str, target: &Target, first: bool) -> Outcome {
    let (namespace, name, entries) = target;
    let Ok(version) = api.resource_api().await else { return Outcome::Retry };
    let claim = format!("{namespace}/{name}");
    let body = body(version.api_version(), uid, namespace, name, entries);
    let key = (namespace.as_str(), name.as_str());
    let mut answer = api.apply_status(version, key, &s.driver, body.clone()).await;
    if answer.as_ref().err().and_then(kube::Error::status) == Some(409) {
        match api.claim_uid(version, key).await {
            Ok(now) if now == uid && first => answer = api.apply_status(version, key, &s.driver, body).await,
            Ok(now) if now == uid => {}
            Ok(_) => {
                debug!(%claim, "the claim was replaced (another UID); its status is not written");
                return Outcome::Gone;
            }
            Err(e) if e.status() == Some(404) => {
                debug!(%claim, "the claim is gone; its status is not written");
                return Outcome::Gone;
            }
            Err(e) => debug!(%claim, error = %error_chain(&e), "reading the claim after a conflict failed"),
        }
    }
    judge(s, &claim, entries, answer)
}

/// What the server's answer to a write means.
fn judge(s: &ClaimStatusSettings, claim: &str, entries: &[Value], answer: Result<Value, kube::Error>) -> Outcome {
    let e = match answer {
        Ok(stored) => {
            let kept =
                stored["status"]["devices"].as_array().is_some_and(|d| d.iter().any(|e| e["driver"] == *s.driver));
            if !entries.is_empty() && !kept {
                warn!(
                    %claim,
                    "the API server drops ResourceClaim status.devices (feature gate DRAResourceClaimDeviceStatus off?); \
                     edra writes no claim status until it restarts"
                );
                return Outcome::Stop;
            }
            return Outcome::Written;
        }
        Err(e) => e,
    };
    let text = error_chain(&e);
    match e.status() {
        Some(404) => {
            debug!(%claim, error = %text, "claim gone; its status is not written");
            Outcome::Gone
        }
        Some(422) if text.contains("resourceclaims/driver") => {
            warn!(error = %text, "{PERMISSION}; edra writes no claim status until it restarts");
            Outcome::Stop
        }
        Some(code) if refusal(code).is_some() => {
            warn!(error = %text, "{}; edra writes no claim status until it restarts", refusal(code).unwrap_or_default());
            Outcome::Stop
        }
        Some(code) if (400..500).contains(&code) && code != 429 && code != 409 => {
            warn!(%claim, error = %text, "the API server refused this claim's status; not tried again until it changes");
            Outcome::Written
        }
        _ => {
            debug!(%claim, error = %text, "writing claim status failed; tried again");
            Outcome::Retry
        }
    }
}

/// What the writer remembers between passes.
#[derive(Debug, Default)]
struct Ledger {
    /// The entries last written, by claim UID.
    written: Written,
    /// Claims whose last write failed: tried again after a growing delay.
    pending: BTreeSet<String>,
    /// Claims found gone or replaced, with the entries that found them so: not written
    /// again until the entries change or the claim is unprepared.
    gone: Written,
    /// The `Healthy` condition last wanted, by (claim UID, entry key): status and
    /// lastTransitionTime.
    health: BTreeMap<(String, String), (String, String)>,
}

impl Ledger {
    /// The writes this pass owes: wanted entries not yet written (or failing), and removals
    /// of entries no longer wanted. What is no longer wanted is forgotten.
    fn targets(&mut self, want: &Written) -> Vec<(String, Target)> {
        self.gone.retain(|uid, _| want.contains_key(uid));
        let written = &self.written;
        self.pending.retain(|uid| want.contains_key(uid) || written.contains_key(uid));
        let mut targets: Vec<(String, Target)> = Vec::new();
        for (uid, target) in want {
            let owed = self.written.get(uid) != Some(target) || self.pending.contains(uid);
            if owed && self.gone.get(uid) != Some(target) {
                targets.push((uid.clone(), target.clone()));
            }
        }
        for (uid, (ns, name, _)) in &self.written {
            if !want.contains_key(uid) {
                targets.push((uid.clone(), (ns.clone(), name.clone(), Vec::new())));
            }
        }
        targets
    }

    /// Notes what a write did; false when nothing more is to be written.
    fn record(&mut self, uid: String, target: Target, outcome: Outcome) -> bool {
        match outcome {
            Outcome::Written | Outcome::Gone if target.2.is_empty() => {
                self.written.remove(&uid);
                self.pending.remove(&uid);
            }
            Outcome::Written => {
                self.written.insert(uid.clone(), target);
                self.pending.remove(&uid);
            }
            Outcome::Gone => {
                self.written.remove(&uid);
                self.pending.remove(&uid);
                self.gone.insert(uid, target);
            }
            Outcome::Retry => {
                self.pending.insert(uid);
            }
            Outcome::Stop => return false,
        }
        true
    }

    /// Whether writes are owed that are neither failing nor known to find the claim gone
    /// (claims beyond a pass's share): the next pass comes at once.
    fn unwritten(&self, want: &Written) -> bool {
        let owed = |u: &String, t: &Target| {
            self.written.get(u) != Some(t) && !self.pending.contains(u) && self.gone.get(u) != Some(t)
        };
        want.iter().any(|(u, t)| owed(u, t))
            || self.written.keys().any(|u| !want.contains_key(u) && !self.pending.contains(u))
    }

    /// Gives each `Healthy` condition the time its status last changed: kept while the
    /// status stays; on a change, the condition's own start (an XID's time), or `now` when
    /// the GPU recovers or the start is not newer than the last change. The first time a
    /// claim is seen (also after a restart) the computed time stands.
    fn stamp(&mut self, want: &mut Written, now: i64) {
        self.health.retain(|(uid, _), _| want.contains_key(uid));
        for (uid, (_, _, entries)) in want.iter_mut() {
            for e in entries.iter_mut() {
                let key = format!("{}/{}/{}", e["pool"], e["device"], e["shareID"]);
                let Some(c) =
                    e["conditions"].as_array_mut().and_then(|cs| cs.iter_mut().find(|c| c["type"] == "Healthy"))
                else {
                    continue;
                };
                let status = c["status"].as_str().unwrap_or_default().to_string();
                let computed = c["lastTransitionTime"].as_str().unwrap_or_default().to_string();
                let time = match self.health.get(&(uid.clone(), key.clone())) {
                    None => computed,
                    Some((was, since)) if *was == status => since.clone(),
                    Some((_, since)) if status == "True" || computed <= *since => rfc3339(now).max(since.clone()),
                    Some(_) => computed,
                };
                c["lastTransitionTime"] = json!(time);
                self.health.insert((uid.clone(), key), (status, time));
            }
        }
    }
}

fn unix_now() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
}

/// Keeps edra's entries in the prepared claims' status until `shutdown`.
pub async fn keep_claim_status<A: StatusApi>(
    cluster: Arc<A>,
    settings: ClaimStatusSettings,
    store: Store,
    (mut inventory, mut health): (watch::Receiver<Arc<Inventory>>, watch::Receiver<Arc<HealthSnapshot>>),
    mut changed: watch::Receiver<u64>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut ledger = Ledger::default();
    let mut backoff = crate::kube::backoff::Backoff::new(Duration::from_secs(1), RESYNC);
    loop {
        let (inv, snapshot) = (inventory.borrow_and_update().clone(), health.borrow_and_update().clone());
        changed.borrow_and_update();
        let (s, st) = (settings.clone(), store.clone());
        let Ok(mut want) = tokio::task::spawn_blocking(move || desired(&s, &st, &inv, &snapshot)).await else {
            return;
        };
        ledger.stamp(&mut want, unix_now());
        for (uid, target) in ledger.targets(&want).into_iter().take(WRITES_PER_PASS) {
            let first = !ledger.pending.contains(&uid);
            let outcome = write(&*cluster, &settings, &uid, &target, first).await;
            if !ledger.record(uid, target, outcome) {
                return;
            }
        }
        // Claims beyond this pass's share come at once; failed writes after a growing delay.
        let wait = match (ledger.unwritten(&want), ledger.pending.is_empty()) {
            (true, _) => COALESCE,
            (false, false) => backoff.next_delay(),
            (false, true) => {
                backoff.reset();
                RESYNC
            }
        };
        tokio::select! {
            _ = changed.changed() => {}
            _ = health.changed() => {}
            _ = inventory.changed() => {}
            () = tokio::time::sleep(wait) => {}
            _ = async { let _ = shutdown.wait_for(|s| *s).await; } => return,
        }
        // Gather what else comes within the coalescing window.
        tokio::select! {
            () = tokio::time::sleep(COALESCE) => {}
            _ = async { let _ = shutdown.wait_for(|s| *s).await; } => return,
        }
    }
}

#[cfg(test)]
mod tests;
