//! The text view: ages, columns, and the 100-column limit.

use super::render::{age, text};
use super::*;

fn view() -> NodeStatus {
    let gpu = |name: &str, health: &str| GpuStatus {
        name: name.into(),
        uuid: format!("GPU-{name}"),
        product: "NVIDIA A100-SXM4-80GB".into(),
        memory: 80 << 30,
        health: health.into(),
        conditions: Vec::new(),
        taints: Vec::new(),
        compute_mode: "Default".into(),
        mig_mode: false,
        mig_instances: Vec::new(),
        mps_daemons: Vec::new(),
        memory_shared: 0,
        shares: 0,
        held_by: Vec::new(),
    };
    let mut sick = gpu("gpu-1", "unhealthy");
    sick.taints.push(TaintStatus { taint: "gpu.edra.dev/xid=79:NoSchedule".into(), since: 1_000 });
    let mut shared = gpu("gpu-0", "healthy");
    (shared.memory_shared, shared.shares) = (30 << 30, 2);
    NodeStatus {
        schema: SCHEMA.into(),
        version: "0.1.0".into(),
        node: "n1".into(),
        backend: "mock".into(),
        started_at: 1_000,
        now: 1_000 + 3 * 3600 + 5 * 60,
        kubelet_registered: true,
        slices_in_sync: true,
        publish_error: None,
        pods_known: true,
        gpus: vec![shared, sick],
        claims: vec![ClaimStatus {
            namespace: "team-with-a-rather-long-namespace".into(),
            name: "a-claim-with-a-long-name".into(),
            uid: "0b0c9a28-4a35-4d0e-9f3e-0f2b1d7c1a11".into(),
            phase: "PrepareCompleted".into(),
            pods: Some(vec!["trainer-0".into()]),
            devices: vec![ClaimDeviceStatus {
                device: "gpu-0".into(),
                gpu: "gpu-0".into(),
                request: "gpu".into(),
                share_id: Some("6de5d941-c79d-4a8a-ba10-668351620525".into()),
                memory: Some(10 << 30),
                strategy: "Exclusive".into(),
                admin_access: false,
            }],
            prepared_at: 1_000 + 60,
        }],
    }
}

#[test]
fn ages_read_like_kubectl() {
    assert_eq!(
        (age(9), age(250), age(7500), age(90_000), age(-5)),
        ("9s".into(), "4m10s".into(), "2h5m".into(), "1d1h".into(), "0s".into())
    );
}

#[test]
fn the_text_view_fits_100_columns_and_says_what_matters() {
    let t = text(&view(), false);
    assert!(t.lines().all(|l| l.chars().count() <= 100), "{t}");
    assert!(
        t.starts_with("NODE n1  edra 0.1.0 (mock)  up 3h5m  kubelet registered  slices in sync  pods known"),
        "{t}"
    );
    let gpu0 = t.lines().find(|l| l.starts_with("gpu-0")).unwrap();
    assert!(
        gpu0.contains("healthy") && gpu0.contains("80Gi") && gpu0.contains("30Gi") && gpu0.contains("50Gi"),
        "{gpu0}"
    );
    let gpu1 = t.lines().find(|l| l.starts_with("gpu-1")).unwrap();
    assert!(gpu1.ends_with("xid=79 (3h5m)"), "{gpu1}");
    assert!(text(&view(), true).contains("gpu.edra.dev/xid=79:NoSchedule (3h5m)"));
    let claim = t.lines().find(|l| l.starts_with("team-with")).unwrap();
    assert!(claim.contains("gpu-0#6de5d941") && claim.contains("10Gi") && claim.contains("trainer-0"), "{claim}");
    let wide = text(&view(), true);
    assert!(wide.contains("0b0c9a28-4a35-4d0e-9f3e-0f2b1d7c1a11") && wide.contains("GPU-gpu-0"), "{wide}");
    assert!(wide.contains("gpu-0#6de5d941-c79d-4a8a-ba10-668351620525"), "{wide}");
}

#[test]
fn text_from_outside_is_shown_escaped_in_every_output() {
    let hostile = "\u{1b}]0;owned\u{7}\u{1b}[2J\r\nFAKE LINE: all GPUs healthy\u{9b}2J";
    let mut v = view();
    v.publish_error = Some(format!("500 Internal Server Error: {hostile}"));
    v.gpus[1].conditions.push(ConditionStatus {
        kind: "xid".into(),
        value: Some("79".into()),
        fatal: true,
        since: 1_000,
        message: hostile.into(),
    });
    v.claims[0].name = hostile.into();
    v.claims[0].pods = Some(vec![hostile.into()]);
    for wide in [false, true] {
        let t = text(&v, wide);
        assert!(!t.chars().any(|c| crate::util::is_control(c) && c != '\n'), "{t:?}");
        assert!(!t.lines().any(|l| l.starts_with("FAKE LINE")), "{t}");
        assert!(t.contains(
            "last publish error: 500 Internal Server Error: \\u{1b}]0;owned\\u{7}\\u{1b}[2J\\u{d}\\u{a}FAKE"
        ));
    }
    assert!(text(&v, true).contains("gpu-1: xid since 3h5m ago: \\u{1b}]0;owned"), "{}", text(&v, true));
    let json = super::render::json(&v);
    assert!(!json.chars().any(|c| crate::util::is_control(c) && c != '\n'), "{json:?}");
    let back: NodeStatus = serde_json::from_str(&json).expect("valid JSON");
    assert_eq!(back, v, "the JSON view keeps the text itself");
}
