use super::*;

#[test]
fn the_none_effect_needs_v1_on_kubernetes_1_35_or_newer() {
    assert!(accepts_none_effect(ResourceApi::V1, Some("v1.36.2")));
    assert!(accepts_none_effect(ResourceApi::V1, Some("v1.35.0+k3s1")));
    assert!(!accepts_none_effect(ResourceApi::V1, Some("v1.34.3")));
    assert!(accepts_none_effect(ResourceApi::V1, None));
    assert!(accepts_none_effect(ResourceApi::V1, Some("garbage")));
    assert!(!accepts_none_effect(ResourceApi::V1beta2, Some("v1.36.2")));
    assert!(!accepts_none_effect(ResourceApi::V1beta1, None));
}

#[test]
fn partitionable_devices_need_v1_on_kubernetes_1_35_or_newer() {
    assert_eq!(accepts_partitions(ResourceApi::V1, Some("v1.36.2")), Ok(()));
    assert_eq!(accepts_partitions(ResourceApi::V1, Some("v1.35.0+k3s1")), Ok(()));
    assert_eq!(accepts_partitions(ResourceApi::V1, None), Ok(()));
    assert_eq!(accepts_partitions(ResourceApi::V1, Some("v1.34.3")), Err("the API server is v1.34.3".into()));
    assert_eq!(
        accepts_partitions(ResourceApi::V1beta2, Some("v1.36.2")),
        Err("the API server serves resource.k8s.io/v1beta2 only".into())
    );
}
