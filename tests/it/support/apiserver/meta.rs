//! Object metadata helpers shared by the store and the handlers: apiVersion/kind stamping,
//! the `metadata` map, UIDs, `generateName` suffixes and RFC 3339 timestamps.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

/// A copy of `object` with apiVersion/kind for `version` first, as the real server prints it.
pub(crate) fn with_type(object: &Value, api_version: &str, kind: &str) -> Value {
    let api_version = if api_version.contains('/') || kind == "Node" {
        api_version.to_owned()
    } else {
        format!("resource.k8s.io/{api_version}")
    };
    let mut out = serde_json::Map::new();
    out.insert("kind".to_owned(), json!(kind));
    out.insert("apiVersion".to_owned(), json!(api_version));
    if let Value::Object(fields) = object {
        for (k, v) in fields {
            if k != "kind" && k != "apiVersion" {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

pub(crate) fn strip_type(object: &mut Value) {
    if let Value::Object(fields) = object {
        fields.remove("kind");
        fields.remove("apiVersion");
    }
}

/// The `metadata` map of an object, created if missing or not an object.
pub(crate) fn metadata_mut(object: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !object.is_object() {
        *object = json!({});
    }
    let fields = match object {
        Value::Object(fields) => fields,
        _ => unreachable!("replaced by an object above"),
    };
    let meta = fields.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    match meta {
        Value::Object(m) => m,
        _ => unreachable!("replaced by an object above"),
    }
}

/// A random RFC 4122 version-4 UID in lowercase.
pub(crate) fn new_uid() -> String {
    let a = fastrand::u128(..);
    let a = (a & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let h = format!("{a:032x}");
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// Five random `[a-z0-9]` characters, as `generateName` appends.
pub(crate) fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5).map(|_| char::from(ALPHABET[fastrand::usize(..ALPHABET.len())])).collect()
}

/// Current UTC time as RFC 3339 with second precision (`2026-12-02T10:00:00Z`).
pub(crate) fn now_rfc3339() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil-from-days (Howard Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}
