use super::*;

#[test]
fn paths_per_version() {
    let cases = [
        (ResourceApi::V1, "/apis/resource.k8s.io/v1/resourceslices/s-1"),
        (ResourceApi::V1beta2, "/apis/resource.k8s.io/v1beta2/resourceslices/s-1"),
        (ResourceApi::V1beta1, "/apis/resource.k8s.io/v1beta1/resourceslices/s-1"),
    ];
    for (api, want) in cases {
        let r = get_slice(api, "s-1");
        assert_eq!(r.method(), Method::GET);
        assert_eq!(r.uri(), want);
        assert!(r.body().is_empty());
        assert_eq!(ResourceApi::from_version(api.version()), Some(api));
    }
    assert_eq!(ResourceApi::from_version("v1alpha3"), None);
}

#[test]
fn field_selector_is_escaped() {
    let r = list_slices(ResourceApi::V1, "spec.nodeName=node-1,spec.driver=gpu.edra.dev");
    assert_eq!(
        r.uri(),
        "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dnode-1%2Cspec.driver%3Dgpu.edra.dev"
    );
    assert_eq!(list_slices(ResourceApi::V1, "").uri(), "/apis/resource.k8s.io/v1/resourceslices");
    assert_eq!(with_query("/p", &[("a", "x y&z"), ("b", "")]), "/p?a=x%20y%26z");
}

#[test]
fn watch_carries_version_bookmarks_timeout_and_selector() {
    let r = watch_slices(ResourceApi::V1beta1, "spec.nodeName=n", "123", 290);
    assert_eq!(
        r.uri(),
        "/apis/resource.k8s.io/v1beta1/resourceslices?watch=true&resourceVersion=123&allowWatchBookmarks=true&timeoutSeconds=290&fieldSelector=spec.nodeName%3Dn"
    );
}

#[test]
fn names_are_escaped_as_path_segments() {
    assert_eq!(get_node("a/b").uri(), "/api/v1/nodes/a%2Fb");
    assert_eq!(get_claim(ResourceApi::V1, "ns", "c").uri(), "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c");
}

#[test]
fn writes_have_method_and_json_body() {
    let c = create_slice(ResourceApi::V1, b"{}".to_vec());
    assert_eq!(c.method(), Method::POST);
    assert_eq!(c.uri(), "/apis/resource.k8s.io/v1/resourceslices");
    assert_eq!(c.headers()[header::CONTENT_TYPE], "application/json");
    assert_eq!(c.body().as_ref(), b"{}");
    let u = update_slice(ResourceApi::V1beta2, "s", b"{\"a\":1}".to_vec());
    assert_eq!(u.method(), Method::PUT);
    assert_eq!(u.uri(), "/apis/resource.k8s.io/v1beta2/resourceslices/s");
}

#[test]
fn delete_sends_preconditions() {
    let d = delete_slice(ResourceApi::V1, "s", "uid-1", "42");
    assert_eq!(d.method(), Method::DELETE);
    let body: serde_json::Value = serde_json::from_slice(d.body()).unwrap();
    assert_eq!(body["kind"], "DeleteOptions");
    assert_eq!(body["preconditions"], serde_json::json!({"uid": "uid-1", "resourceVersion": "42"}));
    let d = delete_slice(ResourceApi::V1, "s", "", "");
    let body: serde_json::Value = serde_json::from_slice(d.body()).unwrap();
    assert_eq!(body["preconditions"], serde_json::json!({}));
}

#[test]
fn pods_are_listed_and_watched_by_node() {
    assert_eq!(list_pods("spec.nodeName=n1").uri(), "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1");
    let w = watch_pods("spec.nodeName=n1", "7", 290);
    assert_eq!(
        w.uri(),
        "/api/v1/pods?watch=true&resourceVersion=7&allowWatchBookmarks=true&timeoutSeconds=290&fieldSelector=spec.nodeName%3Dn1"
    );
}
