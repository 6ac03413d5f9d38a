//! [`PublishStatus`]: what the publisher reports to the rest of the agent (metrics,
//! `/readyz`, systemd's status line). The state machine makes it and the reconcile loop
//! sends it, so it sits below both.

/// What the publisher reports to the rest of the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishStatus {
    /// The API matched the inventory after the last reconcile.
    pub in_sync: bool,
    /// Devices published.
    pub devices: usize,
    /// Writes made since start.
    pub writes: u64,
    /// The last error, if the last reconcile failed.
    pub last_error: Option<String>,
}
