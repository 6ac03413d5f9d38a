//! The operations edra performs: discovery, version, nodes, ResourceSlices (list, get,
//! create, update, delete with preconditions) and ResourceClaims. Objects are always
//! `resource.k8s.io/v1` types here; `convert` maps them to the served version.

use bytes::Bytes;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::client::{Pace, operation};
use super::convert::{self, ConvertError};
use super::{Client, Error, ResourceApi, request};

/// A list of slices and the list's resourceVersion (to start a watch from).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SliceList {
    pub items: Vec<ResourceSlice>,
    pub resource_version: String,
}

fn decode<T: DeserializeOwned>(op: &str, body: &Bytes) -> Result<T, Error> {
    serde_json::from_slice(body).map_err(|source| Error::Decode { operation: op.to_string(), source })
}

/// A claim from its body, once [`super::shape::check_claim`] found it holds no more than a
/// claim may: its bytes are bounded, and so is what they become.
fn decode_claim(api: ResourceApi, op: &str, body: &Bytes) -> Result<ResourceClaim, Error> {
    super::shape::check_claim(body)
        .map_err(|e| Error::Convert { operation: op.to_string(), problem: e.to_string() })?;
    convert::claim_from_body(api, body).map_err(|e| convert_err(op, e))
}

pub(super) fn convert_err(op: &str, e: ConvertError) -> Error {
    match e {
        ConvertError::Decode { source, .. } | ConvertError::Encode(source) => {
            Error::Decode { operation: op.to_string(), source }
        }
        other => Error::Convert { operation: op.to_string(), problem: other.to_string() },
    }
}

/// Decode a slice list in the wire version `api`.
pub(crate) fn decode_slice_list(api: ResourceApi, op: &str, body: &[u8]) -> Result<SliceList, Error> {
    let mut v: Value =
        serde_json::from_slice(body).map_err(|source| Error::Decode { operation: op.to_string(), source })?;
    let resource_version =
        v.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or_default().to_string();
    let items = match v.get_mut("items").map(Value::take) {
        Some(Value::Array(items)) => items,
        Some(Value::Null) | None => Vec::new(),
        Some(_) => return Err(Error::Convert { operation: op.to_string(), problem: "items is not a list".into() }),
    };
    let items = items
        .into_iter()
        .map(|i| convert::slice_from_wire(api, i).map_err(|e| convert_err(op, e)))
        .collect::<Result<_, _>>()?;
    Ok(SliceList { items, resource_version })
}

#[derive(serde::Deserialize)]
struct ApiGroup {
    #[serde(default)]
    versions: Vec<GroupVersion>,
}

#[derive(serde::Deserialize)]
struct GroupVersion {
    version: String,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Version {
    git_version: String,
}

impl Client {
    /// Which resource.k8s.io version to use: v1, else v1beta2, else v1beta1.
    pub async fn discover_resource_api(&self) -> Result<ResourceApi, Error> {
        let req = request::get("/apis/resource.k8s.io");
        let op = operation(&req);
        let served: Vec<String> = match self.request(req).await {
            Ok(body) => decode::<ApiGroup>(&op, &body)?.versions.into_iter().map(|v| v.version).collect(),
            Err(e) if e.is_not_found() => Vec::new(),
            Err(e) => return Err(e),
        };
        if let Some(api) = ResourceApi::PREFERENCE.into_iter().find(|a| served.iter().any(|v| v == a.version())) {
            tracing::debug!(version = api.version(), ?served, "resource.k8s.io version chosen");
            return Ok(api);
        }
        let server_version = self.server_version().await.unwrap_or_else(|e| format!("unknown ({e})"));
        let served = if served.is_empty() { "none".to_string() } else { served.join(", ") };
        Err(Error::NoResourceApi { server_version, served })
    }

    /// The server's `gitVersion` (e.g. `v1.34.1+k3s1`).
    pub async fn server_version(&self) -> Result<String, Error> {
        let req = request::get("/version");
        let op = operation(&req);
        let body = self.request(req).await?;
        Ok(decode::<Version>(&op, &body)?.git_version)
    }

    pub async fn get_node(&self, name: &str) -> Result<Node, Error> {
        let req = request::get_node(name);
        let op = operation(&req);
        let body = self.request(req).await?;
        decode(&op, &body)
    }

    /// List slices matching a field selector (e.g. `spec.nodeName=n1,spec.driver=d`).
    pub async fn list_slices(&self, api: ResourceApi, field_selector: &str) -> Result<SliceList, Error> {
        let req = request::list_slices(api, field_selector);
        let op = operation(&req);
        let body = self.request(req).await?;
        decode_slice_list(api, &op, &body)
    }

