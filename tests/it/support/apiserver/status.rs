//! `metav1.Status` failure bodies with the reasons, codes, messages and details the real
//! API server uses, and the resource descriptors those messages name.

use http::StatusCode;
use serde_json::{Value, json};

/// A served resource: plural, group and kind, as they appear in messages and details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource {
    pub plural: &'static str,
    pub group: &'static str,
    pub kind: &'static str,
}

pub const SLICES: Resource = Resource { plural: "resourceslices", group: "resource.k8s.io", kind: "ResourceSlice" };
pub const CLAIMS: Resource = Resource { plural: "resourceclaims", group: "resource.k8s.io", kind: "ResourceClaim" };
pub const NODES: Resource = Resource { plural: "nodes", group: "", kind: "Node" };
pub const PODS: Resource = Resource { plural: "pods", group: "", kind: "Pod" };

impl Resource {
    /// `resourceslices.resource.k8s.io`, or `nodes` for the core group.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() { self.plural.to_owned() } else { format!("{}.{}", self.plural, self.group) }
    }
}

/// An API failure: HTTP status plus the Status body, and extra headers (Retry-After).
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: StatusCode,
    pub body: Value,
    pub retry_after: Option<u64>,
}

/// One `details.causes[]` entry of an Invalid status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// `FieldValueRequired`, `FieldValueInvalid`, `FieldValueTooMany`, `FieldValueDuplicate`, ...
    pub reason: &'static str,
    /// Field path, e.g. `spec.devices[3].name`.
    pub field: String,
    /// Human text after the field path, e.g. `Required value`.
    pub message: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: String, details: Option<Value>) -> Self {
        let mut body = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        });
        if let Some(details) = details {
            body["details"] = details;
        }
        Self { code: StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body, retry_after: None }
    }

    fn details(res: Resource, name: &str) -> Value {
        json!({"name": name, "group": res.group, "kind": res.plural})
    }

    pub fn not_found(res: Resource, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{} \"{name}\" not found", res.qualified()), Some(Self::details(res, name)))
    }

    pub fn path_not_found() -> Self {
        Self::new(404, "NotFound", "the server could not find the requested resource".to_owned(), Some(json!({})))
    }

    pub fn already_exists(res: Resource, name: &str) -> Self {
        let message = format!("{} \"{name}\" already exists", res.qualified());
        Self::new(409, "AlreadyExists", message, Some(Self::details(res, name)))
    }

    /// Optimistic-concurrency conflict on update.
    pub fn modified(res: Resource, name: &str) -> Self {
        Self::conflict(
            res,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn conflict(res: Resource, name: &str, why: &str) -> Self {
        let message = format!("Operation cannot be fulfilled on {} \"{name}\": {why}", res.qualified());
        Self::new(409, "Conflict", message, Some(Self::details(res, name)))
    }

    pub fn forbidden(message: String, res: Resource, name: &str) -> Self {
        Self::new(403, "Forbidden", message, Some(Self::details(res, name)))
    }

    pub fn invalid(res: Resource, name: &str, causes: &[Cause]) -> Self {
        let rendered: Vec<String> = causes.iter().map(|c| format!("{}: {}", c.field, c.message)).collect();
        let list = if rendered.len() == 1 { rendered[0].clone() } else { format!("[{}]", rendered.join(", ")) };
        let message = format!("{}.{} \"{name}\" is invalid: {list}", res.kind, res.group);
        let causes: Vec<Value> =
            causes.iter().map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field})).collect();
        let details = json!({"name": name, "group": res.group, "kind": res.kind, "causes": causes});
        Self::new(422, "Invalid", message, Some(details))
    }

    pub fn bad_request(message: String) -> Self {
        Self::new(400, "BadRequest", message, None)
    }

    pub fn gone(message: String) -> Self {
        Self::new(410, "Expired", message, None)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized".to_owned(), None)
    }

    pub fn method_not_allowed(method: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource: {method}"),
            Some(json!({})),
        )
    }

    pub fn internal(message: String) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
            Some(json!({"causes": [{"message": message}]})),
        )
    }

    /// What etcd3 storage answers to a create that carries a resourceVersion: a 500 without
    /// a reason.
    pub fn resource_version_on_create() -> Self {
        let mut err = Self::new(500, "", "resourceVersion should not be set on objects to be created".to_owned(), None);
        if let Value::Object(fields) = &mut err.body {
            fields.remove("reason");
        }
        err
    }

    pub fn too_many_requests(retry_after: u64) -> Self {
        let mut err = Self::new(
            429,
            "TooManyRequests",
            "The apiserver is shutting down or is overloaded, please try again later.".to_owned(),
            Some(json!({"retryAfterSeconds": retry_after})),
        );
        err.retry_after = Some(retry_after);
        err
    }

    /// A 429 or 503 whose delay is in the `Retry-After` header, in `details`, both or neither.
    pub fn throttled(code: u16, header_secs: Option<u64>, details_secs: Option<u64>) -> Self {
        let reason = if code == 429 { "TooManyRequests" } else { "ServiceUnavailable" };
        let details = details_secs.map(|secs| json!({"retryAfterSeconds": secs}));
        let mut err = Self::new(code, reason, "please try again later".to_owned(), details);
        err.retry_after = header_secs;
        err
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, not {content_type}"
            ),
            None,
        )
    }
}
