//! Property tests of the Kubernetes-side parsers: kubeconfig, opaque GpuConfig (alone and
//! in a claim), Status bodies, watch streams and LIST bodies. Each must answer every input
//! with a value or an error, and keep its promises on valid input.

use std::path::Path;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::hostile::{bytes, config, deep, json as json_of, soup};
use crate::kube::{Auth, Event, MAX_RETRY_AFTER, ResourceApi};

use crate::prepare::config::{GpuConfig, Interval, MpsConfig, Sharing, Strategy as Sharing_, TimeSlicingConfig};

const KUBECONFIG_KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "current-context",
    "clusters",
    "users",
    "contexts",
    "name",
    "cluster",
    "user",
    "context",
    "server",
    "certificate-authority",
    "certificate-authority-data",
    "insecure-skip-tls-verify",
    "tls-server-name",
    "client-certificate",
    "client-certificate-data",
    "client-key",
    "client-key-data",
    "token",
    "tokenFile",
    "exec",
    "auth-provider",
    "username",
];
const KUBECONFIG_STRINGS: &[&str] = &["edra", "c", "u", "https://127.0.0.1:6443", "http://x", "https://", "ca.crt"];

const CONFIG_KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "sharing",
    "strategy",
    "timeSlicing",
    "interval",
    "mps",
    "defaultActiveThreadPercentage",
    "defaultPinnedDeviceMemoryLimit",
];
const CONFIG_STRINGS: &[&str] =
    &["gpu.edra.dev/v1alpha1", "GpuConfig", "Exclusive", "TimeSlicing", "MPS", "Default", "Short", "Long", "10Gi"];

const CLAIM_KEYS: &[&str] = &[
    "metadata",
    "uid",
    "spec",
    "status",
    "allocation",
    "devices",
    "requests",
    "name",
    "firstAvailable",
    "exactly",
    "deviceClassName",
    "config",
    "results",
    "request",
    "driver",
    "pool",
    "device",
    "opaque",
    "parameters",
    "source",
    "apiVersion",
    "kind",
    "sharing",
    "strategy",
];
const CLAIM_STRINGS: &[&str] =
    &["gpu.edra.dev", "gpu.edra.dev/v1alpha1", "GpuConfig", "FromClass", "FromClaim", "r", "r/s", "gpu-0", "MPS"];

const STATUS_KEYS: &[&str] =
    &["kind", "apiVersion", "message", "reason", "code", "details", "causes", "field", "retryAfterSeconds"];
const STATUS_STRINGS: &[&str] = &["Status", "NotFound", "Conflict", "spec.devices"];

const WATCH_KEYS: &[&str] = &[
    "type",
    "object",
    "metadata",
    "resourceVersion",
    "name",
    "code",
    "kind",
    "message",
    "spec",
    "devices",
    "basic",
    "driver",
    "pool",
    "nodeName",
    "generation",
    "resourceSliceCount",
    "items",
];
const WATCH_STRINGS: &[&str] = &["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR", "Status", "7", "n1"];

fn text(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("a Value serializes")
}

fn assert_kubeconfig(path: &Path, input: &[u8]) {
    for context in [None, Some("edra")] {
        if let Err(e) = crate::fuzzing::kubeconfig(path, input, context)
            && std::str::from_utf8(input).is_ok()
        {
            assert!(e.starts_with(&format!("kubeconfig {}", path.display())), "error does not name the file: {e}");
        }
    }
}

proptest! {
    #![proptest_config(config(3_000))]

    #[test]
    fn kubeconfig_never_panics_on_bytes(input in bytes(512)) {
        assert_kubeconfig(Path::new("/nonexistent/kubeconfig"), &input);
    }

    #[test]
    fn gpu_config_never_panics(input in prop_oneof![bytes(256), soup(CONFIG_KEYS), deep()]) {
        let _ = crate::fuzzing::gpu_config(&input);
    }

    #[test]
    fn status_never_panics_and_keeps_messages_short(
        code in any::<u16>(),
        header in prop_oneof![Just(None), Just(Some(u64::MAX)), any::<u64>().prop_map(Some)],
        body in prop_oneof![bytes(2_048), soup(STATUS_KEYS), deep()],
    ) {
        let (err, _) = crate::fuzzing::status(code, &body, header);
        let api = err.api().expect("an HTTP status gives an API error");
        prop_assert_eq!(api.code, code);
        if header.is_some() {
            // A server-supplied delay is capped, however large.
            prop_assert_eq!(api.retry_after, header.map(|h| h.min(MAX_RETRY_AFTER.as_secs())));
        }
        if serde_json::from_slice::<Value>(&body).is_err() {
            prop_assert!(api.message.chars().count() <= 512);
        }
    }

    #[test]
    fn gpu_config_round_trips(c in gpu_config()) {
        let mut v = serde_json::to_value(&c).expect("serializes");
        v["apiVersion"] = json!("gpu.edra.dev/v1alpha1");
        v["kind"] = json!("GpuConfig");
        prop_assert_eq!(crate::fuzzing::gpu_config(&text(&v)), Ok(c));
    }

}

