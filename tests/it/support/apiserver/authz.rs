//! Authorization: test-forbidden (user, verb, resource) combinations, and an optional
//! emulation of the node authorizer plus NodeRestriction admission for identities
//! `system:node:<name>` in group `system:nodes`. Without emulation every authenticated
//! identity may do everything not explicitly forbidden.

use super::UserInfo;
use super::status::{ApiError, CLAIMS, NODES, PODS, Resource, SLICES};

/// What a request wants to do, as far as authorization needs to know.
#[derive(Debug)]
pub struct Attributes<'a> {
    pub verb: &'static str,
    pub resource: Resource,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
    /// `spec.nodeName=<x>` requirement from the field selector (list/watch).
    pub selector_node: Option<&'a str>,
    /// `spec.nodeName` of the stored object (get/update/delete), if it exists.
    pub existing_node: Option<Option<&'a str>>,
    /// `spec.nodeName` of the submitted object (create/update).
    pub new_node: Option<Option<&'a str>>,
    /// Whether the claim is marked as used by a pod on the requesting node.
    pub claim_on_node: bool,
}

impl Attributes<'_> {
    /// `verb` on `resource`, cluster-wide, with nothing else known (fill in the rest).
    pub fn new(verb: &'static str, resource: Resource) -> Self {
        Attributes {
            verb,
            resource,
            namespace: None,
            name: None,
            selector_node: None,
            existing_node: None,
            new_node: None,
            claim_on_node: false,
        }
    }
}

/// A (user, verb, resource plural) combination the test forbids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForbidRule {
    pub user: String,
    pub verb: String,
    pub resource: String,
}

fn scope(attrs: &Attributes<'_>) -> String {
    match attrs.namespace {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_owned(),
    }
}

/// The real server's RBAC-style denial text.
fn denial(identity: &UserInfo, attrs: &Attributes<'_>, reason: Option<&str>) -> ApiError {
    let subject = match attrs.name {
        Some(name) => format!("{} \"{name}\"", attrs.resource.qualified()),
        None => attrs.resource.qualified(),
    };
    let mut message = format!(
        "{subject} is forbidden: User \"{}\" cannot {} resource \"{}\" in API group \"{}\" {}",
        identity.user,
        attrs.verb,
        attrs.resource.plural,
        attrs.resource.group,
        scope(attrs)
    );
    if let Some(reason) = reason {
        message.push_str(": ");
        message.push_str(reason);
    }
    ApiError::forbidden(message, attrs.resource, attrs.name.unwrap_or_default())
}

/// NodeRestriction admission denial (create/delete of another node's slice).
fn admission_denial(attrs: &Attributes<'_>, what: &str) -> ApiError {
    let message = format!(
        "{} \"{}\" is forbidden: can only {what} ResourceSlice with the same NodeName as the requesting node",
        attrs.resource.qualified(),
        attrs.name.unwrap_or_default()
    );
    ApiError::forbidden(message, attrs.resource, attrs.name.unwrap_or_default())
}

/// Decides one request. `node_authorizer` enables the node-authorizer emulation.
/// The test's forbidden combinations alone (no node authorizer).
pub fn forbidden_by_rule(identity: &UserInfo, attrs: &Attributes<'_>, rules: &[ForbidRule]) -> Result<(), ApiError> {
    if rules.iter().any(|r| r.user == identity.user && r.verb == attrs.verb && r.resource == attrs.resource.plural) {
        return Err(denial(identity, attrs, None));
    }
    Ok(())
}

pub fn authorize(
    identity: &UserInfo,
    attrs: &Attributes<'_>,
    rules: &[ForbidRule],
    node_authorizer: bool,
) -> Result<(), ApiError> {
    if rules.iter().any(|r| r.user == identity.user && r.verb == attrs.verb && r.resource == attrs.resource.plural) {
        return Err(denial(identity, attrs, None));
    }
    if !node_authorizer {
        return Ok(());
    }
    let Some(node) = identity.user.strip_prefix("system:node:") else {
        return Ok(());
    };
    if !identity.groups.iter().any(|g| g == "system:nodes") {
        return Ok(());
    }
    let no_relationship = format!("no relationship found between node '{node}' and this object");
    match (attrs.resource, attrs.verb) {
        (SLICES, "list" | "watch") => {
            if attrs.selector_node == Some(node) {
                Ok(())
            } else {
                Err(denial(identity, attrs, Some("can only list/watch resourceslices with nodeName field selector")))
            }
        }
        (SLICES, "create") => match attrs.new_node {
            Some(Some(n)) if n == node => Ok(()),
            _ => Err(admission_denial(attrs, "create")),
        },
        (SLICES, "get" | "update" | "patch" | "delete") => match attrs.existing_node {
            // A missing object: the authorizer has no graph edge to it.
            None | Some(None) => Err(denial(identity, attrs, Some(&no_relationship))),
            Some(Some(n)) if n != node => Err(denial(identity, attrs, Some(&no_relationship))),
            Some(Some(_)) => match (attrs.verb, attrs.new_node) {
                ("update" | "patch", Some(Some(n))) if n != node => Err(admission_denial(attrs, "update")),
                ("update" | "patch", Some(None)) => Err(admission_denial(attrs, "update")),
                _ => Ok(()),
            },
        },
        // AuthorizeNodeWithSelectors (GA in 1.34): a node lists and watches only its own pods.
        (PODS, "list" | "watch") => {
            if attrs.selector_node == Some(node) {
                Ok(())
            } else {
                Err(denial(identity, attrs, Some("can only list/watch pods with spec.nodeName field selector")))
            }
        }
        (CLAIMS, "get") if attrs.claim_on_node => Ok(()),
        (CLAIMS, _) => Err(denial(identity, attrs, Some(&no_relationship))),
        (NODES, "get") if attrs.name == Some(node) => Ok(()),
        (NODES, _) => Err(denial(
            identity,
            attrs,
            Some(&format!("node '{node}' cannot read '{}', only its own Node object", attrs.name.unwrap_or_default())),
        )),
        _ => Err(denial(identity, attrs, None)),
    }
}
