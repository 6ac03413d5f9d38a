//! How a prepared claim is judged from the API server's answer.

use serde_json::json;

use super::*;
use crate::state::SCHEMA_VERSION;

const UID: &str = "2f3a9c1e-0d4b-4f8e-9a6c-7b5e1d2c3f40";

fn record() -> ClaimRecord {
    ClaimRecord {
        schema: SCHEMA_VERSION,
        uid: UID.into(),
        namespace: "default".into(),
        name: "gpu".into(),
        phase: Phase::PrepareCompleted,
        devices: Vec::new(),
        cdi_spec_path: "/run/cdi/x.json".into(),
        created_at: 1,
        boot_id: "b".into(),
    }
}

fn claim(uid: &str, status: serde_json::Value) -> Result<ResourceClaim, crate::kube::Error> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": "gpu", "namespace": "default", "uid": uid},
        "spec": {},
        "status": status,
    }))
    .expect("a claim"))
}

fn error(code: u16) -> Result<ResourceClaim, crate::kube::Error> {
    Err(crate::kube::Error::from_status("GET resourceclaims".into(), code, b"{}", None))
}

fn allocated() -> serde_json::Value {
    json!({"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.edra.dev", "pool": "n1", "device": "gpu-0"}]}}})
}

#[test]
fn a_claim_is_gone_only_when_the_server_says_so() {
    let reserved = {
        let mut s = allocated();
        s["reservedFor"] = json!([{"resource": "pods", "name": "p", "uid": "pod-uid"}]);
        s
    };
    assert_eq!(judge(&record(), claim(UID, reserved.clone()), true), Verdict::Holds);
    let gone = |v: Verdict, why: &str| match v {
        Verdict::Gone(reason) => assert!(reason.contains(why), "{reason}"),
        other => panic!("expected gone ({why}), got {other:?}"),
    };
    gone(judge(&record(), error(404), false), "no longer exists");
    gone(judge(&record(), claim("0000", reserved), true), "created again (its UID is now 0000)");
    gone(judge(&record(), claim(UID, allocated()), true), "reserved for no pod");
    gone(judge(&record(), claim(UID, json!({})), true), "no longer allocated");
    gone(judge(&record(), error(403), true), "node authorizer");
    assert!(matches!(judge(&record(), error(403), false), Verdict::Unknown(_)), "RBAC refusals say nothing");
    for code in [429, 500, 503] {
        assert!(matches!(judge(&record(), error(code), true), Verdict::Unknown(_)), "{code}");
    }
}
