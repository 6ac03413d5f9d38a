//! `<state_dir>/health.json`: the GPUs' conditions as edra last knew them, so a restart
//! keeps a taint and its `timeAdded` (eviction deadlines count from it) until recovery is
//! seen, and `edra doctor` can say what is unhealthy without asking the agent.
//!
//! Written atomically (temporary file, fsync, rename, fsync of the directory) after every
//! change of a condition; a missing file is an empty view, an unreadable one is reported
//! and replaced at the next change.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::view::GpuHealth;

/// The file's name in the state directory.
pub const FILE_NAME: &str = "health.json";
/// The format version written.
const VERSION: u32 = 1;

/// Why the file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Reading failed.
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not edra's health file.
    #[error("{path} is not a health file edra can read: {problem}")]
    Decode { path: PathBuf, problem: String },
    /// Writing failed.
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Serialize, Deserialize)]
struct File {
    version: u32,
    #[serde(default)]
    gpus: BTreeMap<String, GpuHealth>,
}

/// The health file of `state_dir`.
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE_NAME)
}

/// Reads the persisted GPU health; an absent file is an empty map.
pub fn load(state_dir: &Path) -> Result<BTreeMap<String, GpuHealth>, StoreError> {
    let path = path(state_dir);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(source) => return Err(StoreError::Read { path, source }),
    };
    let file: File =
        serde_json::from_slice(&text).map_err(|e| StoreError::Decode { path: path.clone(), problem: e.to_string() })?;
    if file.version != VERSION {
        return Err(StoreError::Decode { path, problem: format!("format version {} is not {VERSION}", file.version) });
    }
    Ok(file.gpus)
}

/// Writes `gpus` durably (only GPUs with conditions or a first-seen time are kept).
pub fn save(state_dir: &Path, gpus: &BTreeMap<String, GpuHealth>) -> Result<(), StoreError> {
    let path = path(state_dir);
    let file = File { version: VERSION, gpus: gpus.clone() };
    let text = serde_json::to_vec_pretty(&file)
        .map_err(|e| StoreError::Write { path: path.clone(), source: std::io::Error::other(e) })?;
    let tmp = state_dir.join(format!(".{FILE_NAME}.tmp"));
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(state_dir)?;
        crate::util::write_atomically(&path, &tmp, &text, 0o644)?;
        std::fs::File::open(state_dir)?.sync_all()
    };
    write().map_err(|source| StoreError::Write { path, source })
}

#[cfg(test)]
mod tests;
