//! Claim preparation: the [`Preparer`] behind the kubelet's prepare and unprepare calls.
//!
//! Prepare, per claim and idempotent: a claim already completed answers from the state store
//! without the API server (re-writing its CDI spec if a reboot removed it); otherwise GET the
//! claim (or take it as [`prefetch`] read it before the kubelet asked), check UID and allocation, take this driver's results on this node's pool, resolve
//! opaque configs; a claim that changes nothing on a GPU then writes its CDI spec atomically
//! and records PrepareCompleted (one durable step, taking the devices); a claim that changes
//! GPU settings or runs an MPS daemon records PrepareStarted first (durable, taking the
//! devices), makes the changes, writes the spec and records PrepareCompleted. Then answer
//! with the CDI IDs. A share of a GPU with `sharing.enforcement` set is such a claim: the
//! GPU's first share changes the GPU for all its shares (`shared`). A claim that changes
//! nothing on a GPU may be prepared before the kubelet asks, as soon as its pod is bound
//! ([`stage`]); the kubelet's call then answers from the state.
//! Unprepare works from the store alone; the release of a claim that changed nothing on a
//! GPU is not waited for on disk (it runs on the call's thread, and sled writes it within
//! about 0.5 s), so a crash may bring its record back: when such a record (or one of a
//! claim deleted while the node was down) stands in the way of a prepare, the claim is
//! checked against the API server and released if gone ([`stale`]). Claims in one call
//! run concurrently, each claim UID serialised by its own lock, which blocking work keeps
//! until it ends even when the kubelet cancels the call. Recovery at start is in
//! [`recover`].

mod api_claims;
pub mod cdi;
pub mod cdi_validate;
pub mod config;
pub mod driver_files;
pub mod in_use;
pub use crate::failpoint;
pub mod locks;
pub mod mig;
pub mod mps;
pub mod plan;
pub mod prefetch;
pub mod recover;
mod shared;
pub mod stage;
pub mod stale;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use futures_util::future::{BoxFuture, join_all};
use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::gpu::mps::{MpsSettings, MpsStats, Supervisor};
use crate::gpu::timeslice::{self, NvidiaSmi};
use crate::gpu::{ChangeCounts, ComputeMode, ComputeModes, GpuError, Setting};
use crate::inventory::{DeviceBackend, Inventory};
use crate::plugin::handler::{ClaimRef, DraHandler, PrepareResults, PreparedDevice, UnprepareResults};
use crate::sharing::Enforcement;
use crate::state::{ClaimRecord, GPU_CHANGE_SCHEMA, GpuChange, Phase, SCHEMA_VERSION, StateError, Store};
use driver_files::DriverFilesCache;
use locks::ClaimLocks;
pub(crate) use shared::{SHARED_HOLDER, shared_holder};
use shared::{enforced_shares, enforcement_summary};

pub use recover::RecoveryReport;

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

/// How long one kubelet call may spend fetching its claims (from the call's start), so it
/// answers well within the kubelet's 45 s timeout when the API server does not answer or
/// edra's own rate limit is saturated.
pub const FETCH_BUDGET: Duration = Duration::from_secs(20);

/// Claims of one call prepared at once. A call with thousands of claims then holds at most
/// this many places in the client's rate-limit queue, so a call that comes after it waits
/// for a few of its reads, not for all of them.
pub const CLAIMS_AT_ONCE: usize = 16;

/// Where claims come from: the API server in production, a map in tests.
pub trait ClaimSource: Send + Sync {
    /// GETs the ResourceClaim `namespace/name`, giving up at `deadline` (the end of the
    /// call's [`FETCH_BUDGET`]).
    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
        deadline: Instant,
    ) -> BoxFuture<'_, Result<ResourceClaim, ClaimFetchError>>;

    /// [`Self::get_claim`] for a read nobody waits for yet ([`prefetch`]): the API server
    /// sends it only when the rate limit has a token free at once.
    fn get_claim_early(
        &self,
        namespace: &str,
        name: &str,
        deadline: Instant,
    ) -> BoxFuture<'_, Result<ResourceClaim, ClaimFetchError>> {
        self.get_claim(namespace, name, deadline)
    }

    /// The claim the kubelet asks to prepare; a source that read it already may answer
    /// without a GET, and must check that the UID is `claim.uid`.
    fn claim_for<'a>(
        &'a self,
        claim: &'a ClaimRef,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<ResourceClaim, ClaimFetchError>> {
        self.get_claim(&claim.namespace, &claim.name, deadline)
    }

    /// `claim` was prepared: what was kept for it is no longer needed.
    fn prepared(&self, _claim: &ClaimRef) {}
}

