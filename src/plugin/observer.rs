//! What the plugin server reports about its calls, for metrics.
//!
//! The gRPC layer knows nothing about how its calls are counted: it hands a
//! [`CallReport`] for every finished DRAPlugin call and a note of every registration
//! status the kubelet sends to a [`CallObserver`] given at start
//! ([`PluginServer::start_with`](super::PluginServer::start_with)). `telemetry::metrics`
//! is the real observer; without one, nothing is recorded.

use std::time::Duration;

/// Which DRAPlugin call finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DraMethod {
    /// `NodePrepareResources`.
    Prepare,
    /// `NodeUnprepareResources`.
    Unprepare,
}

impl DraMethod {
    /// The gRPC method name.
    pub fn grpc_name(self) -> &'static str {
        match self {
            DraMethod::Prepare => "NodePrepareResources",
            DraMethod::Unprepare => "NodeUnprepareResources",
        }
    }
}

/// How a whole call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallOutcome {
    /// Every claim in the call succeeded (an empty call included).
    Ok,
    /// The call was answered, but at least one claim carries an error.
    ClaimErrors,
    /// The call failed as a whole with a gRPC status (malformed request, shutdown, panic).
    Failed,
}

impl CallOutcome {
    /// The label value used for this outcome: `ok`, `claim_error` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            CallOutcome::Ok => "ok",
            CallOutcome::ClaimErrors => "claim_error",
            CallOutcome::Failed => "failed",
        }
    }
}

/// One finished DRAPlugin call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallReport {
    /// Prepare or unprepare.
    pub method: DraMethod,
    /// The DRAPlugin version the kubelet used (`v1`, `v1beta1`).
    pub version: &'static str,
    /// How the call ended.
    pub outcome: CallOutcome,
    /// Claims answered without an error.
    pub claims_ok: u64,
    /// Claims answered with an error (zero when the whole call failed).
    pub claims_failed: u64,
    /// From receiving the request to having the answer.
    pub duration: Duration,
}

/// Receives reports from the plugin server. Called on the serving tasks: implementations
/// must be quick and must not block.
pub trait CallObserver: Send + Sync + 'static {
    /// A DRAPlugin call finished.
    fn call_finished(&self, report: &CallReport);

    /// The kubelet sent a registration status: accepted (`true`) or refused.
    fn registration_status(&self, registered: bool) {
        let _ = registered;
    }
}

/// The observer used when none is given: records nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl CallObserver for NoObserver {
    fn call_finished(&self, _report: &CallReport) {}
}
