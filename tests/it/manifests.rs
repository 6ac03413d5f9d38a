//! The Kubernetes manifests in config/ (shipped under /usr/share/edra/manifests): every
//! YAML document parses as the API type its apiVersion and kind name, carries no field
//! that type lacks (the API server would drop it, or kubectl reject it), keeps the rules
//! the API server enforces, and agrees with the other documents and with edra itself
//! (the DaemonSet's environment is a valid edra configuration whose paths are all
//! mounted; selectors name attributes edra publishes).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use edra::config::{Config, LoadContext, Overrides};
use edra::inventory::DeviceBackend;
use k8s_openapi::api::{admissionregistration::v1 as admission, apps::v1 as apps, core::v1 as core};
use k8s_openapi::api::{rbac::v1 as rbac, resource::v1 as resource, resource::v1beta1 as resource_beta};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

const DRIVER: &str = "gpu.edra.dev";

/// One YAML document of one file.
struct Doc {
    at: String,
    value: Value,
}

impl Doc {
    fn kind(&self) -> (&str, &str) {
        (self.value["apiVersion"].as_str().unwrap_or(""), self.value["kind"].as_str().unwrap_or(""))
    }
    fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or("")
    }
    fn file(&self) -> &str {
        self.at.split('#').next().unwrap_or("")
    }
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read config dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            // config/monitoring/ holds Prometheus rules, not Kubernetes objects (tests/it/monitoring.rs).
            if !path.ends_with("monitoring") {
                yaml_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
}

/// Every non-empty document of every YAML file under config/.
fn docs() -> Vec<Doc> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut files = Vec::new();
    yaml_files(&root, &mut files);
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read manifest");
        let rel = file.strip_prefix(&root).expect("under config").display().to_string();
        out.extend(parse_docs(&rel, &text));
    }
    out
}

/// The non-empty documents of the YAML `text` of file `rel`.
fn parse_docs(rel: &str, text: &str) -> Vec<Doc> {
    let mut out = Vec::new();
    for (i, de) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let yaml: yaml_serde::Value =
            serde::Deserialize::deserialize(de).unwrap_or_else(|e| panic!("{rel}: document {i}: {e}"));
        if yaml.is_null() {
            continue;
        }
        let value = serde_json::to_value(&yaml).unwrap_or_else(|e| panic!("{rel}: document {i}: {e}"));
        out.push(Doc { at: format!("{rel}#{i}"), value });
    }
    out
}

fn of_kind<'a>(docs: &'a [Doc], api_version: &str, kind: &str) -> Vec<&'a Doc> {
    docs.iter().filter(|d| d.kind() == (api_version, kind)).collect()
}

/// Parses `doc` as `T` and fails on any field `T` does not know: such a field is lost in
/// the round trip back to JSON.
fn typed<T: DeserializeOwned + Serialize>(doc: &Doc) -> T {
    let parsed: T = serde_json::from_value(doc.value.clone()).unwrap_or_else(|e| panic!("{}: {e}", doc.at));
    let back = serde_json::to_value(&parsed).expect("serialize");
    if let Some(diff) = first_difference(&doc.value, &back, String::new()) {
        panic!("{}: field {diff} is not part of {:?}", doc.at, doc.kind());
    }
    parsed
}

fn first_difference(a: &Value, b: &Value, path: String) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => x.iter().find_map(|(k, v)| match y.get(k) {
            Some(w) => first_difference(v, w, format!("{path}.{k}")),
            None => Some(format!("{path}.{k}")),
        }),
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            x.iter().zip(y).enumerate().find_map(|(i, (v, w))| first_difference(v, w, format!("{path}[{i}]")))
        }
        _ if a == b => None,
        _ => Some(format!("{path} ({a} became {b})")),
    }
}

fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// The `config/` document set must contain each kind edra documents.
#[test]
fn every_document_is_a_known_kind_without_unknown_fields() {
    let docs = docs();
    let mut seen = BTreeMap::<(String, String), usize>::new();
    for doc in &docs {
        let (api_version, kind) = doc.kind();
        *seen.entry((api_version.to_string(), kind.to_string())).or_default() += 1;
        let name = doc.name();
        let namespaced = !matches!(
            kind,
            "Namespace"
                | "DeviceClass"
                | "ClusterRole"
                | "ClusterRoleBinding"
                | "ValidatingAdmissionPolicy"
                | "ValidatingAdmissionPolicyBinding"
        );
        let name_ok = if kind == "Namespace" { is_dns_label(name) } else { is_dns_subdomain(name) };
        assert!(name_ok, "{}: metadata.name {name:?} is not a valid {kind} name", doc.at);
        if let Some(ns) = doc.value["metadata"].get("namespace") {
            assert!(namespaced, "{}: a {kind} has no namespace", doc.at);
            assert!(ns.as_str().is_some_and(is_dns_label), "{}: bad namespace {ns}", doc.at);
        }
        check_typed(doc);
    }
    let have = |api: &str, kind: &str| seen.get(&(api.to_string(), kind.to_string())).copied().unwrap_or(0);
    assert_eq!(have("resource.k8s.io/v1", "DeviceClass"), 2);
    assert_eq!(have("resource.k8s.io/v1beta1", "DeviceClass"), 2);
    assert_eq!(have("apps/v1", "DaemonSet"), 1);
    // The DaemonSet's (rbac.yaml) and the opt-in claim status grant for node identities.
    assert_eq!(have("rbac.authorization.k8s.io/v1", "ClusterRole"), 2);
    assert_eq!(have("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"), 1);
    assert!(have("v1", "Pod") >= 5, "examples: {seen:?}");
    assert!(
        have("resource.k8s.io/v1", "ResourceClaim") >= 2 && have("resource.k8s.io/v1", "ResourceClaimTemplate") >= 3
    );
}

/// Parses `doc` as the API type its apiVersion and kind name ([`typed`]).
fn check_typed(doc: &Doc) {
    let (api_version, kind) = doc.kind();
    match (api_version, kind) {
        ("v1", "Namespace") => drop(typed::<core::Namespace>(doc)),
        ("v1", "ServiceAccount") => drop(typed::<core::ServiceAccount>(doc)),
        ("v1", "Pod") => drop(typed::<core::Pod>(doc)),
        ("apps/v1", "DaemonSet") => drop(typed::<apps::DaemonSet>(doc)),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => drop(typed::<rbac::ClusterRole>(doc)),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => drop(typed::<rbac::ClusterRoleBinding>(doc)),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            drop(typed::<admission::ValidatingAdmissionPolicy>(doc))
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            drop(typed::<admission::ValidatingAdmissionPolicyBinding>(doc))
        }
        ("resource.k8s.io/v1", "DeviceClass") => drop(typed::<resource::DeviceClass>(doc)),
        ("resource.k8s.io/v1beta1", "DeviceClass") => drop(typed::<resource_beta::DeviceClass>(doc)),
        ("resource.k8s.io/v1", "ResourceClaim") => drop(typed::<resource::ResourceClaim>(doc)),
        ("resource.k8s.io/v1", "ResourceClaimTemplate") => drop(typed::<resource::ResourceClaimTemplate>(doc)),
        other => panic!("{}: no checks for {other:?}; add them to this test", doc.at),
    }
}

