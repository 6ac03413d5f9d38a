//! Why a claim could not be fetched ([`ClaimFetchError`]) or prepared and unprepared
//! ([`PrepareError`]); each message says what to do.

use std::path::PathBuf;

use crate::gpu::GpuError;
use crate::state::StateError;

use super::shared::enforcement_summary;
use super::{config, mig_instances};

/// Why a ResourceClaim could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum ClaimFetchError {
    /// The claim does not exist (any more).
    #[error("ResourceClaim {namespace}/{name} was not found; it was deleted, so its pod cannot start")]
    NotFound {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The API server answered, but edra cannot decode the claim it sent.
    #[error("ResourceClaim {namespace}/{name} cannot be read: {reason}")]
    Unreadable {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// What is wrong and what to do.
        reason: String,
        /// The decoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// The API server sent what edra does not decode as a claim: more than a claim may
    /// hold ([`crate::kube::shape`]), or not an object.
    #[error(
        "ResourceClaim {namespace}/{name} cannot be read: {problem}; the API server never accepts such a claim, so \
         it or a proxy in front of it is misbehaving"
    )]
    Refused {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// edra's own client-side rate limit would have held the read past the call's
    /// deadline, so it was not sent.
    #[error("ResourceClaim {namespace}/{name} was not fetched in time (the kubelet retries)")]
    Throttled {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The limiter's numbers.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The call's time for fetching claims ran out before this claim's turn.
    #[error(
        "ResourceClaim {namespace}/{name} was not fetched: the {}s this kubelet call has for fetching claims ran out before its turn, while other claims of the call were fetched; the kubelet retries",
        budget.as_secs()
    )]
    OutOfTime {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The call's fetch budget.
        budget: std::time::Duration,
    },
    /// The API server could not be asked or refused.
    #[error(
        "cannot get ResourceClaim {namespace}/{name}; check the API server connection and edra's permission to get ResourceClaims"
    )]
    Api {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl ClaimFetchError {
    /// Whether the API server refused the read (HTTP 403).
    pub fn is_forbidden(&self) -> bool {
        match self {
            ClaimFetchError::Api { source, .. } => {
                source.downcast_ref::<crate::kube::Error>().is_some_and(crate::kube::Error::is_forbidden)
            }
            _ => false,
        }
    }

    /// The error for a claim the API server sent but edra cannot decode.
    pub fn unreadable(namespace: &str, name: &str, source: serde_json::Error) -> Self {
        // serde_json stops at 128 nested levels; the API server accepts deeper opaque
        // parameters.
        let reason = if source.to_string().contains("recursion limit exceeded") {
            "it nests deeper than edra reads (128 levels), most likely in opaque device \
             parameters of the claim or its DeviceClass; flatten them"
                .to_string()
        } else {
            format!(
                "{source}; it is not a ResourceClaim edra understands (check that edra supports this Kubernetes version)"
            )
        };
        ClaimFetchError::Unreadable { namespace: namespace.to_string(), name: name.to_string(), reason, source }
    }
}

/// Why a claim could not be prepared or unprepared, grouped by cause: the claim, its
/// allocation, its configs, a change on a GPU, or edra's own state and files. Each message
/// says what to do.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The claim itself (see [`ClaimError`]).
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// Its allocation results (see [`AllocationError`]).
    #[error(transparent)]
    Allocation(#[from] AllocationError),
    /// Its configs (see [`RequestError`]).
    #[error(transparent)]
    Request(#[from] RequestError),
    /// A change on a GPU (see [`GpuChangeError`]).
    #[error(transparent)]
    GpuChange(#[from] GpuChangeError),
    /// The state store failed or refused.
    #[error(transparent)]
    State(#[from] StateError),
    /// The CDI spec could not be written or removed.
    #[error("cannot {op} the CDI spec {}; check that the directory exists and is writable", path.display())]
    Cdi {
        /// `write` or `remove`.
        op: &'static str,
        /// The spec file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// edra's CDI directory is not a directory it can write (checked at start).
    #[error(
        "edra's CDI directory {} {problem}; set cdi.dynamic_dir to a directory the container runtime reads and edra may write",
        dir.display()
    )]
    CdiDir {
        /// `cdi.dynamic_dir`.
        dir: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// A Jetson's CSV lists give no files.
    #[error(transparent)]
    JetsonFiles(super::driver_files::csv::CsvError),
    /// The generated spec breaks the CDI rules (a bug in edra).
    #[error("the generated CDI spec is invalid ({}); please report this", problems.join("; "))]
    InvalidSpec {
        /// The rules broken.
        problems: Vec<String>,
    },
    /// A blocking task failed.
    #[error("internal task failed: {0}")]
    Task(String),
}

/// What the kubelet asked for, or the claim as the API server holds it, does not let it be prepared. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The UID is not usable in names and paths.
    #[error("claim UID {uid:?} is not a lowercase RFC 4122 UUID; the kubelet must pass the claim's metadata.uid")]
    InvalidUid {
        /// The UID given.
        uid: String,
    },
    /// The claim could not be fetched.
    #[error(transparent)]
    Fetch(ClaimFetchError),
    /// The claim was deleted and re-created.
    #[error(
        "ResourceClaim {claim} has UID {found}, not {expected}: the claim was replaced; the kubelet retries with the new one"
    )]
    Replaced {
        /// `namespace/name`.
        claim: String,
        /// The UID the kubelet asked for.
        expected: String,
        /// The UID found.
        found: String,
    },
    /// The claim has no allocation.
    #[error("ResourceClaim {claim} is not allocated; wait for the scheduler to allocate it")]
    NotAllocated {
        /// `namespace/name`.
        claim: String,
    },
    /// A device is held by other claims, and the API server did not say they are gone.
    #[error("{conflict}; {checked}")]
    HeldBy {
        /// What the state refused: names the device and its holder.
        conflict: StateError,
        /// What the API server answered about each holder in the way.
        checked: String,
    },
}

/// The claim's allocation results name devices, shares or MIG devices this node cannot prepare as allocated. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum AllocationError {
    /// No results for this driver and node.
    #[error("the claim has no devices allocated by driver {driver} in pool {pool}; check the DeviceClass and the node")]
    NoDevices {
        /// The driver.
        driver: String,
        /// The pool.
        pool: String,
    },
    /// An allocated device is not in the inventory.
    #[error("device {device} is not on this node (any more); delete the pod so the claim is allocated again")]
    UnknownDevice {
        /// The device.
        device: String,
    },
    /// An allocation result's share ID cannot be used.
    #[error(
        "the allocation of device {device} carries share ID {share_id:?}, which is not a lowercase RFC 4122 UUID as \
         the scheduler writes; delete the pod so the claim is allocated again"
    )]
    InvalidShareId {
        /// The device.
        device: String,
        /// The share ID as found.
        share_id: String,
    },
    /// An allocation result carries a share ID for a device edra does not publish as shares.
    #[error(
        "device {device} is not offered as shares ({why}): an allocation with a share ID cannot be prepared; the \
         ResourceSlice the scheduler used is not this node's (check it with edra doctor), so delete the pod so the \
         claim is allocated again; to share the GPU, select it with [sharing] (mode = \"shares\", gpus) and restart \
         edra"
    )]
    NotOfferedAsShares {
        /// The device allocated.
        device: String,
        /// Why it is not offered as shares, naming the rule.
        why: String,
    },
    /// An allocation result's consumed memory cannot be used.
    #[error(
        "the allocation of device {device} says it consumes {found:?} of memory, which is not a size edra \
         understands or is more than the GPU's {gpu_memory}; delete the pod so the claim is allocated again"
    )]
    InvalidConsumedMemory {
        /// The device.
        device: String,
        /// The quantity as found.
        found: String,
        /// The GPU's memory, as a quantity.
        gpu_memory: String,
    },
    /// An allocation result's consumed memory is not a share edra publishes.
    #[error(
        "the allocation of device {device} has consumedCapacity memory {found:?}, which is not a share edra \
         publishes: its memory capacity is published with requestPolicy validRange {{min: {step}, step: {step}}} \
         (sharing.memory_step), so a share is at least {step} and a multiple of {step}; delete the pod so the \
         claim is allocated again"
    )]
    UnpublishedShare {
        /// The device.
        device: String,
        /// The consumed memory as found.
        found: String,
        /// `sharing.memory_step`, as a quantity.
        step: String,
    },
    /// A device, or a share of it, appears twice among a claim's allocation results.
    #[error(
        "device {device}{} is allocated twice in the claim (requests {first} and {second}); a device is allocated \
         once per claim and a share ID is unique per device, so the allocation is not one the scheduler makes; \
         delete the pod so the claim is allocated again",
        .share_id.as_ref().map(|s| format!(" with share ID {s}")).unwrap_or_default()
    )]
    DuplicateAllocation {
        /// The device.
        device: String,
        /// The share ID both results carry, if any.
        share_id: Option<String>,
        /// The first result's request.
        first: String,
        /// The second result's request.
        second: String,
    },
    /// A MIG device cannot be prepared on this node as it is.
    #[error("MIG device {device} cannot be prepared: {reason}; delete the pod so the claim is allocated again")]
    MigUnavailable {
        /// The device as allocated.
        device: String,
        /// Why.
        reason: String,
    },
}

