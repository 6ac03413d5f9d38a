//! The DRAPlugin services (v1 and v1beta1) on the DRA socket.
//!
//! Both versions decode into [`ClaimRef`]s, go through the same checks and the same
//! [`DraHandler`], and encode the answer in their own message types (v1 carries
//! `share_id`, v1beta1 has no such field). Checks: an empty request gets an empty answer;
//! a claim without UID or a UID listed twice fails the whole call with `InvalidArgument`;
//! a claim without namespace or name gets a per-claim error; every requested UID is in
//! the answer, even if the handler missed one. Each call runs in a span with a sequential
//! request id; its outcome and latency are reported to the [`CallObserver`] (the metrics)
//! and logged at debug level: a call answered from state (every restart of a pod's
//! containers) writes no log line, and each claim prepared, released or failed is logged
//! at INFO or WARN where it happens.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::handler::{ClaimRef, DraHandler, PreparedDevice};
use super::inflight::InFlight;
use super::observer::{CallObserver, CallOutcome, CallReport, DraMethod};
use super::proto::{dra_v1 as v1, dra_v1beta1 as v1beta1};

/// Per-claim outcomes, keyed by claim UID.
type Outcomes<T> = BTreeMap<String, Result<T, String>>;

/// What both DRAPlugin versions share: the handler, the request counter, the task tracker
/// and the observer of finished calls.
pub(crate) struct DraCalls<H> {
    handler: Arc<H>,
    inflight: Arc<InFlight>,
    observer: Arc<dyn CallObserver>,
    next_id: AtomicU64,
}

impl<H: DraHandler> DraCalls<H> {
    pub(crate) fn new(handler: Arc<H>, inflight: Arc<InFlight>, observer: Arc<dyn CallObserver>) -> Arc<Self> {
        Arc::new(DraCalls { handler, inflight, observer, next_id: AtomicU64::new(0) })
    }

    async fn prepare(
        &self,
        version: &'static str,
        claims: Vec<ClaimRef>,
    ) -> Result<Outcomes<Vec<PreparedDevice>>, Status> {
        self.call(version, DraMethod::Prepare, claims, |handler, claims| async move { handler.prepare(claims).await })
            .await
    }

    async fn unprepare(&self, version: &'static str, claims: Vec<ClaimRef>) -> Result<Outcomes<()>, Status> {
        self.call(
            version,
            DraMethod::Unprepare,
            claims,
            |handler, claims| async move { handler.unprepare(claims).await },
        )
        .await
    }

    async fn call<T, F, Fut>(
        &self,
        version: &'static str,
        method: DraMethod,
        claims: Vec<ClaimRef>,
        run: F,
    ) -> Result<Outcomes<T>, Status>
    where
        T: Send + 'static,
        F: FnOnce(Arc<H>, Vec<ClaimRef>) -> Fut,
        Fut: Future<Output = Outcomes<T>> + Send + 'static,
    {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let span = tracing::info_span!(
            "dra_call",
            request_id = id,
            version,
            method = method.grpc_name(),
            claims = claims.len()
        );
        let started = Instant::now();
        let result = async move {
            let checked = validate(claims).inspect_err(|status| {
                tracing::warn!(error = status.message(), "rejected a malformed request");
            })?;
            let mut outcomes = checked.errors;
            if !checked.valid.is_empty() {
                let uids: Vec<&str> = checked.valid.iter().map(|c| c.uid.as_str()).collect();
                tracing::debug!(?uids, "calling the claim handler");
                let work = run(Arc::clone(&self.handler), checked.valid.clone()).in_current_span();
                let mut handled = self.inflight.spawn(id, work).await.map_err(join_status)?;
                for claim in checked.valid {
                    let outcome = handled.remove(&claim.uid).unwrap_or_else(|| {
                        Err("edra produced no result for this claim; the kubelet will retry".to_string())
                    });
                    outcomes.insert(claim.uid, outcome);
                }
                for uid in handled.keys() {
                    tracing::warn!(claim.uid = %uid, "ignoring a result for a claim that was not requested");
                }
            }
            let mut failed = 0;
            for (uid, outcome) in &outcomes {
                if let Err(error) = outcome {
                    failed += 1;
                    tracing::warn!(claim.uid = %uid, error = %error, "claim failed");
                }
            }
            let latency_ms = started.elapsed().as_secs_f64() * 1e3;
            // Each claim's outcome is logged where it happens (INFO: prepared, released;
            // WARN: failed); this line per call is for following the kubelet's calls.
            tracing::debug!(failed, latency_ms, "DRA call finished");
            Ok(outcomes)
        }
        .instrument(span)
        .await;
        self.observer.call_finished(&report(method, version, &result, started));
        result
    }
}

