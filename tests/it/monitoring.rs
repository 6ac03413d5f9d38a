//! config/monitoring/ against a running agent (`edra::app::run` with the mock backend and
//! the test API server, scraped over real HTTP): every metric the Grafana dashboard and the
//! Prometheus alert rules name is one edra exports, and the GPU use metrics show what the
//! agent holds (shares and their memory, MIG instances by owner, the state store).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;

use serde_json::Value;

use crate::metrics::{free_port, get, samples};
use crate::support::agent::{Agent, Cluster, DRIVER, NODE, prepare_ok, unprepare_ok};
use crate::support::apiserver::{AllocatedDevice, ClaimBuilder};

/// Two mock GPUs: gpu-0 whole, gpu-1 carved into two MIG devices by someone else.
const STATIC_MIG: &str = "gpus = 2\nmig = [{ gpu = 1, profiles = [\"1g.10gb\", \"3g.40gb\"] }]";
/// One A100 80GB in MIG mode, selected for dynamic MIG (as tests/it/agent/mig.rs).
const DYNAMIC_MIG: &str = "gpus = 1\nmig_mode = true\n[mig]\ndynamic = [\"*\"]";
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn monitoring_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/monitoring").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The `edra_` metric names in a PromQL expression: identifiers that start with `edra_`,
/// outside quoted strings (label values).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut chars = expr.chars().peekable();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut word = String::new();
    let mut flush = |word: &mut String| {
        if word.starts_with("edra_") {
            names.insert(word.clone());
        }
        word.clear();
    };
    while let Some(c) = chars.next() {
        if ident(c) {
            word.push(c);
            continue;
        }
        flush(&mut word);
        if matches!(c, '"' | '\'' | '`') {
            while let Some(q) = chars.next() {
                if q == '\\' && c != '`' {
                    chars.next();
                } else if q == c {
                    break;
                }
            }
        }
    }
    flush(&mut word);
    names
}

/// Every PromQL expression of the dashboard: the panels' `expr`s and the query
/// variables' queries.
fn dashboard_exprs(dashboard: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, &mut out);
    out
}

/// Every rule's `expr` in a Prometheus rules file.
fn rule_exprs(rules: &str) -> Vec<String> {
    let yaml: yaml_serde::Value = yaml_serde::from_str(rules).expect("the rules file is YAML");
    let json = serde_json::to_value(yaml).expect("as JSON");
    let groups = json["groups"].as_array().expect("groups");
    groups
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .map(|r| r["expr"].as_str().expect("each rule has an expr").to_string())
        .collect()
}

/// What a scrape exports: the name of every sample, and for every family (`# TYPE`, also
/// one without samples yet) the names its samples take; the histograms separately.
fn exported(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut names = BTreeSet::new();
    let mut histograms = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (family, kind) = rest.split_once(' ').expect("# TYPE <name> <type>");
            match kind {
                "counter" => names.insert(format!("{family}_total")),
                "info" => names.insert(format!("{family}_info")),
                "histogram" => histograms.insert(family.to_string()),
                _ => names.insert(family.to_string()),
            };
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    (names, histograms)
}

/// The names in `used` that a scrape with `exported` lacks; `_bucket`, `_sum` and `_count`
/// count as their histogram.
fn missing(used: &BTreeSet<String>, (names, histograms): &(BTreeSet<String>, BTreeSet<String>)) -> Vec<String> {
    let of_histogram = |n: &str| {
        ["_bucket", "_sum", "_count"].iter().any(|s| n.strip_suffix(s).is_some_and(|h| histograms.contains(h)))
    };
    used.iter().filter(|n| !names.contains(*n) && !of_histogram(n)).cloned().collect()
}

async fn scrape(addr: SocketAddr) -> (String, BTreeMap<String, f64>) {
    let (status, body) = get(addr, "/metrics").await.expect("metrics answer");
    assert_eq!(status, 200, "{body}");
    let s = samples(&body);
    (body, s)
}

