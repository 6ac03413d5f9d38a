use serde_json::json;

use super::*;

fn claim_with_parameters(parameters: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u", "annotations": {"parameters": "x".repeat(40_000)}},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {"allocation": {"devices": {"results": [], "config": [{"source": "FromClaim",
            "opaque": {"driver": "gpu.edra.dev", "parameters": parameters}}]}},
            "devices": [{"driver": "d", "pool": "p", "device": "gpu-0", "data": {"k": "v"}}]},
    }))
    .unwrap()
}

#[test]
fn a_real_claim_passes_and_a_long_array_anywhere_is_refused() {
    let params = json!({"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}});
    // A long string elsewhere (an annotation named like an opaque field) is only bytes.
    assert_eq!(check_claim(&claim_with_parameters(params)), Ok(()));
    let zeros = vec![0u8; MAX_VALUES];
    assert_eq!(
        check_claim(&serde_json::to_vec(&json!({"metadata": {"finalizers": zeros}})).unwrap()),
        Err(ShapeError::TooManyValues)
    );
    assert_eq!(check_claim(&claim_with_parameters(json!(vec![0u8; 8_000]))), Ok(()), "8k values in 16 KB");
}

#[test]
fn opaque_fields_are_bounded_by_their_size_as_sent() {
    let e = check_claim(&claim_with_parameters(json!(vec![0u8; 10_000]))).unwrap_err();
    assert_eq!(e, ShapeError::RawTooLarge { field: "opaque.parameters", size: 20_001 });
    assert!(e.to_string().contains("the claim's opaque.parameters is 20001 bytes, more than the 16384"), "{e}");
    let mut body: serde_json::Value = serde_json::from_slice(&claim_with_parameters(json!({}))).unwrap();
    body["status"]["devices"][0]["data"] = json!({"blob": "y".repeat(MAX_RAW_BYTES)});
    let e = check_claim(&serde_json::to_vec(&body).unwrap()).unwrap_err();
    assert!(matches!(e, ShapeError::RawTooLarge { field: "status.devices[].data", .. }), "{e:?}");
}

#[test]
fn what_the_decoder_refuses_anyway_is_left_to_its_message() {
    // Nested deeper than serde_json reads, or not JSON.
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    for odd in [deep.as_bytes(), b"{\"a\": ", b"", b"\xff", b"[1, 2,]"] {
        assert_eq!(check_claim(odd), Ok(()));
    }
}
