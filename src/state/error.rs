//! [`StateError`]: what went wrong with the state store, each variant naming the failed
//! operation or the claim, device or GPU it refused, and what to do about it.

use std::io;
use std::path::PathBuf;

use super::record::{RecordError, SCHEMA_VERSION};

/// What went wrong with the state store.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The database could not be opened.
    #[error("cannot open edra's state in {}: {hint}", dir.display())]
    Open {
        /// The state directory.
        dir: PathBuf,
        /// What to do about it.
        hint: &'static str,
        /// The cause.
        #[source]
        source: sled::Error,
    },
    /// The state directory could not be created or secured.
    #[error("cannot create edra's state directory {}; check that its parent exists and is writable", dir.display())]
    CreateDir {
        /// The state directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The database was written by a newer edra.
    #[error(
        "edra's state in {} has schema version {found}, newer than {SCHEMA_VERSION} which this edra understands; \
         upgrade edra, or move the state directory aside (prepared claims are then forgotten)",
        dir.display()
    )]
    NewerSchema {
        /// The state directory.
        dir: PathBuf,
        /// The version found.
        found: u32,
    },
    /// A stored record cannot be used.
    #[error("the stored record of claim {uid} cannot be read; upgrade edra or move the state directory aside")]
    Record {
        /// The claim UID.
        uid: String,
        /// The cause.
        #[source]
        source: RecordError,
    },
    /// A device is already held by another claim.
    #[error(
        "device {device} is already prepared for claim {}UID {holder}; unprepare that claim first (delete its pod)",
        .holder_name.as_ref().map(|n| format!("{n}, ")).unwrap_or_default()
    )]
    DeviceHeld {
        /// The device.
        device: String,
        /// The claim UID holding it.
        holder: String,
        /// `namespace/name` of that claim, when its record is readable.
        holder_name: Option<String>,
    },
    /// A share does not fit in what the GPU's other shares leave.
    #[error(
        "GPU {gpu} has {} of memory left for shares and this claim asks for {}; it is shared with {holders}. \
         The scheduler should not have placed the claim here: check that the published slices match the GPUs \
         (edra doctor), or delete one of those pods",
        crate::util::quantity(*.free), crate::util::quantity(*.asked)
    )]
    SharesExceed {
        /// The GPU's device name.
        gpu: String,
        /// Memory this claim's shares of it take, in bytes.
        asked: u64,
        /// Memory left by the other shares, in bytes.
        free: u64,
        /// The other holders with their memory.
        holders: String,
    },
    /// Another claim holds a share of the device with the same share ID.
    #[error(
        "share {share_id} of device {device} is already prepared for claim {}UID {holder}; a share ID is unique per \
         device, so the allocation is not one the scheduler makes: delete one of the pods so its claim is \
         allocated again",
        .holder_name.as_ref().map(|n| format!("{n}, ")).unwrap_or_default()
    )]
    ShareIdTaken {
        /// The device.
        device: String,
        /// The share ID.
        share_id: String,
        /// The claim UID holding it.
        holder: String,
        /// `namespace/name` of that claim, when its record is readable.
        holder_name: Option<String>,
    },
    /// A GPU's stored list of shares cannot be read.
    #[error(
        "the share list of GPU {gpu} in edra's state cannot be read, so its free memory is unknown and no share of \
         it is taken; restart edra, which rebuilds the list from the claims' records at start"
    )]
    SharesRecord {
        /// The GPU (device name).
        gpu: String,
        /// The cause.
        #[source]
        source: RecordError,
    },
    /// A stored GPU change record cannot be used.
    #[error("the stored change record of GPU {uuid} cannot be read; upgrade edra or move the state directory aside")]
    GpuRecord {
        /// The GPU's UUID.
        uuid: String,
        /// The cause.
        #[source]
        source: RecordError,
    },
    /// A stored MPS daemon record cannot be used.
    #[error(
        "the stored MPS daemon record of claim UID {uid} cannot be read; upgrade edra or move the state directory aside"
    )]
    MpsRecord {
        /// The claim's UID.
        uid: String,
        /// The cause.
        #[source]
        source: RecordError,
    },
    /// A stored GPU memory limit record cannot be decoded.
    #[error("the stored GPU memory limit record {key} cannot be read; upgrade edra or move the state directory aside")]
    MemoryLimitRecord {
        /// The record's key.
        key: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// Another claim is changing the GPU's settings.
    #[error(
        "GPU {uuid} has its compute mode or time-slice set for claim UID {holder}; unprepare that claim first (delete its pod)"
    )]
    GpuChanged {
        /// The GPU's UUID.
        uuid: String,
        /// The claim UID whose change it carries.
        holder: String,
    },
    /// A read or a transaction failed.
    #[error("cannot {op} in edra's state database")]
    Db {
        /// The operation.
        op: &'static str,
        /// The cause.
        #[source]
        source: sled::Error,
    },
    /// An earlier change could not be made durable; nothing is served until a re-open.
    #[error(
        "edra's state in {} is unusable since a change could not be made durable ({reason}); free space or fix the disk \
         there: edra re-opens the state by itself and retries, or restart edra",
        dir.display()
    )]
    Poisoned {
        /// The state directory.
        dir: PathBuf,
        /// The first failure.
        reason: String,
    },
    /// The change could not be made durable.
    #[error("cannot make edra's state durable in {}; check the disk (space, errors)", dir.display())]
    Sync {
        /// The state directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}
