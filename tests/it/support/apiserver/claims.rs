//! Builder for allocated ResourceClaims in v1 shape, as the scheduler leaves them for a
//! driver: requests, `status.allocation.devices.results`, allocation config entries and the
//! node selector of a node-local allocation.

use serde_json::{Value, json};

use super::meta::new_uid;

/// One allocation result: `{request, driver, pool, device}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatedDevice {
    pub request: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
    /// `shareID` and the consumed `memory` of a multi-allocatable device's allocation.
    pub share: Option<(String, String)>,
}

impl AllocatedDevice {
    pub fn new(request: &str, driver: &str, pool: &str, device: &str) -> Self {
        Self {
            request: request.to_owned(),
            driver: driver.to_owned(),
            pool: pool.to_owned(),
            device: device.to_owned(),
            share: None,
        }
    }

    /// The allocation of a share: its ID and the memory it consumes (a quantity).
    pub fn share(mut self, share_id: &str, memory: &str) -> Self {
        self.share = Some((share_id.to_owned(), memory.to_owned()));
        self
    }
}

/// Builds `{"metadata": ..., "spec": {"devices": ...}, "status": {"allocation": ...}}`.
#[derive(Debug, Clone)]
pub struct ClaimBuilder {
    namespace: String,
    name: String,
    uid: String,
    requests: Vec<(String, String)>,
    results: Vec<AllocatedDevice>,
    config: Vec<Value>,
    node: Option<String>,
    reserved_for: Vec<Value>,
}

impl ClaimBuilder {
    /// A claim with a fresh uid and no requests.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: new_uid(),
            requests: Vec::new(),
            results: Vec::new(),
            config: Vec::new(),
            node: None,
            reserved_for: Vec::new(),
        }
    }

    pub fn uid(mut self, uid: &str) -> Self {
        self.uid = uid.to_owned();
        self
    }

    /// An `ExactCount` request for one device of `device_class`.
    pub fn request(mut self, name: &str, device_class: &str) -> Self {
        self.requests.push((name.to_owned(), device_class.to_owned()));
        self
    }

    /// An allocation result; its request is added (class `gpu.example.com`) if missing.
    pub fn allocated(mut self, device: AllocatedDevice) -> Self {
        if !self.requests.iter().any(|(r, _)| *r == device.request) {
            self.requests.push((device.request.clone(), "gpu.example.com".to_owned()));
        }
        self.results.push(device);
        self
    }

    /// An opaque allocation config entry (`source` is `FromClass` or `FromClaim`).
    pub fn opaque_config(mut self, source: &str, requests: &[&str], driver: &str, parameters: Value) -> Self {
        self.config.push(json!({
            "source": source,
            "requests": requests,
            "opaque": {"driver": driver, "parameters": parameters},
        }));
        self
    }

    /// Node-local allocation on `node` (allocation.nodeSelector with a matchFields term).
    pub fn on_node(mut self, node: &str) -> Self {
        self.node = Some(node.to_owned());
        self
    }

    /// Adds a `status.reservedFor` pod entry.
    pub fn reserved_for_pod(mut self, name: &str, uid: &str) -> Self {
        self.reserved_for.push(json!({"resource": "pods", "name": name, "uid": uid}));
        self
    }

    /// The claim in v1 shape, ready for [`super::TestApiServer::put_claim`].
    pub fn build(self) -> Value {
        let requests: Vec<Value> = self
            .requests
            .iter()
            .map(|(name, class)| {
                json!({"name": name, "exactly": {"deviceClassName": class, "allocationMode": "ExactCount", "count": 1}})
            })
            .collect();
        let results: Vec<Value> = self
            .results
            .iter()
            .map(|d| {
                let mut r = json!({"request": d.request, "driver": d.driver, "pool": d.pool, "device": d.device});
                if let Some((id, memory)) = &d.share {
                    r["shareID"] = json!(id);
                    r["consumedCapacity"] = json!({"memory": memory});
                }
                r
            })
            .collect();
        let mut claim = json!({
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
            "spec": {"devices": {"requests": requests}},
            "status": {},
        });
        if !results.is_empty() {
            let mut allocation = json!({"devices": {"results": results, "config": self.config}});
            if let Some(node) = &self.node {
                allocation["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}
                ]}]});
            }
            claim["status"]["allocation"] = allocation;
        }
        if !self.reserved_for.is_empty() {
            claim["status"]["reservedFor"] = Value::Array(self.reserved_for);
        }
        claim
    }
}