    pub async fn get_slice(&self, api: ResourceApi, name: &str) -> Result<ResourceSlice, Error> {
        let req = request::get_slice(api, name);
        self.slice_call(api, req).await
    }

    /// Create a slice; `metadata.generateName` is honoured. Not retried after an ambiguous
    /// failure (see the client's retry policy), so it never creates two.
    pub async fn create_slice(&self, api: ResourceApi, slice: &ResourceSlice) -> Result<ResourceSlice, Error> {
        let body = self.encode_slice(api, slice, "POST")?;
        self.slice_call(api, request::create_slice(api, body)).await
    }

    /// Replace a slice (PUT); the object's resourceVersion makes a stale update a 409 Conflict.
    pub async fn update_slice(&self, api: ResourceApi, slice: &ResourceSlice) -> Result<ResourceSlice, Error> {
        let name = slice.metadata.name.clone().unwrap_or_default();
        if name.is_empty() {
            return Err(Error::Convert {
                operation: "PUT resourceslice".into(),
                problem: "the slice has no name".into(),
            });
        }
        let body = self.encode_slice(api, slice, "PUT")?;
        self.slice_call(api, request::update_slice(api, &name, body)).await
    }

    /// Delete a slice only if it still has this uid and resourceVersion (else 409 Conflict).
    pub async fn delete_slice(
        &self,
        api: ResourceApi,
        name: &str,
        uid: &str,
        resource_version: &str,
    ) -> Result<(), Error> {
        self.request(request::delete_slice(api, name, uid, resource_version)).await.map(|_| ())
    }

    /// Server-side apply of `body` to claim `namespace/name`'s status as field manager
    /// `manager`; the claim as the server stored it, as JSON.
    pub async fn apply_claim_status(
        &self,
        api: ResourceApi,
        namespace: &str,
        name: &str,
        manager: &str,
        body: Vec<u8>,
    ) -> Result<serde_json::Value, Error> {
        let req = request::apply_claim_status(api, namespace, name, manager, body);
        let answer = self.request(req).await?;
        serde_json::from_slice(&answer).map_err(|e| Error::Convert {
            operation: "PATCH resourceclaims/status".into(),
            problem: format!("the answer is not JSON: {e}"),
        })
    }

    pub async fn get_claim(&self, api: ResourceApi, namespace: &str, name: &str) -> Result<ResourceClaim, Error> {
        self.get_claim_paced(api, namespace, name, Pace { until: None, queue: true }).await
    }

    /// [`Client::get_claim`], done by `deadline`: if the client's own rate limit would hold
    /// the request past it, it is not sent ([`Error::Throttled`]); attempts end at it.
    pub async fn get_claim_by(
        &self,
        api: ResourceApi,
        namespace: &str,
        name: &str,
        deadline: tokio::time::Instant,
    ) -> Result<ResourceClaim, Error> {
        self.get_claim_paced(api, namespace, name, Pace { until: Some(deadline), queue: true }).await
    }

    /// [`Client::get_claim_by`] for a read nobody waits for yet (a claim fetched before the
    /// kubelet asks): each attempt is sent only if the rate limit has a token free at once,
    /// so it never queues ahead of reads the kubelet waits for ([`Error::Throttled`]).
    pub async fn get_claim_if_free(
        &self,
        api: ResourceApi,
        namespace: &str,
        name: &str,
        deadline: tokio::time::Instant,
    ) -> Result<ResourceClaim, Error> {
        self.get_claim_paced(api, namespace, name, Pace { until: Some(deadline), queue: false }).await
    }

    async fn get_claim_paced(
        &self,
        api: ResourceApi,
        namespace: &str,
        name: &str,
        pace: Pace,
    ) -> Result<ResourceClaim, Error> {
        let req = request::get_claim(api, namespace, name);
        let op = operation(&req);
        let body =
            tracing::Instrument::instrument(self.request_paced(req, pace), tracing::trace_span!("claim.request"))
                .await?;
        tracing::trace_span!("claim.decode").in_scope(|| decode_claim(api, &op, &body))
    }

    fn encode_slice(&self, api: ResourceApi, slice: &ResourceSlice, verb: &str) -> Result<Vec<u8>, Error> {
        let op = format!("{verb} {}", api.slices_path());
        let v = convert::slice_to_wire(api, slice).map_err(|e| convert_err(&op, e))?;
        serde_json::to_vec(&v).map_err(|source| Error::Decode { operation: op, source })
    }

    async fn slice_call(&self, api: ResourceApi, req: http::Request<Bytes>) -> Result<ResourceSlice, Error> {
        let op = operation(&req);
        let body = self.request(req).await?;
        let v: Value = decode(&op, &body)?;
        convert::slice_from_wire(api, v).map_err(|e| convert_err(&op, e))
    }
}
