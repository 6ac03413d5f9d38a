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
mod claim;
pub mod config;
pub mod driver_files;
mod error;
mod gpu_settings;
pub mod in_use;
pub use crate::failpoint;
pub mod locks;
pub mod memory_limit;
pub mod mig_instances;
pub mod mps;
pub mod plan;
pub mod prefetch;
pub mod recover;
mod release;
mod settings;
mod shared;
pub mod stage;
pub mod stale;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use futures_util::future::{BoxFuture, join_all};
use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::gpu::mps::{MpsStats, Supervisor};
use crate::gpu::{ChangeCounts, ComputeModes};
use crate::inventory::{DeviceBackend, Inventory};
use crate::plugin::handler::{ClaimRef, DraHandler, PrepareResults, UnprepareResults};
use crate::state::Store;
use claim::Planned;
use driver_files::DriverFilesCache;
use locks::ClaimLocks;
pub(crate) use shared::{SHARED_HOLDER, shared_holder};

pub use error::{AllocationError, ClaimError, ClaimFetchError, GpuChangeError, PrepareError, RequestError};
use error::{gpu_error, message};
pub use recover::RecoveryReport;
pub use settings::PrepareSettings;

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
    owned_mig: watch::Sender<Arc<crate::dynamic_mig::OwnedInstances>>,
    /// Bumped after a MIG instance was created or destroyed on a GPU (rediscovery looks).
    mig_changes: watch::Sender<u64>,
    /// Claims prepared early that the kubelet has not asked for yet: UID → (namespace, name).
    staged: std::sync::Mutex<std::collections::HashMap<String, (String, String)>>,
    /// Whether edra reads claims as this node, once the API server said ([`stale`]).
    node_identity: std::sync::OnceLock<bool>,
    /// Bumped after every kubelet call that may have changed which claims are prepared.
    claims_changed: watch::Sender<u64>,
    /// GPU memory limits per container (`sharing.memory_limit`), when NVML has them.
    memory_limits: std::sync::OnceLock<memory_limit::MemoryLimits>,
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

/// Whether a device prepared as `device` (with `share_id`) is a share or a replica of a GPU,
/// which the publisher keeps published as shared while it is held.
fn is_shared(share_id: Option<&str>, device: &str) -> bool {
    share_id.is_some() || crate::sharing::replica_name(device).is_some()
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
            mig_changes: watch::Sender::new(0),
            staged: Default::default(),
            node_identity: std::sync::OnceLock::new(),
            claims_changed: watch::Sender::new(0),
            memory_limits: std::sync::OnceLock::new(),
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

    /// The compute-mode control in use.
    pub fn compute_modes(&self) -> Arc<dyn ComputeModes> {
        self.inner.compute_modes.clone()
    }
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