/// The device types and attribute names a mock node with MIG and a Jetson publish.
fn published_vocabulary() -> (BTreeSet<String>, BTreeSet<String>, BTreeSet<String>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("edra.toml");
    let toml = "backend = \"mock\"\nnode_name = \"n\"\n[mock]\ngpus = 2\n\
                mig = [{ gpu = 1, profiles = [\"1g.10gb\", \"3g.40gb\"] }]\n";
    std::fs::write(&file, toml).expect("write config");
    let ctx = LoadContext {
        explicit_file: Some(file),
        default_file: dir.path().join("absent.toml"),
        env: Vec::new(),
        overrides: Overrides::default(),
        hostname: None,
    };
    let cfg = Config::load(&ctx).expect("mock config");
    let inventory = edra::inventory::mock::MockBackend::new(&cfg).discover().expect("mock inventory");
    // A Jetson's integrated GPU (a fake Orin) adds its attributes.
    crate::support::tegra::make(dir.path(), &[("libcuda.so.1.1", b"cuda")]);
    let mut jetson = cfg.clone();
    jetson.paths = edra::config::Paths::under(dir.path());
    jetson.nvml.library = "libnvidia-ml-absent-for-tests.so.1".into();
    let integrated = edra::inventory::tegra::TegraBackend::load(&jetson).expect("a fake Jetson").discover();
    let (mut types, mut attributes, mut capacity) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    for d in inventory.devices.iter().chain(&integrated.expect("its inventory").devices) {
        attributes.extend(d.attributes.keys().cloned());
        capacity.extend(d.capacity.keys().cloned());
        if let Some(edra::inventory::AttributeValue::String(t)) = d.attributes.get("type") {
            types.insert(t.clone());
        }
    }
    (types, attributes, capacity)
}

/// Every CEL expression of every document, with where it is.
fn cel_expressions(docs: &[Doc]) -> Vec<(String, String)> {
    fn walk(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(e)) = m.get("cel").and_then(|c| c.get("expression")) {
                    out.push((at.to_string(), e.clone()));
                }
                m.values().for_each(|x| walk(x, at, out));
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, at, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    docs.iter().for_each(|d| walk(&d.value, &d.at, &mut out));
    out
}

/// The names used as `<map>["gpu.edra.dev"].<name>` in a CEL expression.
fn names_after(expr: &str, map: &str) -> Vec<String> {
    let needle = format!("{map}[\"{DRIVER}\"].");
    expr.match_indices(&needle)
        .map(|(i, _)| expr[i + needle.len()..].chars().take_while(|c| c.is_ascii_alphanumeric()).collect())
        .collect()
}

#[test]
fn device_classes_select_edra_devices_by_published_type() {
    let docs = docs();
    let (types, _, _) = published_vocabulary();
    assert_eq!(types, BTreeSet::from(["gpu".to_string(), "mig".to_string()]));
    for api in ["resource.k8s.io/v1", "resource.k8s.io/v1beta1"] {
        let classes = of_kind(&docs, api, "DeviceClass");
        let names: BTreeSet<&str> = classes.iter().map(|d| d.name()).collect();
        assert_eq!(names, BTreeSet::from(["gpu.edra.dev", "mig.edra.dev"]), "{api}");
        for class in classes {
            let selectors = class.value["spec"]["selectors"].as_array().cloned().unwrap_or_default();
            assert!(!selectors.is_empty() && selectors.len() <= 32, "{}: 1 to 32 selectors", class.at);
            let exprs: Vec<&str> = selectors.iter().filter_map(|s| s["cel"]["expression"].as_str()).collect();
            assert_eq!(exprs.len(), selectors.len(), "{}: every selector is a CEL expression", class.at);
            let all = exprs.join(" && ");
            assert!(all.contains(&format!("device.driver == \"{DRIVER}\"")), "{}: must select the driver", class.at);
            let wanted = class.name().split('.').next().unwrap_or("");
            assert!(types.contains(wanted), "{}: edra publishes no type {wanted:?}", class.at);
            assert!(
                all.contains(&format!("device.attributes[\"{DRIVER}\"].type == \"{wanted}\"")),
                "{}: must select type {wanted}",
                class.at
            );
            let extended = class.value["spec"].get("extendedResourceName").and_then(Value::as_str);
            match (api, class.name(), extended) {
                ("resource.k8s.io/v1", "gpu.edra.dev", Some(name)) => {
                    let (domain, resource) = name.split_once('/').expect("domain-qualified extended resource");
                    assert!(is_dns_subdomain(domain) && !domain.ends_with("kubernetes.io"), "{name}");
                    assert!(!resource.is_empty() && resource.len() <= 63, "{name}");
                }
                (_, _, None) => {}
                _ => panic!("{}: extendedResourceName only on the v1 whole-GPU class", class.at),
            }
        }
    }
}

