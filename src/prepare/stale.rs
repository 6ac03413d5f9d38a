//! Releasing prepared claims that are gone: a claim deleted while the node was down, or an
//! unprepare the kubelet never sent, must not hold its GPUs (and its CDI spec, MPS daemon,
//! compute modes, MIG instances) forever.
//!
//! Every `claims.check_interval` each prepared claim that no pod of this node uses any more
//! is read from the API server: a claim that a pod of this node which has not ended names,
//! as the pod watch sees it ([`super::in_use`]), is not read, so a node at rest sends no
//! claim reads however many claims it holds. Without the watch (`claims.prefetch = false`,
//! not listed yet, or failed and not delivering again since) every prepared claim is read,
//! as the watch cannot say. A read claim is *gone* when the ResourceClaim no longer exists, exists under another UID (deleted and
//! created again), is no longer allocated, or is reserved for no pod; with node credentials
//! also when the node authorizer refuses to let the node read it (it does so exactly when no
//! pod bound to this node references the claim). A claim seen gone is released only when it
//! is still gone `claims.release_after` later, under the claim's lock, as an unprepare would
//! (so a kubelet call in flight goes first), and the release is logged with the reason. Any
//! other answer (the server unreachable, throttled, a refusal to other credentials) keeps
//! the claim, and the next check backs off.
//!
//! A prepare does not wait for the loop: when the state refuses its devices because other
//! claims' records hold them (a release lost to a crash, a claim deleted while the node was
//! down), each of those claims is read and judged the same way at once, under its lock
//! (waited for at most [`HOLDER_LOCK_WAIT`]), released if gone, and the prepare applied
//! once more; otherwise its error names them and what the server answered. Whether edra
//! reads claims as this node is asked once at start and shared with prepare.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::{OwnedMutexGuard, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::ClaimError;
use super::in_use::PodsInUse;
use super::{PrepareError, Preparer};
use crate::kube::{Cluster, backoff::Backoff};
use crate::plugin::ClaimRef;
use crate::state::{ClaimRecord, Phase, StateError};
use crate::util::until_stopped;

pub use crate::config::settings::StaleSettings;

/// What the API server says about a prepared claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The claim is still allocated and reserved for a pod.
    Holds,
    /// The claim is gone, for the reason given.
    Gone(String),
    /// The server's answer says nothing either way (the error given).
    Unknown(String),
}

/// Judges `record` by the answer to a GET of its claim; `node_identity` when edra reads
/// claims as this node (`system:node:<name>`), so a refusal means no pod of this node uses it.
pub fn judge(record: &ClaimRecord, answer: Result<ResourceClaim, crate::kube::Error>, node_identity: bool) -> Verdict {
    match answer {
        Ok(claim) => judge_claim(record, &claim),
        Err(e) if e.is_not_found() => Verdict::Gone(NOT_FOUND.into()),
        Err(e) if e.is_forbidden() && node_identity => Verdict::Gone(REFUSED_TO_NODE.into()),
        Err(e) => Verdict::Unknown(crate::util::error_chain(&e)),
    }
}

/// [`judge`] for an answer from the preparer's [`super::ClaimSource`].
pub fn judge_fetched(
    record: &ClaimRecord,
    answer: Result<ResourceClaim, super::ClaimFetchError>,
    node_identity: bool,
) -> Verdict {
    match answer {
        Ok(claim) => judge_claim(record, &claim),
        Err(super::ClaimFetchError::NotFound { .. }) => Verdict::Gone(NOT_FOUND.into()),
        Err(e) if node_identity && e.is_forbidden() => Verdict::Gone(REFUSED_TO_NODE.into()),
        Err(e) => Verdict::Unknown(crate::util::error_chain(&e)),
    }
}

const NOT_FOUND: &str = "the ResourceClaim no longer exists";
const REFUSED_TO_NODE: &str =
    "no pod bound to this node uses the ResourceClaim any more (the node authorizer refuses to let the node read it)";

/// Judges `record` by its claim as the API server sent it.
fn judge_claim(record: &ClaimRecord, claim: &ResourceClaim) -> Verdict {
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    if uid != record.uid {
        return Verdict::Gone(format!("the ResourceClaim was deleted and created again (its UID is now {uid})"));
    }
    let Some(status) = claim.status.as_ref() else {
        return Verdict::Gone("the ResourceClaim is no longer allocated".into());
    };
    if status.allocation.is_none() {
        return Verdict::Gone("the ResourceClaim is no longer allocated".into());
    }
    if status.reserved_for.as_ref().is_none_or(Vec::is_empty) {
        return Verdict::Gone("the ResourceClaim is reserved for no pod any more".into());
    }
    Verdict::Holds
}

