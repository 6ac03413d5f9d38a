//! Releasing prepared claims that are gone: a claim deleted while the node was down, or an
//! unprepare the kubelet never sent, must not hold its GPUs (and its CDI spec, MPS daemon,
//! compute modes, MIG instances) forever.
//!
//! Every `claims.check_interval` each prepared claim is read from the API server. It is
//! *gone* when the ResourceClaim no longer exists, exists under another UID (deleted and
//! created again), is no longer allocated, or is reserved for no pod; with node credentials
//! also when the node authorizer refuses to let the node read it (it does so exactly when no
//! pod bound to this node references the claim). A claim seen gone is released only when it
//! is still gone `claims.release_after` later, under the claim's lock, as an unprepare would
//! (so a kubelet call in flight goes first), and the release is logged with the reason. Any
//! other answer (the server unreachable, throttled, a refusal to other credentials) keeps
//! the claim, and the next check backs off.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::Preparer;
use crate::kube::{Cluster, backoff::Backoff};
use crate::plugin::ClaimRef;
use crate::state::{ClaimRecord, Phase};
use crate::util::until_stopped;

/// How often and how patiently claims are checked (`[claims]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleSettings {
    /// How often prepared claims are checked against the API server.
    pub check_interval: Duration,
    /// How long a claim must stay gone before it is released.
    pub release_after: Duration,
}

impl Default for StaleSettings {
    fn default() -> Self {
        Self { check_interval: Duration::from_secs(300), release_after: Duration::from_secs(120) }
    }
}

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
    let claim = match answer {
        Ok(claim) => claim,
        Err(e) if e.is_not_found() => return Verdict::Gone("the ResourceClaim no longer exists".into()),
        Err(e) if e.is_forbidden() && node_identity => {
            return Verdict::Gone(
                "no pod bound to this node uses the ResourceClaim any more (the node authorizer refuses to let the \
                 node read it)"
                    .into(),
            );
        }
        Err(e) => return Verdict::Unknown(crate::util::error_chain(&e)),
    };
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

/// Checks the prepared claims every `settings.check_interval` until `shutdown`, releasing
/// those that stay gone for `settings.release_after`.
pub async fn release_stale_claims(
    preparer: Preparer,
    cluster: Arc<Cluster>,
    node: String,
    settings: StaleSettings,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Backoff::new(Duration::from_secs(10), settings.check_interval.max(Duration::from_secs(10)));
    let mut node_identity: Option<bool> = None;
    // Claim UID → when it was first seen gone, and why.
    let mut suspects: HashMap<String, (Instant, String)> = HashMap::new();
    let mut delay = settings.check_interval;
    loop {
        if until_stopped(tokio::time::sleep(delay), &mut shutdown).await.is_none() {
            return;
        }
        if node_identity.is_none() {
            // Whether a refusal means "no pod of this node uses it": only for node credentials.
            match until_stopped(cluster.client().self_subject_review(), &mut shutdown).await {
                None => return,
                Some(Ok(who)) => node_identity = Some(who.node_name() == Some(node.as_str())),
                Some(Err(e)) => {
                    debug!(error = %crate::util::error_chain(&e), "cannot ask who edra is; refusals count as unknown")
                }
            }
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
        let now = Instant::now();
        suspects.retain(|uid, _| records.iter().any(|r| &r.uid == uid));
        let node_identity = node_identity == Some(true);
        for rec in records.iter().filter(|r| r.phase == Phase::PrepareCompleted) {
            let check = || async {
                let answer = async {
                    let api = cluster.api().await?;
                    let deadline = Instant::now() + super::FETCH_BUDGET;
                    cluster.client().get_claim_by(api, &rec.namespace, &rec.name, deadline).await
                };
                judge(rec, answer.await, node_identity)
            };
            let Some(verdict) = until_stopped(check(), &mut shutdown).await else { return };
            match verdict {
                Verdict::Holds => {
                    suspects.remove(&rec.uid);
                }
                Verdict::Unknown(e) => unknown = Some(e),
                Verdict::Gone(reason) => {
                    let (since, _) = suspects.entry(rec.uid.clone()).or_insert_with(|| (now, reason.clone()));
                    if now.duration_since(*since) < settings.release_after {
                        info!(
                            claim.uid = %rec.uid,
                            claim = %format!("{}/{}", rec.namespace, rec.name),
                            "claim {}/{} looks gone ({reason}); it is released if it still is in {}s",
                            rec.namespace,
                            rec.name,
                            settings.release_after.saturating_sub(now.duration_since(*since)).as_secs()
                        );
                        continue;
                    }
                    let claim =
                        ClaimRef { namespace: rec.namespace.clone(), name: rec.name.clone(), uid: rec.uid.clone() };
                    let released = until_stopped(preparer.release_stale(claim, check()), &mut shutdown).await;
                    let Some(released) = released else { return };
                    match released {
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
                }
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

#[cfg(test)]
#[path = "tests_stale.rs"]
mod tests;