/// The claim's opaque configs ask for what this node cannot do with the devices allocated. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The opaque config is wrong.
    #[error("invalid GpuConfig")]
    Config(#[source] config::ConfigError),
    /// Two requests of one claim ask for MPS with different settings.
    #[error(
        "requests {first} and {second} ask for MPS with different settings; a claim has one MPS daemon, so give \
         all its MPS requests the same sharing.mps"
    )]
    MpsConfigsDiffer {
        /// The first request.
        first: String,
        /// The other request.
        second: String,
    },
    /// A per-device MPS limit names a device the claim's MPS requests do not have.
    #[error(
        "sharing.mps.defaultPerDevicePinnedMemoryLimit names {key:?}, which is not one of the claim's MPS devices \
         ({devices}); use a device name or UUID of those"
    )]
    MpsLimitForOtherDevice {
        /// The key.
        key: String,
        /// The claim's MPS devices.
        devices: String,
    },
    /// What a Jetson's integrated GPU cannot do.
    #[error("request {request} asks for {what} on {device}, a Jetson's integrated GPU: {why}")]
    NotOnJetson {
        /// The request.
        request: String,
        /// The device as allocated.
        device: String,
        /// What was asked for.
        what: String,
        /// Why the platform, or edra on it, cannot, and what to do.
        why: &'static str,
    },
    /// A sharing strategy asked for on a share of a GPU.
    #[error(
        "sharing strategy {strategy} (request {request}) cannot apply to {device}, a share of GPU {gpu} that other \
         claims may use too: compute mode, time-slice and MPS daemon are settings of the whole GPU, and this node \
         sets them for all shares of a GPU (sharing.enforcement = \"{enforcement}\": {what}). Use Exclusive for \
         shares, or request the whole GPU (no capacity request) to choose its strategy",
        what = enforcement_summary(enforcement)
    )]
    SharingOnShare {
        /// The strategy asked for.
        strategy: &'static str,
        /// The request.
        request: String,
        /// The device as allocated.
        device: String,
        /// The GPU.
        gpu: String,
        /// The node's `sharing.enforcement`.
        enforcement: &'static str,
    },
    /// Shares of two GPUs with MPS enforcement in one claim.
    #[error(
        "requests {first} and {second} hold shares of GPUs {first_gpu} and {second_gpu}, and this node runs one MPS \
         daemon per shared GPU (sharing.enforcement = \"mps\"): a container talks to one MPS daemon, so a claim's \
         shares must be of one GPU. Use one claim per GPU"
    )]
    MpsSharesOnTwoGpus {
        /// The first request.
        first: String,
        /// Its GPU.
        first_gpu: String,
        /// The other request.
        second: String,
        /// Its GPU.
        second_gpu: String,
    },
    /// TimeSlicing asked for on a MIG device.
    #[error(
        "sharing strategy TimeSlicing (request {request}) cannot apply to MIG device {device}: the time-slice is a \
         setting of a full GPU; use Exclusive for MIG devices or request a full GPU"
    )]
    TimeSlicingOnMig {
        /// The request.
        request: String,
        /// The MIG device.
        device: String,
    },
    /// One device got different configs through two requests.
    #[error(
        "device {device} is allocated to requests {first} and {second} with different GpuConfigs; give both \
         requests the same config"
    )]
    ConflictingConfigs {
        /// The device.
        device: String,
        /// The first request.
        first: String,
        /// The second request.
        second: String,
    },
}

