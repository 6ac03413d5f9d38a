//! Claim preparation: the [`Preparer`] behind the kubelet's prepare and unprepare calls.
//!
//! Prepare, per claim and idempotent: a claim already completed answers from the state store
//! without the API server (re-writing its CDI spec if a reboot removed it); otherwise GET the
//! claim, check UID and allocation, take this driver's results on this node's pool, resolve
//! opaque configs, record PrepareStarted (durable, taking the devices exclusively), write the
//! CDI spec atomically, record PrepareCompleted (durable) and answer with the CDI IDs.
//! Unprepare works from the store alone. Claims in one call run concurrently, each claim
//! UID serialised by its own lock, which blocking work keeps until it ends even when the
//! kubelet cancels the call. Recovery at start is in [`recover`].

mod api_claims;
pub mod cdi;
pub mod cdi_validate;
pub mod config;
pub mod driver_files;
pub mod failpoint;
pub mod locks;
pub mod plan;
pub mod recover;
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

use crate::inventory::Inventory;
use crate::plugin::handler::{ClaimRef, DraHandler, PrepareResults, PreparedDevice, UnprepareResults};
use crate::state::{ClaimRecord, Phase, SCHEMA_VERSION, StateError, Store};
use driver_files::DriverFilesCache;
use locks::ClaimLocks;

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
}

impl PrepareSettings {
    /// Settings from the configuration; `hook_binary` is usually `std::env::current_exe()`.
    pub fn from_config(config: &crate::config::Config, hook_binary: PathBuf) -> Self {
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
    /// A sharing strategy edra does not implement yet.
    #[error("sharing strategy {strategy:?} (request {request}) is not supported yet; use Exclusive")]
    UnsupportedSharing {
        /// The strategy.
        strategy: config::Strategy,
        /// The request it applies to.
        request: String,
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

/// The real [`DraHandler`]. Cheap to clone.
#[derive(Clone)]
pub struct Preparer {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    inventory: watch::Receiver<Arc<Inventory>>,
    claims: Arc<dyn ClaimSource>,
    settings: PrepareSettings,
    locks: ClaimLocks,
    driver_files: DriverFilesCache,
    /// The boot ID at construction, stored in new records.
    boot_id: String,
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
    /// A preparer over `store`, the current inventory and a claim source.
    pub fn new(
        store: Store,
        inventory: watch::Receiver<Arc<Inventory>>,
        claims: Arc<dyn ClaimSource>,
        settings: PrepareSettings,
    ) -> Self {
        let host =
            driver_files::HostRoots { sys_root: settings.sys_root.clone(), proc_root: settings.proc_root.clone() };
        let inner = Inner {
            boot_id: read_boot_id(&settings.proc_root),
            store,
            inventory,
            claims,
            settings,
            locks: ClaimLocks::default(),
            driver_files: DriverFilesCache::new(host),
        };
        Self { inner: Arc::new(inner) }
    }

    /// The settings in use.
    pub fn settings(&self) -> &PrepareSettings {
        &self.inner.settings
    }

    /// The state store.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Builds and checks the spec of `record` from the current inventory.
    fn spec_for(&self, record: &ClaimRecord) -> Result<cdi::Spec, PrepareError> {
        let inventory = self.inner.inventory.borrow().clone();
        let mut devices = Vec::new();
        for d in &record.devices {
            let dev =
                inventory.device(&d.device).ok_or_else(|| PrepareError::UnknownDevice { device: d.device.clone() })?;
            if !devices.iter().any(|x: &&crate::inventory::Device| x.name == dev.name) {
                devices.push(dev);
            }
        }
        let s = &self.inner.settings;
        let files =
            self.inner.driver_files.get(&s.driver_root, inventory.driver_version.as_deref().unwrap_or_default());
        let vendor = s.cdi_vendor();
        let layout = cdi::SpecLayout {
            vendor: &vendor,
            dev_root: &s.dev_root,
            hook_binary: &s.hook_binary,
            host_driver_root: s.host_driver_root.as_deref(),
        };
        let spec = cdi::build_spec(&layout, &record.uid, &devices, &files);
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
        if let Some(rec) = self.inner.store.claim(&claim.uid)?
            && rec.phase == Phase::PrepareCompleted
        {
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
            tracing::debug!(claim.uid = %rec.uid, "claim already prepared; answered from state");
            return Ok(answer(&rec));
        }
        let fetched =
            self.inner.claims.get_claim(&claim.namespace, &claim.name, deadline).await.map_err(PrepareError::Fetch)?;
        let inventory = self.inner.inventory.borrow().clone();
        let devices = plan::plan(&self.inner.settings, &claim, &fetched, &inventory)?;
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
        let this = self.clone();
        let held = guard.clone();
        let done = blocking(move || {
            let _held = held;
            this.apply(record)
        })
        .await??;
        tracing::info!(claim.uid = %done.uid, devices = done.devices.len(), "claim prepared");
        Ok(answer(&done))
    }

    /// Steps 4–6 of prepare (blocking I/O): PrepareStarted, spec, PrepareCompleted. On a
    /// failure after PrepareStarted, what was done is undone.
    fn apply(&self, mut record: ClaimRecord) -> Result<ClaimRecord, PrepareError> {
        let store = &self.inner.store;
        store.put_claim(&record)?;
        failpoint::hit("prepare-after-started");
        let finish = (|| {
            self.write_spec_of(&record)?;
            failpoint::hit("prepare-after-cdi-write");
            record.phase = Phase::PrepareCompleted;
            failpoint::hit("prepare-before-completed");
            store.put_claim(&record)?;
            failpoint::hit("prepare-after-completed");
            Ok(())
        })();
        if let Err(e) = finish {
            let _ = cdi::remove_spec(&record.cdi_spec_path);
            if let Err(undo) = store.remove_claim(&record.uid) {
                tracing::warn!(claim.uid = %record.uid, error = %undo, "cannot roll back a failed prepare; recovery will");
            }
            return Err(e);
        }
        Ok(record)
    }

    async fn unprepare_one(&self, claim: ClaimRef) -> Result<(), PrepareError> {
        let guard = self.inner.locks.lock(&claim.uid).await;
        let this = self.clone();
        // Held by the blocking task: it outlives this future if the call is cancelled.
        blocking(move || {
            let _held = guard;
            this.release(&claim.uid)
        })
        .await?
    }

    /// Removes a claim's spec and record (blocking I/O); unknown UIDs are fine.
    pub(crate) fn release(&self, uid: &str) -> Result<(), PrepareError> {
        let store = &self.inner.store;
        let Some(rec) = store.claim(uid)? else {
            tracing::debug!(claim.uid = uid, "unprepare of an unknown claim; nothing to do");
            return Ok(());
        };
        cdi::remove_spec(&rec.cdi_spec_path).map_err(|source| PrepareError::Cdi {
            op: "remove",
            path: rec.cdi_spec_path.clone(),
            source,
        })?;
        failpoint::hit("unprepare-after-cdi-remove");
        store.remove_claim(uid)?;
        failpoint::hit("unprepare-after-record-remove");
        tracing::info!(claim.uid = uid, phase = ?rec.phase, "claim unprepared");
        Ok(())
    }
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
        futures_util::stream::iter(calls).buffer_unordered(CLAIMS_AT_ONCE).collect().await
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
        join_all(calls).await.into_iter().collect()
    }
}
