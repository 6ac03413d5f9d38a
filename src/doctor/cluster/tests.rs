//! Unit tests of the cluster checks' pure parts: the actions edra asks about, how answers
//! become a result for node and RBAC identities, DRA enablement hints per Kubernetes
//! version, and a bounded failure when no API server listens.

use super::*;
use crate::doctor::test_config;

fn answers(deny: &[(&str, &str)], node: &str) -> Vec<(AccessCheck, Result<AccessDecision, String>)> {
    needed_access(node, "gpu.edra.dev")
        .into_iter()
        .map(|c| {
            let denied = deny.iter().any(|(v, r)| c.verb == *v && c.resource == *r);
            let d = AccessDecision {
                allowed: !denied,
                reason: if denied { "nope".into() } else { String::new() },
                ..Default::default()
            };
            (c, Ok(d))
        })
        .collect()
}

fn node_identity(n: &str) -> SubjectInfo {
    SubjectInfo {
        username: format!("system:node:{n}"),
        groups: vec!["system:nodes".into(), "system:authenticated".into()],
    }
}

#[test]
fn needed_access_covers_every_verb_edra_uses() {
    let v = needed_access("n1", "gpu.edra.dev");
    let described: Vec<String> = v.iter().map(AccessCheck::describe).collect();
    for want in [
        "create resourceslices.resource.k8s.io",
        "delete resourceslices.resource.k8s.io",
        "list resourceslices.resource.k8s.io (spec.nodeName=n1,spec.driver=gpu.edra.dev)",
        "watch resourceslices.resource.k8s.io (spec.nodeName=n1,spec.driver=gpu.edra.dev)",
        "get resourceclaims.resource.k8s.io",
        "get nodes/n1",
    ] {
        assert!(described.iter().any(|d| d == want), "{want} missing from {described:?}");
    }
}

#[test]
fn rbac_identity_with_everything_passes_and_a_denial_fails_with_the_rbac_fix() {
    let who = SubjectInfo { username: "system:serviceaccount:edra:edra".into(), groups: vec![] };
    let r = evaluate_permissions(Some(&who), "n1", &answers(&[], "n1"));
    assert_eq!(r.status, Status::Pass, "{r:?}");
    let r = evaluate_permissions(Some(&who), "n1", &answers(&[("delete", "resourceslices")], "n1"));
    assert_eq!(r.status, Status::Fail);
    assert!(r.detail.contains("delete resourceslices.resource.k8s.io (nope)"), "{}", r.detail);
    assert!(r.fix.contains("ClusterRole") && r.fix.contains("system:serviceaccount:edra:edra"), "{}", r.fix);
}

#[test]
fn node_identity_per_object_denials_are_notes_but_others_fail() {
    let who = node_identity("n1");
    let per_object = [
        ("get", "resourceslices"),
        ("update", "resourceslices"),
        ("delete", "resourceslices"),
        ("get", "resourceclaims"),
    ];
    let r = evaluate_permissions(Some(&who), "n1", &answers(&per_object, "n1"));
    assert_eq!(r.status, Status::Pass, "{r:?}");
    assert!(r.detail.contains("decided per object by the node authorizer"), "{}", r.detail);
    let r = evaluate_permissions(Some(&who), "n1", &answers(&[("create", "resourceslices")], "n1"));
    assert_eq!(r.status, Status::Fail);
    assert!(r.fix.contains("--authorization-mode=Node,RBAC"), "{}", r.fix);
}

#[test]
fn node_identity_of_another_node_fails() {
    let r = evaluate_permissions(Some(&node_identity("other")), "n1", &answers(&[], "n1"));
    assert_eq!(r.status, Status::Fail);
    assert!(r.detail.contains("node other") && r.fix.contains("--node-name"), "{r:?}");
}

#[test]
fn review_errors_warn() {
    let mut a = answers(&[], "n1");
    a[0].1 = Err("POST selfsubjectaccessreviews: no answer within 5s".into());
    let r = evaluate_permissions(None, "n1", &a);
    assert_eq!(r.status, Status::Warn);
    assert!(r.detail.starts_with("(unknown identity): could not ask"), "{}", r.detail);
}

#[test]
fn dra_hints_per_version() {
    assert!(enable_dra_hint("v1.32.5+k3s1").contains("resource.k8s.io/v1beta1=true"));
    assert!(enable_dra_hint("v1.33.1").contains("resource.k8s.io/v1beta2=true"));
    assert!(enable_dra_hint("v1.33.1").contains("/etc/rancher/k3s/config.yaml"));
    assert!(enable_dra_hint("v1.33.1+k3s1").contains("#14286"));
    assert!(!enable_dra_hint("v1.33.1").contains("#14286"));
    assert!(enable_dra_hint("v1.35.0").contains("on by default"));
    assert!(enable_dra_hint("v1.30.2").contains("upgrade"));
}

#[tokio::test]
async fn no_credentials_fail_fast_and_skip_permissions() {
    let d = tempfile::tempdir().unwrap();
    let cfg = test_config(d.path(), &[]);
    let started = std::time::Instant::now();
    let r = checks(&cfg).await;
    assert_eq!((r[0].name, r[0].status), ("api-server", Status::Fail), "{:?}", r[0]);
    assert!(r[0].detail.contains("kubeconfig"), "{}", r[0].detail);
    assert_eq!(r[1].status, Status::Skip);
    assert!(started.elapsed() < NETWORK_TIMEOUT);
}

