//! Query-string parsing (percent-decoding) and ResourceSlice field selectors
//! (`spec.nodeName`, `spec.driver`, `metadata.name` with `=`, `==`, `!=`, comma-combined).

use std::collections::HashMap;

use serde_json::Value;

use super::status::ApiError;

/// Decoded query parameters (last value wins).
pub fn parse(query: Option<&str>) -> HashMap<String, String> {
    query
        .unwrap_or_default()
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// `%XX` and `+` decoding; invalid escapes stay as they are.
pub fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"), 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One `field op value` requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub field: String,
    pub equal: bool,
    pub value: String,
}

/// A parsed field selector; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    pub requirements: Vec<Requirement>,
}

const SLICE_FIELDS: [&str; 3] = ["metadata.name", "spec.nodeName", "spec.driver"];
/// The pod fields edra or its tests select on (the real server has a few more).
const POD_FIELDS: [&str; 4] = ["metadata.name", "metadata.namespace", "spec.nodeName", "status.phase"];

impl FieldSelector {
    /// Parses a ResourceSlice field selector; errors are the real server's 400 texts.
    pub fn parse_for_slices(raw: Option<&str>) -> Result<Self, ApiError> {
        Self::parse(raw, &SLICE_FIELDS)
    }

    /// Parses a pod field selector.
    pub fn parse_for_pods(raw: Option<&str>) -> Result<Self, ApiError> {
        Self::parse(raw, &POD_FIELDS)
    }

    fn parse(raw: Option<&str>, fields: &[&str]) -> Result<Self, ApiError> {
        let mut requirements = Vec::new();
        for term in raw.unwrap_or_default().split(',').filter(|t| !t.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid field selector: invalid selector: '{}'; can't understand '{term}'",
                    raw.unwrap_or_default()
                )));
            };
            if !fields.contains(&field) {
                return Err(ApiError::bad_request(format!("field label not supported: {field}")));
            }
            requirements.push(Requirement { field: field.to_owned(), equal, value: value.to_owned() });
        }
        Ok(Self { requirements })
    }

    /// The value required by `field=value`, if the selector has exactly that requirement.
    pub fn required_value(&self, field: &str) -> Option<&str> {
        self.requirements.iter().find(|r| r.field == field && r.equal).map(|r| r.value.as_str())
    }

    /// Whether a stored (v1) object satisfies every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        self.requirements.iter().all(|r| {
            let pointer = format!("/{}", r.field.replace('.', "/"));
            let actual = object.pointer(&pointer).and_then(Value::as_str).unwrap_or_default();
            (actual == r.value) == r.equal
        })
    }
}
