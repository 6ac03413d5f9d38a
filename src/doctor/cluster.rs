//! Checks 6 and 7: the API server is reachable and serves resource.k8s.io, and edra's
//! credentials may do what edra does (SelfSubjectAccessReview per verb). Every request is
//! bounded by [`NETWORK_TIMEOUT`] and tried at most twice, so an unreachable cluster
//! fails in seconds.

use std::future::Future;

use futures_util::future::join_all;

use super::{CheckResult, NETWORK_TIMEOUT, Status};
use k8s_openapi::api::resource::v1::ResourceSlice;

use crate::config::Config;
use crate::kube::{AccessCheck, AccessDecision, Client, ClientSettings, Error, Sources, SubjectInfo};
use crate::sharing::{SharingMode, SharingSettings};

const API: &str = "api-server";
const PERMS: &str = "api-permissions";
const SHARES: &str = "gpu-shares";
const MIG: &str = "mig";

/// A client whose every request gives up within a few seconds.
pub fn doctor_client(cfg: &Config) -> Result<Client, Error> {
    let env = std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
    let creds = crate::kube::credentials::resolve(&Sources::from_settings(&cfg.kube, env))?;
    let settings = ClientSettings {
        request_timeout: cfg.kube.request_timeout.min(NETWORK_TIMEOUT),
        max_attempts: 2,
        retry_budget: NETWORK_TIMEOUT,
        ..ClientSettings::from_config(&cfg.kube)
    };
    Client::new(creds, settings)
}

async fn bounded<T>(what: &str, f: impl Future<Output = Result<T, Error>>) -> Result<T, String> {
    match tokio::time::timeout(NETWORK_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(crate::util::error_chain(&e)),
        Err(_) => Err(format!("{what}: no answer within {NETWORK_TIMEOUT:?}")),
    }
}

/// How to get resource.k8s.io served on Kubernetes `git_version`.
pub fn enable_dra_hint(git_version: &str) -> String {
    let minor: Option<u32> = git_version.trim_start_matches('v').split('.').nth(1).and_then(|m| m.parse().ok());
    let gates = |versions: &str| {
        format!(
            "enable DRA: --feature-gates=DynamicResourceAllocation=true on kube-apiserver, kube-controller-manager, \
             kube-scheduler and every kubelet, plus kube-apiserver --runtime-config={versions} (k3s: kube-apiserver-arg, \
             kube-controller-manager-arg, kube-scheduler-arg and kubelet-arg in /etc/rancher/k3s/config.yaml, on agents too)"
        )
    };
    // k3s #14286: some releases dropped feature gates given in config.yaml.
    let k3s = if git_version.contains("+k3s") {
        "; if they are set and DRA is still off, upgrade to the newest k3s patch release (k3s #14286 dropped such gates)"
    } else {
        ""
    };
    match minor {
        Some(m) if m < 32 => "upgrade to Kubernetes 1.32 or later (1.34+ has DRA on by default)".into(),
        Some(32) => gates("resource.k8s.io/v1beta1=true") + k3s,
        Some(33) => gates("resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true") + k3s,
        Some(_) => "DRA is on by default since 1.34: check that kube-apiserver's --runtime-config does not disable \
                    resource.k8s.io/v1"
            .into(),
        None => "use Kubernetes 1.34+ (DRA on by default), or enable DynamicResourceAllocation and resource.k8s.io \
                 on 1.32/1.33"
            .into(),
    }
}

fn unreachable_fix(err: &str, server: &str) -> String {
    if err.contains("unauthorized") {
        "the credentials were rejected: renew the client certificate or token (k3s re-signs it at restart)".into()
    } else if err.contains("TLS") {
        "check the kubeconfig's certificate-authority and the API server address".into()
    } else {
        format!(
            "is the API server at {server} up and reachable from this node? check kubernetes.kubeconfig / --kubeconfig"
        )
    }
}