/// A change on this node's GPUs (compute mode, time-slice, MPS daemon, MIG instance) failed. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum GpuChangeError {
    /// The claim's MPS daemon could not be started or stopped.
    #[error("cannot run the claim's MPS control daemon")]
    Mps(#[source] crate::gpu::mps::MpsError),
    /// The MPS daemon of a shared GPU could not be started or stopped.
    #[error("cannot run the MPS control daemon of shared GPU {gpu} (sharing.enforcement = \"mps\")")]
    SharedMps {
        /// The GPU's device name.
        gpu: String,
        /// The cause.
        #[source]
        source: crate::gpu::mps::MpsError,
    },
    /// A GPU could not be read, changed or restored.
    #[error("cannot {action} of GPU {uuid}")]
    Gpu {
        /// What was being done.
        action: &'static str,
        /// The GPU's UUID.
        uuid: String,
        /// The cause.
        #[source]
        source: GpuError,
    },
    /// A MIG instance could not be listed, created or destroyed.
    #[error(transparent)]
    Mig(Box<mig_instances::MigFailure>),
    /// A prepared claim's MIG instance was lost and could not be created again.
    #[error(
        "the MIG instance of {device} (profile {profile} at placement {placement} of GPU {gpu}) was lost, most likely \
         by a reboot, and could not be created again: {reason}; delete the pod so the claim is allocated again"
    )]
    MigLost {
        /// The device as allocated.
        device: String,
        /// The GPU instance profile.
        profile: String,
        /// The placement.
        placement: crate::gpu::mig_control::Placement,
        /// The GPU's UUID.
        gpu: String,
        /// Why it could not be created again.
        reason: String,
    },
    /// A GPU memory limit could not be set or cleared.
    #[error(transparent)]
    MemoryLimit(#[from] crate::gpu::memory_limit::LimitError),
}

/// Wraps a GPU failure with what was being done to which GPU.
pub(super) fn gpu_error(action: &'static str, uuid: &str) -> impl FnOnce(GpuError) -> PrepareError {
    let uuid = uuid.to_string();
    move |source| GpuChangeError::Gpu { action, uuid, source }.into()
}

pub(super) fn message(e: &PrepareError) -> String {
    crate::util::error_chain(e)
}

impl From<crate::gpu::memory_limit::LimitError> for PrepareError {
    fn from(e: crate::gpu::memory_limit::LimitError) -> Self {
        GpuChangeError::MemoryLimit(e).into()
    }
}
