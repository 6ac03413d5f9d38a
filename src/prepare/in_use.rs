//! Which claims the pods of this node still use, as the pod watch
//! ([`super::prefetch::watch_pods`]) sees them: the stale-claim check
//! ([`super::stale`]) reads a prepared claim from the API server only when no pod of this
//! node that has not ended names it, or when the watch cannot say (not listed yet, or
//! failed and not delivering again since), so a node at rest sends no claim reads
//! whatever it holds.
//!
//! A pod names a claim by name in its namespace; a claim a running pod names cannot be
//! deleted (its reservation keeps it, with its finalizer, until the pod ends), so while
//! such a pod is there the claim holds.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::kube::pods::PodClaims;

/// The claims of the pods of this node that have not ended, while the watch is current.
#[derive(Debug, Default)]
pub struct PodsInUse {
    known: Mutex<Known>,
}

#[derive(Debug, Default)]
struct Known {
    /// Whether the pods below are the watch's current view: listed, and no failure since
    /// the last event.
    current: bool,
    /// Claim names by pod `(namespace, name)`.
    pods: HashMap<(String, String), Vec<String>>,
}

impl PodsInUse {
    fn known(&self) -> MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pods of this node, as a (re)list gives them.
    pub fn listed(&self, pods: &[PodClaims]) {
        let mut known = self.known();
        known.pods = pods.iter().filter(|p| uses_claims(p)).map(|p| (p.key(), p.claims.clone())).collect();
        known.current = true;
    }

    /// A pod was added or changed (an ended one no longer uses its claims).
    pub fn applied(&self, pod: &PodClaims) {
        let mut known = self.known();
        match uses_claims(pod) {
            true => known.pods.insert(pod.key(), pod.claims.clone()),
            false => known.pods.remove(&pod.key()),
        };
        known.current = true;
    }

    /// A pod was deleted.
    pub fn deleted(&self, pod: &PodClaims) {
        let mut known = self.known();
        known.pods.remove(&pod.key());
        known.current = true;
    }

    /// The watch failed: what it saw may be out of date until it delivers again.
    pub fn lost(&self) {
        self.known().current = false;
    }

    /// `Some(true)` when a pod of this node that has not ended names claim
    /// `namespace/name`, `Some(false)` when none does, `None` when the watch cannot say.
    pub fn uses(&self, namespace: &str, name: &str) -> Option<bool> {
        let known = self.known();
        known
            .current
            .then(|| known.pods.iter().any(|((ns, _), claims)| ns == namespace && claims.iter().any(|c| c == name)))
    }
}

impl PodsInUse {
    /// Whether the watch's view is current.
    pub fn is_current(&self) -> bool {
        self.known().current
    }

    /// The pods of this node that have not ended and name claim `namespace/name`, sorted;
    /// `None` when the watch cannot say.
    pub fn pods_of(&self, namespace: &str, name: &str) -> Option<Vec<String>> {
        let known = self.known();
        known.current.then(|| {
            let mut pods: Vec<String> = known
                .pods
                .iter()
                .filter(|((ns, _), claims)| ns == namespace && claims.iter().any(|c| c == name))
                .map(|((_, pod), _)| pod.clone())
                .collect();
            pods.sort();
            pods
        })
    }
}

fn uses_claims(pod: &PodClaims) -> bool {
    !pod.ended && !pod.claims.is_empty()
}

#[cfg(test)]
mod tests;