/// Check 6: reachability, version and served resource.k8s.io versions. Returns the
/// client when the server answered.
pub async fn api_server(cfg: &Config) -> (CheckResult, Option<Client>) {
    let client = match doctor_client(cfg) {
        Ok(c) => c,
        Err(crate::kube::Error::NoCredentials { tried }) => {
            let detail = format!("no usable Kubernetes credentials; tried, in order: {}", tried.join("; "));
            let fix = crate::kube::credentials::NO_CREDENTIALS_FIX;
            return (CheckResult::new(API, Status::Fail, detail, fix), None);
        }
        Err(e) => {
            let fix =
                "fix the credentials named, or point kubernetes.kubeconfig (--kubeconfig) at a working kubeconfig";
            return (CheckResult::new(API, Status::Fail, crate::util::error_chain(&e), fix), None);
        }
    };
    let server = client.server_url().to_string();
    let version = match bounded("GET /version", client.server_version()).await {
        Ok(v) => v,
        Err(e) => {
            let fix = unreachable_fix(&e, &server);
            return (CheckResult::new(API, Status::Fail, e, fix), None);
        }
    };
    let served = match bounded("GET /apis/resource.k8s.io", client.resource_api_versions()).await {
        Ok(v) => v,
        Err(e) => {
            let fix = unreachable_fix(&e, &server);
            return (
                CheckResult::new(API, Status::Fail, format!("Kubernetes {version} at {server}: {e}"), fix),
                Some(client),
            );
        }
    };
    let chosen = crate::kube::ResourceApi::PREFERENCE.into_iter().find(|a| served.iter().any(|v| v == a.version()));
    let shown = if served.is_empty() { "none".to_string() } else { served.join(", ") };
    let result = match chosen {
        Some(api) => CheckResult::pass(
            API,
            format!("Kubernetes {version} at {server}; resource.k8s.io served: {shown}; edra uses {}", api.version()),
        ),
        None => CheckResult::new(
            API,
            Status::Fail,
            format!("Kubernetes {version} at {server} serves no resource.k8s.io version edra speaks (served: {shown})"),
            enable_dra_hint(&version),
        ),
    };
    (result, Some(client))
}

/// The actions edra performs, as access checks for node `node` and driver `driver`.
pub fn needed_access(node: &str, driver: &str) -> Vec<AccessCheck> {
    let g = "resource.k8s.io";
    let selector = format!("spec.nodeName={node},spec.driver={driver}");
    let mut v: Vec<AccessCheck> =
        ["create", "update", "delete", "get"].iter().map(|verb| AccessCheck::new(verb, g, "resourceslices")).collect();
    v.push(AccessCheck::new("list", g, "resourceslices").with_field_selector(&selector));
    v.push(AccessCheck::new("watch", g, "resourceslices").with_field_selector(&selector));
    v.push(AccessCheck::new("get", g, "resourceclaims"));
    v.push(AccessCheck::new("get", "", "nodes").named(node));
    v
}

/// What `claims.prefetch` asks for: a list and a watch of the pods bound to `node`.
pub fn prefetch_access(node: &str) -> Vec<AccessCheck> {
    let selector = format!("spec.nodeName={node}");
    ["list", "watch"].iter().map(|verb| AccessCheck::new(verb, "", "pods").with_field_selector(&selector)).collect()
}

/// Actions edra can do without: reading claims before the kubelet asks needs the pod watch,
/// preparing does not.
fn optional(check: &AccessCheck) -> bool {
    check.group.is_empty() && check.resource == "pods"
}

/// Actions the node authorizer decides per object (edra's own slices, claims of pods on
/// the node), so a review without an object cannot grant them to a node identity.
fn per_object(check: &AccessCheck) -> bool {
    matches!(
        (check.resource.as_str(), check.verb.as_str()),
        ("resourceslices", "get" | "update" | "delete") | ("resourceclaims", "get")
    )
}

/// Check 7 from the reviews' answers: `who` when the server said; `node` is edra's node name.
pub fn evaluate_permissions(
    who: Option<&SubjectInfo>,
    node: &str,
    answers: &[(AccessCheck, Result<AccessDecision, String>)],
) -> CheckResult {
    let identity_node = who.and_then(SubjectInfo::node_name);
    let user = who.map(|w| w.username.as_str()).unwrap_or("(unknown identity)");
    if let Some(n) = identity_node
        && n != node
    {
        return CheckResult::new(
            PERMS,
            Status::Fail,
            format!("the credentials are node {n}'s ({user}) but edra's node_name is {node}"),
            "use this node's own kubelet credentials, or set node_name (--node-name) to match",
        );
    }
    let mut denied = Vec::new();
    let mut optional_denied = Vec::new();
    let mut per_object_notes = 0;
    let mut unknown = Vec::new();
    for (check, answer) in answers {
        match answer {
            Ok(d) if d.allowed => {}
            Ok(_) if identity_node.is_some() && per_object(check) => per_object_notes += 1,
            Ok(_) if optional(check) => optional_denied.push(check.describe()),
            Ok(d) => {
                let why = [d.reason.as_str(), d.evaluation_error.as_str()]
                    .into_iter()
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join("; ");
                denied.push(if why.is_empty() { check.describe() } else { format!("{} ({why})", check.describe()) });
            }
            Err(e) => unknown.push(format!("{}: {e}", check.describe())),
        }
    }
    if !denied.is_empty() {
        let fix = match identity_node {
            Some(_) => "node identities get these rights from the node authorizer: run kube-apiserver with \
                        --authorization-mode=Node,RBAC and keep the system:node ClusterRole bindings"
                .to_string(),
            None => format!(
                "bind {user} to a ClusterRole allowing resourceslices.resource.k8s.io \
                 get/list/watch/create/update/delete, resourceclaims.resource.k8s.io get and nodes get"
            ),
        };
        return CheckResult::new(PERMS, Status::Fail, format!("{user} may not: {}", denied.join("; ")), fix);
    }
    if !unknown.is_empty() {
        return CheckResult::new(
            PERMS,
            Status::Warn,
            format!("{user}: could not ask about {}", unknown.join("; ")),
            "check that authorization.k8s.io/v1 SelfSubjectAccessReview is allowed for edra's identity",
        );
    }
    if !optional_denied.is_empty() {
        return CheckResult::new(
            PERMS,
            Status::Warn,
            format!(
                "{user} may do what preparing needs but not {}: claims are read when the kubelet asks, not before \
                 (claims.prefetch)",
                optional_denied.join("; ")
            ),
            "allow list and watch of pods (config/rbac.yaml), or set claims.prefetch = false",
        );
    }
    let mut detail = format!("{user} may do all {} actions edra needs", answers.len());
    if per_object_notes > 0 {
        detail = format!(
            "{user}: {} actions allowed; {per_object_notes} (get/update/delete of slices, get of claims) are decided \
             per object by the node authorizer: edra's own slices and claims of pods on {node}",
            answers.len() - per_object_notes
        );
    }
    CheckResult::pass(PERMS, detail)
}

