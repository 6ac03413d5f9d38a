//! ResourceSlice validation matching the real server's limits that edra can hit: required
//! spec fields, node-selection exclusivity, device count (128, or 64 with taints or
//! consumesCounters), device names (DNS label, unique), attributes + capacity ≤ 32 per device,
//! one value per attribute, and immutable fields on update. Field paths are v1 paths.

use serde_json::Value;

use super::quantity;
use super::status::Cause;

const MAX_DEVICES: usize = 128;
const MAX_DEVICES_WITH_TAINTS_OR_COUNTERS: usize = 64;
const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
const MAX_COUNTER_SETS: usize = 8;
const MAX_COUNTERS: usize = 32;

fn required(field: &str) -> Cause {
    Cause { reason: "FieldValueRequired", field: field.to_owned(), message: "Required value".to_owned() }
}

fn invalid(field: &str, value: &Value, why: &str) -> Cause {
    Cause { reason: "FieldValueInvalid", field: field.to_owned(), message: format!("Invalid value: {value}: {why}") }
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn is_dns_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// DNS subdomain: dot-separated DNS labels, at most 253 characters.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Validates a ResourceSlice in v1 shape; `old` is the stored object on update.
pub fn slice(object: &Value, old: Option<&Value>) -> Vec<Cause> {
    let mut causes = Vec::new();
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    if name.is_empty() {
        causes.push(Cause {
            reason: "FieldValueRequired",
            field: "metadata.name".to_owned(),
            message: "Required value: name or generateName is required".to_owned(),
        });
    } else if !is_dns_subdomain(name) {
        causes.push(invalid("metadata.name", &object["metadata"]["name"], "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"));
    }
    let spec = &object["spec"];
    match spec["driver"].as_str() {
        None | Some("") => causes.push(required("spec.driver")),
        Some(d) if d.len() > 63 || !is_dns_subdomain(&d.to_ascii_lowercase()) => causes.push(invalid(
            "spec.driver",
            &spec["driver"],
            "a lowercase RFC 1123 subdomain of at most 63 characters",
        )),
        Some(_) => {}
    }
    match spec["pool"]["name"].as_str() {
        None | Some("") => causes.push(required("spec.pool.name")),
        Some(p) if p.len() > 253 || !p.split('/').all(is_dns_subdomain) => causes.push(invalid(
            "spec.pool.name",
            &spec["pool"]["name"],
            "must be one or more DNS subdomains separated by slashes",
        )),
        Some(_) => {}
    }
    match spec["pool"]["generation"].as_i64() {
        Some(g) if g < 0 => causes.push(invalid(
            "spec.pool.generation",
            &spec["pool"]["generation"],
            "must be greater than or equal to 0",
        )),
        Some(_) => {}
        None if spec["pool"]["generation"].is_null() => {}
        None => causes.push(invalid("spec.pool.generation", &spec["pool"]["generation"], "must be an integer")),
    }
    match spec["pool"]["resourceSliceCount"].as_i64() {
        Some(c) if c > 0 => {}
        _ => causes.push(invalid(
            "spec.pool.resourceSliceCount",
            &spec["pool"]["resourceSliceCount"],
            "must be greater than zero",
        )),
    }
    let selection: Vec<&str> = ["nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection"]
        .into_iter()
        .filter(|f| match &spec[*f] {
            Value::Null => false,
            Value::String(s) => !s.is_empty(),
            _ => true,
        })
        .collect();
    if selection.len() != 1 {
        causes.push(Cause {
            reason: if selection.is_empty() { "FieldValueRequired" } else { "FieldValueInvalid" },
            field: "spec".to_owned(),
            message: "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
                .to_owned(),
        });
    }
    if spec["allNodes"].as_bool() == Some(false) {
        causes.push(invalid("spec.allNodes", &spec["allNodes"], "must be true when set"));
    }
    devices(spec, &mut causes);
    counters(spec, &mut causes);
    if let Some(old) = old {
        for (path, field) in [
            ("spec.driver", "/spec/driver"),
            ("spec.pool.name", "/spec/pool/name"),
            ("spec.nodeName", "/spec/nodeName"),
        ] {
            if object.pointer(field) != old.pointer(field) {
                causes.push(invalid(path, object.pointer(field).unwrap_or(&Value::Null), "field is immutable"));
            }
        }
    }
    causes
}

/// The `None` taint effect is valid from Kubernetes 1.35 on (`git_version` `v1.MINOR...`).
pub fn taint_effects(object: &Value, git_version: &str) -> Vec<Cause> {
    let minor: u32 = git_version
        .trim_start_matches("v1.")
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or(u32::MAX);
    if minor >= 35 {
        return Vec::new();
    }
    let mut causes = Vec::new();
    for (i, d) in object["spec"]["devices"].as_array().into_iter().flatten().enumerate() {
        for (j, t) in d["taints"].as_array().into_iter().flatten().enumerate() {
            if t["effect"] == "None" {
                causes.push(Cause {
                    reason: "FieldValueNotSupported",
                    field: format!("spec.devices[{i}].taints[{j}].effect"),
                    message: "Unsupported value: \"None\": supported values: \"NoExecute\", \"NoSchedule\"".to_owned(),
                });
            }
        }
    }
    causes
}

/// The API's rules for a capacity's `requestPolicy` (Kubernetes 1.36 validation): exactly
/// one of validValues / validRange; for a range: `default` and `min` required, `min <=
/// value`, `default >= min`, `max` within `[min, value]` and `>= default`, and with a step
/// `min + step <= value`, `(default - min) % step == 0`, `(max - min) % step == 0`, all on
/// whole numbers.
fn request_policy(field: &str, cap: &Value, causes: &mut Vec<Cause>) {
    let policy = &cap["requestPolicy"];
    let num = |v: &Value| v.as_str().and_then(quantity::value);
    let mut bad = |path: &str, why: &str| {
        causes.push(Cause {
            reason: "FieldValueInvalid",
            field: format!("{field}.requestPolicy{path}"),
            message: format!("Invalid value: {why}"),
        })
    };
    let Some(value) = num(&cap["value"]) else { return };
    let range = &policy["validRange"];
    if range.is_null() == policy["validValues"].is_null() {
        bad("", "exactly one of validValues or validRange must be set");
        return;
    }
    if range.is_null() {
        return;
    }
    let Some(default) = num(&policy["default"]) else {
        bad(".default", "required when validRange is set");
        return;
    };
    let Some(min) = num(&range["min"]) else {
        bad(".validRange.min", "required");
        return;
    };
    if min > value {
        bad(".validRange.min", "must be less than or equal to the capacity value");
    }
    if default < min {
        bad(".default", "must be greater than or equal to validRange.min");
    }
    let max = num(&range["max"]);
    if let Some(max) = max
        && (max < min || max > value || default > max)
    {
        bad(".validRange.max", "must be between min and the capacity value, and at least the default");
    }
    if let Some(step) = num(&range["step"]) {
        if step <= 0 || min + step > value {
            bad(".validRange.step", "min + step must be less than or equal to the capacity value");
            return;
        }
        if (default - min) % step != 0 {
            bad(".default", "default - min must be a multiple of validRange.step");
        }
        if let Some(max) = max
            && (max - min) % step != 0
        {
            bad(".validRange.max", "max - min must be a multiple of validRange.step");
        }
    }
}

/// Partitionable devices (Kubernetes 1.35+): a slice holds `sharedCounters` or `devices`,
/// not both; at most 8 counter sets per slice and 32 counters per set, names DNS labels;
/// at most 2 `consumesCounters` entries per device (one per set), 32 counters each.
fn counters(spec: &Value, causes: &mut Vec<Cause>) {
    let sets = spec["sharedCounters"].as_array().map_or(&[][..], Vec::as_slice);
    if !sets.is_empty() && spec["devices"].as_array().is_some_and(|d| !d.is_empty()) {
        causes.push(Cause {
            reason: "FieldValueInvalid",
            field: "spec".to_owned(),
            message: "Invalid value: only one of `sharedCounters` or `devices` is allowed".to_owned(),
        });
    }
    if sets.len() > MAX_COUNTER_SETS {
        causes.push(too_many("spec.sharedCounters", sets.len(), MAX_COUNTER_SETS));
    }
    let counter_map = |field: &str, counters: &Value, causes: &mut Vec<Cause>| {
        let Some(map) = counters.as_object() else {
            causes.push(required(field));
            return;
        };
        if map.len() > MAX_COUNTERS {
            causes.push(too_many(field, map.len(), MAX_COUNTERS));
        }
        for (name, c) in map {
            if !is_dns_label(name) {
                causes.push(invalid(&format!("{field}[{name}]"), &Value::String(name.clone()), "must be a DNS label"));
            }
            if c["value"].is_null() {
                causes.push(required(&format!("{field}[{name}].value")));
            }
        }
    };
    let mut names = std::collections::HashSet::new();
    for (i, set) in sets.iter().enumerate() {
        let name = set["name"].as_str().unwrap_or_default();
        if !is_dns_label(name) {
            causes.push(invalid(&format!("spec.sharedCounters[{i}].name"), &set["name"], "must be a DNS label"));
        } else if !names.insert(name) {
            causes.push(Cause {
                reason: "FieldValueDuplicate",
                field: format!("spec.sharedCounters[{i}].name"),
                message: format!("Duplicate value: \"{name}\""),
            });
        }
        counter_map(&format!("spec.sharedCounters[{i}].counters"), &set["counters"], causes);
    }
    for (i, d) in spec["devices"].as_array().into_iter().flatten().enumerate() {
        let uses = d["consumesCounters"].as_array().map_or(&[][..], Vec::as_slice);
        if uses.len() > 2 {
            causes.push(too_many(&format!("spec.devices[{i}].consumesCounters"), uses.len(), 2));
        }
        for (j, u) in uses.iter().enumerate() {
            if u["counterSet"].as_str().is_none_or(|s| !is_dns_label(s)) {
                causes.push(invalid(
                    &format!("spec.devices[{i}].consumesCounters[{j}].counterSet"),
                    &u["counterSet"],
                    "must be a DNS label",
                ));
            }
            counter_map(&format!("spec.devices[{i}].consumesCounters[{j}].counters"), &u["counters"], causes);
        }
    }
}

fn too_many(field: &str, n: usize, max: usize) -> Cause {
    Cause {
        reason: "FieldValueTooMany",
        field: field.to_owned(),
        message: format!("Too many: {n}: must have at most {max} items"),
    }
}

fn devices(spec: &Value, causes: &mut Vec<Cause>) {
    let Some(devices) = spec["devices"].as_array() else {
        if !spec["devices"].is_null() {
            causes.push(invalid("spec.devices", &spec["devices"], "must be a list"));
        }
        return;
    };
    let restricted = devices.iter().any(|d| {
        d["taints"].as_array().is_some_and(|t| !t.is_empty())
            || d["consumesCounters"].as_array().is_some_and(|c| !c.is_empty())
    });
    let max = if restricted { MAX_DEVICES_WITH_TAINTS_OR_COUNTERS } else { MAX_DEVICES };
    if devices.len() > max {
        causes.push(Cause {
            reason: "FieldValueTooMany",
            field: "spec.devices".to_owned(),
            message: format!("Too many: {}: must have at most {max} items", devices.len()),
        });
    }
    for (i, d) in devices.iter().enumerate() {
        for (j, t) in d["taints"].as_array().into_iter().flatten().enumerate() {
            let field = format!("spec.devices[{i}].taints[{j}]");
            if t["key"].as_str().is_none_or(str::is_empty) {
                causes.push(required(&format!("{field}.key")));
            }
            match t["effect"].as_str() {
                Some("None" | "NoSchedule" | "NoExecute") => {}
                None => causes.push(required(&format!("{field}.effect"))),
                Some(_) => causes.push(Cause {
                    reason: "FieldValueNotSupported",
                    field: format!("{field}.effect"),
                    message: format!(
                        "Unsupported value: {}: supported values: \"NoExecute\", \"NoSchedule\", \"None\"",
                        t["effect"]
                    ),
                }),
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    for (i, device) in devices.iter().enumerate() {
        let field = format!("spec.devices[{i}].name");
        match device["name"].as_str() {
            None | Some("") => causes.push(required(&field)),
            Some(n) if !is_dns_label(n) => causes.push(invalid(&field, &device["name"], "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character")),
            Some(n) if !seen.insert(n) => causes.push(Cause {
                reason: "FieldValueDuplicate",
                field,
                message: format!("Duplicate value: \"{n}\""),
            }),
            Some(_) => {}
        }
        let attributes = device["attributes"].as_object();
        let capacity = device["capacity"].as_object();
        let total = attributes.map_or(0, |a| a.len()) + capacity.map_or(0, |c| c.len());
        if total > MAX_ATTRIBUTES_AND_CAPACITIES {
            causes.push(Cause {
                reason: "FieldValueTooMany",
                field: format!("spec.devices[{i}].attributes"),
                message: format!("Too many: {total}: must have at most {MAX_ATTRIBUTES_AND_CAPACITIES} items"),
            });
        }
        for (key, attr) in attributes.into_iter().flatten() {
            let set = ["int", "bool", "string", "version", "ints", "bools", "strings", "versions"]
                .iter()
                .filter(|f| !attr[**f].is_null())
                .count();
            if set != 1 {
                causes.push(invalid(
                    &format!("spec.devices[{i}].attributes[{key}]"),
                    attr,
                    "exactly one value must be specified",
                ));
            }
        }
        for (key, cap) in capacity.into_iter().flatten() {
            let field = format!("spec.devices[{i}].capacity[{key}]");
            if cap["value"].is_null() {
                causes.push(required(&format!("{field}.value")));
            }
            if !cap["requestPolicy"].is_null() {
                if device["allowMultipleAllocations"] != Value::Bool(true) {
                    causes.push(Cause {
                        reason: "FieldValueForbidden",
                        field: format!("{field}.requestPolicy"),
                        message: "Forbidden: allowMultipleAllocations must be true".to_owned(),
                    });
                }
                request_policy(&field, cap, causes);
            }
        }
    }
}
