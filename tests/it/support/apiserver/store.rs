//! The test API server's object store: ResourceSlices, ResourceClaims and Nodes kept as
//! `serde_json::Value` in v1 shape, one global integer resourceVersion counter shared by all
//! kinds (like etcd's revision), a bounded event history for watches, and the request log.
//!
//! Every mutation goes through [`State`] methods that stamp metadata and append the event;
//! the owner bumps a `tokio::sync::watch` generation after each change so watches and
//! `wait_for` wake up.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Instant;

use serde_json::{Value, json};

use super::UserInfo;
use super::authz::ForbidRule;
use super::faults::Fault;
use super::meta::{metadata_mut, new_uid, now_rfc3339, strip_type, with_type};

/// Which collection an event belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Slice,
    Claim,
    Node,
    Pod,
}

/// Watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, as a watch replays it: the object (v1 shape) after the change (for DELETED,
/// the last state with the deletion's resourceVersion).
#[derive(Debug, Clone)]
pub struct Event {
    pub rv: u64,
    pub kind: Kind,
    pub event_type: EventType,
    pub object: Value,
}

/// One served HTTP request, as recorded for tests and benchmarks.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    /// Position in the log (0-based); compare with [`State::request_mark`].
    pub seq: usize,
    pub method: http::Method,
    pub path: String,
    pub query: Option<String>,
    /// Kubernetes verb: get, list, watch, create, update, delete, discovery, or "" if unknown.
    pub verb: &'static str,
    /// Authenticated user, if any.
    pub user: Option<String>,
    pub status: u16,
    pub request_bytes: usize,
    /// Bytes of the response body; 0 for a watch (see [`State::watch_bytes`]).
    pub response_bytes: usize,
    /// When the request arrived.
    pub at: Instant,
    /// Time until the response head was ready (for a watch: until the stream started).
    pub duration: std::time::Duration,
}

impl RequestRecord {
    /// Whether the request changed (or tried to change) stored objects; reviews are
    /// `create`s that store nothing.
    pub fn is_write(&self) -> bool {
        matches!(self.verb, "create" | "update" | "patch" | "delete") && !self.path.contains("selfsubject")
    }
}

/// Registered bearer tokens; `Debug` prints only the users.
#[derive(Default)]
pub(crate) struct Tokens(pub(crate) HashMap<String, UserInfo>);

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.values().map(|u| &u.user)).finish()
    }
}

/// The whole server state; tests read it through [`super::TestApiServer::wait_for`] and the
/// accessors on the handle.
#[derive(Debug)]
pub struct State {
    rv: u64,
    pub(crate) slices: BTreeMap<String, Value>,
    pub(crate) claims: BTreeMap<(String, String), Value>,
    pub(crate) nodes: BTreeMap<String, Value>,
    /// Pods by (namespace, name), in v1 shape.
    pub(crate) pods: BTreeMap<(String, String), Value>,
    /// (namespace, claim name) → nodes whose pods use the claim (node authorizer graph).
    pub(crate) claim_nodes: HashMap<(String, String), HashSet<String>>,
    history: VecDeque<Event>,
    history_limit: usize,
    /// Watches must start at or after this resourceVersion.
    compacted: u64,
    pub(crate) log: Vec<RequestRecord>,
    pub(crate) open_watches: usize,
    pub(crate) open_connections: usize,
    pub(crate) in_flight: usize,
    pub(crate) connections_accepted: usize,
    pub(crate) watch_bytes: usize,
    pub(crate) tokens: Tokens,
    pub(crate) faults: Vec<Fault>,
    /// Requests an injected fault was applied to.
    pub(crate) faults_applied: usize,
    pub(crate) forbid: Vec<ForbidRule>,
    pub(crate) node_authorizer: bool,
    pub(crate) gone_as_http_status: bool,
    /// Device taints are stored (`DRADeviceTaints` on); when false they are dropped.
    pub(crate) device_taints: bool,
    /// `allowMultipleAllocations` and request policies are stored (`DRAConsumableCapacity`
    /// on); when false they are dropped.
    pub(crate) consumable_capacity: bool,
    pub(crate) partitionable_devices: bool,
    /// `status.devices` of claims is stored (`DRAResourceClaimDeviceStatus` on); when
    /// false it is dropped.
    pub(crate) device_status: bool,
    /// Node identities may apply claim status for every driver, as the opt-in RBAC for
    /// node identities grants (patch on `resourceclaims/status`, `arbitrary-node:patch` on
    /// `resourceclaims/driver`).
    pub(crate) claim_status_rbac: bool,
    /// Which field manager owns which `status.devices` entry, by (namespace, name).
    pub(crate) status_owners: HashMap<(String, String), BTreeMap<String, String>>,
}