/// Check 7: asks the server about every action edra performs.
pub async fn api_permissions(cfg: &Config, client: &Client) -> CheckResult {
    let who = bounded("POST selfsubjectreviews", client.self_subject_review()).await.ok();
    let mut checks = needed_access(&cfg.node_name, &cfg.driver_name);
    if cfg.prefetch_claims {
        checks.extend(prefetch_access(&cfg.node_name));
    }
    let answers =
        join_all(checks.iter().map(|c| bounded("POST selfsubjectaccessreviews", client.self_subject_access_review(c))))
            .await;
    let pairs: Vec<_> = checks.into_iter().zip(answers).collect();
    evaluate_permissions(who.as_ref(), &cfg.node_name, &pairs)
}

/// How this node's published slices offer its GPUs, against `[sharing]`: a server that
/// dropped consumable capacity shows as shares configured but none published.
pub fn evaluate_sharing(sharing: &SharingSettings, slices: &[ResourceSlice]) -> CheckResult {
    let devices: Vec<_> = slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).collect();
    if devices.is_empty() {
        return CheckResult::skip(SHARES, "no devices of this node are published yet (see the agent's log)");
    }
    let shareable = devices.iter().filter(|d| d.allow_multiple_allocations == Some(true)).count();
    let replicas = devices.iter().filter(|d| crate::sharing::replica_name(&d.name).is_some()).count();
    match sharing.mode {
        SharingMode::Exclusive => {
            CheckResult::pass(SHARES, format!("sharing.mode is exclusive: {} devices, one claim each", devices.len()))
        }
        SharingMode::Replicas => {
            CheckResult::pass(SHARES, format!("{replicas} replica devices published{}", enforced(sharing)))
        }
        SharingMode::Shares if shareable > 0 => CheckResult::pass(
            SHARES,
            format!(
                "{shareable} GPUs published as shareable (consumable capacity; claims ask for memory){}",
                enforced(sharing)
            ),
        ),
        SharingMode::Shares => CheckResult::new(
            SHARES,
            Status::Warn,
            format!(
                "sharing.mode is shares but no device is published as shareable ({} devices, {replicas} of them \
                 replicas): the API server drops consumable capacity (its DRAConsumableCapacity gate is off, or it \
                 is older than Kubernetes 1.34), or sharing.gpus selects no GPU",
                devices.len()
            ),
            "enable DRAConsumableCapacity on kube-apiserver and kube-scheduler and restart edra, or set \
             sharing.mode = \"replicas\" (or sharing.fallback = \"replicas\") to share GPUs without it",
        ),
    }
}

