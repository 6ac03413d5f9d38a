//! `SelfSubjectReview` (authentication.k8s.io/v1: who am I) and `SelfSubjectAccessReview`
//! (authorization.k8s.io/v1: may I), answered with the same decisions real requests get:
//! forbid rules and, when enabled, the node authorizer emulation. As in the real server,
//! reviews ask authorizers only: NodeRestriction admission (a node creating another node's
//! slice) is not consulted, so `create resourceslices` is allowed for a node identity.
//! Both answer `201 Created` and store nothing.

use http::StatusCode;
use serde_json::{Value, json};

use super::authz::{self, Attributes, ForbidRule};
use super::handler::{Call, Reply};
use super::query::FieldSelector;
use super::status::{ApiError, CLAIMS, NODES, PODS, Resource, SLICES};

const VERBS: [&str; 8] = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"];

pub(crate) fn self_review(call: &Call<'_>) -> Result<Reply, ApiError> {
    call.json_body()?;
    let mut groups = call.user.groups.clone();
    groups.push("system:authenticated".to_owned());
    Ok(Reply::Json(
        StatusCode::CREATED,
        json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "SelfSubjectReview",
            "metadata": {"creationTimestamp": null},
            "status": {"userInfo": {"username": call.user.user, "groups": groups}},
        }),
    ))
}

fn resource(group: &str, plural: &str) -> Option<Resource> {
    [SLICES, CLAIMS, NODES, PODS].into_iter().find(|r| r.group == group && r.plural == plural)
}

pub(crate) fn access_review(call: &Call<'_>) -> Result<Reply, ApiError> {
    let body = call.json_body()?;
    let spec = body.get("spec").cloned().unwrap_or(Value::Null);
    let Some(ra) = spec.get("resourceAttributes").filter(|v| v.is_object()) else {
        return Err(ApiError::new(
            422,
            "Invalid",
            "SelfSubjectAccessReview.authorization.k8s.io \"\" is invalid: spec.resourceAttributes: Invalid value: \
             \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified"
                .to_owned(),
            None,
        ));
    };
    let text = |k: &str| ra.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
    let verb = text("verb").unwrap_or_default();
    let group = text("group").unwrap_or_default();
    let plural = text("resource").unwrap_or_default();
    let subresource = text("subresource");
    let namespace = text("namespace");
    let name = text("name");
    let raw_selector = ra.pointer("/fieldSelector/rawSelector").and_then(Value::as_str);
    let decision = {
        let state = call.shared.lock();
        if let Some(sub) = subresource {
            let decision = claim_subresource(call, &state, verb, plural, sub);
            return Ok(review_reply(spec.clone(), decision));
        }
        match (resource(group, plural), VERBS.iter().find(|v| **v == verb)) {
            (Some(res), Some(verb)) => {
                let selector = if res == SLICES {
                    FieldSelector::parse_for_slices(raw_selector)?
                } else if res == PODS {
                    FieldSelector::parse_for_pods(raw_selector)?
                } else {
                    FieldSelector::default()
                };
                let node = call.user.user.strip_prefix("system:node:");
                let existing_node = match (res, name) {
                    (r, Some(n)) if r == SLICES => state.slices.get(n).map(|s| s["spec"]["nodeName"].as_str()),
                    _ => None,
                };
                let claim_on_node = match (namespace, name, node) {
                    (Some(ns), Some(n), Some(node)) => {
                        state.claim_nodes.get(&(ns.to_owned(), n.to_owned())).is_some_and(|nodes| nodes.contains(node))
                    }
                    _ => false,
                };
                let attrs = Attributes {
                    verb,
                    resource: res,
                    namespace,
                    name,
                    selector_node: selector.required_value("spec.nodeName"),
                    existing_node,
                    // The node authorizer allows create; only NodeRestriction admission
                    // checks the object's node, and reviews do not run admission.
                    new_node: node.map(Some),
                    claim_on_node,
                };
                authz::authorize(call.user, &attrs, &state.forbid, state.node_authorizer)
                    .map_err(|e| e.body["message"].as_str().unwrap_or("forbidden").to_owned())
            }
            _ => other_resource(call, verb, plural, &state.forbid, state.node_authorizer),
        }
    };
    Ok(review_reply(spec, decision))
}

fn review_reply(spec: Value, decision: Result<(), String>) -> Reply {
    let status = match decision {
        Ok(()) => json!({"allowed": true}),
        Err(reason) => json!({"allowed": false, "reason": reason}),
    };
    Reply::Json(
        StatusCode::CREATED,
        json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "metadata": {"creationTimestamp": null},
            "spec": spec,
            "status": status,
        }),
    )
}

/// `resourceclaims/status` and `resourceclaims/driver`: forbid rules (on
/// `resourceclaims/<sub>`), then, for node identities under the node authorizer, only what
/// the opt-in RBAC for claim status grants (patch, `arbitrary-node:patch`).
fn claim_subresource(
    call: &Call<'_>,
    state: &super::store::State,
    verb: &str,
    plural: &str,
    sub: &str,
) -> Result<(), String> {
    let full = format!("{plural}/{sub}");
    let granted = state.claim_status_rbac
        && matches!(
            (full.as_str(), verb),
            ("resourceclaims/status", "patch") | ("resourceclaims/driver", "arbitrary-node:patch")
        );
    if granted {
        let user = &call.user.user;
        if state.forbid.iter().any(|r| &r.user == user && r.verb == verb && r.resource == full) {
            return Err(format!("User \"{user}\" cannot {verb} resource \"{full}\""));
        }
        return Ok(());
    }
    other_resource(call, verb, &full, &state.forbid, state.node_authorizer)
}

/// Kinds the server does not serve: forbid rules apply; the node authorizer grants nothing.
fn other_resource(
    call: &Call<'_>,
    verb: &str,
    plural: &str,
    forbid: &[ForbidRule],
    node_authorizer: bool,
) -> Result<(), String> {
    let user = &call.user.user;
    if forbid.iter().any(|r| &r.user == user && r.verb == verb && r.resource == plural) {
        return Err(format!("User \"{user}\" cannot {verb} resource \"{plural}\""));
    }
    let is_node = user.starts_with("system:node:") && call.user.groups.iter().any(|g| g == "system:nodes");
    if node_authorizer && is_node {
        return Err(format!("node authorizer: no rule for {verb} {plural}"));
    }
    Ok(())
}
