//! Table-driven tests of GpuConfig decoding and resolution.

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::json;

use super::*;

const D: &str = "gpu.edra.dev";

fn gpu(sharing: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig", "sharing": sharing})
}

#[test]
fn decode_table() {
    let big = "x".repeat(MAX_PARAMETERS_BYTES);
    let cases: Vec<(&str, serde_json::Value, Result<Strategy, &str>)> = vec![
        (
            "bare kind defaults to Exclusive",
            json!({"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig"}),
            Ok(Strategy::Exclusive),
        ),
        ("explicit exclusive", gpu(json!({"strategy": "Exclusive"})), Ok(Strategy::Exclusive)),
        (
            "time slicing",
            gpu(json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}})),
            Ok(Strategy::TimeSlicing),
        ),
        (
            "mps",
            gpu(
                json!({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"}}),
            ),
            Ok(Strategy::Mps),
        ),
        ("not an object", json!(["GpuConfig"]), Err("must be a JSON object")),
        (
            "wrong group",
            json!({"apiVersion": "gpu.nvidia.com/v1beta1", "kind": "GpuConfig"}),
            Err("apiVersion \"gpu.nvidia.com/v1beta1\""),
        ),
        (
            "wrong version",
            json!({"apiVersion": "gpu.edra.dev/v2", "kind": "GpuConfig"}),
            Err("use \"gpu.edra.dev/v1alpha1\""),
        ),
        ("missing kind", json!({"apiVersion": "gpu.edra.dev/v1alpha1"}), Err("kind \"\"")),
        ("other kind", json!({"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "MigConfig"}), Err("kind \"MigConfig\"")),
        (
            "unknown top-level field",
            json!({"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig", "sharring": {}}),
            Err("unknown field `sharring`"),
        ),
        (
            "unknown sharing field",
            gpu(json!({"strategy": "Exclusive", "replicas": 2})),
            Err("unknown field `replicas`"),
        ),
        ("unknown strategy", gpu(json!({"strategy": "Shared"})), Err("unknown variant `Shared`")),
        (
            "unknown interval",
            gpu(json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Forever"}})),
            Err("unknown variant `Forever`"),
        ),
        (
            "mps field typo",
            gpu(json!({"strategy": "MPS", "mps": {"activeThreads": 1}})),
            Err("unknown field `activeThreads`"),
        ),
        ("timeSlicing without strategy", gpu(json!({"timeSlicing": {}})), Err("sharing.timeSlicing is set")),
        ("mps without strategy", gpu(json!({"strategy": "TimeSlicing", "mps": {}})), Err("sharing.mps is set")),
        (
            "percentage out of range",
            gpu(json!({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 101}})),
            Err("between 1 and 100"),
        ),
        (
            "too large",
            json!({"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig", "pad": big}),
            Err("bytes, more than"),
        ),
    ];
    for (name, params, want) in cases {
        let got = decode(D, 3, &params);
        match (got, want) {
            (Ok(c), Ok(s)) => assert_eq!(c.sharing.strategy, s, "{name}"),
            (Err(e), Err(fragment)) => {
                let msg = e.to_string();
                assert!(msg.contains(fragment), "{name}: {msg:?} lacks {fragment:?}");
                assert!(msg.starts_with("config entry 3"), "{name}: {msg:?} does not name the entry");
            }
            (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
}

fn claim(configs: serde_json::Value) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "ns", "uid": "0b0c9a28-4a35-4d0e-9f3e-0f2b1d7c1a11"},
        "spec": {"devices": {"requests": [
            {"name": "a", "exactly": {"deviceClassName": "gpu"}},
            {"name": "b", "firstAvailable": [{"name": "big", "deviceClassName": "gpu"}, {"name": "small", "deviceClassName": "gpu"}]}
        ]}},
        "status": {"allocation": {"devices": {"results": [], "config": configs}}}
    }))
    .unwrap()
}

fn entry(source: &str, requests: &[&str], sharing: &str) -> serde_json::Value {
    let params = match sharing {
        "TimeSlicing" => gpu(json!({"strategy": "TimeSlicing"})),
        "MPS" => gpu(json!({"strategy": "MPS"})),
        _ => gpu(json!({"strategy": "Exclusive"})),
    };
    json!({"source": source, "requests": requests, "opaque": {"driver": D, "parameters": params}})
}

#[test]
fn strategies_are_shown_as_written_in_a_claim() {
    for s in [Strategy::Exclusive, Strategy::TimeSlicing, Strategy::Mps] {
        assert_eq!(serde_json::to_value(s).unwrap(), serde_json::Value::String(s.to_string()));
    }
    assert_eq!(Strategy::Mps.to_string(), "MPS");
}

#[test]
fn resolve_table() {
    use Strategy::{Exclusive as E, Mps as M, TimeSlicing as T};
    type Case = (&'static str, serde_json::Value, Vec<Strategy>);
    let other_driver = json!({"source": "FromClaim", "requests": [], "opaque": {"driver": "other.example.com", "parameters": {"anything": true}}});
    let cases: Vec<Case> = vec![
        ("no configs: defaults", json!([]), vec![E, E, E]),
        ("claim config for all", json!([entry("FromClaim", &[], "MPS")]), vec![M, M, M]),
        (
            "claim beats class whatever the order",
            json!([entry("FromClaim", &[], "MPS"), entry("FromClass", &[], "TimeSlicing")]),
            vec![M, M, M],
        ),
        (
            "later claim entry wins",
            json!([entry("FromClaim", &[], "MPS"), entry("FromClaim", &["a"], "TimeSlicing")]),
            vec![T, M, M],
        ),
        ("base name covers subrequests", json!([entry("FromClaim", &["b"], "TimeSlicing")]), vec![E, T, T]),
        ("subrequest name is precise", json!([entry("FromClaim", &["b/small"], "MPS")]), vec![E, E, M]),
        ("other drivers are ignored", json!([other_driver]), vec![E, E, E]),
    ];
    for (name, configs, want) in cases {
        let got = resolve(D, &claim(configs), &["a", "b/big", "b/small"]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got: Vec<Strategy> = got.iter().map(|c| c.sharing.strategy).collect();
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn resolve_errors_name_the_problem() {
    let cases = [
        (json!([entry("FromClaim", &["nope"], "")]), "names request \"nope\""),
        (json!([entry("FromClaim", &["b/medium"], "")]), "names request \"b/medium\""),
        (json!([entry("FromSomewhere", &[], "")]), "source \"FromSomewhere\""),
        (
            json!([entry("FromClass", &[], ""), {"source": "FromClaim", "opaque": {"driver": D, "parameters": {"kind": "GpuConfig"}}}]),
            "config entry 1: apiVersion",
        ),
    ];
    for (configs, fragment) in cases {
        let e = resolve(D, &claim(configs), &["a"]).unwrap_err().to_string();
        assert!(e.contains(fragment), "{e:?} lacks {fragment:?}");
    }
}

#[test]
fn base_request_strips_subrequest() {
    assert_eq!(base_request("req"), "req");
    assert_eq!(base_request("req/sub"), "req");
}

#[test]
fn resolved_config_round_trips_through_json() {
    let c = decode(D, 0, &gpu(json!({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 20}}))).unwrap();
    let back: GpuConfig = serde_json::from_slice(&serde_json::to_vec(&c).unwrap()).unwrap();
    assert_eq!(back, c);
}