/// Dynamic MIG as published: whether the GPUs `[mig] dynamic` selects went out carved
/// (counter sets), and which of them have MIG instances edra did not create (their counter
/// set is published but the whole GPU is not).
pub fn evaluate_mig(mig: &crate::dynamic_mig::MigSettings, slices: &[ResourceSlice]) -> CheckResult {
    if !mig.any() {
        return CheckResult::pass(MIG, "static MIG: MIG devices are published as they exist ([mig] dynamic is empty)");
    }
    let devices: Vec<_> = slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).collect();
    if devices.is_empty() {
        return CheckResult::skip(MIG, "no devices of this node are published yet (see the agent's log)");
    }
    let sets: Vec<&str> =
        slices.iter().flat_map(|s| s.spec.shared_counters.iter().flatten()).map(|c| c.name.as_str()).collect();
    if sets.is_empty() {
        return CheckResult::new(
            MIG,
            Status::Warn,
            format!(
                "[mig] dynamic selects GPUs but no counter set is published ({} devices, static): the API server \
                 has no partitionable devices (its {} gate is off, it is older than Kubernetes 1.35 or serves \
                 only v1beta1/v1beta2), or no selected GPU is a MIG-capable GPU in MIG mode",
                devices.len(),
                crate::dynamic_mig::FEATURE_GATE
            ),
            format!(
                "enable {} on kube-apiserver and kube-scheduler (on by default from 1.36) and restart edra; enable \
                 MIG mode with `nvidia-smi -i <gpu> -mig 1`; the agent's log says which applies",
                crate::dynamic_mig::FEATURE_GATE
            ),
        );
    }
    let partly: Vec<String> = sets
        .iter()
        .filter_map(|set| set.strip_suffix("-counters"))
        .filter(|gpu| !devices.iter().any(|d| d.name == *gpu))
        .map(str::to_string)
        .collect();
    let mig_devices = devices.iter().filter(|d| d.consumes_counters.is_some()).count();
    if partly.is_empty() {
        CheckResult::pass(
            MIG,
            format!("{} GPUs published for dynamic MIG ({mig_devices} devices consume their counters)", sets.len()),
        )
    } else {
        CheckResult::new(
            MIG,
            Status::Warn,
            format!(
                "{} GPUs published for dynamic MIG; {} carry MIG instances edra did not create: their space and \
                 the whole GPU are not offered",
                sets.len(),
                partly.join(", ")
            ),
            "destroy those instances (nvidia-smi mig -dci, then -dgi) if nothing uses them; edra never does",
        )
    }
}

/// What a shared GPU gets from edra, after the published figures: nothing for
/// `sharing.enforcement = "none"`.
fn enforced(sharing: &SharingSettings) -> String {
    match sharing.enforcement {
        crate::sharing::Enforcement::None => String::new(),
        crate::sharing::Enforcement::TimeSlicing(i) => {
            format!("; sharing.enforcement = timeslicing: a shared GPU is time-sliced ({i:?}) while it has shares")
        }
        crate::sharing::Enforcement::Mps => "; sharing.enforcement = mps: a shared GPU runs one MPS daemon while it \
                                             has shares, each share's pinned memory limited"
            .to_string(),
    }
}

/// Check 8 and 9: how the GPUs are offered as published (needs the API server).
pub async fn published_offers(cfg: &Config, client: &Client) -> (CheckResult, CheckResult) {
    let selector = format!("spec.nodeName={},spec.driver={}", cfg.node_name, cfg.driver_name);
    let listed = async {
        let api = client.discover_resource_api().await?;
        client.list_slices(api, &selector).await
    };
    match bounded("list ResourceSlices", listed).await {
        Ok(list) => (evaluate_sharing(&cfg.sharing, &list.items), evaluate_mig(&cfg.mig, &list.items)),
        Err(e) => (
            CheckResult::skip(SHARES, format!("cannot list this node's ResourceSlices: {e}")),
            CheckResult::skip(MIG, format!("cannot list this node's ResourceSlices: {e}")),
        ),
    }
}

/// Checks 6 to 9.
pub async fn checks(cfg: &Config) -> Vec<CheckResult> {
    let (api, client) = api_server(cfg).await;
    let unreachable = "the API server could not be reached (see api-server)";
    let (perms, status, (sharing, mig)) = match &client {
        Some(c) => (api_permissions(cfg, c).await, claim_status(cfg, c).await, published_offers(cfg, c).await),
        None => (
            CheckResult::skip(PERMS, unreachable),
            CheckResult::skip(super::claim_status::NAME, unreachable),
            (CheckResult::skip(SHARES, unreachable), CheckResult::skip(MIG, unreachable)),
        ),
    };
    vec![api, perms, status, sharing, mig]
}

/// Whether edra may write its entries in claim status.
async fn claim_status(cfg: &Config, client: &Client) -> CheckResult {
    let who = bounded("POST selfsubjectreviews", client.self_subject_review()).await.ok();
    let checks = super::claim_status::needed(&cfg.driver_name);
    let answers =
        join_all(checks.iter().map(|c| bounded("POST selfsubjectaccessreviews", client.self_subject_access_review(c))))
            .await;
    super::claim_status::evaluate(who.as_ref(), &answers)
}

#[cfg(test)]
mod tests;
