//! Pods as the claim prefetch sees them: which ResourceClaims a pod bound to this node uses,
//! decoded straight from the wire into [`PodClaims`] (namespace, name, whether it still has to
//! start, claim names), never kept as whole pods.
//!
//! A pod names its claims in `spec.resourceClaims`: directly (`resourceClaimName`) or through a
//! template, whose generated claim's name the resource claim controller writes to
//! `status.resourceClaimStatuses` (the entry of the same `name`). The claim the scheduler
//! creates for extended resources is in `status.extendedResourceClaimStatus`.

use serde::Deserialize;
use serde_json::Value;

use super::Error;

/// The claims of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodClaims {
    /// The pod's namespace (its claims are in the same namespace).
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod has not started yet: bound, not running, not terminating. Only such a pod's
    /// claims are about to be prepared.
    pub starting: bool,
    /// The pod ended (phase Succeeded or Failed): its containers are gone, so it holds no
    /// claim any more, though it may stay listed for long.
    pub ended: bool,
    /// Names of the ResourceClaims it uses, as far as they are known yet.
    pub claims: Vec<String>,
}

impl PodClaims {
    /// `(namespace, name)`.
    pub fn key(&self) -> (String, String) {
        (self.namespace.clone(), self.name.clone())
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Wire {
    metadata: Meta,
    spec: Spec,
    status: Status,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Meta {
    namespace: Option<String>,
    name: Option<String>,
    deletion_timestamp: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Spec {
    resource_claims: Option<Vec<Named>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Status {
    phase: Option<String>,
    resource_claim_statuses: Option<Vec<Named>>,
    extended_resource_claim_status: Option<Named>,
}

/// A `spec.resourceClaims[]` or `status.resourceClaimStatuses[]` entry.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Named {
    name: Option<String>,
    resource_claim_name: Option<String>,
}

impl From<Wire> for PodClaims {
    fn from(w: Wire) -> Self {
        let statuses = w.status.resource_claim_statuses.unwrap_or_default();
        let mut claims: Vec<String> = Vec::new();
        for entry in w.spec.resource_claims.unwrap_or_default() {
            let claim = entry.resource_claim_name.or_else(|| {
                let name = entry.name.as_deref()?;
                statuses.iter().find(|s| s.name.as_deref() == Some(name))?.resource_claim_name.clone()
            });
            claims.extend(claim.filter(|c| !c.is_empty()));
        }
        if let Some(extended) = w.status.extended_resource_claim_status.and_then(|e| e.resource_claim_name) {
            claims.push(extended);
        }
        claims.sort();
        claims.dedup();
        let phase = w.status.phase.unwrap_or_default();
        PodClaims {
            ended: phase == "Succeeded" || phase == "Failed",
            namespace: w.metadata.namespace.unwrap_or_default(),
            name: w.metadata.name.unwrap_or_default(),
            starting: w.metadata.deletion_timestamp.is_none() && (phase.is_empty() || phase == "Pending"),
            claims,
        }
    }
}

/// A pod from its JSON (a watch event's object).
pub fn from_wire(op: &str, object: Value) -> Result<PodClaims, Error> {
    Wire::deserialize(object).map(PodClaims::from).map_err(|source| Error::Decode { operation: op.to_string(), source })
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ListWire {
    metadata: ListMeta,
    items: Option<Vec<Wire>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ListMeta {
    resource_version: Option<String>,
}

/// A pod list: the pods and the list's resourceVersion. Decoded item by item into
/// [`PodClaims`]; the rest of each pod is skipped while reading.
pub fn decode_list(op: &str, body: &[u8]) -> Result<(Vec<PodClaims>, String), Error> {
    let list: ListWire =
        serde_json::from_slice(body).map_err(|source| Error::Decode { operation: op.to_string(), source })?;
    let items = list.items.unwrap_or_default().into_iter().map(PodClaims::from).collect();
    Ok((items, list.metadata.resource_version.unwrap_or_default()))
}

#[cfg(test)]
mod tests;
