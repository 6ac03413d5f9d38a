use serde_json::json;

use super::*;

fn pod(v: Value) -> PodClaims {
    from_wire("WATCH pods", v).expect("a pod")
}

#[test]
fn claims_come_from_names_templates_and_extended_resources() {
    let p = pod(json!({
        "metadata": {"namespace": "ns", "name": "p", "uid": "u"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c"}], "resourceClaims": [
            {"name": "direct", "resourceClaimName": "shared-gpu"},
            {"name": "templated", "resourceClaimTemplateName": "one-gpu"},
            {"name": "not-generated-yet", "resourceClaimTemplateName": "one-gpu"},
        ]},
        "status": {"phase": "Pending", "resourceClaimStatuses": [
            {"name": "templated", "resourceClaimName": "p-templated-x7k2"},
            {"name": "not-generated-yet"},
        ], "extendedResourceClaimStatus": {"resourceClaimName": "p-extended-resources-abcd", "requestMappings": []}},
    }));
    assert_eq!(p.key(), ("ns".to_string(), "p".to_string()));
    assert!(p.starting);
    assert_eq!(p.claims, ["p-extended-resources-abcd", "p-templated-x7k2", "shared-gpu"]);
}

#[test]
fn running_finished_and_terminating_pods_are_not_starting() {
    for (phase, deleting) in [("Running", false), ("Succeeded", false), ("Failed", false), ("Pending", true)] {
        let mut v = json!({"metadata": {"namespace": "ns", "name": "p"}, "status": {"phase": phase}});
        if deleting {
            v["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        let p = pod(v);
        assert!(!p.starting, "{phase}, deleting: {deleting}");
        assert_eq!(p.ended, phase == "Succeeded" || phase == "Failed", "{phase}");
    }
    assert!(pod(json!({"metadata": {"name": "p"}})).starting, "no status yet");
}

#[test]
fn nulls_and_missing_fields_are_no_claims() {
    let p = pod(json!({"metadata": {"name": "p", "namespace": null}, "spec": {"resourceClaims": null},
            "status": {"resourceClaimStatuses": null}}));
    assert!(p.claims.is_empty());
    assert!(from_wire("WATCH pods", json!({"spec": {"resourceClaims": "no"}})).is_err());
}

#[test]
fn lists_decode_items_and_version() {
    let body = serde_json::to_vec(&json!({"kind": "PodList", "metadata": {"resourceVersion": "12"}, "items": [
            {"metadata": {"namespace": "a", "name": "p1"}, "spec": {"resourceClaims": [{"name": "g", "resourceClaimName": "c1"}]}},
            {"metadata": {"namespace": "a", "name": "p2"}},
        ]}))
        .unwrap();
    let (items, rv) = decode_list("LIST pods", &body).unwrap();
    assert_eq!(rv, "12");
    assert_eq!(items.len(), 2);
    assert_eq!(items[0].claims, ["c1"]);
    assert!(decode_list("LIST pods", b"{\"items\": 3}").is_err());
}
