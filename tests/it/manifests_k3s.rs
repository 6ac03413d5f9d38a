//! edra-k3s.yaml, as packaging/build-k3s-manifest.sh writes it: every object the DaemonSet
//! needs on k3s (namespace, service account, RBAC with claim status, admission policy,
//! DeviceClasses, DaemonSet), each one equal to its document in config/, each a valid API
//! object, and the DaemonSet naming this version's image archive, never pulled.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::{Doc, check_typed, docs, parse_docs};

/// The script's output for `args`, parsed, and the file's text.
fn generate(args: &[&str]) -> (Vec<Doc>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("edra-k3s.yaml");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/build-k3s-manifest.sh");
    let run = Command::new("bash").arg(&script).args(args).arg("--out").arg(&out).output().expect("run bash");
    assert!(run.status.success(), "build-k3s-manifest.sh: {}", String::from_utf8_lossy(&run.stderr));
    let text = std::fs::read_to_string(&out).expect("read edra-k3s.yaml");
    (parse_docs("edra-k3s.yaml", &text), text)
}

/// (apiVersion, kind, namespace, name) of a document.
fn key(doc: &Doc) -> (String, String, String, String) {
    let (api, kind) = doc.kind();
    let ns = doc.value["metadata"]["namespace"].as_str().unwrap_or("").to_string();
    (api.to_string(), kind.to_string(), ns, doc.name().to_string())
}

/// The documents of `files` in config/, by key.
fn config_objects(files: &[&str]) -> BTreeMap<(String, String, String, String), Value> {
    docs().into_iter().filter(|d| files.contains(&d.file())).map(|d| (key(&d), d.value)).collect()
}

fn check(args: &[&str], classes: &str, class_version: &str) {
    let (generated, text) = generate(args);
    let mut objects = BTreeMap::new();
    for doc in &generated {
        check_typed(doc);
        assert!(objects.insert(key(doc), doc.value.clone()).is_none(), "{}: {:?} twice", doc.at, key(doc));
    }
    let expected = config_objects(&["daemonset.yaml", "rbac.yaml", "admission-policy.yaml", classes]);
    assert_eq!(objects.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>(), "the objects differ");
    for (k, v) in &expected {
        assert_eq!(&objects[k], v, "{k:?} differs from config/");
    }
    let kinds: Vec<(&str, &str)> = objects.keys().map(|(a, k, _, _)| (a.as_str(), k.as_str())).collect();
    for want in [
        ("v1", "Namespace"),
        ("v1", "ServiceAccount"),
        ("rbac.authorization.k8s.io/v1", "ClusterRole"),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"),
        (class_version, "DeviceClass"),
        ("apps/v1", "DaemonSet"),
    ] {
        assert!(kinds.contains(&want), "edra-k3s.yaml lacks a {want:?}: {kinds:?}");
    }
    // The Namespace first: the objects after it live in it.
    assert_eq!(generated[0].kind(), ("v1", "Namespace"));
    let role = objects.iter().find(|(k, _)| k.1 == "ClusterRole").map(|(_, v)| v).expect("a ClusterRole");
    let claim_status = role["rules"].as_array().into_iter().flatten().any(|r| {
        r["resources"] == serde_json::json!(["resourceclaims/status"]) && r["verbs"] == serde_json::json!(["patch"])
    });
    assert!(claim_status, "the ClusterRole lets edra write claim status: {role}");
    let image = format!("localhost/edra:{}", env!("CARGO_PKG_VERSION"));
    let ds = objects.iter().find(|(k, _)| k.1 == "DaemonSet").map(|(_, v)| v).expect("a DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let containers: Vec<&Value> =
        ["initContainers", "containers"].iter().flat_map(|k| pod[*k].as_array().into_iter().flatten()).collect();
    assert_eq!(containers.len(), 2);
    for c in containers {
        assert_eq!(c["image"], image.as_str(), "{}", c["name"]);
        assert_eq!(c["imagePullPolicy"], "IfNotPresent", "{}: the archive is imported, never pulled", c["name"]);
    }
    assert!(text.contains(&format!("edra-{}-<amd64|arm64>.oci.tar.zst", env!("CARGO_PKG_VERSION"))), "{text}");
}

#[test]
fn edra_k3s_yaml_holds_every_object_of_config_as_it_is() {
    check(&[], "deviceclasses.yaml", "resource.k8s.io/v1");
}

#[test]
fn edra_k3s_yaml_for_kubernetes_1_32_and_1_33_takes_the_v1beta1_device_classes() {
    check(&["--v1beta1"], "deviceclasses-v1beta1.yaml", "resource.k8s.io/v1beta1");
}

/// The init container installs the hook where the CDI specs name it, with edra itself
/// (the image has no shell).
#[test]
fn the_init_container_installs_the_hook_binary_the_specs_name() {
    let (generated, _) = generate(&[]);
    let ds = generated.iter().find(|d| d.kind() == ("apps/v1", "DaemonSet")).expect("a DaemonSet");
    let pod = &ds.value["spec"]["template"]["spec"];
    let hook_binary = pod["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "EDRA_CDI_HOOK_BINARY")
        .and_then(|e| e["value"].as_str())
        .expect("EDRA_CDI_HOOK_BINARY");
    let init = &pod["initContainers"][0];
    assert_eq!(init["command"], serde_json::json!(["/usr/bin/edra", "install-hook", hook_binary]));
    let mounted = init["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["mountPath"].as_str())
        .any(|p| Path::new(hook_binary).starts_with(p));
    assert!(mounted, "{hook_binary} is on a volume of the init container");
}