impl State {
    pub(crate) fn new(history_limit: usize) -> Self {
        Self {
            rv: 1,
            slices: BTreeMap::new(),
            claims: BTreeMap::new(),
            nodes: BTreeMap::new(),
            pods: BTreeMap::new(),
            claim_nodes: HashMap::new(),
            device_status: true,
            claim_status_rbac: false,
            status_owners: HashMap::new(),
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            compacted: 1,
            log: Vec::new(),
            open_watches: 0,
            open_connections: 0,
            in_flight: 0,
            connections_accepted: 0,
            watch_bytes: 0,
            tokens: Tokens::default(),
            faults: Vec::new(),
            faults_applied: 0,
            forbid: Vec::new(),
            node_authorizer: false,
            gone_as_http_status: false,
            device_taints: true,
            consumable_capacity: true,
            partitionable_devices: true,
        }
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// Oldest resourceVersion a watch may still start from.
    pub fn compacted_rv(&self) -> u64 {
        self.compacted
    }

    /// All slices (v1 shape, with kind/apiVersion), by name.
    pub fn slices(&self) -> Vec<Value> {
        self.slices.values().map(|s| with_type(s, "v1", "ResourceSlice")).collect()
    }

    pub fn slice(&self, name: &str) -> Option<Value> {
        self.slices.get(name).map(|s| with_type(s, "v1", "ResourceSlice"))
    }

    /// Slices whose `spec.nodeName` is `node`.
    pub fn slices_on(&self, node: &str) -> Vec<Value> {
        self.slices().into_iter().filter(|s| s["spec"]["nodeName"].as_str() == Some(node)).collect()
    }

    pub fn claim(&self, namespace: &str, name: &str) -> Option<Value> {
        self.claims.get(&(namespace.to_owned(), name.to_owned())).cloned()
    }

    /// The request log so far.
    pub fn requests(&self) -> &[RequestRecord] {
        &self.log
    }

    /// Current end of the request log, for [`Self::writes_since`].
    pub fn request_mark(&self) -> usize {
        self.log.len()
    }

    /// Number of logged requests with the Kubernetes verb (`get`, `list`, `watch`, `create`, ...).
    pub fn count_verb(&self, verb: &str) -> usize {
        self.log.iter().filter(|r| r.verb == verb).count()
    }

    /// Write requests (create/update/patch/delete) logged at or after `mark`.
    pub fn writes_since(&self, mark: usize) -> usize {
        self.log.iter().skip(mark).filter(|r| r.is_write()).count()
    }

    /// Watch streams currently open (a watch counts from its first byte to its end).
    pub fn open_watches(&self) -> usize {
        self.open_watches
    }

    /// TCP connections currently open (after the TLS handshake started).
    pub fn open_connections(&self) -> usize {
        self.open_connections
    }

    /// Requests received whose response head is not ready yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Requests an injected fault was applied to so far (a delayed one counts from the
    /// moment it is held).
    pub fn faults_applied(&self) -> usize {
        self.faults_applied
    }

    /// TCP connections accepted since start.
    pub fn connections_accepted(&self) -> usize {
        self.connections_accepted
    }

    /// Bytes sent on all watch streams so far.
    pub fn watch_bytes(&self) -> usize {
        self.watch_bytes
    }

    pub(crate) fn events_after(&self, rv: u64, kind: Kind) -> impl Iterator<Item = &Event> {
        self.history.iter().filter(move |e| e.rv > rv && e.kind == kind)
    }

    /// Forgets history up to now: watches from an older resourceVersion get 410.
    pub(crate) fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    pub(crate) fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn record(&mut self, kind: Kind, event_type: EventType, object: Value) {
        let rv = self.rv;
        self.history.push_back(Event { rv, kind, event_type, object });
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted = self.compacted.max(old.rv);
            }
        }
    }

    /// Stamps creation metadata (uid, creationTimestamp, resourceVersion, generation 1).
    fn stamp_new(&mut self, object: &mut Value) -> u64 {
        let rv = self.next_rv();
        let meta = metadata_mut(object);
        meta.insert("uid".to_owned(), json!(new_uid()));
        meta.insert("creationTimestamp".to_owned(), json!(now_rfc3339()));
        meta.insert("resourceVersion".to_owned(), json!(rv.to_string()));
        meta.insert("generation".to_owned(), json!(1));
        rv
    }

    /// Stores a new slice (name already decided) and emits ADDED; returns the stored object.
    pub(crate) fn create_slice(&mut self, name: &str, mut object: Value) -> Value {
        strip_type(&mut object);
        metadata_mut(&mut object).insert("name".to_owned(), json!(name));
        self.stamp_new(&mut object);
        self.slices.insert(name.to_owned(), object.clone());
        self.record(Kind::Slice, EventType::Added, object.clone());
        object
    }

    /// Replaces a slice, keeping identity metadata; bumps generation when the spec changed.
    pub(crate) fn replace_slice(&mut self, name: &str, mut object: Value) -> Option<Value> {
        let old = self.slices.get(name)?.clone();
        strip_type(&mut object);
        let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
        let generation = if old["spec"] == object["spec"] { generation } else { generation + 1 };
        let meta = metadata_mut(&mut object);
        for key in ["uid", "creationTimestamp", "name", "resourceVersion"] {
            match old["metadata"].get(key) {
                Some(v) => meta.insert(key.to_owned(), v.clone()),
                None => meta.remove(key),
            };
        }
        meta.insert("generation".to_owned(), json!(generation));
        if object == old {
            // Like etcd3's GuaranteedUpdate: an identical object is not written, the
            // resourceVersion stays and no event is emitted.
            return Some(old);
        }
        let rv = self.next_rv();
        metadata_mut(&mut object).insert("resourceVersion".to_owned(), json!(rv.to_string()));
        self.slices.insert(name.to_owned(), object.clone());
        self.record(Kind::Slice, EventType::Modified, object.clone());
        Some(object)
    }

    pub(crate) fn delete_slice(&mut self, name: &str) -> Option<Value> {
        let mut object = self.slices.remove(name)?;
        let rv = self.next_rv();
        metadata_mut(&mut object).insert("resourceVersion".to_owned(), json!(rv.to_string()));
        self.record(Kind::Slice, EventType::Deleted, object.clone());
        Some(object)
    }

    /// Creates or replaces a claim (v1 shape); keeps the uid if the test did not set one.
    pub(crate) fn put_claim(&mut self, mut claim: Value) -> Value {
        strip_type(&mut claim);
        let ns = claim["metadata"]["namespace"].as_str().unwrap_or("default").to_owned();
        let name = claim["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let key = (ns.clone(), name);
        let old = self.claims.get(&key).cloned();
        let rv = self.next_rv();
        let meta = metadata_mut(&mut claim);
        meta.insert("namespace".to_owned(), json!(ns));
        let old_uid = old.as_ref().and_then(|o| o["metadata"]["uid"].as_str().map(str::to_owned));
        if !meta.get("uid").is_some_and(Value::is_string) {
            meta.insert("uid".to_owned(), json!(old_uid.unwrap_or_else(new_uid)));
        }
        if !meta.contains_key("creationTimestamp") {
            meta.insert("creationTimestamp".to_owned(), json!(now_rfc3339()));
        }
        meta.insert("resourceVersion".to_owned(), json!(rv.to_string()));
        meta.entry("generation").or_insert(json!(1));
        self.claims.insert(key, claim.clone());
        let event_type = if old.is_some() { EventType::Modified } else { EventType::Added };
        self.record(Kind::Claim, event_type, claim.clone());
        claim
    }

    pub(crate) fn delete_claim(&mut self, namespace: &str, name: &str) -> Option<Value> {
        let mut claim = self.claims.remove(&(namespace.to_owned(), name.to_owned()))?;
        let rv = self.next_rv();
        metadata_mut(&mut claim).insert("resourceVersion".to_owned(), json!(rv.to_string()));
        self.record(Kind::Claim, EventType::Deleted, claim.clone());
        Some(claim)
    }

    /// Creates or replaces a pod (v1 shape), keeping its uid across replacements.
    pub(crate) fn put_pod(&mut self, mut pod: Value) -> Value {
        strip_type(&mut pod);
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default").to_owned();
        let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let key = (ns.clone(), name);
        let old = self.pods.get(&key).cloned();
        let rv = self.next_rv();
        let meta = metadata_mut(&mut pod);
        meta.insert("namespace".to_owned(), json!(ns));
        let old_uid = old.as_ref().and_then(|o| o["metadata"]["uid"].as_str().map(str::to_owned));
        if !meta.get("uid").is_some_and(Value::is_string) {
            meta.insert("uid".to_owned(), json!(old_uid.unwrap_or_else(new_uid)));
        }
        meta.entry("creationTimestamp").or_insert(json!(now_rfc3339()));
        meta.insert("resourceVersion".to_owned(), json!(rv.to_string()));
        self.pods.insert(key, pod.clone());
        let event_type = if old.is_some() { EventType::Modified } else { EventType::Added };
        self.record(Kind::Pod, event_type, pod.clone());
        pod
    }

    pub(crate) fn delete_pod(&mut self, namespace: &str, name: &str) -> Option<Value> {
        let mut pod = self.pods.remove(&(namespace.to_owned(), name.to_owned()))?;
        let rv = self.next_rv();
        metadata_mut(&mut pod).insert("resourceVersion".to_owned(), json!(rv.to_string()));
        self.record(Kind::Pod, EventType::Deleted, pod.clone());
        Some(pod)
    }

    /// Whether a pod bound to `node` uses claim `namespace/name` (directly, or as the claim
    /// generated for it from a template): the node authorizer's pod → claim edge.
    pub(crate) fn pod_on_node_uses_claim(&self, node: &str, namespace: &str, name: &str) -> bool {
        self.pods
            .values()
            .filter(|p| p["metadata"]["namespace"] == namespace)
            .any(|p| p["spec"]["nodeName"].as_str() == Some(node) && pod_claim_names(p).iter().any(|c| c == name))
    }

    pub(crate) fn delete_node(&mut self, name: &str) -> Option<Value> {
        let mut node = self.nodes.remove(name)?;
        let rv = self.next_rv();
        metadata_mut(&mut node).insert("resourceVersion".to_owned(), json!(rv.to_string()));
        self.record(Kind::Node, EventType::Deleted, node.clone());
        Some(node)
    }

    /// Adds (or returns the existing) Node; returns its uid.
    pub(crate) fn add_node(&mut self, name: &str) -> String {
        if let Some(uid) = self.nodes.get(name).and_then(|n| n["metadata"]["uid"].as_str()) {
            return uid.to_owned();
        }
        let mut node = json!({"metadata": {"name": name}, "spec": {}, "status": {}});
        self.stamp_new(&mut node);
        let uid = node["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
        self.nodes.insert(name.to_owned(), node.clone());
        self.record(Kind::Node, EventType::Added, node);
        uid
    }
}

/// The names of the claims a pod uses: `spec.resourceClaims[].resourceClaimName`, the
/// generated names in `status.resourceClaimStatuses` and the extended-resource claim.
pub(crate) fn pod_claim_names(pod: &Value) -> Vec<String> {
    let mut names = Vec::new();
    let statuses = pod["status"]["resourceClaimStatuses"].as_array().cloned().unwrap_or_default();
    for entry in pod["spec"]["resourceClaims"].as_array().into_iter().flatten() {
        if let Some(n) = entry["resourceClaimName"].as_str() {
            names.push(n.to_owned());
        } else if let Some(n) =
            statuses.iter().find(|s| s["name"] == entry["name"]).and_then(|s| s["resourceClaimName"].as_str())
        {
            names.push(n.to_owned());
        }
    }
    if let Some(n) = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"].as_str() {
        names.push(n.to_owned());
    }
    names
}