#[test]
fn published_sharing_is_judged_against_the_configuration() {
    use crate::sharing::{SharingMode, SharingSettings};
    let slice = |devices: serde_json::Value| -> ResourceSlice {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "s"}, "spec": {"driver": "gpu.edra.dev",
            "nodeName": "n1", "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1}, "devices": devices}}))
        .unwrap()
    };
    let shared = slice(serde_json::json!([{"name": "gpu-0", "allowMultipleAllocations": true}, {"name": "gpu-1"}]));
    let dropped = slice(serde_json::json!([{"name": "gpu-0"}, {"name": "gpu-1"}]));
    let replicas = slice(serde_json::json!([{"name": "gpu-0-replica-0"}, {"name": "gpu-0-replica-1"}]));
    let shares = SharingSettings::default();
    let r = evaluate_sharing(&shares, std::slice::from_ref(&shared));
    assert_eq!(r.status, Status::Pass, "{r:?}");
    assert!(r.detail.starts_with("1 GPUs published as shareable"), "{r:?}");
    let r = evaluate_sharing(&shares, std::slice::from_ref(&dropped));
    assert_eq!(r.status, Status::Warn, "{r:?}");
    assert!(r.detail.contains("drops consumable capacity") && r.fix.contains("DRAConsumableCapacity"), "{r:?}");
    let r = evaluate_sharing(&shares, std::slice::from_ref(&replicas));
    assert!(r.status == Status::Warn && r.detail.contains("2 of them replicas"), "the replicas fallback: {r:?}");
    let r = evaluate_sharing(
        &SharingSettings { mode: SharingMode::Replicas, ..shares.clone() },
        std::slice::from_ref(&replicas),
    );
    assert_eq!((r.status, r.detail.as_str()), (Status::Pass, "2 replica devices published"));
    let mps = SharingSettings {
        mode: SharingMode::Replicas,
        enforcement: crate::sharing::Enforcement::Mps,
        ..shares.clone()
    };
    let r = evaluate_sharing(&mps, &[replicas]);
    assert_eq!(
        r.detail,
        "2 replica devices published; sharing.enforcement = mps: a shared GPU runs one MPS daemon while it has shares, \
         each share's pinned memory limited"
    );
    let r = evaluate_sharing(&SharingSettings { mode: SharingMode::Exclusive, ..shares.clone() }, &[dropped]);
    assert_eq!(r.status, Status::Pass);
    assert_eq!(evaluate_sharing(&shares, &[]).status, Status::Skip);
}

#[test]
fn published_mig_is_judged_against_the_configuration() {
    use crate::dynamic_mig::{MigSettings, OwnedInstances};
    use crate::gpu::mig_control::Placement;
    use crate::publish::desired::{NodeIdentity, desired_slices};
    let node = NodeIdentity { name: "n1".into(), uid: None };
    let slices_of = |inv: &crate::inventory::Inventory| -> Vec<ResourceSlice> {
        desired_slices(inv, &node, "gpu.edra.dev", 1)
            .into_iter()
            .enumerate()
            .map(|(i, mut s)| {
                s.metadata.name = Some(format!("s{i}"));
                s
            })
            .collect()
    };
    let dynamic = MigSettings { dynamic: crate::sharing::GpuSelection::All };
    let inv = crate::dynamic_mig::tests::inventory(2);
    let carved = dynamic.published(&inv, &OwnedInstances::new(), true).inventory;
    let r = evaluate_mig(&dynamic, &slices_of(&carved));
    assert_eq!(
        (r.status, r.detail.as_str()),
        (Status::Pass, "2 GPUs published for dynamic MIG (52 devices consume their counters)")
    );
    let r = evaluate_mig(&dynamic, &slices_of(&inv));
    assert_eq!(r.status, Status::Warn, "{r:?}");
    assert!(r.detail.contains("no counter set is published") && r.fix.contains("DRAPartitionableDevices"), "{r:?}");
    let mut foreign = inv.clone();
    foreign.mig_gpus[1].instances.push(crate::dynamic_mig::tests::instance(3, 19, 6, 1));
    let carved = dynamic.published(&foreign, &OwnedInstances::new(), true).inventory;
    let r = evaluate_mig(&dynamic, &slices_of(&carved));
    assert_eq!(r.status, Status::Warn, "{r:?}");
    assert!(r.detail.contains("gpu-1 carry MIG instances edra did not create"), "{r:?}");
    let owned = OwnedInstances::from([(foreign.mig_gpus[1].uuid.clone(), Placement { start: 6, size: 1 })]);
    let carved = dynamic.published(&foreign, &owned, true).inventory;
    assert_eq!(evaluate_mig(&dynamic, &slices_of(&carved)).status, Status::Pass, "edra's own instance");
    let r = evaluate_mig(&MigSettings::default(), &slices_of(&inv));
    assert_eq!(r.status, Status::Pass);
    assert_eq!(evaluate_mig(&dynamic, &[]).status, Status::Skip);
}

#[test]
fn a_denied_pod_watch_is_a_warning_naming_claims_prefetch() {
    let who = SubjectInfo { username: "system:serviceaccount:edra-system:edra".into(), groups: vec![] };
    let mut a = answers(&[], "n1");
    for c in prefetch_access("n1") {
        let allowed = c.verb == "list";
        a.push((c, Ok(AccessDecision { allowed, ..Default::default() })));
    }
    let r = evaluate_permissions(Some(&who), "n1", &a);
    assert_eq!(r.status, Status::Warn, "{r:?}");
    assert!(r.detail.contains("watch pods (spec.nodeName=n1)") && !r.detail.contains("list pods"), "{}", r.detail);
    assert!(r.fix.contains("claims.prefetch = false"), "{}", r.fix);
    let allowed: Vec<_> = prefetch_access("n1")
        .into_iter()
        .map(|c| (c, Ok(AccessDecision { allowed: true, ..Default::default() })))
        .collect();
    let mut a = answers(&[], "n1");
    a.extend(allowed);
    assert_eq!(evaluate_permissions(Some(&who), "n1", &a).status, Status::Pass);
}
