//! Requests as plain values: pure functions that build `http::Request`s (path and query
//! only; the client adds the server address and credentials), so URIs, query escaping,
//! methods and bodies are unit-tested without I/O.

use bytes::Bytes;
use http::{Method, Request, header};

/// The resource.k8s.io version edra talks, chosen by discovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResourceApi {
    V1,
    V1beta2,
    V1beta1,
}

impl ResourceApi {
    /// All versions, most preferred first.
    pub const PREFERENCE: [ResourceApi; 3] = [ResourceApi::V1, ResourceApi::V1beta2, ResourceApi::V1beta1];

    /// `v1`, `v1beta2`, `v1beta1`.
    pub fn version(&self) -> &'static str {
        match self {
            ResourceApi::V1 => "v1",
            ResourceApi::V1beta2 => "v1beta2",
            ResourceApi::V1beta1 => "v1beta1",
        }
    }

    /// `resource.k8s.io/<version>`.
    pub fn api_version(&self) -> &'static str {
        match self {
            ResourceApi::V1 => "resource.k8s.io/v1",
            ResourceApi::V1beta2 => "resource.k8s.io/v1beta2",
            ResourceApi::V1beta1 => "resource.k8s.io/v1beta1",
        }
    }

    /// `/apis/resource.k8s.io/<version>/resourceslices`.
    pub fn slices_path(&self) -> String {
        format!("/apis/{}/resourceslices", self.api_version())
    }

    /// `/apis/resource.k8s.io/<version>/resourceslices/<name>`.
    pub fn slice_path(&self, name: &str) -> String {
        format!("{}/{}", self.slices_path(), segment(name))
    }

    /// `/apis/resource.k8s.io/<version>/namespaces/<ns>/resourceclaims/<name>`.
    pub fn claim_path(&self, namespace: &str, name: &str) -> String {
        format!("/apis/{}/namespaces/{}/resourceclaims/{}", self.api_version(), segment(namespace), segment(name))
    }

    /// The version named `v` (as in discovery), if edra speaks it.
    pub fn from_version(v: &str) -> Option<ResourceApi> {
        Self::PREFERENCE.into_iter().find(|a| a.version() == v)
    }
}

impl std::fmt::Display for ResourceApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.api_version())
    }
}

/// Percent-encode everything but RFC 3986 unreserved characters.
fn encode(s: &str, out: &mut String) {
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    encode(s, &mut out);
    out
}

/// `path?k1=v1&k2=v2` with keys and values percent-encoded; empty values are left out.
pub fn with_query(path: &str, params: &[(&str, &str)]) -> String {
    let mut out = path.to_string();
    let mut sep = '?';
    for (k, v) in params.iter().filter(|(_, v)| !v.is_empty()) {
        out.push(sep);
        sep = '&';
        encode(k, &mut out);
        out.push('=');
        encode(v, &mut out);
    }
    out
}

fn build(method: Method, uri: String, body: Option<Vec<u8>>) -> Request<Bytes> {
    let mut b = Request::builder().method(method).uri(uri).header(header::ACCEPT, "application/json");
    if body.is_some() {
        b = b.header(header::CONTENT_TYPE, "application/json");
    }
    // The URI is built from encoded parts only, so the builder cannot fail; fall back to an
    // empty request rather than panic.
    b.body(body.map(Bytes::from).unwrap_or_default()).unwrap_or_default()
}

pub fn get(path: &str) -> Request<Bytes> {
    build(Method::GET, path.to_string(), None)
}

/// `POST path` with a JSON body (creates, reviews).
pub fn post(path: &str, body: Vec<u8>) -> Request<Bytes> {
    build(Method::POST, path.to_string(), Some(body))
}

pub fn get_node(name: &str) -> Request<Bytes> {
    get(&format!("/api/v1/nodes/{}", segment(name)))
}

pub fn list_slices(api: ResourceApi, field_selector: &str) -> Request<Bytes> {
    get(&with_query(&api.slices_path(), &[("fieldSelector", field_selector)]))
}

pub fn watch_slices(
    api: ResourceApi,
    field_selector: &str,
    resource_version: &str,
    timeout_seconds: u32,
) -> Request<Bytes> {
    watch(&api.slices_path(), field_selector, resource_version, timeout_seconds)
}

pub fn get_slice(api: ResourceApi, name: &str) -> Request<Bytes> {
    get(&api.slice_path(name))
}

pub fn create_slice(api: ResourceApi, body: Vec<u8>) -> Request<Bytes> {
    build(Method::POST, api.slices_path(), Some(body))
}

pub fn update_slice(api: ResourceApi, name: &str, body: Vec<u8>) -> Request<Bytes> {
    build(Method::PUT, api.slice_path(name), Some(body))
}

/// DELETE with `DeleteOptions.preconditions` (uid and resourceVersion; empty ones left out).
pub fn delete_slice(api: ResourceApi, name: &str, uid: &str, resource_version: &str) -> Request<Bytes> {
    let mut pre = serde_json::Map::new();
    if !uid.is_empty() {
        pre.insert("uid".into(), uid.into());
    }
    if !resource_version.is_empty() {
        pre.insert("resourceVersion".into(), resource_version.into());
    }
    let body = serde_json::json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": pre});
    build(Method::DELETE, api.slice_path(name), Some(body.to_string().into_bytes()))
}

pub fn get_claim(api: ResourceApi, namespace: &str, name: &str) -> Request<Bytes> {
    get(&api.claim_path(namespace, name))
}

/// Server-side apply of `body` (a partial ResourceClaim as JSON, which is YAML) to a
/// claim's `status` subresource as field manager `manager`, taking over conflicting fields.
pub fn apply_claim_status(
    api: ResourceApi,
    namespace: &str,
    name: &str,
    manager: &str,
    body: Vec<u8>,
) -> Request<Bytes> {
    let path = format!("{}/status", api.claim_path(namespace, name));
    let uri = with_query(&path, &[("fieldManager", manager), ("force", "true")]);
    let mut r = build(Method::PATCH, uri, Some(body));
    r.headers_mut().insert(header::CONTENT_TYPE, http::HeaderValue::from_static("application/apply-patch+yaml"));
    r
}

/// `/api/v1/pods`: the pods of all namespaces (narrowed by a field selector).
pub const PODS_PATH: &str = "/api/v1/pods";

/// List pods matching a field selector (e.g. `spec.nodeName=n1`, the one selector the node
/// authorizer lets a node list pods with).
pub fn list_pods(field_selector: &str) -> Request<Bytes> {
    get(&with_query(PODS_PATH, &[("fieldSelector", field_selector)]))
}

/// Watch pods matching a field selector from `resource_version`, with bookmarks.
pub fn watch_pods(field_selector: &str, resource_version: &str, timeout_seconds: u32) -> Request<Bytes> {
    watch(PODS_PATH, field_selector, resource_version, timeout_seconds)
}

/// Watch the objects at `path` matching a field selector from `resource_version`, with
/// bookmarks, for at most `timeout_seconds`.
fn watch(path: &str, field_selector: &str, resource_version: &str, timeout_seconds: u32) -> Request<Bytes> {
    let timeout = timeout_seconds.to_string();
    let uri = with_query(
        path,
        &[
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", &timeout),
            ("fieldSelector", field_selector),
        ],
    );
    build(Method::GET, uri, None)
}

#[cfg(test)]
mod tests;
