//! The boundary between the gRPC layer and claim preparation.
//!
//! The plugin server decodes kubelet requests into these plain types and calls a
//! [`DraHandler`]; `prepare::Preparer` is the real handler. Both DRAPlugin versions (v1 and
//! v1beta1) map onto the same calls; `share_id` is dropped for v1beta1.

use std::collections::BTreeMap;
use std::future::Future;

/// A claim as the kubelet names it: all three fields are required.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClaimRef {
    /// Namespace of the ResourceClaim.
    pub namespace: String,
    /// Name of the ResourceClaim.
    pub name: String,
    /// UID of the ResourceClaim; the key of every answer.
    pub uid: String,
}

/// One prepared device, as returned to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PreparedDevice {
    /// Base request names (`req`, never `req/sub`) this device satisfies.
    pub request_names: Vec<String>,
    /// The pool (this node's name).
    pub pool_name: String,
    /// The device's name in the pool.
    pub device_name: String,
    /// Fully-qualified CDI device IDs (`vendor/class=name`).
    pub cdi_device_ids: Vec<String>,
    /// The allocation's share ID for consumable-capacity devices (v1 only).
    pub share_id: Option<String>,
}

/// Per-claim outcome of a prepare call: devices, or an error for the kubelet to report.
pub type PrepareResults = BTreeMap<String, Result<Vec<PreparedDevice>, String>>;
/// Per-claim outcome of an unprepare call.
pub type UnprepareResults = BTreeMap<String, Result<(), String>>;

/// What the kubelet asks of a DRA driver. Implementations must be idempotent, answer
/// every claim in the request (keyed by UID), and never panic on bad input.
pub trait DraHandler: Send + Sync + 'static {
    /// Prepares the claims' devices on this node.
    fn prepare(&self, claims: Vec<ClaimRef>) -> impl Future<Output = PrepareResults> + Send;
    /// Releases whatever prepare did; must work without the API server.
    fn unprepare(&self, claims: Vec<ClaimRef>) -> impl Future<Output = UnprepareResults> + Send;
}