/// What the preparer needs to know about the node and its paths.
#[derive(Debug, Clone)]
pub struct PrepareSettings {
    /// The DRA driver name.
    pub driver: String,
    /// This node's name, which is the pool name.
    pub node: String,
    /// The dynamic CDI spec directory.
    pub cdi_dir: PathBuf,
    /// Root of the NVIDIA driver's files.
    pub driver_root: PathBuf,
    /// Where the driver root is on the host when edra sees it elsewhere.
    pub host_driver_root: Option<PathBuf>,
    /// The device filesystem.
    pub dev_root: PathBuf,
    /// procfs (for the boot ID and the kernel release).
    pub proc_root: PathBuf,
    /// sysfs (for the kernel's firmware path).
    pub sys_root: PathBuf,
    /// The edra binary, which the CDI specs run as their hook.
    pub hook_binary: PathBuf,
    /// The `nvidia-smi` that sets time-slice intervals.
    pub nvidia_smi: NvidiaSmi,
    /// Where and how MPS control daemons run.
    pub mps: MpsSettings,
    /// How full GPUs are offered (which replica names exist).
    pub sharing: crate::sharing::SharingSettings,
    /// Which GPUs are carved into MIG devices on demand (which MIG device names exist).
    pub mig: crate::mig::MigSettings,
}

/// The folder of the driver root's NVML library, for tools the driver root ships, when the
/// driver root is not `/` (on `/` the loader finds it by itself).
fn nvml_library_dir(library: &Path, driver_root: &Path) -> Option<PathBuf> {
    crate::inventory::host::library_candidates(library, driver_root)
        .into_iter()
        .find(|p| p.is_absolute() && p.exists() && driver_root != Path::new("/"))
        .and_then(|p| p.parent().map(Path::to_path_buf))
}

impl PrepareSettings {
    /// Settings from the configuration; `hook_binary` is usually `std::env::current_exe()`.
    pub fn from_config(config: &crate::config::Config, hook_binary: PathBuf) -> Self {
        let library_dir = nvml_library_dir(&config.nvml.library, &config.paths.driver_root);
        Self {
            driver: config.driver_name.clone(),
            node: config.node_name.clone(),
            cdi_dir: config.paths.cdi_dynamic_dir.clone(),
            driver_root: config.paths.driver_root.clone(),
            host_driver_root: config.paths.host_driver_root.clone(),
            dev_root: config.paths.dev_root.clone(),
            proc_root: config.paths.proc_root.clone(),
            sys_root: config.paths.sys_root.clone(),
            hook_binary,
            nvidia_smi: NvidiaSmi::new(
                config.paths.nvidia_smi.as_deref(),
                &config.paths.driver_root,
                library_dir.clone(),
            ),
            mps: MpsSettings {
                control: config.paths.mps_control.clone().unwrap_or_else(|| {
                    crate::gpu::driver_tool(&config.paths.driver_root, crate::gpu::mps::DEFAULT_RELATIVE_PATH)
                }),
                control_key: crate::gpu::mps::CONFIG_KEY,
                runtime_dir: config.paths.runtime_dir.clone(),
                // Daemons are processes of this pid namespace, whatever paths.proc_root says.
                proc_root: PathBuf::from("/proc"),
                ready_timeout: config.mps.ready_timeout,
                quit_grace: config.mps.quit_grace,
                library_dir,
            },
            sharing: config.sharing.clone(),
            mig: config.mig.clone(),
        }
    }

    /// The CDI vendor: `k8s.<driver>`.
    pub fn cdi_vendor(&self) -> String {
        cdi::vendor(&self.driver)
    }

    /// The spec file of claim `uid`.
    pub fn spec_path(&self, uid: &str) -> PathBuf {
        self.cdi_dir.join(cdi::spec_file_name(&self.cdi_vendor(), uid))
    }
}

/// Why a claim could not be prepared or unprepared. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
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
    /// The generated spec breaks the CDI rules (a bug in edra).
    #[error("the generated CDI spec is invalid ({}); please report this", problems.join("; "))]
    InvalidSpec {
        /// The rules broken.
        problems: Vec<String>,
    },
    /// A MIG device cannot be prepared on this node as it is.
    #[error("MIG device {device} cannot be prepared: {reason}; delete the pod so the claim is allocated again")]
    MigUnavailable {
        /// The device as allocated.
        device: String,
        /// Why.
        reason: String,
    },
    /// A MIG instance could not be listed, created or destroyed.
    #[error(transparent)]
    Mig(Box<mig::MigFailure>),
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
        placement: crate::gpu::mig::Placement,
        /// The GPU's UUID.
        gpu: String,
        /// Why it could not be created again.
        reason: String,
    },
    /// A device is held by other claims, and the API server did not say they are gone.
    #[error("{conflict}; {checked}")]
    HeldBy {
        /// What the state refused: names the device and its holder.
        conflict: StateError,
        /// What the API server answered about each holder in the way.
        checked: String,
    },
    /// A blocking task failed.
    #[error("internal task failed: {0}")]
    Task(String),
}

