//! The `claim-status` check: whether edra may keep its entries in ResourceClaim
//! `status.devices` (patch on `resourceclaims/status`, and on Kubernetes 1.36+ the driver
//! permission on `resourceclaims/driver`: `associated-node:patch` for a service account,
//! `arbitrary-node:patch` for anyone). Optional: without it edra logs one warning and
//! writes no claim status, so a denial is a warning, not a failure.

use super::{CheckResult, Status};
use crate::kube::review::{AccessCheck, AccessDecision, SubjectInfo};

/// The check's name.
pub const NAME: &str = "claim-status";

/// What writing claim status asks for, for driver `driver`: the status patch, then the
/// driver permission as a service account would have it, then as anyone.
pub fn needed(driver: &str) -> [AccessCheck; 3] {
    let g = "resource.k8s.io";
    [
        AccessCheck::new("patch", g, "resourceclaims").subresource("status"),
        AccessCheck::new("associated-node:patch", g, "resourceclaims").subresource("driver").named(driver),
        AccessCheck::new("arbitrary-node:patch", g, "resourceclaims").subresource("driver").named(driver),
    ]
}

/// The check from the reviews' answers (in the order of [`needed`]).
pub fn evaluate(who: Option<&SubjectInfo>, answers: &[Result<AccessDecision, String>]) -> CheckResult {
    let user = who.map(|w| w.username.as_str()).unwrap_or("(unknown identity)");
    let allowed = |i: usize| matches!(answers.get(i), Some(Ok(d)) if d.allowed);
    if let Some(Err(e)) = answers.iter().find(|a| a.is_err()) {
        return CheckResult::new(NAME, Status::Warn, format!("{user}: could not ask the API server: {e}"), "");
    }
    let service_account = user.starts_with("system:serviceaccount:");
    let driver = match (allowed(1) && service_account, allowed(2)) {
        (true, _) => Some("associated-node:patch"),
        (_, true) => Some("arbitrary-node:patch"),
        _ => None,
    };
    match (allowed(0), driver) {
        (true, Some(verb)) => CheckResult::pass(
            NAME,
            format!(
                "{user} may write edra's entries in ResourceClaim status (patch resourceclaims/status, {verb} resourceclaims/driver)"
            ),
        ),
        (status, _) => {
            let missing = match status {
                false => "patch on resourceclaims/status",
                true => "the driver permission on resourceclaims/driver",
            };
            let fix = match who.and_then(SubjectInfo::node_name) {
                Some(_) => {
                    "kubectl apply -f /usr/share/edra/manifests/rbac-claim-status-nodes.yaml (opt-in for node identities)"
                }
                None => {
                    "apply config/rbac.yaml (patch on resourceclaims/status, associated-node:patch on resourceclaims/driver)"
                }
            };
            CheckResult::new(
                NAME,
                Status::Warn,
                format!(
                    "{user} lacks {missing}: edra writes no claim status (one warning at run time; prepares are unaffected)"
                ),
                fix,
            )
        }
    }
}
