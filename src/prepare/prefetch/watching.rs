//! The watch of this node's pods that starts early reads: one watch per node
//! (`fieldSelector=spec.nodeName=<node>`, the only way the node authorizer lets a node list
//! pods), reconnecting with backoff like the ResourceSlice watch. Only the claim names of
//! pods that have not started yet are kept. With a [`Preparer`] to stage them, a claim read
//! early is prepared at once ([`crate::prepare::stage`]), and released again when no pod
//! of this node waits for it any more before the kubelet asked for it — also when the pod
//! went while the claim was being read or prepared: each early preparation that ends is
//! checked against the pods the watch knows then. Every pod event also keeps
//! [`PodsInUse`] current, which spares the stale-claim check its reads of claims in use.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures_util::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use super::{Early, Prefetcher};
use crate::kube::pods::PodClaims;
use crate::kube::{Client, Event};
use crate::prepare::Preparer;
use crate::prepare::in_use::PodsInUse;
use crate::prepare::stage::Staged;
use crate::util::{error_chain, stopped};

/// The claim names of the starting pods with claims, by pod.
#[derive(Debug, Default)]
pub(super) struct Pods {
    claims: HashMap<(String, String), Vec<String>>,
}

/// What one pod event asks of the cache.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Changes {
    /// Claims to read now.
    pub fetch: Vec<(String, String)>,
    /// Claims whose pod no longer waits for them.
    pub forget: Vec<(String, String)>,
}

impl Pods {
    /// A pod was added or changed.
    pub(super) fn applied(&mut self, pod: PodClaims, out: &mut Changes) {
        let key = pod.key();
        if !pod.starting || pod.claims.is_empty() {
            self.gone(&key, out);
            return;
        }
        let known = self.claims.get(&key).map(Vec::as_slice).unwrap_or_default();
        out.fetch.extend(pod.claims.iter().filter(|c| !known.contains(c)).map(|c| (pod.namespace.clone(), c.clone())));
        out.forget.extend(known.iter().filter(|c| !pod.claims.contains(c)).map(|c| (pod.namespace.clone(), c.clone())));
        self.claims.insert(key, pod.claims);
    }

    /// A pod was deleted, started or ended.
    pub(super) fn gone(&mut self, key: &(String, String), out: &mut Changes) {
        if let Some(claims) = self.claims.remove(key) {
            out.forget.extend(claims.into_iter().map(|c| (key.0.clone(), c)));
        }
    }

    /// The full set after a (re)list: pods no longer there are gone.
    pub(super) fn restarted(&mut self, pods: Vec<PodClaims>, out: &mut Changes) {
        let present: HashSet<(String, String)> = pods.iter().map(PodClaims::key).collect();
        let vanished: Vec<_> = self.claims.keys().filter(|k| !present.contains(*k)).cloned().collect();
        for key in &vanished {
            self.gone(key, out);
        }
        for pod in pods {
            self.applied(pod, out);
        }
    }

    /// Whether a starting pod still uses claim `namespace/name`.
    pub(super) fn waits_for(&self, namespace: &str, name: &str) -> bool {
        self.claims.iter().any(|((ns, _), claims)| ns == namespace && claims.iter().any(|c| c == name))
    }

    /// Starting pods with claims.
    pub(super) fn len(&self) -> usize {
        self.claims.len()
    }
}