#[test]
fn cel_expressions_name_published_attributes_and_capacities() {
    let docs = docs();
    let (_, attributes, capacity) = published_vocabulary();
    let exprs = cel_expressions(&docs);
    assert!(exprs.len() >= 6, "found only {} CEL expressions", exprs.len());
    for (at, e) in exprs {
        assert!(e.len() <= 10 * 1024, "{at}: CEL expression longer than 10 KiB");
        assert!(e.contains("device."), "{at}: {e:?} does not look at the device");
        let count = |c: char| e.chars().filter(|x| *x == c).count();
        assert_eq!(count('('), count(')'), "{at}: unbalanced parentheses in {e:?}");
        assert_eq!(count('['), count(']'), "{at}: unbalanced brackets in {e:?}");
        assert_eq!(count('"') % 2, 0, "{at}: unbalanced quotes in {e:?}");
        for name in names_after(&e, "device.attributes") {
            assert!(attributes.contains(&name), "{at}: edra publishes no attribute {name:?} ({attributes:?})");
        }
        for name in names_after(&e, "device.capacity") {
            assert!(capacity.contains(&name), "{at}: edra publishes no capacity {name:?} ({capacity:?})");
        }
    }
}

#[test]
fn claims_request_existing_classes_with_valid_configs() {
    let docs = docs();
    let classes: BTreeSet<&str> =
        of_kind(&docs, "resource.k8s.io/v1", "DeviceClass").iter().map(|d| d.name()).collect();
    let mut specs = Vec::new();
    for d in of_kind(&docs, "resource.k8s.io/v1", "ResourceClaim") {
        specs.push((d.at.clone(), d.value["spec"].clone()));
    }
    for d in of_kind(&docs, "resource.k8s.io/v1", "ResourceClaimTemplate") {
        specs.push((d.at.clone(), d.value["spec"]["spec"].clone()));
    }
    let mut configs = 0;
    for (at, spec) in specs {
        let requests = spec["devices"]["requests"].as_array().cloned().unwrap_or_default();
        assert!(!requests.is_empty() && requests.len() <= 32, "{at}: 1 to 32 requests");
        let mut names = BTreeSet::new();
        for r in &requests {
            let name = r["name"].as_str().unwrap_or("");
            assert!(is_dns_label(name), "{at}: request name {name:?} is not a DNS label");
            assert!(names.insert(name.to_string()), "{at}: request {name} twice");
            let exactly = r.get("exactly").unwrap_or_else(|| panic!("{at}: request {name} needs `exactly` (v1)"));
            assert!(r.get("firstAvailable").is_none(), "{at}: exactly one of exactly/firstAvailable");
            let class = exactly["deviceClassName"].as_str().unwrap_or("");
            assert!(classes.contains(class), "{at}: no DeviceClass {class:?} in config/deviceclasses.yaml");
            if let Some(count) = exactly.get("count") {
                assert!(count.as_i64().is_some_and(|c| c > 0), "{at}: count must be positive");
            }
        }
        for c in spec["devices"]["config"].as_array().cloned().unwrap_or_default() {
            for r in c["requests"].as_array().cloned().unwrap_or_default() {
                let r = r.as_str().unwrap_or("");
                assert!(names.contains(r.split('/').next().unwrap_or("")), "{at}: config names unknown request {r}");
            }
            assert_eq!(c["opaque"]["driver"], DRIVER, "{at}: config for another driver");
            let params = &c["opaque"]["parameters"];
            assert!(params.is_object(), "{at}: opaque parameters must be a JSON object");
            assert!(serde_json::to_vec(params).expect("json").len() <= 10 * 1024, "{at}: parameters over 10 KiB");
            assert_eq!(params["apiVersion"], "gpu.edra.dev/v1alpha1", "{at}");
            assert_eq!(params["kind"], "GpuConfig", "{at}");
            let strategy = params["sharing"]["strategy"].as_str().unwrap_or("");
            assert!(["Exclusive", "TimeSlicing", "MPS"].contains(&strategy), "{at}: sharing.strategy {strategy:?}");
            // edra's own decoder accepts it, as prepare would.
            if let Err(e) = edra::prepare::config::decode(DRIVER, 0, params) {
                panic!("{at}: edra refuses the GpuConfig: {e}");
            }
            configs += 1;
        }
    }
    assert!(configs >= 1, "the examples show an opaque GpuConfig");
}

