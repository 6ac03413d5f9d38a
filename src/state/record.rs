//! The records edra keeps per prepared claim, and their schema versions.
//!
//! Records are JSON with an explicit `schema` field. [`decode_claim`] reads a stored record:
//! the current schema as it is, an older one through [`migrate`], a newer one is refused
//! (a newer edra wrote it; running an older one on it could lose allocations).

use serde::{Deserialize, Serialize};

use crate::device_config::GpuConfig;
use crate::gpu::ComputeMode;

/// The schema version this edra writes.
pub const SCHEMA_VERSION: u32 = 1;

/// How far a claim's preparation got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Devices are held and artifacts may be partly written; rolled back at recovery.
    PrepareStarted,
    /// Everything is in place; prepare answers from this record.
    PrepareCompleted,
}

/// One allocation result of the claim prepared on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceRecord {
    /// The request as written in the allocation result (`req` or `req/sub`).
    pub request: String,
    /// Base request names (`req`) answered to the kubelet.
    pub request_names: Vec<String>,
    /// Device name in the pool.
    pub device: String,
    /// Pool name (this node's name).
    pub pool: String,
    /// Fully-qualified CDI device IDs.
    pub cdi_ids: Vec<String>,
    /// Admin access: the device is not held exclusively.
    pub admin_access: bool,
    /// Share ID of a consumable-capacity allocation.
    pub share_id: Option<String>,
    /// The resolved opaque configuration.
    pub config: GpuConfig,
    /// For a share of a GPU (a consumable-capacity allocation or a replica): the GPU and the
    /// memory the share takes. Absent for whole devices, so their records read as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<ShareRecord>,
    /// For a dynamic MIG device: the MIG instance edra creates for it. Absent for every
    /// other device, so their records read as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigRecord>,
}

/// How far edra got with the MIG instance of a [`MigRecord`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MigState {
    /// About to be created (recorded before the create call): it may or may not exist.
    Intent,
    /// Created; `gi`, `ci` and `uuid` say which.
    Created,
    /// Being destroyed by an unprepare: it may or may not exist any more.
    Releasing,
    /// Gone (a reboot) and could not be created again; `lost` says why.
    Lost,
}

/// The MIG instance edra creates for a dynamic MIG device of a claim: the intent is
/// recorded before the instance is created, its IDs once it is, so a crash at any step
/// leaves a record that says what may exist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigRecord {
    /// The parent GPU's UUID.
    pub gpu: String,
    /// The parent GPU's minor number (`/dev/nvidia<minor>`).
    pub gpu_minor: u32,
    /// The GPU instance profile ID.
    pub profile_id: u32,
    /// The profile's name, e.g. `3g.40gb`.
    pub profile: String,
    /// Where the GPU instance sits.
    pub placement: crate::gpu::mig_control::Placement,
    /// How far edra got.
    pub state: MigState,
    /// GPU instance ID, once created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gi: Option<u32>,
    /// Compute instance ID, once created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci: Option<u32>,
    /// The MIG device's UUID, once created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Why a lost instance could not be created again (state [`MigState::Lost`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<String>,
}

/// The part of a GPU one allocation takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShareRecord {
    /// The physical GPU's device name (`gpu-0` for `gpu-0` and `gpu-0-replica-2`).
    pub gpu: String,
    /// Memory the share consumes, in bytes.
    pub memory: u64,
    /// The GPU's memory when the share was prepared, in bytes: the most all shares may take.
    pub gpu_memory: u64,
}

impl DeviceRecord {
    /// The physical device this record uses: the GPU of a replica, otherwise the device.
    pub fn gpu(&self) -> &str {
        self.share.as_ref().map_or(&self.device, |s| &s.gpu)
    }

    /// The CDI device name's device part: the device, with the share ID for a share (two
    /// requests of one claim may hold two shares of one GPU).
    pub fn cdi_device(&self) -> String {
        match &self.share_id {
            Some(id) => format!("{}-{id}", self.device),
            None => self.device.clone(),
        }
    }

    /// Whether this record takes only part of its GPU, so the GPU is shared with others.
    pub fn is_partial_share(&self) -> bool {
        self.share.as_ref().is_some_and(|s| s.memory < s.gpu_memory || s.gpu != self.device)
    }
}

