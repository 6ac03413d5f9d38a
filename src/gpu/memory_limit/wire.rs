//! What `edra hook apply-memory-limit` and the agent say to each other on the agent's
//! memory-limit socket (`<runtime_dir>/memory-limit.sock`, 0600): one JSON request line
//! from the hook, one JSON answer line from the agent, then the connection closes. Each
//! side reads at most [`MAX_LINE`] bytes.

use serde::{Deserialize, Serialize};

/// The socket's file name in the runtime directory.
pub const SOCKET: &str = "memory-limit.sock";
/// The longest request or answer line, in bytes.
pub const MAX_LINE: usize = 16 * 1024;

/// Set the share's limit on a container's cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// The claim UID.
    pub claim: String,
    /// The share's device name in the claim (`gpu-0`, as in the claim's allocation).
    pub device: String,
    /// The share ID, when the allocation has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// The container's cgroup, relative to the cgroup root.
    pub cgroup: String,
    /// The container ID, for logs.
    #[serde(default)]
    pub container: String,
}

/// The agent's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// Whether the limit is set.
    pub ok: bool,
    /// What went wrong and what to do, when not.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// The GPU the limit is on.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gpu: String,
    /// The limit, bytes.
    #[serde(default)]
    pub bytes: u64,
    /// The cgroup directory, as given to NVML.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cgroup: String,
}

impl Answer {
    /// A refusal saying `error`.
    pub fn refused(error: impl Into<String>) -> Self {
        Answer { ok: false, error: error.into(), gpu: String::new(), bytes: 0, cgroup: String::new() }
    }
}

/// One JSON line of `value`.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut line = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    line.push(b'\n');
    line
}

/// A value from a line read (with or without its newline).
pub fn decode<T: for<'de> Deserialize<'de>>(line: &[u8]) -> Result<T, String> {
    if line.len() > MAX_LINE {
        return Err(format!("the line is longer than {MAX_LINE} bytes"));
    }
    serde_json::from_slice(line.strip_suffix(b"\n").unwrap_or(line)).map_err(|e| e.to_string())
}