/// Watches the pods bound to `node` and reads the claims of those about to start into
/// `prefetcher`, until `shutdown`; with `stager`, claims read are prepared at once and those
/// no pod waits for any more before the kubelet asked are released; `in_use` follows the
/// claims of the pods that have not ended. Reads in flight at shutdown are dropped.
pub async fn watch_pods(
    prefetcher: Arc<Prefetcher>,
    stager: Option<Preparer>,
    in_use: Arc<PodsInUse>,
    client: Client,
    node: String,
    mut shutdown: watch::Receiver<bool>,
) {
    let selector = format!("spec.nodeName={node}");
    let events = client.watch_pods(&selector);
    let mut events = std::pin::pin!(events);
    let mut pods = Pods::default();
    // A read that prepared its claim early returns which claim, to be checked again.
    let mut reads: JoinSet<Option<(String, String)>> = JoinSet::new();
    let mut last_error: Option<String> = None;
    loop {
        let event = tokio::select! {
            () = stopped(&mut shutdown) => return,
            Some(done) = reads.join_next(), if !reads.is_empty() => {
                // A claim prepared early after its pod went (the pod event arrived while
                // the claim was read or prepared) is released like one whose pod goes later.
                if let Ok(Some((namespace, name))) = done {
                    release_unwaited(&mut reads, stager.as_ref(), &pods, namespace, name);
                }
                continue;
            }
            event = events.next() => event,
        };
        let Some(event) = event else { return };
        let mut changes = Changes::default();
        match event {
            Event::Restarted(all) => {
                if last_error.take().is_some() {
                    info!(node = %node, "watching this node's pods again; their claims are read before the kubelet asks");
                }
                in_use.listed(&all);
                pods.restarted(all, &mut changes);
                debug!(starting_pods = pods.len(), "pods of this node listed");
            }
            Event::Applied(pod) => {
                in_use.applied(&pod);
                pods.applied(pod, &mut changes)
            }
            Event::Deleted(pod) => {
                in_use.deleted(&pod);
                pods.gone(&pod.key(), &mut changes)
            }
            Event::Error(e) => {
                in_use.lost();
                let message = error_chain(&e);
                // Once per distinct error: a missing permission would otherwise repeat forever.
                if last_error.as_deref() != Some(message.as_str()) {
                    let hint = if e.is_forbidden() {
                        "; with a service account, allow it to list and watch pods (config/rbac.yaml)"
                    } else {
                        ""
                    };
                    warn!(error = %message, "cannot watch this node's pods; claims are read when the kubelet asks{hint}; retrying");
                    last_error = Some(message);
                } else {
                    debug!(error = %message, "watching this node's pods failed again; retrying");
                }
            }
        }
        for (namespace, name) in changes.forget {
            prefetcher.forget(&namespace, &name);
            release_unwaited(&mut reads, stager.as_ref(), &pods, namespace, name);
        }
        for (namespace, name) in changes.fetch {
            if reads.len() >= super::CAPACITY {
                debug!(claim.namespace = %namespace, claim.name = %name, "too many claims waiting to be read early; left to the kubelet's call");
                continue;
            }
            let p = prefetcher.clone();
            let stager = stager.clone();
            reads.spawn(async move {
                if let Early::Kept(claim) = p.fetch_early(&namespace, &name).await
                    && let Some(stager) = stager
                    && stage(&stager, &claim).await
                {
                    return Some((namespace, name));
                }
                None
            });
        }
    }
}

/// Prepares `claim` early, logging at debug why not; returns whether it prepared it now.
async fn stage(stager: &Preparer, claim: &k8s_openapi::api::resource::v1::ResourceClaim) -> bool {
    let (namespace, name) = (claim.metadata.namespace.as_deref(), claim.metadata.name.as_deref());
    let (namespace, name) = (namespace.unwrap_or_default(), name.unwrap_or_default());
    match stager.stage(claim).await {
        Ok(Staged::Prepared) => true,
        Ok(Staged::AlreadyPrepared) => false,
        Ok(Staged::ChangesGpus) => {
            debug!(
                claim.namespace = namespace,
                claim.name = name,
                "claim changes GPU settings; prepared when the kubelet asks"
            );
            false
        }
        Err(e) => {
            debug!(
                claim.namespace = namespace,
                claim.name = name,
                error = %crate::util::error_chain(&e),
                "claim not prepared early; the kubelet's call prepares it"
            );
            false
        }
    }
}

/// With a stager, releases claim `namespace/name` in `reads` unless a starting pod of this
/// node still waits for it ([`unstage`]: only a claim prepared early and not asked for).
fn release_unwaited(
    reads: &mut JoinSet<Option<(String, String)>>,
    stager: Option<&Preparer>,
    pods: &Pods,
    namespace: String,
    name: String,
) {
    if let Some(stager) = stager
        && !pods.waits_for(&namespace, &name)
    {
        let stager = stager.clone();
        reads.spawn(async move {
            unstage(&stager, &namespace, &name).await;
            None
        });
    }
}

/// Releases claim `namespace/name` if it was prepared early and the kubelet never asked.
async fn unstage(stager: &Preparer, namespace: &str, name: &str) {
    match stager.unstage(namespace, name).await {
        Ok(true) => info!(
            claim = %format!("{namespace}/{name}"),
            "released claim {namespace}/{name}, prepared before the kubelet asked: no pod of this node waits for it any more"
        ),
        Ok(false) => {}
        Err(e) => warn!(
            claim = %format!("{namespace}/{name}"),
            error = %crate::util::error_chain(&e),
            "cannot release claim {namespace}/{name}, prepared early for a pod that went; the stale-claim check will"
        ),
    }
}
