//! Shape conversion between the stored v1 objects and the served API versions, written
//! independently of edra's own conversion so that tests check it rather than mirror it.
//!
//! - v1beta2 has the v1 shapes for ResourceSlice and ResourceClaim.
//! - v1beta1 ResourceSlice devices keep every field except `name` under `basic`
//!   (`{"name": "gpu-0", "basic": {"attributes": ..., "capacity": ...}}`).
//! - v1beta1 ResourceClaim requests carry the `exactly` fields (`deviceClassName`, `count`,
//!   `allocationMode`, `selectors`, `adminAccess`, `tolerations`, `capacity`) directly on the
//!   request instead of under `exactly`; `firstAvailable` is the same in both.

use serde_json::{Map, Value};

/// A served resource.k8s.io version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ApiVersion {
    V1,
    V1beta2,
    V1beta1,
}

impl ApiVersion {
    pub const ALL: [ApiVersion; 3] = [ApiVersion::V1, ApiVersion::V1beta2, ApiVersion::V1beta1];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V1beta2 => "v1beta2",
            Self::V1beta1 => "v1beta1",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// `resource.k8s.io/v1`, ...
    pub fn group_version(self) -> String {
        format!("resource.k8s.io/{}", self.as_str())
    }
}

/// Fields of a v1 `ExactDeviceRequest` that v1beta1 keeps on the request itself.
const EXACT_FIELDS: [&str; 7] =
    ["deviceClassName", "selectors", "allocationMode", "count", "adminAccess", "tolerations", "capacity"];

/// Converts a stored (v1) ResourceSlice to `version`'s shape (without apiVersion/kind).
pub fn slice_out(version: ApiVersion, object: &Value) -> Value {
    let mut out = object.clone();
    if version == ApiVersion::V1beta1 {
        for_each_device(&mut out, |device| {
            let name = device.remove("name");
            let basic = std::mem::take(device);
            if let Some(name) = name {
                device.insert("name".to_owned(), name);
            }
            device.insert("basic".to_owned(), Value::Object(basic));
        });
    }
    out
}

/// Converts a ResourceSlice received on `version` to the stored v1 shape.
pub fn slice_in(version: ApiVersion, object: &Value) -> Value {
    let mut out = object.clone();
    if version == ApiVersion::V1beta1 {
        for_each_device(&mut out, |device| {
            if let Some(Value::Object(basic)) = device.remove("basic") {
                for (k, v) in basic {
                    device.entry(k).or_insert(v);
                }
            }
        });
    }
    out
}

/// Converts a stored (v1) ResourceClaim to `version`'s shape.
pub fn claim_out(version: ApiVersion, object: &Value) -> Value {
    let mut out = object.clone();
    if version == ApiVersion::V1beta1 {
        for_each_request(&mut out, |request| {
            if let Some(Value::Object(exactly)) = request.remove("exactly") {
                for (k, v) in exactly {
                    request.insert(k, v);
                }
            }
        });
    }
    out
}

/// Converts a ResourceClaim received on `version` to the stored v1 shape.
pub fn claim_in(version: ApiVersion, object: &Value) -> Value {
    let mut out = object.clone();
    if version == ApiVersion::V1beta1 {
        for_each_request(&mut out, |request| {
            if request.contains_key("firstAvailable") {
                return;
            }
            let mut exactly = Map::new();
            for field in EXACT_FIELDS {
                if let Some(v) = request.remove(field) {
                    exactly.insert(field.to_owned(), v);
                }
            }
            request.insert("exactly".to_owned(), Value::Object(exactly));
        });
    }
    out
}

fn for_each_device(object: &mut Value, mut f: impl FnMut(&mut Map<String, Value>)) {
    if let Some(devices) = object.pointer_mut("/spec/devices").and_then(Value::as_array_mut) {
        devices.iter_mut().filter_map(Value::as_object_mut).for_each(&mut f);
    }
}

fn for_each_request(object: &mut Value, mut f: impl FnMut(&mut Map<String, Value>)) {
    if let Some(requests) = object.pointer_mut("/spec/devices/requests").and_then(Value::as_array_mut) {
        requests.iter_mut().filter_map(Value::as_object_mut).for_each(&mut f);
    }
}