/// The real [`DraHandler`]. Cheap to clone.
#[derive(Clone)]
pub struct Preparer {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    compute_modes: Arc<dyn ComputeModes>,
    gpu_counts: Arc<ChangeCounts>,
    inventory: watch::Receiver<Arc<Inventory>>,
    claims: Arc<dyn ClaimSource>,
    settings: PrepareSettings,
    locks: ClaimLocks,
    driver_files: DriverFilesCache,
    /// The boot ID at construction, stored in new records.
    boot_id: String,
    /// Runs MPS control daemons.
    mps: Supervisor,
    /// MPS daemon counts.
    mps_stats: Arc<MpsStats>,
    /// Daemons that failed to start again, and when to try next.
    mps_retries: mps::Retries,
    /// The GPUs with shares prepared (for the publisher, which keeps their sharing).
    shared_gpus: watch::Sender<Arc<std::collections::BTreeSet<String>>>,
    /// The device backend, for MIG instances (none: MIG devices cannot be prepared).
    backend: Option<Arc<dyn DeviceBackend>>,
    /// The MIG instances recorded (for the publisher, which tells them from foreign ones).
    owned_mig: watch::Sender<Arc<crate::mig::OwnedInstances>>,
    /// Claims prepared early that the kubelet has not asked for yet: UID → (namespace, name).
    staged: std::sync::Mutex<std::collections::HashMap<String, (String, String)>>,
    /// Whether edra reads claims as this node, once the API server said ([`stale`]).
    node_identity: std::sync::OnceLock<bool>,
    /// Bumped after every kubelet call that may have changed which claims are prepared.
    claims_changed: watch::Sender<u64>,
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, PrepareError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| PrepareError::Task(e.to_string()))
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The boot ID under `proc_root`, or empty when unreadable.
pub fn read_boot_id(proc_root: &Path) -> String {
    std::fs::read_to_string(proc_root.join("sys/kernel/random/boot_id"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// A claim planned for prepare: its record and the GPU changes it needs.
#[derive(Clone)]
struct Planned {
    record: ClaimRecord,
    gpus: Vec<plan::TimeSlicedGpu>,
    mps_plan: Option<plan::MpsPlan>,
}

/// Whether a device prepared as `device` (with `share_id`) is a share or a replica of a GPU,
/// which the publisher keeps published as shared while it is held.
fn is_shared(share_id: Option<&str>, device: &str) -> bool {
    share_id.is_some() || crate::sharing::replica_name(device).is_some()
}

fn answer(record: &ClaimRecord) -> Vec<PreparedDevice> {
    record
        .devices
        .iter()
        .map(|d| PreparedDevice {
            request_names: d.request_names.clone(),
            pool_name: d.pool.clone(),
            device_name: d.device.clone(),
            cdi_device_ids: d.cdi_ids.clone(),
            share_id: d.share_id.clone(),
        })
        .collect()
}

impl Preparer {
    /// A preparer over `store`, the current inventory, a claim source and the backend's
    /// compute-mode control.
    pub fn new(
        store: Store,
        inventory: watch::Receiver<Arc<Inventory>>,
        claims: Arc<dyn ClaimSource>,
        settings: PrepareSettings,
        compute_modes: Arc<dyn ComputeModes>,
    ) -> Self {
        Self::build(store, inventory, claims, settings, compute_modes, None)
    }

    /// A preparer like [`Preparer::new`] whose GPU control is `backend`'s: its compute
    /// modes and, when it has it, its MIG control (dynamic MIG devices need it).
    pub fn with_backend(
        store: Store,
        inventory: watch::Receiver<Arc<Inventory>>,
        claims: Arc<dyn ClaimSource>,
        settings: PrepareSettings,
        backend: Arc<dyn DeviceBackend>,
    ) -> Self {
        Self::build(store, inventory, claims, settings, backend.clone(), Some(backend))
    }

    fn build(
        store: Store,
        inventory: watch::Receiver<Arc<Inventory>>,
        claims: Arc<dyn ClaimSource>,
        settings: PrepareSettings,
        compute_modes: Arc<dyn ComputeModes>,
        backend: Option<Arc<dyn DeviceBackend>>,
    ) -> Self {
        let host =
            driver_files::HostRoots { sys_root: settings.sys_root.clone(), proc_root: settings.proc_root.clone() };
        let inner = Inner {
            boot_id: read_boot_id(&settings.proc_root),
            mps: Supervisor { settings: settings.mps.clone() },
            mps_stats: Arc::default(),
            mps_retries: Default::default(),
            store,
            compute_modes,
            gpu_counts: Arc::default(),
            inventory,
            claims,
            settings,
            locks: ClaimLocks::default(),
            driver_files: DriverFilesCache::new(host),
            shared_gpus: watch::Sender::new(Arc::default()),
            backend,
            owned_mig: watch::Sender::new(Arc::default()),
            staged: Default::default(),
            node_identity: std::sync::OnceLock::new(),
            claims_changed: watch::Sender::new(0),
        };
        let preparer = Self { inner: Arc::new(inner) };
        preparer.refresh_shared_gpus();
        preparer.refresh_owned_mig();
        preparer
    }

    /// A counter bumped after every prepare and unprepare call, once its answers are ready:
    /// what follows the prepared claims (their status in the API server) re-reads the state.
    pub fn claims_changed(&self) -> watch::Receiver<u64> {
        self.inner.claims_changed.subscribe()
    }

    /// The GPUs with shares prepared, updated after every call that may change them.
    pub fn shared_gpus(&self) -> watch::Receiver<Arc<std::collections::BTreeSet<String>>> {
        self.inner.shared_gpus.subscribe()
    }

    /// Re-reads which GPUs have shares prepared (an unreadable state keeps the last
    /// answer, which only delays a change of their published sharing).
    pub(crate) fn refresh_shared_gpus(&self) {
        let Ok(gpus) = self.inner.store.gpus_with_shares() else { return };
        self.inner.shared_gpus.send_if_modified(|held| {
            let changed = **held != gpus;
            if changed {
                *held = Arc::new(gpus);
            }
            changed
        });
    }

    /// The settings in use.
    pub fn settings(&self) -> &PrepareSettings {
        &self.inner.settings
    }

    /// The state store.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// MPS daemon counts (for the metrics).
    pub fn mps_stats(&self) -> Arc<MpsStats> {
        self.inner.mps_stats.clone()
    }

    /// GPU setting changes made or tried so far (for the metrics).
    pub fn gpu_change_counts(&self) -> Arc<ChangeCounts> {
        self.inner.gpu_counts.clone()
    }

    /// Sets a compute mode, counting the outcome.
    fn set_mode(&self, uuid: &str, mode: ComputeMode) -> Result<(), GpuError> {
        let r = self.inner.compute_modes.set_compute_mode(uuid, mode);
        self.inner.gpu_counts.record(Setting::ComputeMode, r.is_ok());
        r
    }

    /// Sets a time-slice value, counting the outcome.
    fn set_slice(&self, uuid: &str, value: u8) -> Result<(), GpuError> {
        let r = self.inner.settings.nvidia_smi.set_timeslice(uuid, value);
        self.inner.gpu_counts.record(Setting::Timeslice, r.is_ok());
        r
    }

    /// The compute-mode control in use.
    pub fn compute_modes(&self) -> Arc<dyn ComputeModes> {
        self.inner.compute_modes.clone()
    }

    /// Builds and checks the spec of `record` from the current inventory.
    fn spec_for(&self, record: &ClaimRecord) -> Result<cdi::Spec, PrepareError> {
        let s = &self.inner.settings;
        let inventory = self.inventory_view();
        let inventory = match record.migs().next() {
            None => inventory,
            Some(_) => {
                if let Some(lost) = record.migs().find(|(_, m)| m.state != crate::state::MigState::Created) {
                    return Err(Self::lost_mig(record).unwrap_or_else(|| PrepareError::MigUnavailable {
                        device: lost.0.device.clone(),
                        reason: "its MIG instance is not created".into(),
                    }));
                }
                Arc::new(mig::with_mig_devices(&inventory, &record.devices, &s.dev_root, &s.proc_root))
            }
        };
        let mut devices = Vec::new();
        for d in &record.devices {
            let dev =
                inventory.device(d.gpu()).ok_or_else(|| PrepareError::UnknownDevice { device: d.device.clone() })?;
            // A replica or a share is the GPU under its own CDI name.
            let name = d.cdi_device();
            if !devices.iter().any(|x: &crate::inventory::Device| x.name == name) {
                devices.push(crate::inventory::Device { name, ..dev.clone() });
            }
        }
        let files =
            self.inner.driver_files.get(&s.driver_root, inventory.driver_version.as_deref().unwrap_or_default());
        let vendor = s.cdi_vendor();
        let layout = cdi::SpecLayout {
            vendor: &vendor,
            dev_root: &s.dev_root,
            hook_binary: &s.hook_binary,
            host_driver_root: s.host_driver_root.as_deref(),
        };
        let devices: Vec<&crate::inventory::Device> = devices.iter().collect();
        let mut spec = cdi::build_spec(&layout, &record.uid, &devices, &files);
        mps::add_edits(&mut spec, record, &s.mps);
        // Shares of GPUs whose shares run an MPS daemon (set by the GPU's first share).
        let mut shared = Vec::new();
        for share in enforced_shares(&record.devices) {
            if !shared.contains(&share.gpu) && self.inner.store.mps_daemon(&shared_holder(&share.gpu))?.is_some() {
                shared.push(share.gpu.clone());
            }
        }
        mps::add_share_edits(&mut spec, record, &s.mps, &shared);
        let problems = cdi_validate::validate(&spec);
        if problems.is_empty() { Ok(spec) } else { Err(PrepareError::InvalidSpec { problems }) }
    }

    /// Writes `record`'s spec (blocking I/O).
    fn write_spec_of(&self, record: &ClaimRecord) -> Result<(), PrepareError> {
        let spec = self.spec_for(record)?;
        cdi::write_spec(&record.cdi_spec_path, &spec).map_err(|source| PrepareError::Cdi {
            op: "write",
            path: record.cdi_spec_path.clone(),
            source,
        })
    }

    async fn prepare_one(&self, claim: ClaimRef, deadline: Instant) -> Result<Vec<PreparedDevice>, PrepareError> {
        if !cdi::is_valid_uid(&claim.uid) {
            return Err(PrepareError::InvalidUid { uid: claim.uid });
        }
        // Blocking work goes on when the kubelet cancels the call and this future is
        // dropped, so each blocking task holds the claim's lock too, until it ends.
        let guard = Arc::new(self.inner.locks.lock(&claim.uid).await);
        // A read of one small record is served from sled's cache in microseconds; doing it
        // here rather than on the blocking pool keeps the repeated prepare of a prepared
        // claim (every pod restart) to one thread hop less.
        // A completed record that does not hold its devices was cut short by a crash
        // before it was answered: the claim is prepared again.
        if let Some(rec) = self.inner.store.claim(&claim.uid)?
            && rec.phase == Phase::PrepareCompleted
            && self.inner.store.holds_devices(&rec)?
        {
            if let Some(lost) = Self::lost_mig(&rec) {
                return Err(lost);
            }
            if !rec.cdi_spec_path.exists() {
                tracing::info!(claim.uid = %rec.uid, path = %rec.cdi_spec_path.display(), "re-writing a missing CDI spec");
                let this = self.clone();
                let r = rec.clone();
                let held = guard.clone();
                blocking(move || {
                    let _held = held;
                    this.write_spec_of(&r)
                })
                .await??;
            }
            self.inner.claims.prepared(&claim);
            match self.asked_for(&claim.uid) {
                true => {
                    tracing::info!(claim.uid = %rec.uid, "the kubelet asked for a claim prepared early; answered from state")
                }
                false => tracing::debug!(claim.uid = %rec.uid, "claim already prepared; answered from state"),
            }
            return Ok(answer(&rec));
        }
        let fetched = self.inner.claims.claim_for(&claim, deadline).await.map_err(PrepareError::Fetch)?;
        let planned = self.plan_claim(&claim, &fetched)?;
        // Before anything is recorded or changed: a missing binary leaves all as it was.
        self.check_nvidia_smi(&planned.gpus)?;
        if planned.mps_plan.is_some() {
            self.inner.mps.check_binary().map_err(PrepareError::Mps)?;
        }
        if self.inner.settings.sharing.enforcement == Enforcement::Mps
            && let Some(share) = enforced_shares(&planned.record.devices).next()
        {
            let gpu = share.gpu.clone();
            self.inner.mps.check_binary().map_err(|source| PrepareError::SharedMps { gpu, source })?;
        }
        let done = self.apply_checking_holders(planned, &guard, deadline).await?;
        self.inner.claims.prepared(&claim);
        tracing::info!(claim.uid = %done.uid, devices = done.devices.len(), "claim prepared");
        Ok(answer(&done))
    }

    /// Plans claim `claim` as the API server sent it (`fetched`): the record to write
    /// (PrepareStarted, its devices resolved against the current inventory) and the GPU
    /// changes it needs.
    fn plan_claim(&self, claim: &ClaimRef, fetched: &ResourceClaim) -> Result<Planned, PrepareError> {
        let inventory = self.inventory_view();
        let devices = plan::plan(&self.inner.settings, claim, fetched, &inventory)?;
        let gpus = plan::timeslicing_gpus(&devices, &inventory);
        let mps_plan = match devices.iter().any(|d| d.mig.is_some()) {
            false => plan::mps_plan(&devices, &inventory)?,
            // Checked now with the parent GPUs standing in; planned again once created.
            true => {
                let s = &self.inner.settings;
                plan::mps_plan(&devices, &mig::with_mig_devices(&inventory, &devices, &s.dev_root, &s.proc_root))?
            }
        };
        let record = ClaimRecord {
            schema: SCHEMA_VERSION,
            uid: claim.uid.clone(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            phase: Phase::PrepareStarted,
            devices,
            cdi_spec_path: self.inner.settings.spec_path(&claim.uid),
            created_at: now_secs(),
            boot_id: self.inner.boot_id.clone(),
        };
        Ok(Planned { record, gpus, mps_plan })
    }

    /// Whether a planned claim changes nothing on a GPU (no time-slice, MPS daemon, MIG
    /// instance or shared-GPU setting): then one durable step prepares it.
    fn changes_nothing(&self, planned: &Planned) -> bool {
        planned.gpus.is_empty()
            && planned.mps_plan.is_none()
            && planned.record.migs().next().is_none()
            && !self.changes_shared_gpus(&planned.record)
    }

    /// Steps 4–7 of prepare (blocking I/O). A claim that changes nothing on a GPU needs one
    /// durable step: its spec is written first (recovery removes a spec without a record),
    /// then PrepareCompleted is recorded, taking its devices. A claim that changes GPU
    /// settings or runs an MPS daemon records PrepareStarted first, so recovery can undo
    /// them, then the changes, the spec and PrepareCompleted. On a failure, what was done
    /// is undone.
    fn apply(&self, planned: Planned) -> Result<ClaimRecord, PrepareError> {
        if self.changes_nothing(&planned) {
            return self.apply_in_one_step(planned.record);
        }
        let Planned { mut record, gpus, mps_plan } = planned;
        let (gpus, mps_plan) = (gpus.as_slice(), mps_plan.as_ref());
        let migs = record.migs().next().is_some();
        let store = &self.inner.store;
        if migs {
            self.check_migs(&record)?;
        }
        store.put_claim(&record)?;
        if migs {
            self.refresh_owned_mig();
            failpoint::hit("prepare-after-mig-intent");
        }
        failpoint::hit("prepare-after-started");
        let finish = (|| {
            self.create_migs(&mut record)?;
            self.time_slice(&record.uid, gpus)?;
            self.enforce_shared(&record)?;
            if let Some(p) = mps_plan {
                let created;
                let p = match migs {
                    false => p,
                    true => {
                        let s = &self.inner.settings;
                        let inventory = self.inventory_view();
                        let inventory = mig::with_mig_devices(&inventory, &record.devices, &s.dev_root, &s.proc_root);
                        created = plan::mps_plan(&record.devices, &inventory)?;
                        created.as_ref().unwrap_or(p)
                    }
                };
                self.start_mps(&record.uid, p)?;
            }
            self.write_spec_of(&record)?;
            failpoint::hit("prepare-after-cdi-write");
            record.phase = Phase::PrepareCompleted;
            failpoint::hit("prepare-before-completed");
            store.put_claim(&record)?;
            failpoint::hit("prepare-after-completed");
            Ok(())
        })();
        if let Err(e) = finish {
            if let Err(undo) = self.release_with(&record.uid, false) {
                tracing::warn!(
                    claim.uid = %record.uid,
                    error = %message(&undo),
                    "cannot roll back a failed prepare; unprepare or recovery at the next start will"
                );
            }
            return Err(e);
        }
        Ok(record)
    }

    /// The one durable step of a claim without GPU changes: spec, then PrepareCompleted.
    fn apply_in_one_step(&self, mut record: ClaimRecord) -> Result<ClaimRecord, PrepareError> {
        self.write_spec_of(&record)?;
        failpoint::hit("prepare-after-cdi-write");
        record.phase = Phase::PrepareCompleted;
        failpoint::hit("prepare-before-completed");
        if let Err(e) = self.inner.store.put_claim(&record) {
            // Not recorded (a device held by another claim, or the disk failed): the spec
            // goes; a spec left behind is removed by recovery as an orphan.
            if let Err(undo) = cdi::remove_spec(&record.cdi_spec_path) {
                tracing::warn!(claim.uid = %record.uid, error = %undo, "cannot remove the spec of a failed prepare; recovery will");
            }
            return Err(e.into());
        }
        failpoint::hit("prepare-after-completed");
        Ok(record)
    }

    /// Fails with the reason when time-slicing `gpus` is asked for and `nvidia-smi` cannot
    /// be run, before anything is recorded or changed.
    fn check_nvidia_smi(&self, gpus: &[plan::TimeSlicedGpu]) -> Result<(), PrepareError> {
        let Some(first) = gpus.first() else { return Ok(()) };
        self.inner.settings.nvidia_smi.check().map_err(|source| PrepareError::Gpu {
            action: "set the time-slice",
            uuid: first.uuid.clone(),
            source,
        })
    }

    /// Sets compute mode DEFAULT and the interval on each GPU, each change recorded
    /// durably before it is made (blocking I/O).
    fn time_slice(&self, uid: &str, gpus: &[plan::TimeSlicedGpu]) -> Result<(), PrepareError> {
        let modes = &self.inner.compute_modes;
        for g in gpus {
            let gpu_err = |action| gpu_error(action, &g.uuid);
            let previous = modes.compute_mode(&g.uuid).map_err(gpu_err("read the compute mode"))?;
            let value = timeslice::interval_value(g.interval);
            self.inner.store.put_gpu_change(&GpuChange {
                schema: GPU_CHANGE_SCHEMA,
                uuid: g.uuid.clone(),
                device: g.device.clone(),
                claim: uid.to_string(),
                previous_compute_mode: previous,
                compute_mode: ComputeMode::Default,
                timeslice: Some(value),
            })?;
            failpoint::hit("prepare-after-gpu-recorded");
            self.set_mode(&g.uuid, ComputeMode::Default).map_err(gpu_err("set the compute mode"))?;
            failpoint::hit("prepare-after-compute-mode");
            self.set_slice(&g.uuid, value).map_err(gpu_err("set the time-slice"))?;
            failpoint::hit("prepare-after-timeslice");
            tracing::info!(claim.uid = uid, gpu = %g.uuid, interval = ?g.interval, "GPU time-sliced");
        }
        Ok(())
    }

    /// Puts back what the GPU change records of claim `uid` say edra changed: the
    /// time-slice to the driver's default (0), then the compute mode as it was (blocking
    /// I/O). A GPU no longer in the inventory is skipped. The records stay; the caller drops
    /// them.
    fn restore_gpus(&self, uid: &str) -> Result<(), PrepareError> {
        for c in self.inner.store.gpu_changes()?.into_iter().filter(|c| c.claim == uid) {
            let gpu_err = |action| gpu_error(action, &c.uuid);
            let gone = |r: Result<(), GpuError>| match r {
                Err(GpuError::UnknownGpu { uuid }) => {
                    tracing::warn!(claim.uid = uid, gpu = %uuid, "GPU is gone; nothing to restore on it");
                    Ok(())
                }
                other => other,
            };
            if !self.gpu_present(&c.uuid) {
                // Fallen off the bus or removed: nothing to restore, and nvidia-smi would fail forever.
                tracing::warn!(claim.uid = uid, gpu = %c.uuid, "GPU is no longer on this node; nothing to restore on it");
                continue;
            }
            if c.timeslice.is_some() {
                self.set_slice(&c.uuid, 0).map_err(gpu_err("reset the time-slice"))?;
            }
            failpoint::hit("unprepare-after-timeslice-reset");
            gone(self.set_mode(&c.uuid, c.previous_compute_mode)).map_err(gpu_err("restore the compute mode"))?;
            failpoint::hit("unprepare-after-compute-mode-restore");
            tracing::info!(claim.uid = uid, gpu = %c.uuid, compute_mode = ?c.previous_compute_mode, "GPU settings restored");
        }
        Ok(())
    }

    /// Whether the full GPU `uuid` is in the current inventory (itself, or as the parent of
    /// MIG devices).
    fn gpu_present(&self, uuid: &str) -> bool {
        let inventory = self.inner.inventory.borrow();
        inventory
            .devices
            .iter()
            .any(|d| d.uuid == uuid || matches!(&d.kind, crate::inventory::DeviceKind::Mig(m) if m.parent_uuid == uuid))
    }

    /// Sets again what the GPU change records of claim `uid` say (blocking I/O): compute
    /// modes and intervals do not survive a reboot or a driver reload, and the claim's
    /// pods expect them.
    pub(crate) fn reapply_gpus(&self, uid: &str) -> Result<usize, PrepareError> {
        let mut n = 0;
        for c in self.inner.store.gpu_changes()?.into_iter().filter(|c| c.claim == uid) {
            let gpu_err = |action| gpu_error(action, &c.uuid);
            self.set_mode(&c.uuid, c.compute_mode).map_err(gpu_err("set the compute mode"))?;
            if let Some(v) = c.timeslice {
                self.set_slice(&c.uuid, v).map_err(gpu_err("set the time-slice"))?;
            }
            n += 1;
        }
        Ok(n)
    }

    async fn unprepare_one(&self, claim: ClaimRef) -> Result<(), PrepareError> {
        let guard = self.inner.locks.lock(&claim.uid).await;
        self.unprepare_locked(claim, guard).await
    }

    /// [`Self::unprepare_one`] with the claim's lock held.
    async fn unprepare_locked(
        &self,
        claim: ClaimRef,
        guard: tokio::sync::OwnedMutexGuard<()>,
    ) -> Result<(), PrepareError> {
        // The shared GPUs this release may put back: the claim's, or for a claim already
        // gone every GPU still time-sliced for shares (a put-back that failed).
        let gpu_locks = match self.inner.store.claim(&claim.uid)? {
            Some(rec) => {
                let gpu_locks = self.lock_shared_gpus(&rec.devices).await;
                // Only its spec (an unlink on tmpfs) and its record (removed lazily, in
                // sled's memory) to remove: done here in microseconds, one thread hop less.
                if self.releases_inline(&rec)? {
                    let _held = (guard, gpu_locks);
                    return self.release_inline(&rec);
                }
                gpu_locks
            }
            None => {
                let holders = self.inner.store.gpu_changes()?.into_iter().map(|c| c.claim);
                self.lock_holders(holders.filter(|h| h.starts_with(SHARED_HOLDER)).collect()).await
            }
        };
        let this = self.clone();
        // Held by the blocking task: it outlives this future if the call is cancelled.
        blocking(move || {
            let _held = (guard, gpu_locks);
            this.release(&claim.uid)
        })
        .await?
    }

    /// Removes a claim's spec, stops its MPS daemon, restores the GPUs it changed,
    /// destroys its MIG instances, then removes its records (blocking I/O); unknown UIDs
    /// are fine.
    pub(crate) fn release(&self, uid: &str) -> Result<(), PrepareError> {
        self.release_with(uid, true)
    }

    /// [`Preparer::release`]; a MIG intent without IDs adopts the instance at its
    /// placement only with `adopt_intents` (not when rolling back a prepare whose create
    /// call failed, which leaves nothing).
    fn release_with(&self, uid: &str, adopt_intents: bool) -> Result<(), PrepareError> {
        let store = &self.inner.store;
        let Some(rec) = store.claim(uid)? else {
            tracing::debug!(claim.uid = uid, "unprepare of an unknown claim; nothing to do");
            // A shared GPU whose last share went while putting it back failed.
            return self.put_back_idle_shared_gpus(None).map(|_| ());
        };
        remove_spec_of(&rec)?;
        self.stop_mps(uid)?;
        self.restore_gpus(uid)?;
        self.destroy_migs(&rec, adopt_intents)?;
        if self.releases_lazily(&rec)? {
            store.remove_claim_lazily(uid)?;
        } else {
            store.remove_claim(uid)?;
        }
        failpoint::hit("unprepare-after-record-remove");
        if rec.migs().next().is_some() {
            self.refresh_owned_mig();
        }
        let gpus: Vec<String> = rec.shares().map(|(_, s)| s.gpu.clone()).collect();
        if !gpus.is_empty() {
            self.put_back_idle_shared_gpus(Some(&gpus))?;
        }
        tracing::info!(claim.uid = uid, phase = ?rec.phase, "claim unprepared");
        Ok(())
    }
}

/// Removes `rec`'s CDI spec (the first step of a release).
fn remove_spec_of(rec: &ClaimRecord) -> Result<(), PrepareError> {
    cdi::remove_spec(&rec.cdi_spec_path).map_err(|source| PrepareError::Cdi {
        op: "remove",
        path: rec.cdi_spec_path.clone(),
        source,
    })?;
    failpoint::hit("unprepare-after-cdi-remove");
    Ok(())
}

impl Preparer {
    /// [`Preparer::release`] of a claim [`Preparer::releases_inline`] found has only its
    /// spec and its record to remove, as read under its lock: the same steps in the same
    /// order, without reading again what the check read. Nothing of its shared GPUs is to
    /// be put back: the check found no change or daemon of theirs, and their locks are held.
    fn release_inline(&self, rec: &ClaimRecord) -> Result<(), PrepareError> {
        remove_spec_of(rec)?;
        self.inner.store.remove_released(rec)?;
        failpoint::hit("unprepare-after-record-remove");
        tracing::info!(claim.uid = rec.uid, phase = ?rec.phase, "claim unprepared");
        Ok(())
    }

    /// Whether the removal of `rec` may be lazy ([`Store::remove_claim_lazily`]): its
    /// prepare was one durable step, as [`Preparer::apply`] decides it — no share of a GPU
    /// whose shares edra sets up (`sharing.enforcement`, now or when it was prepared);
    /// the store itself keeps the removal durable for a claim with GPU changes, an MPS
    /// daemon or MIG instances of its own.
    fn releases_lazily(&self, rec: &ClaimRecord) -> Result<bool, StateError> {
        // Only shares need the GPU change records.
        let changes = if rec.shares().next().is_some() { self.inner.store.gpu_changes()? } else { Vec::new() };
        self.releases_lazily_given(rec, &changes)
    }

    /// [`Preparer::releases_lazily`] with the GPU change records read already.
    fn releases_lazily_given(&self, rec: &ClaimRecord, changes: &[GpuChange]) -> Result<bool, StateError> {
        if self.changes_shared_gpus(rec) {
            return Ok(false);
        }
        let holders: Vec<String> = rec.shares().map(|(_, s)| shared_holder(&s.gpu)).collect();
        if holders.is_empty() {
            return Ok(true);
        }
        let store = &self.inner.store;
        if changes.iter().any(|c| holders.contains(&c.claim)) {
            return Ok(false);
        }
        for h in &holders {
            if store.mps_daemon(h)?.is_some() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether releasing `rec` is only removing its spec and its record lazily: no MIG
    /// instance, no GPU change and no MPS daemon of its own, and its shares (if any) of
    /// GPUs edra set nothing up on ([`Preparer::releases_lazily`]), so nothing that blocks.
    /// Called with the claim's and its shared GPUs' locks held.
    pub(super) fn releases_inline(&self, rec: &ClaimRecord) -> Result<bool, StateError> {
        let store = &self.inner.store;
        if rec.migs().next().is_some() || store.mps_daemon(&rec.uid)?.is_some() {
            return Ok(false);
        }
        let changes = store.gpu_changes()?;
        Ok(!changes.iter().any(|c| c.claim == rec.uid) && self.releases_lazily_given(rec, &changes)?)
    }
}

/// Wraps a GPU failure with what was being done to which GPU.
fn gpu_error(action: &'static str, uuid: &str) -> impl FnOnce(GpuError) -> PrepareError {
    let uuid = uuid.to_string();
    move |source| PrepareError::Gpu { action, uuid, source }
}

fn message(e: &PrepareError) -> String {
    crate::util::error_chain(e)
}

impl DraHandler for Preparer {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        let deadline = crate::kube::backoff::deadline_in(FETCH_BUDGET);
        let calls = claims.into_iter().map(|c| async move {
            let uid = c.uid.clone();
            let span =
                tracing::info_span!("prepare", claim.uid = %uid, claim.namespace = %c.namespace, claim.name = %c.name);
            let r = tracing::Instrument::instrument(self.prepare_one(c, deadline), span).await;
            if let Err(e) = &r {
                tracing::warn!(claim.uid = %uid, error = %message(e), "prepare failed");
            }
            (uid, r.map_err(|e| message(&e)))
        });
        let results: PrepareResults =
            futures_util::stream::iter(calls).buffer_unordered(CLAIMS_AT_ONCE).collect().await;
        if results.values().flatten().flatten().any(|d| is_shared(d.share_id.as_deref(), &d.device_name)) {
            self.refresh_shared_gpus();
        }
        self.inner.claims_changed.send_modify(|n| *n = n.wrapping_add(1));
        results
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        let calls = claims.into_iter().map(|c| async move {
            let uid = c.uid.clone();
            let r = self.unprepare_one(c).await;
            if let Err(e) = &r {
                tracing::warn!(claim.uid = %uid, error = %message(e), "unprepare failed");
            }
            (uid, r.map_err(|e| message(&e)))
        });
        let results = join_all(calls).await.into_iter().collect();
        if !self.inner.shared_gpus.borrow().is_empty() {
            self.refresh_shared_gpus();
        }
        self.inner.claims_changed.send_modify(|n| *n = n.wrapping_add(1));
        results
    }
}
