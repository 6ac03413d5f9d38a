//! Server-side apply of a ResourceClaim's `status` subresource, as far as a driver's
//! `status.devices` entries need it (Kubernetes 1.36, KEP-4817):
//!
//! - only `application/apply-patch+yaml` (JSON bodies) with a `fieldManager`; a
//!   `metadata.uid` that is not the claim's is a 409 precondition failure;
//! - `status.devices` is a map list keyed by driver, pool, device and shareID: the applied
//!   list replaces the entries the manager owned, entries of other managers stay (a key
//!   another manager owns is taken over, as with `force=true`);
//! - every entry must name an allocated device of the claim; at most 8 conditions, `data`
//!   at most 10 KiB;
//! - authorization: `patch` on `resourceclaims/status`, then for every driver whose entries
//!   change `arbitrary-node:patch` on `resourceclaims/driver` (a 422 naming the permission,
//!   as the real strategy's field error); node identities are granted both only with the
//!   opt-in RBAC ([`super::TestApiServer::grant_claim_status`]);
//! - with `DRAResourceClaimDeviceStatus` off ([`super::TestApiServer::drop_device_status`])
//!   the field is dropped, as the real server drops a disabled field.

use std::collections::BTreeMap;

use http::StatusCode;
use serde_json::Value;

use super::authz::{Attributes, forbidden_by_rule};
use super::handler::{Call, Reply};
use super::meta::with_type;
use super::status::{ApiError, CLAIMS, Cause, Resource};
use super::{ApiVersion, convert};

/// `resourceclaims/status`.
pub const CLAIM_STATUS: Resource =
    Resource { plural: "resourceclaims/status", group: "resource.k8s.io", kind: "ResourceClaim" };
/// `resourceclaims/driver`, the synthetic subresource of per-driver status writes.
pub const CLAIM_DRIVER: Resource =
    Resource { plural: "resourceclaims/driver", group: "resource.k8s.io", kind: "ResourceClaim" };

fn key(entry: &Value) -> String {
    let part = |k: &str| entry[k].as_str().unwrap_or_default().to_owned();
    format!("{}/{}/{}/{}", part("driver"), part("pool"), part("device"), part("shareID"))
}

/// Why entry `i` cannot be stored on `claim`.
fn invalid(claim: &Value, i: usize, entry: &Value) -> Option<Cause> {
    let field = format!("status.devices[{i}]");
    let allocated = claim["status"]["allocation"]["devices"]["results"].as_array().is_some_and(|results| {
        results.iter().any(|r| {
            r["driver"] == entry["driver"]
                && r["pool"] == entry["pool"]
                && r["device"] == entry["device"]
                && r.get("shareID") == entry.get("shareID")
        })
    });
    if !allocated {
        let message = format!("Invalid value: \"{}\": must be an allocated device in the claim", key(entry));
        return Some(Cause { reason: "FieldValueInvalid", field, message });
    }
    if entry["conditions"].as_array().is_some_and(|c| c.len() > 8) {
        return Some(Cause {
            reason: "FieldValueTooMany",
            field: format!("{field}.conditions"),
            message: "Too many: must have at most 8 items".into(),
        });
    }
    let data = entry.get("data").map(Value::to_string).unwrap_or_default();
    if data.len() > 10 * 1024 {
        return Some(Cause {
            reason: "FieldValueTooLong",
            field: format!("{field}.data"),
            message: "Too long: must have at most 10240 bytes".into(),
        });
    }
    None
}

