//! `edra status`: a live view of the node from the running agent.
//!
//! The agent serves its view on a Unix socket in its runtime directory
//! (`<paths.runtime_dir>/status.sock`, mode 0600: root only), one
//! HTTP/1.1 `GET /v1/status` answered with a [`NodeStatus`] as JSON ([`server`]);
//! `edra status` is its client and prints it as text, wide text or JSON, once or every two
//! seconds ([`client`], [`render`]). The view is read from what the agent already holds —
//! its state store (never opened a second time), the inventory, the health snapshot, the
//! MIG instances it owns, the pods of the node as the pod watch sees them — so it answers
//! while the API server is down and costs nothing until asked.

pub mod client;
pub mod collect;
pub mod render;
pub mod server;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

/// The JSON document's schema name; it changes only when a field changes meaning.
pub const SCHEMA: &str = "edra.status/v1";

/// The socket's file name in the runtime directory.
pub const SOCKET: &str = "status.sock";

/// The node as the running agent sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// [`SCHEMA`].
    pub schema: String,
    /// The agent's version.
    pub version: String,
    /// The node (pool) name.
    pub node: String,
    /// The device backend (`nvml`, `mock`).
    pub backend: String,
    /// When the agent started, Unix seconds.
    pub started_at: i64,
    /// When this view was taken, Unix seconds.
    pub now: i64,
    /// The kubelet accepted the registration.
    pub kubelet_registered: bool,
    /// The published slices matched the inventory at the last reconcile.
    pub slices_in_sync: bool,
    /// The last publishing error, if the last reconcile failed.
    pub publish_error: Option<String>,
    /// Whether the pod watch's view is current (claims' pods are known).
    pub pods_known: bool,
    /// Every GPU, by name.
    pub gpus: Vec<GpuStatus>,
    /// Every claim prepared (or being prepared), by namespace and name.
    pub claims: Vec<ClaimStatus>,
}

/// One GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuStatus {
    /// Device name (`gpu-0`).
    pub name: String,
    pub uuid: String,
    pub product: String,
    /// Memory in bytes.
    pub memory: u64,
    /// `healthy`, `unhealthy` or `unknown`.
    pub health: String,
    /// Health conditions: kind, value, since (Unix seconds), message.
    pub conditions: Vec<ConditionStatus>,
    /// Taints on its devices, `key=value:effect`, with when they were added.
    pub taints: Vec<TaintStatus>,
    /// `Default`, `ExclusiveProcess`, `Prohibited`, `integrated` for a Jetson's GPU (which
    /// has no compute modes), or why it could not be read.
    pub compute_mode: String,
    /// The GPU is in MIG mode.
    pub mig_mode: bool,
    /// MIG instances on it: edra's and foreign ones.
    pub mig_instances: Vec<MigStatus>,
    /// MPS control daemons edra runs for claims on it.
    pub mps_daemons: Vec<MpsStatus>,
    /// Memory held by shares, in bytes.
    pub memory_shared: u64,
    /// Shares held.
    pub shares: usize,
    /// The claims holding it whole (`namespace/name`).
    pub held_by: Vec<String>,
}

/// A health condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConditionStatus {
    pub kind: String,
    pub value: Option<String>,
    pub fatal: bool,
    pub since: i64,
    pub message: String,
}

/// A taint on a GPU's devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaintStatus {
    /// `key=value:effect`.
    pub taint: String,
    /// When it was added, Unix seconds.
    pub since: i64,
}

/// A MIG instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigStatus {
    pub gi: u32,
    pub ci: Option<u32>,
    pub profile: String,
    /// `start+size` in memory slices.
    pub placement: String,
    pub uuid: Option<String>,
    /// `edra` for instances edra made for claims, `foreign` for others.
    pub owner: String,
    /// The claim it was made for (`namespace/name`), for edra's.
    pub claim: Option<String>,
}

/// An MPS control daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsStatus {
    /// The claim it serves (`namespace/name`), or `shared` for a shared GPU's daemon.
    pub claim: String,
    pub pid: Option<u32>,
    /// Seconds it has run, when known.
    pub uptime: Option<u64>,
    pub restarts: u32,
}

/// A claim edra prepared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimStatus {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `PrepareStarted` or `PrepareCompleted`.
    pub phase: String,
    /// The pods of this node that use it (`None` when the pod watch cannot say).
    pub pods: Option<Vec<String>>,
    pub devices: Vec<ClaimDeviceStatus>,
    /// When it was prepared, Unix seconds.
    pub prepared_at: i64,
}

/// A device of a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimDeviceStatus {
    /// The device as allocated (`gpu-0`, `gpu-0-mig-...`, `gpu-0-replica-1`).
    pub device: String,
    /// The GPU it is on (device name), when known.
    pub gpu: String,
    /// The request it answers.
    pub request: String,
    pub share_id: Option<String>,
    /// Memory of a share, in bytes.
    pub memory: Option<u64>,
    /// `Exclusive`, `TimeSlicing` or `MPS`.
    pub strategy: String,
    pub admin_access: bool,
}