/// What the observer learns about a finished call.
fn report<T>(
    method: DraMethod,
    version: &'static str,
    result: &Result<Outcomes<T>, Status>,
    started: Instant,
) -> CallReport {
    let (outcome, claims_ok, claims_failed) = match result {
        Ok(outcomes) => {
            let failed = outcomes.values().filter(|o| o.is_err()).count() as u64;
            let ok = outcomes.len() as u64 - failed;
            (if failed == 0 { CallOutcome::Ok } else { CallOutcome::ClaimErrors }, ok, failed)
        }
        Err(_) => (CallOutcome::Failed, 0, 0),
    };
    CallReport { method, version, outcome, claims_ok, claims_failed, duration: started.elapsed() }
}

/// A request split into claims for the handler and claims already answered with an error.
struct Checked<T> {
    valid: Vec<ClaimRef>,
    errors: Outcomes<T>,
}

fn validate<T>(claims: Vec<ClaimRef>) -> Result<Checked<T>, Status> {
    let mut seen = HashSet::with_capacity(claims.len());
    let mut checked = Checked { valid: Vec::with_capacity(claims.len()), errors: BTreeMap::new() };
    for (index, claim) in claims.into_iter().enumerate() {
        if claim.uid.is_empty() {
            return Err(Status::invalid_argument(format!(
                "claim at index {index} ({}/{}) has no UID; every claim needs namespace, name and UID",
                claim.namespace, claim.name
            )));
        }
        if !seen.insert(claim.uid.clone()) {
            return Err(Status::invalid_argument(format!(
                "claim UID {} is listed more than once; list each claim once per request",
                claim.uid
            )));
        }
        let missing = match (claim.namespace.is_empty(), claim.name.is_empty()) {
            (true, true) => Some("namespace and name"),
            (true, false) => Some("namespace"),
            (false, true) => Some("name"),
            (false, false) => None,
        };
        match missing {
            Some(what) => {
                let error = format!("claim {} has no {what}; every claim needs namespace, name and UID", claim.uid);
                checked.errors.insert(claim.uid, Err(error));
            }
            None => checked.valid.push(claim),
        }
    }
    Ok(checked)
}

fn join_status(error: tokio::task::JoinError) -> Status {
    if error.is_cancelled() {
        Status::unavailable("edra is shutting down; retry once it is back")
    } else {
        tracing::error!(error = %error, "the claim handler panicked");
        Status::internal("edra failed unexpectedly while handling the claims; see its log, then retry")
    }
}

macro_rules! dra_service {
    ($name:ident, $proto:ident, $version:literal, $device:expr) => {
        /// The DRAPlugin service of this proto version.
        pub(crate) struct $name<H>(pub(crate) Arc<DraCalls<H>>);

        #[tonic::async_trait]
        impl<H: DraHandler> $proto::dra_plugin_server::DraPlugin for $name<H> {
            async fn node_prepare_resources(
                &self,
                request: Request<$proto::NodePrepareResourcesRequest>,
            ) -> Result<Response<$proto::NodePrepareResourcesResponse>, Status> {
                let claims = request.into_inner().claims.into_iter().map(claim_ref!($proto)).collect();
                let outcomes = self.0.prepare($version, claims).await?;
                let to_device = $device;
                let claims = outcomes
                    .into_iter()
                    .map(|(uid, outcome)| {
                        let answer = match outcome {
                            Ok(devices) => $proto::NodePrepareResourceResponse {
                                devices: devices.into_iter().map(to_device).collect(),
                                error: String::new(),
                            },
                            Err(error) => $proto::NodePrepareResourceResponse { devices: Vec::new(), error },
                        };
                        (uid, answer)
                    })
                    .collect();
                Ok(Response::new($proto::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$proto::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$proto::NodeUnprepareResourcesResponse>, Status> {
                let claims = request.into_inner().claims.into_iter().map(claim_ref!($proto)).collect();
                let outcomes = self.0.unprepare($version, claims).await?;
                let claims = outcomes
                    .into_iter()
                    .map(|(uid, outcome)| {
                        let error = outcome.err().unwrap_or_default();
                        (uid, $proto::NodeUnprepareResourceResponse { error })
                    })
                    .collect();
                Ok(Response::new($proto::NodeUnprepareResourcesResponse { claims }))
            }
        }
    };
}

macro_rules! claim_ref {
    ($proto:ident) => {
        |c: $proto::Claim| ClaimRef { namespace: c.namespace, name: c.name, uid: c.uid }
    };
}

dra_service!(DraV1, v1, "v1", |d: PreparedDevice| v1::Device {
    request_names: d.request_names,
    pool_name: d.pool_name,
    device_name: d.device_name,
    cdi_device_ids: d.cdi_device_ids,
    share_id: d.share_id,
});

dra_service!(DraV1beta1, v1beta1, "v1beta1", |d: PreparedDevice| v1beta1::Device {
    request_names: d.request_names,
    pool_name: d.pool_name,
    device_name: d.device_name,
    cdi_device_ids: d.cdi_device_ids,
});

#[cfg(test)]
mod tests;