/// `PATCH .../resourceclaims/<name>/status` as server-side apply.
pub fn apply(call: &Call<'_>, version: ApiVersion, namespace: &str, name: &str) -> Result<Reply, ApiError> {
    let content_type = call.content_type.as_deref().unwrap_or_default();
    if !content_type.starts_with("application/apply-patch+yaml") {
        return Err(ApiError::unsupported_media_type(content_type));
    }
    let manager = call.params.get("fieldManager").cloned().unwrap_or_default();
    if manager.is_empty() {
        return Err(ApiError::bad_request(
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
                .into(),
        ));
    }
    let attrs = |verb, resource, driver: Option<&'static str>| Attributes {
        namespace: Some(namespace),
        name: driver.or(Some("")).filter(|n| !n.is_empty()),
        ..Attributes::new(verb, resource)
    };
    let granted = call.shared.lock().claim_status_rbac;
    let status_attrs = Attributes { name: Some(name), ..attrs("patch", CLAIM_STATUS, None) };
    match granted {
        true => forbidden_by_rule(call.user, &status_attrs, &call.shared.lock().forbid)?,
        false => call.authorize(&status_attrs)?,
    }
    let applied: Value =
        serde_json::from_slice(&call.body).map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    let entries: Vec<Value> = applied["status"]["devices"].as_array().cloned().unwrap_or_default();
    let mut state = call.shared.lock();
    let id = (namespace.to_owned(), name.to_owned());
    let Some(mut claim) = state.claims.get(&id).cloned() else {
        return Err(ApiError::not_found(CLAIMS, name));
    };
    if let Some(uid) = applied["metadata"]["uid"].as_str()
        && claim["metadata"]["uid"].as_str() != Some(uid)
    {
        let why = format!(
            "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
            claim["metadata"]["uid"]
        );
        return Err(ApiError::conflict(CLAIMS, name, &why));
    }
    let causes: Vec<Cause> = entries.iter().enumerate().filter_map(|(i, e)| invalid(&claim, i, e)).collect();
    if !causes.is_empty() {
        return Err(ApiError::invalid(CLAIMS, name, &causes));
    }
    let owners = state.status_owners.entry(id.clone()).or_default().clone();
    let old: Vec<Value> = claim["status"]["devices"].as_array().cloned().unwrap_or_default();
    let new_keys: Vec<String> = entries.iter().map(key).collect();
    let mut merged: Vec<Value> = old
        .iter()
        .filter(|e| owners.get(&key(e)).is_none_or(|m| *m != manager) && !new_keys.contains(&key(e)))
        .cloned()
        .collect();
    merged.extend(entries.iter().cloned());
    // Drivers whose entries change need the driver permission.
    let before: BTreeMap<String, &Value> = old.iter().map(|e| (key(e), e)).collect();
    let after: BTreeMap<String, &Value> = merged.iter().map(|e| (key(e), e)).collect();
    let mut drivers: Vec<String> = before
        .iter()
        .filter(|(k, v)| after.get(*k) != Some(*v))
        .chain(after.iter().filter(|(k, v)| before.get(*k) != Some(*v)))
        .filter_map(|(_, v)| v["driver"].as_str().map(str::to_owned))
        .collect();
    drivers.sort();
    drivers.dedup();
    for driver in &drivers {
        let driver_attrs =
            Attributes { name: Some(driver.as_str()), ..attrs("arbitrary-node:patch", CLAIM_DRIVER, None) };
        let allowed = forbidden_by_rule(call.user, &driver_attrs, &state.forbid).is_ok()
            && (granted || !state.node_authorizer || !call.user.user.starts_with("system:node:"));
        if !allowed {
            let message = format!(
                "changing status.devices requires resource=\"resourceclaims/driver\", verb=\"[arbitrary-node:patch]\" \
                 permission: resourceclaims.resource.k8s.io \"{driver}\" is forbidden: User \"{}\" cannot \
                 arbitrary-node:patch resource \"resourceclaims/driver\" in API group \"resource.k8s.io\" in the \
                 namespace \"{namespace}\"",
                call.user.user
            );
            return Err(ApiError::invalid(
                CLAIMS,
                name,
                &[Cause {
                    reason: "FieldValueForbidden",
                    field: "status.devices".into(),
                    message: format!("Forbidden: {message}"),
                }],
            ));
        }
    }
    let owned = state.status_owners.entry(id.clone()).or_default();
    owned.retain(|k, m| *m != manager || new_keys.contains(k));
    for k in &new_keys {
        owned.insert(k.clone(), manager.clone());
    }
    if state.device_status {
        claim["status"]["devices"] = Value::Array(merged);
    } else if let Some(status) = claim["status"].as_object_mut() {
        status.remove("devices");
    }
    if claim["status"]["devices"].as_array().is_some_and(Vec::is_empty) {
        claim["status"].as_object_mut().map(|s| s.remove("devices"));
    }
    let rv = state.next_rv();
    claim["metadata"]["resourceVersion"] = Value::String(rv.to_string());
    state.claims.insert(id, claim.clone());
    let out = with_type(&convert::claim_out(version, &claim), version.as_str(), "ResourceClaim");
    Ok(Reply::Json(StatusCode::OK, out))
}
