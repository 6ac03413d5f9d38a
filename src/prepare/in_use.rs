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
mod tests {
    use super::*;

    fn pod(name: &str, ended: bool, claims: &[&str]) -> PodClaims {
        PodClaims {
            namespace: "ns".into(),
            name: name.into(),
            starting: false,
            ended,
            claims: claims.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn a_claim_is_in_use_while_a_pod_that_has_not_ended_names_it_and_unknown_while_the_watch_cannot_say() {
        let in_use = PodsInUse::default();
        assert_eq!(in_use.uses("ns", "a"), None, "not listed yet");
        in_use.listed(&[pod("p1", false, &["a", "b"]), pod("p2", true, &["c"])]);
        assert_eq!(in_use.uses("ns", "a"), Some(true));
        assert_eq!(in_use.uses("other", "a"), Some(false), "claims are named in the pod's namespace");
        assert_eq!(in_use.uses("ns", "c"), Some(false), "an ended pod holds nothing");
        in_use.applied(&pod("p3", false, &["a"]));
        in_use.deleted(&pod("p1", false, &[]));
        assert_eq!((in_use.uses("ns", "a"), in_use.uses("ns", "b")), (Some(true), Some(false)));
        in_use.applied(&pod("p3", true, &["a"]));
        assert_eq!(in_use.uses("ns", "a"), Some(false), "its last pod ended");
        in_use.applied(&pod("p4", false, &["d"]));
        in_use.lost();
        assert_eq!(in_use.uses("ns", "d"), None, "the watch failed");
        assert_eq!(in_use.pods_of("ns", "d"), None);
        in_use.listed(&[pod("p4", false, &["d"]), pod("p5", false, &["d", "e"])]);
        assert_eq!(in_use.uses("ns", "d"), Some(true));
        assert_eq!(in_use.pods_of("ns", "d"), Some(vec!["p4".to_string(), "p5".to_string()]));
        assert_eq!(in_use.pods_of("ns", "x"), Some(vec![]));
    }
}
