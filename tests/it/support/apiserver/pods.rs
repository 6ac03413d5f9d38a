//! Pods: list and watch across namespaces with field selectors (`spec.nodeName`,
//! `metadata.name`, `metadata.namespace`, `status.phase`), authorized like the node
//! authorizer does (a node lists and watches only with `spec.nodeName=<itself>`); and the
//! handle's helpers that play the scheduler and the kubelet: a pod created bound to a node
//! with its claims, its phase changed, deleted. Pods are not written by clients.

use http::StatusCode;
use serde_json::{Value, json};

use super::TestApiServer;
use super::authz::Attributes;
use super::handler::{Call, Reply};
use super::query::FieldSelector;
use super::status::{ApiError, PODS};

pub(crate) fn list(call: &Call<'_>) -> Result<Reply, ApiError> {
    let selector = FieldSelector::parse_for_pods(call.params.get("fieldSelector").map(String::as_str))?;
    let attrs = Attributes { selector_node: selector.required_value("spec.nodeName"), ..Attributes::new("list", PODS) };
    call.authorize(&attrs)?;
    let state = call.shared.lock();
    let items: Vec<Value> = state.pods.values().filter(|p| selector.matches(p)).cloned().collect();
    Ok(Reply::Json(
        StatusCode::OK,
        json!({
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": state.resource_version().to_string()},
            "items": items,
        }),
    ))
}

/// A pod as the scheduler leaves it after binding: `spec.nodeName` set, phase Pending.
/// Each claim is `(pod claim name, ResourceClaim name)`; the ResourceClaim names appear in
/// `status.resourceClaimStatuses` as for claims generated from a template.
pub fn bound_pod(namespace: &str, name: &str, node: &str, claims: &[(&str, &str)]) -> Value {
    let spec_claims: Vec<Value> =
        claims.iter().map(|(c, _)| json!({"name": c, "resourceClaimTemplateName": "gpu-template"})).collect();
    let statuses: Vec<Value> = claims.iter().map(|(c, rc)| json!({"name": c, "resourceClaimName": rc})).collect();
    json!({
        "metadata": {"namespace": namespace, "name": name},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "busybox", "resources": {"claims": claims.iter().map(|(c, _)| json!({"name": c})).collect::<Vec<_>>()}}],
            "resourceClaims": spec_claims,
        },
        "status": {"phase": "Pending", "resourceClaimStatuses": statuses},
    })
}

impl TestApiServer {
    /// Creates or replaces a pod given in v1 shape (see [`bound_pod`]); returns the stored one.
    pub fn put_pod(&self, pod: Value) -> Value {
        self.shared.mutate(|s| s.put_pod(pod))
    }

    /// Sets `status.phase` of a stored pod (as its kubelet would); `None` if it does not exist.
    pub fn set_pod_phase(&self, namespace: &str, name: &str, phase: &str) -> Option<Value> {
        self.shared.mutate(|s| {
            let mut pod = s.pods.get(&(namespace.to_owned(), name.to_owned()))?.clone();
            pod["status"]["phase"] = json!(phase);
            Some(s.put_pod(pod))
        })
    }

    pub fn delete_pod(&self, namespace: &str, name: &str) -> Option<Value> {
        self.shared.mutate(|s| s.delete_pod(namespace, name))
    }
}