#[tokio::test]
async fn the_dashboard_and_the_alert_rules_use_only_metrics_a_running_agent_exports() {
    let cluster = Cluster::start().await;
    let mut config = cluster.config_with(NODE, STATIC_MIG);
    let addr = free_port();
    config.metrics.address = Some(addr);
    let memory = config.mock.memory as f64;
    let agent = Agent::start(cluster.fs(), config).await;
    cluster.wait_published(NODE, 3).await;
    let share = cluster.put_claim(
        ClaimBuilder::new("default", "share")
            .allocated(
                AllocatedDevice::new("gpu", DRIVER, NODE, "gpu-0")
                    .share("6de5d941-c79d-4a8a-ba10-668351620525", "30Gi"),
            )
            .reserved_for_pod("pod-share", "uid-of-pod-share"),
    );
    let mut v1 = agent.v1().await;
    prepare_ok(&mut v1, &share).await;

    let (body, s) = scrape(addr).await;
    assert_eq!(s.get("edra_gpu_shares{device=\"gpu-0\"}"), Some(&1.0), "{body}");
    assert_eq!(s.get("edra_gpu_memory_shared_bytes{device=\"gpu-0\"}"), Some(&(30.0 * GIB)), "{body}");
    assert_eq!(s.get("edra_gpu_memory_bytes{device=\"gpu-0\"}"), Some(&memory), "{body}");
    assert_eq!(s.get("edra_mig_instances{device=\"gpu-1\",owner=\"foreign\"}"), Some(&2.0), "{body}");
    assert_eq!(s.get("edra_mig_instances{device=\"gpu-1\",owner=\"edra\"}"), Some(&0.0), "{body}");
    assert_eq!(s.get("edra_state_store_usable"), Some(&1.0), "{body}");

    let dashboard: Value =
        serde_json::from_str(&monitoring_file("edra-dashboard.json")).expect("the dashboard is JSON");
    let alerts = monitoring_file("edra-alerts.yaml");
    let exprs: Vec<String> = dashboard_exprs(&dashboard).into_iter().chain(rule_exprs(&alerts)).collect();
    let used: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    for name in ["edra_gpu_shares", "edra_mig_instances", "edra_state_store_usable", "edra_kubelet_registered"] {
        assert!(used.contains(name), "{name} is read from the files: {used:?}");
    }
    assert!(used.len() >= 20, "{used:?}");
    let exports = exported(&body);
    assert_eq!(missing(&used, &exports), Vec::<String>::new(), "named in config/monitoring/ but not exported");

    // The check fails for a rule that names a metric edra does not export, and a
    // histogram's suffixes count only for a histogram.
    let broken = format!("{alerts}      - alert: Broken\n        expr: sum(edra_gpu_sharez) > 0\n        for: 1m\n");
    let used: BTreeSet<String> = rule_exprs(&broken).iter().flat_map(|e| metric_names(e)).collect();
    assert_eq!(missing(&used, &exports), ["edra_gpu_sharez"]);
    let suffixed = metric_names(r#"rate(edra_prepare_duration_seconds_count[5m]) + edra_gpu_shares_count{a="edra_x"}"#);
    assert_eq!(missing(&suffixed, &exports), ["edra_gpu_shares_count"]);

    unprepare_ok(&mut v1, &share).await;
    let (body, s) = scrape(addr).await;
    assert_eq!(s.get("edra_gpu_shares{device=\"gpu-0\"}"), Some(&0.0), "{body}");
    assert_eq!(s.get("edra_gpu_memory_shared_bytes{device=\"gpu-0\"}"), Some(&0.0), "{body}");
    agent.stop().await;
}

#[tokio::test]
async fn mig_instances_edra_makes_for_claims_count_as_its_own() {
    let cluster = Cluster::start().await;
    let mut config = cluster.config_with(NODE, DYNAMIC_MIG);
    let addr = free_port();
    config.metrics.address = Some(addr);
    let agent = Agent::start(cluster.fs(), config).await;
    let (body, s) = scrape(addr).await;
    assert_eq!(s.get("edra_mig_instances{device=\"gpu-0\",owner=\"edra\"}"), Some(&0.0), "{body}");
    let claim = cluster.put_claim(
        ClaimBuilder::new("default", "slice")
            .allocated(AllocatedDevice::new("gpu", DRIVER, NODE, "gpu-0-mig-3g40gb-9-0"))
            .reserved_for_pod("pod-slice", "uid-of-pod-slice"),
    );
    let mut v1 = agent.v1().await;
    prepare_ok(&mut v1, &claim).await;
    let (body, s) = scrape(addr).await;
    assert_eq!(s.get("edra_mig_instances{device=\"gpu-0\",owner=\"edra\"}"), Some(&1.0), "{body}");
    assert_eq!(s.get("edra_mig_instances{device=\"gpu-0\",owner=\"foreign\"}"), Some(&0.0), "{body}");
    unprepare_ok(&mut v1, &claim).await;
    let (body, s) = scrape(addr).await;
    assert_eq!(s.get("edra_mig_instances{device=\"gpu-0\",owner=\"edra\"}"), Some(&0.0), "{body}");
    agent.stop().await;
}
