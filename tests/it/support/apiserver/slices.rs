//! ResourceSlice list, get, create, update and delete with the real server's semantics:
//! generateName, AlreadyExists, optimistic concurrency on `metadata.resourceVersion`
//! (unconditional when absent), UID/resourceVersion preconditions on delete, validation and
//! authorization (node authorizer + NodeRestriction when enabled).

use http::StatusCode;
use serde_json::{Value, json};

use super::authz::Attributes;
use super::convert::{self, ApiVersion};
use super::handler::{Call, Reply};
use super::meta::now_rfc3339;
use super::meta::{metadata_mut, random_suffix, with_type};
use super::query::FieldSelector;
use super::status::{ApiError, Cause, SLICES};
use super::{quantity, validate};

fn attrs<'a>(verb: &'static str, name: Option<&'a str>) -> Attributes<'a> {
    Attributes { name, ..Attributes::new(verb, SLICES) }
}

fn node_of(object: &Value) -> Option<&str> {
    object["spec"]["nodeName"].as_str()
}

/// The object as served on `version`, with apiVersion/kind.
pub(crate) fn out(version: ApiVersion, stored: &Value) -> Value {
    with_type(&convert::slice_out(version, stored), version.as_str(), "ResourceSlice")
}

pub(crate) fn list(call: &Call<'_>, version: ApiVersion) -> Result<Reply, ApiError> {
    let selector = FieldSelector::parse_for_slices(call.params.get("fieldSelector").map(String::as_str))?;
    let mut a = attrs("list", None);
    a.selector_node = selector.required_value("spec.nodeName");
    call.authorize(&a)?;
    let state = call.shared.lock();
    let items: Vec<Value> =
        state.slices.values().filter(|s| selector.matches(s)).map(|s| convert::slice_out(version, s)).collect();
    Ok(Reply::Json(
        StatusCode::OK,
        json!({
            "kind": "ResourceSliceList",
            "apiVersion": version.group_version(),
            "metadata": {"resourceVersion": state.resource_version().to_string()},
            "items": items,
        }),
    ))
}

pub(crate) fn get(call: &Call<'_>, version: ApiVersion, name: &str) -> Result<Reply, ApiError> {
    let existing = call.shared.lock().slices.get(name).cloned();
    let mut a = attrs("get", Some(name));
    a.existing_node = existing.as_ref().map(node_of);
    call.authorize(&a)?;
    let existing = existing.ok_or_else(|| ApiError::not_found(SLICES, name))?;
    Ok(Reply::Json(StatusCode::OK, out(version, &existing)))
}

/// What the real server's strategy does before validation: canonical quantities, device
/// taints dropped when the server does not serve them (`DRADeviceTaints` off),
/// `allowMultipleAllocations` and request policies dropped likewise
/// (`DRAConsumableCapacity` off), `sharedCounters` and `consumesCounters` likewise
/// (`DRAPartitionableDevices` off), and
/// `timeAdded` defaulted to now on every taint that lacks it (on create and on every
/// update alike: a client that re-sends a taint without its time resets the clock).
/// Returns the causes of unparsable quantities.
fn prepare(
    object: &mut Value,
    (device_taints, consumable_capacity, partitionable_devices): (bool, bool, bool),
) -> Vec<Cause> {
    let causes = quantity::canonicalize_slice(object);
    if !partitionable_devices {
        if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
            spec.remove("sharedCounters");
        }
        for d in object.pointer_mut("/spec/devices").and_then(Value::as_array_mut).into_iter().flatten() {
            if let Some(d) = d.as_object_mut() {
                d.remove("consumesCounters");
            }
        }
    }
    let now = now_rfc3339();
    let Some(devices) = object.pointer_mut("/spec/devices").and_then(Value::as_array_mut) else {
        return causes;
    };
    for device in devices {
        if !consumable_capacity && let Some(d) = device.as_object_mut() {
            d.remove("allowMultipleAllocations");
            for cap in d.get_mut("capacity").and_then(Value::as_object_mut).into_iter().flat_map(|c| c.values_mut()) {
                if let Some(c) = cap.as_object_mut() {
                    c.remove("requestPolicy");
                }
            }
        }
        if !device_taints {
            if let Some(d) = device.as_object_mut() {
                d.remove("taints");
            }
            continue;
        }
        for taint in device.get_mut("taints").and_then(Value::as_array_mut).into_iter().flatten() {
            if taint.is_object() && taint["timeAdded"].is_null() {
                taint["timeAdded"] = json!(now);
            }
        }
    }
    causes
}