/// The record of one claim on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRecord {
    /// Record schema version.
    pub schema: u32,
    /// Claim UID (the key).
    pub uid: String,
    /// Claim namespace.
    pub namespace: String,
    /// Claim name.
    pub name: String,
    /// How far preparation got.
    pub phase: Phase,
    /// The devices prepared for this claim.
    pub devices: Vec<DeviceRecord>,
    /// The claim's CDI spec file.
    pub cdi_spec_path: std::path::PathBuf,
    /// When the record was first written, seconds since the Unix epoch.
    pub created_at: u64,
    /// The boot ID when the record was written (empty when unknown).
    pub boot_id: String,
}

impl ClaimRecord {
    /// Names of the devices this claim holds exclusively (admin access is exempt, and a
    /// consumable-capacity share is accounted in [`ClaimRecord::shares`] instead).
    pub fn held_devices(&self) -> impl Iterator<Item = &str> {
        self.devices.iter().filter(|d| !d.admin_access && d.share_id.is_none()).map(|d| d.device.as_str())
    }

    /// The MIG instances recorded for this claim's dynamic MIG devices, with their devices.
    pub fn migs(&self) -> impl Iterator<Item = (&DeviceRecord, &MigRecord)> {
        self.devices.iter().filter_map(|d| Some((d, d.mig.as_ref()?)))
    }

    /// The shares of GPUs this claim takes (consumable-capacity shares and replicas; admin
    /// access is exempt).
    pub fn shares(&self) -> impl Iterator<Item = (&DeviceRecord, &ShareRecord)> {
        self.devices.iter().filter(|d| !d.admin_access).filter_map(|d| Some((d, d.share.as_ref()?)))
    }
}

/// Why a stored record cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Not JSON, or not the shape of its schema version.
    #[error("record is malformed")]
    Malformed(#[source] serde_json::Error),
    /// Written by a newer edra.
    #[error("record has schema version {found}, newer than {SCHEMA_VERSION} which this edra understands")]
    Newer {
        /// The version found.
        found: u32,
    },
    /// An older version for which no migration exists.
    #[error("record has schema version {found}, which this edra cannot migrate")]
    NoMigration {
        /// The version found.
        found: u32,
    },
}

/// Decodes a stored claim record, migrating older schemas.
pub fn decode_claim(bytes: &[u8]) -> Result<ClaimRecord, RecordError> {
    // A record of today's schema decodes straight into the struct (every prepare answered
    // from state reads one); anything else goes through the generic value, which says
    // whether it is newer, old without a migration, or malformed.
    if let Ok(record) = serde_json::from_slice::<ClaimRecord>(bytes)
        && record.schema == SCHEMA_VERSION
    {
        return Ok(record);
    }
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(RecordError::Malformed)?;
    let found = value.get("schema").and_then(serde_json::Value::as_u64).unwrap_or(0);
    let found = u32::try_from(found).unwrap_or(u32::MAX);
    if found > SCHEMA_VERSION {
        return Err(RecordError::Newer { found });
    }
    let value = migrate(value, found)?;
    serde_json::from_value(value).map_err(RecordError::Malformed)
}

/// Encodes a record (always at [`SCHEMA_VERSION`]).
pub fn encode_claim(record: &ClaimRecord) -> Vec<u8> {
    // A ClaimRecord is strings, integers, bools and enums: serializing cannot fail.
    serde_json::to_vec(record).unwrap_or_default()
}

/// Brings a record from schema `from` to [`SCHEMA_VERSION`].
///
/// Version 1 is the first released layout, so no older layout can be met yet; each future
/// version adds a `from => transform, then continue` arm here, tested with a hand-written
/// record of the old layout.
pub fn migrate(value: serde_json::Value, from: u32) -> Result<serde_json::Value, RecordError> {
    match from {
        SCHEMA_VERSION => Ok(value),
        found => Err(RecordError::NoMigration { found }),
    }
}

/// The schema version of [`GpuChange`] records this edra writes.
pub const GPU_CHANGE_SCHEMA: u32 = 1;

/// What edra is about to change, or has changed, on one full GPU for a claim: written
/// durably before the change, removed with the claim's record after the GPU was
/// restored, so recovery after a crash at any step knows what to put back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuChange {
    /// Record schema version.
    pub schema: u32,
    /// The GPU's UUID (the key).
    pub uuid: String,
    /// The device name in the pool.
    pub device: String,
    /// UID of the claim the change is for.
    pub claim: String,
    /// The compute mode before edra changed it; restored on release.
    pub previous_compute_mode: ComputeMode,
    /// The compute mode edra sets.
    pub compute_mode: ComputeMode,
    /// The time-slice value (`nvidia-smi compute-policy --set-timeslice`) edra sets;
    /// release sets 0 (the driver's default) again.
    pub timeslice: Option<u8>,
}