#[test]
fn pods_use_claims_that_exist() {
    let docs = docs();
    let pods = of_kind(&docs, "v1", "Pod");
    for pod in pods {
        let spec = &pod.value["spec"];
        let mut pod_claims = BTreeSet::new();
        for c in spec["resourceClaims"].as_array().cloned().unwrap_or_default() {
            let name = c["name"].as_str().unwrap_or("").to_string();
            assert!(is_dns_label(&name), "{}: pod claim name {name:?}", pod.at);
            let (claim, template) = (c["resourceClaimName"].as_str(), c["resourceClaimTemplateName"].as_str());
            let (kind, target) = match (claim, template) {
                (Some(n), None) => ("ResourceClaim", n),
                (None, Some(n)) => ("ResourceClaimTemplate", n),
                _ => panic!("{}: claim {name} needs exactly one of resourceClaimName/TemplateName", pod.at),
            };
            let found =
                of_kind(&docs, "resource.k8s.io/v1", kind).iter().any(|d| d.name() == target && d.file() == pod.file());
            assert!(found, "{}: {kind} {target} is not defined next to the pod", pod.at);
            assert!(pod_claims.insert(name), "{}: pod claim listed twice", pod.at);
        }
        let containers = spec["containers"].as_array().cloned().unwrap_or_default();
        assert!(!containers.is_empty(), "{}: a pod needs containers", pod.at);
        let mut used = BTreeSet::new();
        let mut container_names = BTreeSet::new();
        for c in containers {
            let cname = c["name"].as_str().unwrap_or("").to_string();
            assert!(is_dns_label(&cname) && container_names.insert(cname), "{}: container names", pod.at);
            for claim in c["resources"]["claims"].as_array().cloned().unwrap_or_default() {
                let n = claim["name"].as_str().unwrap_or("").to_string();
                assert!(pod_claims.contains(&n), "{}: container uses claim {n:?} the pod does not list", pod.at);
                used.insert(n);
            }
        }
        assert_eq!(used, pod_claims, "{}: every pod claim is used by a container", pod.at);
    }
}

#[path = "manifests_daemonset.rs"]
mod daemonset;

#[path = "manifests_k3s.rs"]
mod k3s;

/// The diagnostics example tolerates exactly the fatal health taints edra sets.
#[test]
fn the_diagnostics_example_tolerates_the_health_taints() {
    let docs = docs();
    let claim = docs
        .iter()
        .find(|d| d.kind() == ("resource.k8s.io/v1", "ResourceClaim") && d.name() == "gpu-diagnostics")
        .expect("config/examples/gpu-diagnostics.yaml has its claim");
    let claim = typed::<resource::ResourceClaim>(claim);
    let requests = claim.spec.and_then(|s| s.devices).and_then(|d| d.requests).unwrap_or_default();
    let tolerations: Vec<(String, String)> = requests
        .first()
        .and_then(|r| r.exactly.as_ref())
        .and_then(|e| e.tolerations.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key.unwrap_or_default(), t.effect.unwrap_or_default()))
        .collect();
    let driver = edra::config::DEFAULT_DRIVER_NAME;
    let expected: Vec<(String, String)> = [edra::health::ConditionKind::Xid, edra::health::ConditionKind::GpuLost]
        .iter()
        .map(|k| (format!("{driver}/{}", k.key()), edra::publish::taints::FATAL_EFFECT.to_string()))
        .collect();
    assert_eq!(tolerations, expected);
}
