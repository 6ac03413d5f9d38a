//! The GPU memory limits edra set on containers' cgroups (`sharing.memory_limit`), one
//! record per (claim, share, cgroup) in tree `memory_limits`, written durably before the
//! limit is set and dropped durably after it is cleared, so recovery finds every limit that
//! may be set. NVML keeps one limit per (GPU, cgroup): the records on one
//! ([`MemoryLimitRecord::same_target`]) together make it, their sum. Records are JSON (a
//! tree of their own: an edra without it ignores the tree).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::db::db_err;
use super::{StateError, Store};

/// The tree's name.
const TREE: &str = "memory_limits";

/// A GPU memory limit on a container's cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryLimitRecord {
    /// The claim UID.
    pub claim: String,
    /// The share's device name in the claim.
    pub device: String,
    /// The share's ID (a claim may hold several shares of one device); none in records
    /// written before shares were told apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// The GPU's UUID.
    pub gpu: String,
    /// The cgroup directory, as given to NVML.
    pub cgroup: PathBuf,
    /// The directory's inode when the limit was recorded (a cgroup made again at the same
    /// path is another one, whose limits are not edra's).
    pub inode: u64,
    /// The boot the limit was set in (cgroups do not outlive a boot).
    pub boot_id: String,
    /// The soft and hard limit, bytes.
    pub bytes: u64,
}

impl MemoryLimitRecord {
    /// The record's key: claim, device, cgroup and share ID (when there is one),
    /// NUL-separated (a record without a share ID keeps the key it was written with).
    pub fn key(&self) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.claim.len() + self.device.len() + 128);
        k.extend_from_slice(self.claim.as_bytes());
        k.push(0);
        k.extend_from_slice(self.device.as_bytes());
        k.push(0);
        k.extend_from_slice(self.cgroup.as_os_str().as_encoded_bytes());
        if let Some(id) = &self.share_id {
            k.push(0);
            k.extend_from_slice(id.as_bytes());
        }
        k
    }

    /// Whether `other` limits the same GPU on the same cgroup: same GPU, directory, inode
    /// and boot. NVML keeps one limit there, which the two records share.
    pub fn same_target(&self, other: &MemoryLimitRecord) -> bool {
        self.gpu == other.gpu
            && self.cgroup == other.cgroup
            && self.inode == other.inode
            && self.boot_id == other.boot_id
    }
}

impl Store {
    /// Records `limit` durably (before it is set); replaces a record with the same key.
    pub fn put_memory_limit(&self, limit: &MemoryLimitRecord) -> Result<(), StateError> {
        let value = serde_json::to_vec(limit).map_err(|source| StateError::MemoryLimitRecord {
            key: String::from_utf8_lossy(&limit.key()).into_owned(),
            source,
        })?;
        self.with_db(|db| {
            let tree = db.db.open_tree(TREE).map_err(db_err("open the memory limit records"))?;
            tree.insert(limit.key(), value).map_err(db_err("record a GPU memory limit"))?;
            self.durable(db)
        })
    }

    /// Drops the record of `limit` durably (after it is cleared); returns whether there was one.
    pub fn remove_memory_limit(&self, limit: &MemoryLimitRecord) -> Result<bool, StateError> {
        self.with_db(|db| {
            let tree = db.db.open_tree(TREE).map_err(db_err("open the memory limit records"))?;
            let removed = tree.remove(limit.key()).map_err(db_err("drop a GPU memory limit record"))?.is_some();
            if removed {
                self.durable(db)?;
            }
            Ok(removed)
        })
    }

    /// Every memory limit record, in key order.
    pub fn memory_limits(&self) -> Result<Vec<MemoryLimitRecord>, StateError> {
        self.memory_limits_with_prefix(&[])
    }

    /// The memory limit records of claim `uid`.
    pub fn memory_limits_of(&self, uid: &str) -> Result<Vec<MemoryLimitRecord>, StateError> {
        let mut prefix = uid.as_bytes().to_vec();
        prefix.push(0);
        self.memory_limits_with_prefix(&prefix)
    }

    /// The memory limit records on `target`'s GPU and cgroup
    /// ([`MemoryLimitRecord::same_target`]), in key order.
    pub fn memory_limits_on(&self, target: &MemoryLimitRecord) -> Result<Vec<MemoryLimitRecord>, StateError> {
        let mut all = self.memory_limits()?;
        all.retain(|r| r.same_target(target));
        Ok(all)
    }

    fn memory_limits_with_prefix(&self, prefix: &[u8]) -> Result<Vec<MemoryLimitRecord>, StateError> {
        self.with_db(|db| {
            let tree = db.db.open_tree(TREE).map_err(db_err("open the memory limit records"))?;
            let mut out = Vec::new();
            for item in tree.scan_prefix(prefix) {
                let (k, v) = item.map_err(db_err("read the GPU memory limit records"))?;
                let rec = serde_json::from_slice(&v).map_err(|source| StateError::MemoryLimitRecord {
                    key: String::from_utf8_lossy(&k).into_owned(),
                    source,
                })?;
                out.push(rec);
            }
            Ok(out)
        })
    }
}