impl Preparer {
    /// Releases the prepared claim `claim` as an unprepare would when `recheck` (asked with
    /// the claim's lock held, so a kubelet call in flight finishes first and none starts
    /// meanwhile) still says it is gone. Returns the verdict acted on; `Holds` or `Unknown`
    /// leave the claim prepared, as does a claim no longer prepared (then `Holds`).
    pub async fn release_stale<F>(&self, claim: ClaimRef, recheck: F) -> Result<Verdict, super::PrepareError>
    where
        F: std::future::Future<Output = Verdict>,
    {
        let guard = self.inner.locks.lock(&claim.uid).await;
        match self.inner.store.claim(&claim.uid)? {
            Some(rec) if rec.phase == Phase::PrepareCompleted => {}
            _ => return Ok(Verdict::Holds),
        }
        let verdict = recheck.await;
        if let Verdict::Gone(_) = verdict {
            self.unprepare_locked(claim, guard).await?;
        }
        Ok(verdict)
    }
}

/// How long prepare waits for the lock of a claim in its way before giving up on it (a
/// prepare or unprepare of that claim is running; two claims each in the other's way do
/// not wait for each other forever).
pub const HOLDER_LOCK_WAIT: Duration = Duration::from_secs(5);

impl Preparer {
    /// Remembers whether edra reads claims as this node (a refusal then means gone).
    pub fn learn_node_identity(&self, node_identity: bool) {
        let _ = self.inner.node_identity.set(node_identity);
    }

    /// [`Preparer::apply`] on the blocking pool with the claim's shared GPUs locked; when
    /// the state refuses the claim's devices because other claims hold them, those claims
    /// are checked against the API server ([`Preparer::release_gone_holders`]) and, if one
    /// was released, the claim is applied once more.
    pub(super) async fn apply_checking_holders(
        &self,
        planned: super::Planned,
        guard: &Arc<OwnedMutexGuard<()>>,
        deadline: Instant,
    ) -> Result<ClaimRecord, PrepareError> {
        let record = planned.record.clone();
        let mut checked = false;
        loop {
            let gpu_locks = self.lock_shared_gpus(&record.devices).await;
            let (this, held, planned) = (self.clone(), guard.clone(), planned.clone());
            // Made here, entered on the blocking thread: the claim's span goes with the work.
            let span = tracing::trace_span!("prepare.blocking");
            let applied = super::blocking(move || {
                let _held = (held, gpu_locks);
                span.in_scope(|| this.apply(planned))
            })
            .await?;
            match applied {
                Err(PrepareError::State(
                    conflict @ (StateError::DeviceHeld { .. }
                    | StateError::SharesExceed { .. }
                    | StateError::ShareIdTaken { .. }),
                )) if !checked => {
                    checked = true;
                    self.release_gone_holders(&record, conflict, deadline).await?;
                }
                other => return other,
            }
        }
    }

    /// The claims whose records stand in the way of `record`'s devices, as
    /// [`crate::state::Store::put_claim`] checks them (exclusive holders and shares).
    fn holders_in_the_way(&self, record: &ClaimRecord) -> Result<BTreeSet<String>, StateError> {
        let store = &self.inner.store;
        let mut out = BTreeSet::new();
        let devices = record.held_devices().chain(record.shares().map(|(_, s)| s.gpu.as_str()));
        for d in devices {
            out.extend(store.holder(d)?);
            out.extend(store.shares_of(d)?.into_iter().map(|h| h.claim));
        }
        out.remove(&record.uid);
        Ok(out)
    }

