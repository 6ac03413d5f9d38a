//! The one place where resource.k8s.io wire versions meet edra's model: edra always works
//! with `resource.k8s.io/v1` types; this module converts JSON to and from v1beta2 (same
//! shapes as v1 for ResourceSlice and ResourceClaim, only `apiVersion` differs) and v1beta1
//! (a slice device's fields sit under `basic`; a claim request carries the exact-request
//! fields directly instead of under `exactly`). Allocation results and configs under
//! `status.allocation` are the same in all three.

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde_json::{Map, Value};

use super::ResourceApi;

/// A conversion failure (the object does not have the expected shape).
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("cannot encode the object: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("cannot decode the {api} object: {source}")]
    Decode {
        api: ResourceApi,
        #[source]
        source: serde_json::Error,
    },
    #[error("the {api} object is not a JSON object")]
    NotAnObject { api: ResourceApi },
}

const V1: &str = "resource.k8s.io/v1";

/// A v1 ResourceSlice as the wire JSON of `api`.
pub fn slice_to_wire(api: ResourceApi, slice: &ResourceSlice) -> Result<Value, ConvertError> {
    let mut v = serde_json::to_value(slice).map_err(ConvertError::Encode)?;
    set_type(&mut v, api.api_version(), "ResourceSlice");
    if api == ResourceApi::V1beta1 {
        for dev in devices(&mut v) {
            if let Value::Object(d) = dev {
                let name = d.remove("name");
                let basic: Map<String, Value> = std::mem::take(d);
                if let Some(n) = name {
                    d.insert("name".into(), n);
                }
                d.insert("basic".into(), Value::Object(basic));
            }
        }
    }
    Ok(v)
}

/// Wire JSON of `api` as a v1 ResourceSlice.
pub fn slice_from_wire(api: ResourceApi, mut v: Value) -> Result<ResourceSlice, ConvertError> {
    if !v.is_object() {
        return Err(ConvertError::NotAnObject { api });
    }
    set_type(&mut v, V1, "ResourceSlice");
    if api == ResourceApi::V1beta1 {
        for dev in devices(&mut v) {
            if let Value::Object(d) = dev
                && let Some(Value::Object(basic)) = d.remove("basic")
            {
                for (k, val) in basic {
                    d.entry(k).or_insert(val);
                }
            }
        }
    }
    serde_json::from_value(v).map_err(|source| ConvertError::Decode { api, source })
}

/// A v1 ResourceClaim as the wire JSON of `api`.
pub fn claim_to_wire(api: ResourceApi, claim: &ResourceClaim) -> Result<Value, ConvertError> {
    let mut v = serde_json::to_value(claim).map_err(ConvertError::Encode)?;
    set_type(&mut v, api.api_version(), "ResourceClaim");
    if api == ResourceApi::V1beta1 {
        for req in requests(&mut v) {
            if let Value::Object(r) = req
                && let Some(Value::Object(exactly)) = r.remove("exactly")
            {
                r.extend(exactly);
            }
        }
    }
    Ok(v)
}

/// [`claim_from_wire`] of a response body. A v1 claim that names its `apiVersion` and
/// `kind`, as the API server sends it, decodes straight into its struct; any other body
/// (another version, a claim without them, an error) takes the generic path through a
/// [`Value`], with the same result.
pub fn claim_from_body(api: ResourceApi, body: &[u8]) -> Result<ResourceClaim, ConvertError> {
    if api == ResourceApi::V1
        && let Ok(claim) = serde_json::from_slice::<ResourceClaim>(body)
    {
        return Ok(claim);
    }
    let v: Value = serde_json::from_slice(body).map_err(|source| ConvertError::Decode { api, source })?;
    claim_from_wire(api, v)
}

/// Wire JSON of `api` as a v1 ResourceClaim.
pub fn claim_from_wire(api: ResourceApi, mut v: Value) -> Result<ResourceClaim, ConvertError> {
    if !v.is_object() {
        return Err(ConvertError::NotAnObject { api });
    }
    set_type(&mut v, V1, "ResourceClaim");
    if api == ResourceApi::V1beta1 {
        for req in requests(&mut v) {
            if let Value::Object(r) = req {
                let exact: Vec<String> = r.keys().filter(|k| *k != "name" && *k != "firstAvailable").cloned().collect();
                if !exact.is_empty() {
                    let mut exactly = Map::new();
                    for k in exact {
                        if let Some(val) = r.remove(&k) {
                            exactly.insert(k, val);
                        }
                    }
                    r.insert("exactly".into(), Value::Object(exactly));
                }
            }
        }
    }
    serde_json::from_value(v).map_err(|source| ConvertError::Decode { api, source })
}

fn set_type(v: &mut Value, api_version: &str, kind: &str) {
    if let Value::Object(m) = v {
        m.insert("apiVersion".into(), api_version.into());
        m.insert("kind".into(), kind.into());
    }
}

fn devices(v: &mut Value) -> impl Iterator<Item = &mut Value> {
    v.pointer_mut("/spec/devices").and_then(Value::as_array_mut).into_iter().flatten()
}

fn requests(v: &mut Value) -> impl Iterator<Item = &mut Value> {
    v.pointer_mut("/spec/devices/requests").and_then(Value::as_array_mut).into_iter().flatten()
}

#[cfg(test)]
mod tests;
