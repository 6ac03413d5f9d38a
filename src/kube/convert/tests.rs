use serde_json::json;

use super::*;

fn v1_slice_json() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "n1-gpu", "resourceVersion": "7"},
        "spec": {
            "driver": "gpu.edra.dev", "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": [{
                "name": "gpu-0",
                "attributes": {"model": {"string": "A100"}, "index": {"int": 0}},
                "capacity": {"memory": {"value": "40Gi"}},
                "taints": [{"key": "unhealthy", "effect": "NoSchedule"}]
            }, {"name": "gpu-1"}]
        }
    })
}

fn v1beta1_devices() -> Value {
    json!([{
        "name": "gpu-0",
        "basic": {
            "attributes": {"model": {"string": "A100"}, "index": {"int": 0}},
            "capacity": {"memory": {"value": "40Gi"}},
            "taints": [{"key": "unhealthy", "effect": "NoSchedule"}]
        }
    }, {"name": "gpu-1", "basic": {}}])
}

#[test]
fn slice_to_wire_per_version() {
    let slice: ResourceSlice = serde_json::from_value(v1_slice_json()).unwrap();
    let cases = [
        (ResourceApi::V1, "resource.k8s.io/v1", v1_slice_json()["spec"]["devices"].clone()),
        (ResourceApi::V1beta2, "resource.k8s.io/v1beta2", v1_slice_json()["spec"]["devices"].clone()),
        (ResourceApi::V1beta1, "resource.k8s.io/v1beta1", v1beta1_devices()),
    ];
    for (api, api_version, devices) in cases {
        let wire = slice_to_wire(api, &slice).unwrap();
        assert_eq!(wire["apiVersion"], api_version, "{api}");
        assert_eq!(wire["kind"], "ResourceSlice");
        assert_eq!(wire["spec"]["devices"], devices, "{api}");
        assert_eq!(wire["spec"]["pool"], v1_slice_json()["spec"]["pool"], "{api}");
        assert_eq!(wire["metadata"]["resourceVersion"], "7");
    }
}

#[test]
fn slice_from_wire_per_version() {
    let want: ResourceSlice = serde_json::from_value(v1_slice_json()).unwrap();
    let mut beta2 = v1_slice_json();
    beta2["apiVersion"] = "resource.k8s.io/v1beta2".into();
    let mut beta1 = v1_slice_json();
    beta1["apiVersion"] = "resource.k8s.io/v1beta1".into();
    beta1["spec"]["devices"] = v1beta1_devices();
    // List items carry no apiVersion/kind.
    let mut bare = beta1.clone();
    bare.as_object_mut().unwrap().remove("apiVersion");
    bare.as_object_mut().unwrap().remove("kind");
    let cases = [
        (ResourceApi::V1, v1_slice_json()),
        (ResourceApi::V1beta2, beta2),
        (ResourceApi::V1beta1, beta1),
        (ResourceApi::V1beta1, bare),
    ];
    for (api, wire) in cases {
        let got = slice_from_wire(api, wire).unwrap();
        assert_eq!(got, want, "{api}");
    }
}

#[test]
fn slice_round_trips_through_every_version() {
    let slice: ResourceSlice = serde_json::from_value(v1_slice_json()).unwrap();
    for api in ResourceApi::PREFERENCE {
        let back = slice_from_wire(api, slice_to_wire(api, &slice).unwrap()).unwrap();
        assert_eq!(back, slice, "{api}");
    }
}

fn v1_claim_json() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u-1"},
        "spec": {"devices": {
            "requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.edra.dev", "count": 2, "allocationMode": "ExactCount",
                    "selectors": [{"cel": {"expression": "true"}}], "adminAccess": false,
                    "tolerations": [{"key": "k", "operator": "Exists"}]}},
                {"name": "any", "firstAvailable": [{"name": "big", "deviceClassName": "gpu.edra.dev"}]}
            ],
            "config": [{"requests": ["gpu"], "opaque": {"driver": "gpu.edra.dev", "parameters": {"sharing": "mps"}}}]
        }},
        "status": {"allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": "gpu.edra.dev", "pool": "n1", "device": "gpu-0"}],
                "config": [{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.edra.dev", "parameters": {}}}]
            },
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}
        }}
    })
}

fn v1beta1_requests() -> Value {
    json!([
        {"name": "gpu", "deviceClassName": "gpu.edra.dev", "count": 2, "allocationMode": "ExactCount",
            "selectors": [{"cel": {"expression": "true"}}], "adminAccess": false,
            "tolerations": [{"key": "k", "operator": "Exists"}]},
        {"name": "any", "firstAvailable": [{"name": "big", "deviceClassName": "gpu.edra.dev"}]}
    ])
}

#[test]
fn claim_conversions_per_version() {
    let want: ResourceClaim = serde_json::from_value(v1_claim_json()).unwrap();
    for api in ResourceApi::PREFERENCE {
        let mut wire = v1_claim_json();
        wire["apiVersion"] = api.api_version().into();
        if api == ResourceApi::V1beta1 {
            wire["spec"]["devices"]["requests"] = v1beta1_requests();
        }
        let got = claim_from_wire(api, wire.clone()).unwrap();
        assert_eq!(got, want, "from {api}");
        let back = claim_to_wire(api, &want).unwrap();
        assert_eq!(back, wire, "to {api}");
        assert_eq!(back["status"], v1_claim_json()["status"], "allocation is the same in {api}");
    }
}

#[test]
fn a_claims_body_decodes_as_its_value_does() {
    for api in ResourceApi::PREFERENCE {
        let mut wire = v1_claim_json();
        wire["apiVersion"] = api.api_version().into();
        if api == ResourceApi::V1beta1 {
            wire["spec"]["devices"]["requests"] = v1beta1_requests();
        }
        let body = serde_json::to_vec(&wire).unwrap();
        assert_eq!(claim_from_body(api, &body).unwrap(), claim_from_wire(api, wire.clone()).unwrap(), "{api}");
        // Without apiVersion and kind, or with a key twice, the claim still decodes.
        let mut bare = wire.clone();
        bare.as_object_mut().unwrap().retain(|k, _| k != "apiVersion" && k != "kind");
        let body = serde_json::to_vec(&bare).unwrap();
        assert_eq!(claim_from_body(api, &body).unwrap(), claim_from_wire(api, wire.clone()).unwrap(), "{api}");
        let text = String::from_utf8(serde_json::to_vec(&wire).unwrap()).unwrap();
        let twice = text.replacen('{', r#"{"kind":"Other","#, 1);
        assert_eq!(claim_from_body(api, twice.as_bytes()).unwrap(), claim_from_wire(api, wire).unwrap(), "{api}");
    }
    let broken = claim_from_body(ResourceApi::V1, b"{\"metadata\": ");
    assert!(matches!(broken, Err(ConvertError::Decode { .. })), "{broken:?}");
}

#[test]
fn malformed_wire_objects_are_errors_not_panics() {
    assert!(matches!(slice_from_wire(ResourceApi::V1, json!([1])), Err(ConvertError::NotAnObject { .. })));
    let bad = json!({"spec": {"driver": 5, "pool": {}}});
    assert!(matches!(slice_from_wire(ResourceApi::V1beta1, bad), Err(ConvertError::Decode { .. })));
    let weird = json!({"metadata": {"name": "c"}, "spec": {"devices": {"requests": [7, {"name": "x"}]}}});
    let c = claim_from_wire(ResourceApi::V1beta1, weird);
    assert!(c.is_err(), "a non-object request must not decode");
}