/// Decodes a slice body sent on `version` into the stored v1 shape.
fn decode(call: &Call<'_>, version: ApiVersion) -> Result<Value, ApiError> {
    decode_value(call.json_body()?, version)
}

fn decode_value(body: Value, version: ApiVersion) -> Result<Value, ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request("the body of the request must be a JSON object".to_owned()));
    }
    if let Some(api_version) = body["apiVersion"].as_str()
        && api_version != version.group_version()
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            version.group_version()
        )));
    }
    if let Some(kind) = body["kind"].as_str()
        && kind != "ResourceSlice"
    {
        return Err(ApiError::bad_request(format!("the kind in the data ({kind}) does not match ResourceSlice")));
    }
    let mut object = convert::slice_in(version, &body);
    // Server-owned fields are ignored on input; status does not exist for slices.
    let meta = metadata_mut(&mut object);
    for key in ["creationTimestamp", "generation", "managedFields", "namespace"] {
        meta.remove(key);
    }
    Ok(object)
}

pub(crate) fn create(call: &Call<'_>, version: ApiVersion) -> Result<Reply, ApiError> {
    let mut object = decode(call, version)?;
    if object["metadata"]["resourceVersion"].as_str().is_some_and(|rv| !rv.is_empty()) {
        return Err(ApiError::resource_version_on_create());
    }
    metadata_mut(&mut object).remove("uid");
    metadata_mut(&mut object).remove("resourceVersion");
    let given = object["metadata"]["name"].as_str().filter(|n| !n.is_empty()).map(str::to_owned);
    let prefix = object["metadata"]["generateName"].as_str().filter(|n| !n.is_empty()).map(str::to_owned);
    let mut state_name = given.clone();
    if state_name.is_none()
        && let Some(prefix) = &prefix
    {
        let state = call.shared.lock();
        state_name = (0..100).map(|_| format!("{prefix}{}", random_suffix())).find(|n| !state.slices.contains_key(n));
    }
    let name = state_name.unwrap_or_default();
    metadata_mut(&mut object).insert("name".to_owned(), json!(name));
    let mut a = attrs("create", Some(&name));
    a.new_node = Some(node_of(&object));
    call.authorize(&a)?;
    let gates = {
        let s = call.shared.lock();
        (s.device_taints, s.consumable_capacity, s.partitionable_devices)
    };
    let mut causes = prepare(&mut object, gates);
    causes.extend(validate::slice(&object, None));
    causes.extend(validate::taint_effects(&object, &call.shared.opts.git_version));
    if !causes.is_empty() {
        return Err(ApiError::invalid(SLICES, &name, &causes));
    }
    let stored = call.shared.mutate(|s| {
        if s.slices.contains_key(&name) {
            return Err(ApiError::already_exists(SLICES, &name));
        }
        Ok(s.create_slice(&name, object))
    })?;
    Ok(Reply::Json(StatusCode::CREATED, out(version, &stored)))
}

pub(crate) fn update(call: &Call<'_>, version: ApiVersion, name: &str) -> Result<Reply, ApiError> {
    replace(call, version, name, decode(call, version)?, "update")
}

/// PATCH with a JSON merge patch (RFC 7386). A strategic merge patch is applied the same
/// way, which is exact for ResourceSlices (their lists are atomic) unless it uses `$patch`
/// directives; JSON patch and apply patches are not emulated (415).
pub(crate) fn patch(call: &Call<'_>, version: ApiVersion, name: &str) -> Result<Reply, ApiError> {
    let content_type = call.content_type.as_deref().unwrap_or_default();
    if !content_type.starts_with("application/merge-patch+json")
        && !content_type.starts_with("application/strategic-merge-patch+json")
    {
        return Err(ApiError::unsupported_media_type(content_type));
    }
    let patch = call.raw_json()?;
    let existing = call.shared.lock().slices.get(name).cloned();
    let Some(existing) = existing else {
        let mut a = attrs("patch", Some(name));
        a.existing_node = None;
        call.authorize(&a)?;
        return Err(ApiError::not_found(SLICES, name));
    };
    let mut patched = out(version, &existing);
    merge_patch(&mut patched, &patch);
    replace(call, version, name, decode_value(patched, version)?, "patch")
}

fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(target_fields) = target {
        for (key, value) in fields {
            if value.is_null() {
                target_fields.remove(key);
            } else {
                merge_patch(target_fields.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

fn replace(
    call: &Call<'_>,
    version: ApiVersion,
    name: &str,
    mut object: Value,
    verb: &'static str,
) -> Result<Reply, ApiError> {
    let body_name = object["metadata"]["name"].as_str().unwrap_or_default();
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let existing = call.shared.lock().slices.get(name).cloned();
    let mut a = attrs(verb, Some(name));
    a.existing_node = existing.as_ref().map(node_of);
    a.new_node = Some(node_of(&object));
    call.authorize(&a)?;
    let Some(existing) = existing else {
        return Err(ApiError::not_found(SLICES, name));
    };
    let gates = {
        let s = call.shared.lock();
        (s.device_taints, s.consumable_capacity, s.partitionable_devices)
    };
    let mut causes = prepare(&mut object, gates);
    causes.extend(validate::slice(&object, Some(&existing)));
    causes.extend(validate::taint_effects(&object, &call.shared.opts.git_version));
    if !causes.is_empty() {
        return Err(ApiError::invalid(SLICES, name, &causes));
    }
    let stored = call.shared.mutate(|s| {
        let current = s.slices.get(name).ok_or_else(|| ApiError::not_found(SLICES, name))?;
        let current_uid = current["metadata"]["uid"].as_str().unwrap_or_default();
        if let Some(uid) = object["metadata"]["uid"].as_str().filter(|u| !u.is_empty())
            && uid != current_uid
        {
            let why = format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {current_uid}");
            return Err(ApiError::conflict(SLICES, name, &why));
        }
        if let Some(rv) = object["metadata"]["resourceVersion"].as_str().filter(|r| !r.is_empty())
            && Some(rv) != current["metadata"]["resourceVersion"].as_str()
        {
            return Err(ApiError::modified(SLICES, name));
        }
        s.replace_slice(name, object).ok_or_else(|| ApiError::not_found(SLICES, name))
    })?;
    Ok(Reply::Json(StatusCode::OK, out(version, &stored)))
}

pub(crate) fn delete(call: &Call<'_>, _version: ApiVersion, name: &str) -> Result<Reply, ApiError> {
    let options = if call.body.is_empty() { json!({}) } else { call.json_body()? };
    let existing = call.shared.lock().slices.get(name).cloned();
    let mut a = attrs("delete", Some(name));
    a.existing_node = existing.as_ref().map(node_of);
    call.authorize(&a)?;
    if existing.is_none() {
        return Err(ApiError::not_found(SLICES, name));
    }
    let deleted = call.shared.mutate(|s| {
        let current = s.slices.get(name).ok_or_else(|| ApiError::not_found(SLICES, name))?;
        let meta = &current["metadata"];
        let pre = &options["preconditions"];
        if let Some(uid) = pre["uid"].as_str()
            && Some(uid) != meta["uid"].as_str()
        {
            let why = format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                meta["uid"].as_str().unwrap_or_default()
            );
            return Err(ApiError::conflict(SLICES, name, &why));
        }
        if let Some(rv) = pre["resourceVersion"].as_str()
            && Some(rv) != meta["resourceVersion"].as_str()
        {
            let why = format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                meta["resourceVersion"].as_str().unwrap_or_default()
            );
            return Err(ApiError::conflict(SLICES, name, &why));
        }
        s.delete_slice(name).ok_or_else(|| ApiError::not_found(SLICES, name))
    })?;
    Ok(Reply::Json(
        StatusCode::OK,
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": name, "group": SLICES.group, "kind": SLICES.plural, "uid": deleted["metadata"]["uid"]},
        }),
    ))
}