    /// After `conflict` refused `record`: checks each claim in its way against the API
    /// server by `deadline`, under that claim's lock (waiting at most [`HOLDER_LOCK_WAIT`]).
    /// A claim judged gone — a record that came back after a crash lost its lazy removal,
    /// or a claim deleted while the node was down — is released as an unprepare would and
    /// logged. Ok when one was released (or all went meanwhile), so applying again may
    /// succeed; otherwise the error names each holder kept and what the server answered.
    async fn release_gone_holders(
        &self,
        record: &ClaimRecord,
        conflict: StateError,
        deadline: Instant,
    ) -> Result<(), PrepareError> {
        let mut freed = false;
        let mut kept = Vec::new();
        for uid in self.holders_in_the_way(record)? {
            let Ok(guard) = tokio::time::timeout(HOLDER_LOCK_WAIT, self.inner.locks.lock(&uid)).await else {
                kept.push(format!(
                    "claim UID {uid} is being prepared or unprepared right now (its lock stayed taken for {}s); the \
                     kubelet retries",
                    HOLDER_LOCK_WAIT.as_secs()
                ));
                continue;
            };
            // Released meanwhile, or a holding without its record (which holds nothing).
            let Some(holder) = self.inner.store.claim(&uid)? else { continue };
            let name = format!("{}/{} (UID {uid})", holder.namespace, holder.name);
            if holder.phase != Phase::PrepareCompleted {
                kept.push(format!("claim {name} is being prepared; the kubelet retries"));
                continue;
            }
            let answer = self.inner.claims.get_claim(&holder.namespace, &holder.name, deadline).await;
            let node_identity = self.inner.node_identity.get().copied().unwrap_or(false);
            match judge_fetched(&holder, answer, node_identity) {
                Verdict::Gone(reason) => {
                    let claim = ClaimRef { namespace: holder.namespace.clone(), name: holder.name.clone(), uid };
                    self.unprepare_locked(claim, guard).await?;
                    warn!(
                        claim.uid = %holder.uid,
                        claim = %format!("{}/{}", holder.namespace, holder.name),
                        for_claim = %record.uid,
                        "released claim {}/{} (UID {}), prepared on this node but gone: {reason}; its devices are \
                         free again for claim {}/{}",
                        holder.namespace,
                        holder.name,
                        holder.uid,
                        record.namespace,
                        record.name
                    );
                    freed = true;
                }
                Verdict::Holds => {
                    kept.push(format!("the API server says claim {name} is still allocated and reserved for a pod"))
                }
                Verdict::Unknown(e) => kept.push(format!(
                    "whether claim {name} is gone is unknown ({e}); it is kept until the API server says so, and \
                     the kubelet retries"
                )),
            }
        }
        // Nothing kept: every claim in the way was released, here or meanwhile.
        if freed || kept.is_empty() {
            return Ok(());
        }
        Err(ClaimError::HeldBy { conflict, checked: kept.join("; ") }.into())
    }
}

/// Checks the prepared claims every `settings.check_interval` until `shutdown` (those no
/// pod of this node uses, as `in_use` tells, or all while it cannot say), releasing those
/// that stay gone for `settings.release_after`.
pub async fn release_stale_claims(
    preparer: Preparer,
    cluster: Arc<Cluster>,
    in_use: Arc<PodsInUse>,
    node: String,
    settings: StaleSettings,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Backoff::new(Duration::from_secs(10), settings.check_interval.max(Duration::from_secs(10)));
    // Asked before the first check too, so prepare's check of a holder in its way
    // ([`Preparer::release_gone_holders`]) knows what a refusal means from the start.
    let Some(mut node_identity) = learn_node_identity(&preparer, &cluster, &node, &mut shutdown).await else {
        return;
    };
    // Claim UID → when it was first seen gone, and why.
    let mut suspects: HashMap<String, (Instant, String)> = HashMap::new();
    let mut delay = settings.check_interval;
    loop {
        if until_stopped(tokio::time::sleep(delay), &mut shutdown).await.is_none() {
            return;
        }
        if node_identity.is_none() {
            let Some(learned) = learn_node_identity(&preparer, &cluster, &node, &mut shutdown).await else { return };
            node_identity = learned;
        }
        let records = match preparer.store().claims() {
            Ok(r) => r,
            Err(e) => {
                debug!(error = %e, "cannot read the prepared claims; checking them later");
                delay = backoff.next_delay();
                continue;
            }
        };
        let mut unknown = None;
        suspects.retain(|uid, _| records.iter().any(|r| &r.uid == uid));
        let named_twice = named_twice(&records);
        let pass = Pass {
            preparer: &preparer,
            cluster: &cluster,
            in_use: &in_use,
            release_after: settings.release_after,
            node_identity: node_identity == Some(true),
            now: Instant::now(),
        };
        for rec in records.iter().filter(|r| r.phase == Phase::PrepareCompleted) {
            let Some(outcome) = pass.check(rec, &named_twice, &mut suspects, &mut shutdown).await else { return };
            if outcome.is_some() {
                unknown = outcome;
            }
        }
        delay = match unknown {
            Some(e) => {
                let d = backoff.next_delay();
                debug!(error = %e, retry_in = ?d, "cannot tell whether prepared claims still exist; checking again later");
                d
            }
            None => {
                backoff.reset();
                settings.check_interval
            }
        };
        // A suspect is looked at again as soon as it may be released.
        if !suspects.is_empty() {
            delay = delay.min(settings.release_after.max(Duration::from_secs(1)));
        }
    }
}

