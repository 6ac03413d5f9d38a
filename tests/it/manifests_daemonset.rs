//! The DaemonSet, its RBAC and its admission policy agree with each other and with edra:
//! every mount has a volume, the environment is a valid edra configuration, every path
//! edra writes is mounted from the host, and the policy names the service account the
//! pods run as.

use std::collections::BTreeSet;
use std::path::Path;

use edra::config::{Config, LoadContext, Overrides};
use serde_json::Value;

use super::{DRIVER, Doc, docs, is_dns_label, of_kind};

fn daemonset(docs: &[Doc]) -> &Doc {
    let sets = of_kind(docs, "apps/v1", "DaemonSet");
    assert_eq!(sets.len(), 1, "one DaemonSet");
    sets[0]
}

fn list(v: &Value) -> Vec<Value> {
    v.as_array().cloned().unwrap_or_default()
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

#[test]
fn daemonset_mounts_match_volumes_and_selector_matches_labels() {
    let docs = docs();
    let ds = daemonset(&docs);
    let spec = &ds.value["spec"];
    let labels = spec["template"]["metadata"]["labels"].as_object().cloned().unwrap_or_default();
    let selector = spec["selector"]["matchLabels"].as_object().cloned().unwrap_or_default();
    assert!(!selector.is_empty(), "{}: selector needs matchLabels", ds.at);
    for (k, v) in &selector {
        assert_eq!(labels.get(k), Some(v), "{}: selector {k}={v} does not match the template labels", ds.at);
    }
    let pod = &spec["template"]["spec"];
    let mut volumes = BTreeSet::new();
    for v in list(&pod["volumes"]) {
        let name = str_of(&v, "name").to_string();
        assert!(is_dns_label(&name) && volumes.insert(name.clone()), "{}: volume name {name:?}", ds.at);
        if let Some(p) = v["hostPath"]["path"].as_str() {
            assert!(p.starts_with('/'), "{}: hostPath {p} must be absolute", ds.at);
        }
    }
    let containers = list(&pod["containers"]);
    assert!(!containers.is_empty());
    for c in &containers {
        let mut paths = BTreeSet::new();
        for m in list(&c["volumeMounts"]) {
            let name = str_of(&m, "name");
            assert!(volumes.contains(name), "{}: volumeMount {name} has no volume", ds.at);
            let path = str_of(&m, "mountPath").to_string();
            assert!(path.starts_with('/') && paths.insert(path.clone()), "{}: mountPath {path:?}", ds.at);
        }
        assert!(c["image"].as_str().is_some_and(|i| i.contains(':')), "{}: image needs a tag", ds.at);
    }
    let strategy = &spec["updateStrategy"];
    assert_eq!(strategy["type"], "RollingUpdate");
    // The new pod starts while the old one serves and takes the node over (plugin.take_over,
    // checked with the environment): never a node without edra.
    assert_eq!(strategy["rollingUpdate"]["maxSurge"], 1, "{}: maxSurge must be 1", ds.at);
    assert_eq!(strategy["rollingUpdate"]["maxUnavailable"], 0, "{}: maxUnavailable must be 0", ds.at);
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    let ns = str_of(&ds.value["metadata"], "namespace");
    assert!(of_kind(&docs, "v1", "Namespace").iter().any(|d| d.name() == ns), "{}: namespace {ns} not defined", ds.at);
    let sa = str_of(pod, "serviceAccountName");
    let sa_found =
        of_kind(&docs, "v1", "ServiceAccount").iter().any(|d| d.name() == sa && d.value["metadata"]["namespace"] == ns);
    assert!(sa_found, "{}: ServiceAccount {ns}/{sa} not defined", ds.at);
}

/// The container's environment loads as an edra configuration, and every directory that
/// configuration makes edra read or write is inside a mount of the matching host path.
#[test]
fn daemonset_environment_is_a_valid_config_whose_paths_are_mounted() {
    let docs = docs();
    let ds = daemonset(&docs);
    let pod = &ds.value["spec"]["template"]["spec"];
    let c = &list(&pod["containers"])[0];
    let mut env = Vec::new();
    for e in list(&c["env"]) {
        let name = str_of(&e, "name").to_string();
        match e.get("value").and_then(Value::as_str) {
            Some(v) => env.push((name, v.to_string())),
            None if name == "POD_UID" => {
                assert_eq!(e["valueFrom"]["fieldRef"]["fieldPath"], "metadata.uid");
            }
            None => {
                assert_eq!(name, "NODE_NAME", "{}: only NODE_NAME and POD_UID come from the downward API", ds.at);
                assert_eq!(e["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
                env.push((name, "gpu-node-1".to_string()));
            }
        }
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let ctx = LoadContext {
        explicit_file: None,
        default_file: dir.path().join("absent.toml"),
        env,
        overrides: Overrides::default(),
        hostname: None,
    };
    let cfg = Config::load(&ctx).unwrap_or_else(|p| panic!("{}: environment is not a valid config: {p:?}", ds.at));
    assert_eq!(cfg.node_name, "gpu-node-1");
    assert_eq!(cfg.driver_name, DRIVER);
    assert!(cfg.take_over, "{}: the new pod of a surge must take the node over (EDRA_PLUGIN_TAKE_OVER)", ds.at);

    let volumes = list(&pod["volumes"]);
    let host_path_of = |volume: &str| {
        volumes.iter().find(|v| v["name"] == volume).and_then(|v| v["hostPath"]["path"].as_str()).map(str::to_string)
    };
    let mounts: Vec<(String, String, bool)> = list(&c["volumeMounts"])
        .iter()
        .map(|m| {
            let host = host_path_of(str_of(m, "name")).unwrap_or_default();
            (str_of(m, "mountPath").to_string(), host, m["readOnly"] == true)
        })
        .collect();
    let mount_for =
        |p: &Path| mounts.iter().filter(|(mp, _, _)| p.starts_with(mp)).max_by_key(|(mp, _, _)| mp.len()).cloned();
    let writable = [
        &cfg.paths.plugins_dir,
        &cfg.paths.registry_dir,
        &cfg.paths.cdi_dynamic_dir,
        &cfg.paths.state_dir,
        &cfg.paths.dev_root,
        // The handover socket: the old and the new pod of a surge meet there.
        &cfg.paths.runtime_dir,
    ];
    for p in writable {
        let (mp, host, ro) = mount_for(p).unwrap_or_else(|| panic!("{}: {} is not mounted", ds.at, p.display()));
        assert!(!ro, "{}: {} is mounted read-only", ds.at, p.display());
        // The kubelet and the container runtime see these paths from the host: the same
        // path inside and outside.
        assert_eq!(mp, host, "{}: {} must be mounted at its host path", ds.at, p.display());
    }
    let (mp, host, ro) = mount_for(&cfg.paths.driver_root).expect("driver root mounted");
    assert_eq!((mp.as_str(), host.as_str(), ro), ("/driver-root", "/", true), "{}: driver root", ds.at);
    assert_eq!(cfg.paths.driver_root, Path::new("/driver-root"));
}

#[test]
fn rbac_grants_only_what_edra_uses() {
    let docs = docs();
    let roles = of_kind(&docs, "rbac.authorization.k8s.io/v1", "ClusterRole");
    let roles: Vec<_> = roles.into_iter().filter(|r| r.name() == "edra").collect();
    assert_eq!(roles.len(), 1);
    let role = roles[0];
    let known: &[(&str, &str, &[&str])] = &[
        ("resource.k8s.io", "resourceclaims", &["get"]),
        // Claim status: edra's entries by server-side apply; the driver permission only for
        // claims on the pod's own node (associated-node), only for edra's driver.
        ("resource.k8s.io", "resourceclaims/status", &["patch"]),
        ("resource.k8s.io", "resourceclaims/driver", &["associated-node:patch"]),
        ("resource.k8s.io", "resourceslices", &["get", "list", "watch", "create", "update", "delete"]),
        ("", "nodes", &["get"]),
        // claims.prefetch: the watch of the node's own pods.
        ("", "pods", &["list", "watch"]),
        ("authorization.k8s.io", "selfsubjectaccessreviews", &["create"]),
    ];
    let mut granted = BTreeSet::new();
    for rule in list(&role.value["rules"]) {
        let driver_only = list(&rule["resources"]).iter().all(|r| *r == "resourceclaims/driver");
        match rule.get("resourceNames") {
            Some(names) => assert!(driver_only && *names == serde_json::json!(["gpu.edra.dev"]), "{}", role.at),
            None => assert!(!driver_only, "{}: the driver permission must name edra's driver", role.at),
        }
        assert!(rule.get("nonResourceURLs").is_none(), "{}", role.at);
        for g in list(&rule["apiGroups"]) {
            for r in list(&rule["resources"]) {
                for v in list(&rule["verbs"]) {
                    let (g, r, v) = (g.as_str().unwrap_or("*"), r.as_str().unwrap_or("*"), v.as_str().unwrap_or("*"));
                    let allowed = known.iter().any(|(kg, kr, kv)| *kg == g && *kr == r && kv.contains(&v));
                    assert!(allowed, "{}: grants {v} on {g}/{r}, which edra does not use", role.at);
                    granted.insert((g.to_string(), r.to_string(), v.to_string()));
                }
            }
        }
    }
    let needed: BTreeSet<_> = known
        .iter()
        .flat_map(|(g, r, vs)| vs.iter().map(move |v| (g.to_string(), r.to_string(), v.to_string())))
        .collect();
    assert_eq!(granted, needed, "{}: edra needs each of these", role.at);

    let binding = of_kind(&docs, "rbac.authorization.k8s.io/v1", "ClusterRoleBinding");
    let binding: Vec<_> = binding.into_iter().filter(|b| b.name() == "edra").collect();
    assert_eq!(binding.len(), 1);
    let b = &binding[0].value;
    assert_eq!(b["roleRef"]["kind"], "ClusterRole");
    assert_eq!(b["roleRef"]["name"], role.name());
    let ds = daemonset(&docs);
    let (ns, sa) = (
        str_of(&ds.value["metadata"], "namespace"),
        str_of(&ds.value["spec"]["template"]["spec"], "serviceAccountName"),
    );
    let subjects = list(&b["subjects"]);
    assert!(
        subjects.iter().any(|s| s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == ns),
        "{}: must bind the DaemonSet's service account {ns}/{sa}",
        binding[0].at
    );
}

#[test]
fn admission_policy_confines_the_daemonset_service_account_to_its_node() {
    let docs = docs();
    let policies = of_kind(&docs, "admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy");
    let bindings = of_kind(&docs, "admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding");
    assert_eq!((policies.len(), bindings.len()), (1, 1));
    let (policy, binding) = (&policies[0].value["spec"], &bindings[0].value["spec"]);
    assert_eq!(binding["policyName"], policies[0].name());
    let actions: Vec<String> =
        list(&binding["validationActions"]).iter().filter_map(|a| a.as_str().map(str::to_string)).collect();
    assert!(actions.contains(&"Deny".to_string()), "the binding must deny: {actions:?}");
    assert!(actions.iter().all(|a| ["Deny", "Warn", "Audit"].contains(&a.as_str())), "{actions:?}");
    assert_eq!(policy["failurePolicy"], "Fail");

    let rules = list(&policy["matchConstraints"]["resourceRules"]);
    let covers = |what: &str, key: &str| rules.iter().any(|r| list(&r[key]).iter().any(|x| x == what));
    assert!(covers("resourceslices", "resources") && covers("resource.k8s.io", "apiGroups"));
    for version in ["v1", "v1beta2", "v1beta1"] {
        assert!(covers(version, "apiVersions"), "policy must cover resource.k8s.io/{version}");
    }
    for op in ["CREATE", "UPDATE", "DELETE"] {
        assert!(covers(op, "operations"), "policy must cover {op}");
    }
    let ds = daemonset(&docs);
    let user = format!(
        "system:serviceaccount:{}:{}",
        str_of(&ds.value["metadata"], "namespace"),
        str_of(&ds.value["spec"]["template"]["spec"], "serviceAccountName")
    );
    let conditions: Vec<String> =
        list(&policy["matchConditions"]).iter().map(|c| str_of(c, "expression").to_string()).collect();
    assert!(conditions.iter().any(|c| c.contains(&format!("\"{user}\""))), "must match {user}: {conditions:?}");
    let variables = list(&policy["variables"]);
    let variable =
        |name: &str| variables.iter().find(|v| v["name"] == name).map(|v| str_of(v, "expression").to_string());
    let user_node = variable("userNodeName").expect("userNodeName variable");
    assert!(user_node.contains("authentication.kubernetes.io/node-name"), "{user_node}");
    let object_node = variable("objectNodeName").expect("objectNodeName variable");
    assert!(object_node.contains("oldObject") && object_node.contains("nodeName"), "DELETE has only oldObject");
    let validations: Vec<String> =
        list(&policy["validations"]).iter().map(|v| str_of(v, "expression").to_string()).collect();
    assert!(validations.iter().any(|v| v.contains("variables.userNodeName == variables.objectNodeName")));
    assert!(validations.iter().any(|v| v.contains("variables.userNodeName != \"\"")));
    assert!(validations.iter().any(|v| v.contains(&format!("\"{DRIVER}\""))), "must pin the driver name");
}