proptest! {
    // Structured inputs cost more per case.
    #![proptest_config(config(800))]

    #[test]
    fn kubeconfig_never_panics_on_hostile_structure(v in json_of(KUBECONFIG_KEYS, KUBECONFIG_STRINGS, 6)) {
        // JSON is YAML: the same document as YAML flow text.
        assert_kubeconfig(Path::new("/nonexistent/kubeconfig"), &text(&v));
    }

    #[test]
    fn gpu_config_decodes_hostile_structure_to_a_valid_config_or_an_error(
        v in json_of(CONFIG_KEYS, CONFIG_STRINGS, 5),
    ) {
        if let Ok(c) = crate::fuzzing::gpu_config(&text(&v)) {
            // What decodes is internally consistent, whatever the input was.
            let s = &c.sharing;
            prop_assert!(s.time_slicing.is_none() || s.strategy == Sharing_::TimeSlicing);
            prop_assert!(s.mps.is_none() || s.strategy == Sharing_::Mps);
            let pct = s.mps.as_ref().and_then(|m| m.default_active_thread_percentage);
            prop_assert!(pct.is_none_or(|p| (1..=100).contains(&p)));
        }
    }

    #[test]
    fn claim_configs_never_panic(
        v in json_of(CLAIM_KEYS, CLAIM_STRINGS, 8),
        raw in prop_oneof![bytes(256), soup(CLAIM_KEYS), deep()],
    ) {
        for api in ResourceApi::PREFERENCE {
            let _ = crate::fuzzing::claim_configs(api, &text(&v));
            let _ = crate::fuzzing::claim_configs(api, &raw);
        }
    }

    #[test]
    fn status_reads_hostile_status_objects(
        v in json_of(STATUS_KEYS, STATUS_STRINGS, 5),
        retry in prop_oneof![Just(json!(u64::MAX)), Just(json!(-1)), Just(json!(1e300)), any::<u64>().prop_map(Value::from)],
    ) {
        let mut v = v;
        if let Value::Object(m) = &mut v {
            m.insert("kind".into(), json!("Status"));
            m.insert("details".into(), json!({"retryAfterSeconds": retry}));
        }
        let (err, _) = crate::fuzzing::status(429, &text(&v), None);
        let api = err.api().expect("an HTTP status gives an API error");
        if v.is_object() && v.get("message").is_none_or(Value::is_string) && v.get("reason").is_none_or(Value::is_string) {
            let want = match retry.as_f64() {
                Some(f) if f >= 0.0 => Some(retry.as_u64().unwrap_or(u64::MAX).min(MAX_RETRY_AFTER.as_secs())),
                _ => None,
            };
            prop_assert_eq!(api.retry_after, want);
        }
    }

    #[test]
    fn watch_never_panics_and_any_split_gives_the_same_events(
        lines in prop::collection::vec(
            prop_oneof![
                json_of(WATCH_KEYS, WATCH_STRINGS, 6).prop_map(|v| text(&v)),
                soup(WATCH_KEYS),
                deep(),
                bytes(64),
            ],
            0..8,
        ),
        piece in 1usize..64,
        api in prop::sample::select(&ResourceApi::PREFERENCE[..]),
    ) {
        let body = lines.join(&b'\n');
        let whole = crate::fuzzing::watch(api, &[&body]);
        let split: Vec<&[u8]> = body.chunks(piece).collect();
        let pieces = crate::fuzzing::watch(api, &split);
        prop_assert_eq!(summary(&whole), summary(&pieces));
        let _ = crate::fuzzing::slice_list(api, &body);
    }

    #[test]
    fn watch_tracks_the_resource_version(
        events in prop::collection::vec((prop::sample::select(&["ADDED", "MODIFIED", "DELETED", "BOOKMARK"][..]), "[0-9]{1,6}"), 1..16),
        api in prop::sample::select(&ResourceApi::PREFERENCE[..]),
    ) {
        let body: Vec<u8> = events
            .iter()
            .map(|(kind, rv)| {
                let object = json!({"metadata": {"name": "s", "resourceVersion": rv},
                    "spec": {"driver": "gpu.edra.dev", "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1}}});
                let mut line = text(&json!({"type": kind, "object": object}));
                line.push(b'\n');
                line
            })
            .collect::<Vec<_>>()
            .concat();
        let out = crate::fuzzing::watch(api, &[&body]);
        prop_assert_eq!(out.len(), events.len());
        for ((kind, rv), (next, event)) in events.iter().zip(&out) {
            prop_assert_eq!(next.as_deref(), Some(rv.as_str()));
            match (*kind, event) {
                ("BOOKMARK", None) | ("DELETED", Some(Event::Deleted(_))) => {}
                ("ADDED" | "MODIFIED", Some(Event::Applied(s))) => prop_assert_eq!(s.spec.driver.as_str(), "gpu.edra.dev"),
                (kind, event) => prop_assert!(false, "{kind} gave {event:?}"),
            }
        }
    }
}

/// Per line: resume version and the kind of event (errors compared by message).
fn summary(out: &[(Option<String>, Option<Event>)]) -> Vec<(Option<String>, String)> {
    out.iter()
        .map(|(rv, ev)| {
            let ev = match ev {
                None => "none".to_string(),
                Some(Event::Error(e)) => format!("error {e}"),
                Some(other) => format!("{other:?}"),
            };
            (rv.clone(), ev)
        })
        .collect()
}

fn gpu_config() -> impl Strategy<Value = GpuConfig> {
    let interval = prop::option::of(prop::sample::select(
        &[Interval::Default, Interval::Short, Interval::Medium, Interval::Long][..],
    ));
    let time_slicing = prop::option::of(interval.prop_map(|interval| TimeSlicingConfig { interval }));
    let mps = prop::option::of(
        (
            prop::option::of(1u32..=100),
            prop::option::of("[1-9][0-9]{0,3}(Mi|Gi)"),
            prop::option::of(prop::collection::btree_map("gpu-[0-9]|GPU-[0-9a-f]{8}", "[1-9][0-9]{0,3}(Mi|Gi)", 0..4)),
        )
            .prop_map(|(p, l, per_device)| MpsConfig {
                default_active_thread_percentage: p,
                default_pinned_device_memory_limit: l,
                default_per_device_pinned_memory_limit: per_device,
            }),
    );
    prop_oneof![
        Just(Sharing::default()),
        time_slicing.prop_map(|t| Sharing { strategy: Sharing_::TimeSlicing, time_slicing: t, mps: None }),
        mps.prop_map(|m| Sharing { strategy: Sharing_::Mps, time_slicing: None, mps: m }),
    ]
    .prop_map(|sharing| GpuConfig { sharing })
}

/// Hostile inputs found by fuzzing or by reasoning, kept as plain regression tests.
mod regressions {
    use super::*;

    #[test]
    fn kubeconfig_alias_bomb_is_an_error_not_memory() {
        // The "billion laughs": nine levels of nine aliases each.
        let mut doc = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let p = i - 1;
            doc.push_str(&format!("a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"));
        }
        doc.push_str("current-context: *a9\n");
        let err = crate::fuzzing::kubeconfig(Path::new("/k"), doc.as_bytes(), None).expect_err("not a kubeconfig");
        assert!(err.starts_with("kubeconfig /k: not a valid kubeconfig (YAML)"), "{err}");
    }

    #[test]
    fn a_valid_kubeconfig_gives_its_credentials() {
        let doc = "current-context: edra\ncontexts: [{name: edra, context: {cluster: c, user: u}}]\n\
                   clusters: [{name: c, cluster: {server: 'https://127.0.0.1:6443/', insecure-skip-tls-verify: true}}]\n\
                   users: [{name: u, user: {token: t0k3n}}]\n";
        let creds = crate::fuzzing::kubeconfig(Path::new("/k"), doc.as_bytes(), None).expect("valid");
        assert_eq!(creds.server, "https://127.0.0.1:6443");
        assert!(matches!(creds.auth, Auth::Token(ref t) if t.expose() == "t0k3n"));
    }

    #[test]
    fn deep_nesting_is_an_error_everywhere() {
        let deep = "[".repeat(20_000);
        assert!(crate::fuzzing::gpu_config(deep.as_bytes()).is_err());
        assert!(crate::fuzzing::kubeconfig(Path::new("/k"), deep.as_bytes(), None).is_err());
        assert!(crate::fuzzing::slice_list(ResourceApi::V1, deep.as_bytes()).is_err());
        let (err, _) = crate::fuzzing::status(500, deep.as_bytes(), None);
        assert_eq!(err.api().map(|a| a.message.len()), Some(512));
        let out = crate::fuzzing::watch(ResourceApi::V1, &[deep.as_bytes(), b"\n"]);
        assert!(matches!(out.as_slice(), [(Some(_), Some(Event::Error(_)))]));
    }
}