/// One pass of [`release_stale_claims`] over the prepared claims.
struct Pass<'a> {
    preparer: &'a Preparer,
    cluster: &'a Cluster,
    in_use: &'a PodsInUse,
    release_after: Duration,
    node_identity: bool,
    now: Instant,
}

impl Pass<'_> {
    /// Checks the prepared claim `rec`, releasing it when it stayed gone for
    /// `release_after` (`suspects`: claim UID → when it was first seen gone, and why).
    /// `None` when `shutdown` came; `Some(Some(error))` when the server could not tell.
    async fn check(
        &self,
        rec: &ClaimRecord,
        named_twice: &BTreeSet<(&str, &str)>,
        suspects: &mut HashMap<String, (Instant, String)>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Option<Option<String>> {
        // A pod of this node still runs with it: the claim holds, no read needed. Two
        // records of one name (a claim deleted and created again, both prepared here)
        // are read: a pod names a claim by name, and only the UID tells them apart.
        let key = (rec.namespace.as_str(), rec.name.as_str());
        if !named_twice.contains(&key) && self.in_use.uses(&rec.namespace, &rec.name) == Some(true) {
            suspects.remove(&rec.uid);
            return Some(None);
        }
        let check = || async {
            let answer = async {
                let api = self.cluster.api().await?;
                let deadline = Instant::now() + super::FETCH_BUDGET;
                self.cluster.client().get_claim_by(api, &rec.namespace, &rec.name, deadline).await
            };
            judge(rec, answer.await, self.node_identity)
        };
        let verdict = until_stopped(check(), shutdown).await?;
        match verdict {
            Verdict::Holds => {
                suspects.remove(&rec.uid);
            }
            Verdict::Unknown(e) => return Some(Some(e)),
            Verdict::Gone(reason) => {
                let (since, _) = suspects.entry(rec.uid.clone()).or_insert_with(|| (self.now, reason.clone()));
                if self.now.duration_since(*since) < self.release_after {
                    info!(
                        claim.uid = %rec.uid,
                        claim = %format!("{}/{}", rec.namespace, rec.name),
                        "claim {}/{} looks gone ({reason}); it is released if it still is in {}s",
                        rec.namespace,
                        rec.name,
                        self.release_after.saturating_sub(self.now.duration_since(*since)).as_secs()
                    );
                    return Some(None);
                }
                let claim = ClaimRef { namespace: rec.namespace.clone(), name: rec.name.clone(), uid: rec.uid.clone() };
                let released = until_stopped(self.preparer.release_stale(claim, check()), shutdown).await;
                let mut unknown = None;
                match released? {
                    Ok(Verdict::Gone(reason)) => warn!(
                        claim.uid = %rec.uid,
                        claim = %format!("{}/{}", rec.namespace, rec.name),
                        "released claim {}/{} (UID {}), prepared on this node but gone: {reason}; its devices are \
                         free again",
                        rec.namespace,
                        rec.name,
                        rec.uid
                    ),
                    Ok(Verdict::Holds) => debug!(claim.uid = %rec.uid, "claim is back; kept"),
                    Ok(Verdict::Unknown(e)) => unknown = Some(e),
                    Err(e) => warn!(
                        claim.uid = %rec.uid,
                        error = %crate::util::error_chain(&e),
                        "releasing gone claim {}/{} failed; trying again at the next check",
                        rec.namespace,
                        rec.name
                    ),
                }
                suspects.remove(&rec.uid);
                return Some(unknown);
            }
        }
        Some(None)
    }
}

/// The `(namespace, name)` of claims with more than one record.
fn named_twice(records: &[ClaimRecord]) -> BTreeSet<(&str, &str)> {
    let mut seen = BTreeSet::new();
    let mut twice = BTreeSet::new();
    for r in records {
        let key = (r.namespace.as_str(), r.name.as_str());
        if !seen.insert(key) {
            twice.insert(key);
        }
    }
    twice
}

/// Asks the API server who edra is: whether a refusal means "no pod of this node uses it"
/// (only for node credentials), and tells `preparer`. `None` when stopped meanwhile;
/// `Some(None)` when the question went unanswered (refusals then count as unknown).
async fn learn_node_identity(
    preparer: &Preparer,
    cluster: &Cluster,
    node: &str,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<Option<bool>> {
    match until_stopped(cluster.client().self_subject_review(), shutdown).await? {
        Ok(who) => {
            let node_identity = who.node_name() == Some(node);
            preparer.learn_node_identity(node_identity);
            Some(Some(node_identity))
        }
        Err(e) => {
            debug!(error = %crate::util::error_chain(&e), "cannot ask who edra is; refusals count as unknown");
            Some(None)
        }
    }
}

#[cfg(test)]
mod tests;