/// Decodes a stored record of schema `current`; a newer schema is refused.
fn decode_versioned<T: serde::de::DeserializeOwned>(bytes: &[u8], current: u32) -> Result<T, RecordError> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(RecordError::Malformed)?;
    let found = value.get("schema").and_then(serde_json::Value::as_u64).unwrap_or(0);
    let found = u32::try_from(found).unwrap_or(u32::MAX);
    if found > current {
        return Err(RecordError::Newer { found });
    }
    if found != current {
        return Err(RecordError::NoMigration { found });
    }
    serde_json::from_value(value).map_err(RecordError::Malformed)
}

/// Decodes a stored GPU change record; a newer schema is refused.
pub fn decode_gpu_change(bytes: &[u8]) -> Result<GpuChange, RecordError> {
    decode_versioned(bytes, GPU_CHANGE_SCHEMA)
}

/// One share of a GPU held by a claim (an entry of the `shares` tree's list for that GPU).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShareHolding {
    /// The holding claim's UID.
    pub claim: String,
    /// The device the allocation names (the GPU, or one of its replicas).
    pub device: String,
    /// The allocation's share ID (none for a replica).
    pub share_id: Option<String>,
    /// Memory taken, in bytes.
    pub memory: u64,
}

/// Decodes a GPU's list of shares.
pub fn decode_shares(bytes: &[u8]) -> Result<Vec<ShareHolding>, RecordError> {
    serde_json::from_slice(bytes).map_err(RecordError::Malformed)
}

/// Encodes a GPU's list of shares.
pub fn encode_shares(shares: &[ShareHolding]) -> Vec<u8> {
    // Strings and integers: serializing cannot fail.
    serde_json::to_vec(shares).unwrap_or_default()
}

/// Encodes a GPU change record.
pub fn encode_gpu_change(change: &GpuChange) -> Vec<u8> {
    // Strings, integers and enums: serializing cannot fail.
    serde_json::to_vec(change).unwrap_or_default()
}

/// The schema version of [`MpsDaemonRecord`]s this edra writes.
pub const MPS_DAEMON_SCHEMA: u32 = 1;

/// The MPS control daemon of one claim, or of a shared GPU's shares
/// (`sharing.enforcement = "mps"`): written durably before the daemon is started
/// (without `daemon`), again once it answers (with `daemon`), removed with the claim's
/// record after the daemon was stopped. Recovery and the supervision loop adopt, restart
/// or stop daemons from these records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MpsDaemonRecord {
    /// Record schema version.
    pub schema: u32,
    /// UID of the claim (the key, and the daemon's directory name), or the shared GPU's
    /// holder `shared:gpu-0` (directory `shared-gpu-0`).
    pub claim: String,
    /// The UUIDs the daemon serves (`CUDA_VISIBLE_DEVICES`).
    pub gpus: Vec<String>,
    /// `set_default_active_thread_percentage`, when the config sets it.
    pub active_thread_percentage: Option<u32>,
    /// `set_default_device_pinned_mem_limit <uuid> <MiB>M`, per GPU.
    pub pinned_memory_mib: Vec<(String, u64)>,
    /// Clock ticks after boot just before the last start: a process found through the
    /// daemon's pid file that started earlier is not the daemon.
    pub not_before: u64,
    /// The running daemon (pid and start time), once it answered.
    pub daemon: Option<(u32, u64)>,
    /// How often the daemon was started again after it died.
    pub restarts: u32,
}

/// Decodes a stored MPS daemon record; a newer schema is refused.
pub fn decode_mps_daemon(bytes: &[u8]) -> Result<MpsDaemonRecord, RecordError> {
    decode_versioned(bytes, MPS_DAEMON_SCHEMA)
}

/// Encodes an MPS daemon record.
pub fn encode_mps_daemon(record: &MpsDaemonRecord) -> Vec<u8> {
    // Strings, integers and options: serializing cannot fail.
    serde_json::to_vec(record).unwrap_or_default()
}

/// `namespace/name` of the claim whose stored record is `bytes`, when it is readable.
pub(crate) fn claim_name(bytes: &[u8]) -> Option<String> {
    decode_claim(bytes).ok().map(|r| format!("{}/{}", r.namespace, r.name))
}
