//! ResourceSlice CRUD, validation, field selectors and v1beta1 conversion self-tests.

use anyhow::Result;
use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::{SLICES, rv, slice, start};
use crate::support::apiserver::{AllocatedDevice, ApiVersion, ClaimBuilder, Options};

#[tokio::test]
async fn generate_name_appends_five_characters_and_names_conflict() -> Result<()> {
    let (server, client) = start(Options::default()).await?;
    let mut body = slice("", "node-a", "gpu.example.com", 2);
    body["metadata"] = json!({"generateName": "node-a-gpu.example.com-"});
    let (s1, first) = client.json(Method::POST, SLICES, Some(&body)).await?;
    let (s2, second) = client.json(Method::POST, SLICES, Some(&body)).await?;
    assert_eq!((s1, s2), (StatusCode::CREATED, StatusCode::CREATED));
    for created in [&first, &second] {
        let name = created["metadata"]["name"].as_str().unwrap_or_default();
        let suffix = name.strip_prefix("node-a-gpu.example.com-").unwrap_or_default();
        assert_eq!(suffix.len(), 5, "{name}");
        assert!(suffix.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()), "{name}");
        assert_eq!(created["metadata"]["generation"], 1);
        assert!(created["metadata"]["uid"].as_str().is_some_and(|u| u.len() == 36));
        assert!(created["metadata"]["creationTimestamp"].as_str().is_some_and(|t| t.ends_with('Z')));
        assert_eq!(created["kind"], "ResourceSlice");
        assert_eq!(created["apiVersion"], "resource.k8s.io/v1");
    }
    assert_ne!(first["metadata"]["name"], second["metadata"]["name"]);
    assert!(rv(&second)? > rv(&first)?);

    let mut again = slice("", "node-a", "gpu.example.com", 1);
    again["metadata"]["name"] = first["metadata"]["name"].clone();
    let (status, body) = client.json(Method::POST, SLICES, Some(&again)).await?;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["reason"], "AlreadyExists");
    assert_eq!(server.slices().len(), 2);
    Ok(())
}

#[tokio::test]
async fn update_checks_resource_version_and_bumps_generation() -> Result<()> {
    let (server, client) = start(Options::default()).await?;
    let (_, created) = client.json(Method::POST, SLICES, Some(&slice("s", "node-a", "gpu.example.com", 1))).await?;
    let path = format!("{SLICES}/s");

    let mut changed = created.clone();
    changed["spec"]["pool"]["generation"] = json!(2);
    let (status, updated) = client.json(Method::PUT, &path, Some(&changed)).await?;
    assert_eq!(status, StatusCode::OK);
    assert!(rv(&updated)? > rv(&created)?);
    assert_eq!(updated["metadata"]["generation"], 2);
    assert_eq!(updated["metadata"]["uid"], created["metadata"]["uid"]);

    // Still carrying the first resourceVersion: stale.
    let (status, body) = client.json(Method::PUT, &path, Some(&changed)).await?;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["reason"], "Conflict");
    assert!(body["message"].as_str().unwrap_or_default().contains("the object has been modified"));

    // Without a resourceVersion the update is unconditional.
    let mut blind = changed.clone();
    blind["metadata"].as_object_mut().map(|m| m.remove("resourceVersion"));
    blind["spec"]["pool"]["generation"] = json!(3);
    let (status, blind) = client.json(Method::PUT, &path, Some(&blind)).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(server.slice("s").map(|s| s["spec"]["pool"]["generation"].clone()), Some(json!(3)));

    // Immutable fields.
    let mut moved = blind.clone();
    moved["spec"]["nodeName"] = json!("node-b");
    let (status, body) = client.json(Method::PUT, &path, Some(&moved)).await?;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["details"]["causes"][0]["field"], "spec.nodeName");

    let (status, _) =
        client.json(Method::PUT, &format!("{SLICES}/absent"), Some(&slice("absent", "n", "d.example.com", 1))).await?;
    assert_eq!(status, StatusCode::NOT_FOUND);
    Ok(())
}

#[tokio::test]
async fn delete_honours_preconditions() -> Result<()> {
    let (server, client) = start(Options::default()).await?;
    let (_, created) = client.json(Method::POST, SLICES, Some(&slice("s", "node-a", "gpu.example.com", 1))).await?;
    let path = format!("{SLICES}/s");
    let uid = created["metadata"]["uid"].clone();
    let options = |pre: Value| json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": pre});

    let (status, body) = client.json(Method::DELETE, &path, Some(&options(json!({"uid": "other"})))).await?;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(body["message"].as_str().unwrap_or_default().contains("Precondition failed: UID in precondition: other"));
    let (status, _) = client.json(Method::DELETE, &path, Some(&options(json!({"resourceVersion": "1"})))).await?;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(server.slice("s").is_some());

    let pre = json!({"uid": uid, "resourceVersion": created["metadata"]["resourceVersion"]});
    let (status, body) = client.json(Method::DELETE, &path, Some(&options(pre))).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "Success");
    assert_eq!(body["details"]["uid"], uid);
    let (status, body) = client.json(Method::DELETE, &path, None).await?;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["message"], "resourceslices.resource.k8s.io \"s\" not found");
    Ok(())
}

#[tokio::test]
async fn field_selectors_filter_lists() -> Result<()> {
    let (_server, client) = start(Options::default()).await?;
    for (name, node, driver) in
        [("a1", "node-a", "gpu.example.com"), ("a2", "node-a", "net.example.com"), ("b1", "node-b", "gpu.example.com")]
    {
        client.json(Method::POST, SLICES, Some(&slice(name, node, driver, 1))).await?;
    }
    let names = |list: &Value| -> Vec<String> {
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_owned))
            .collect()
    };
    let (_, all) = client.get(SLICES).await?;
    assert_eq!(names(&all), ["a1", "a2", "b1"]);
    assert_eq!(all["kind"], "ResourceSliceList");
    assert!(all["metadata"]["resourceVersion"].as_str().is_some_and(|rv| rv.parse::<u64>().is_ok()));
    let (_, on_a) = client.get(&format!("{SLICES}?fieldSelector=spec.nodeName%3Dnode-a")).await?;
    assert_eq!(names(&on_a), ["a1", "a2"]);
    let (_, both) =
        client.get(&format!("{SLICES}?fieldSelector=spec.nodeName%3Dnode-a%2Cspec.driver%3Dgpu.example.com")).await?;
    assert_eq!(names(&both), ["a1"]);
    let (_, not_a) = client.get(&format!("{SLICES}?fieldSelector=spec.nodeName!%3Dnode-a")).await?;
    assert_eq!(names(&not_a), ["b1"]);
    let (status, body) = client.get(&format!("{SLICES}?fieldSelector=spec.pool.name%3Dx")).await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["reason"], "BadRequest");
    assert_eq!(client.get(&format!("{SLICES}?fieldSelector=nonsense")).await?.0, StatusCode::BAD_REQUEST);
    Ok(())
}

#[tokio::test]
async fn validation_rejects_what_the_real_server_rejects() -> Result<()> {
    let (server, client) = start(Options::default()).await?;
    assert_eq!(
        client.json(Method::POST, SLICES, Some(&slice("max", "n", "gpu.example.com", 128))).await?.0,
        StatusCode::CREATED
    );

    let (status, body) = client.json(Method::POST, SLICES, Some(&slice("big", "n", "gpu.example.com", 129))).await?;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["reason"], "Invalid");
    assert_eq!(body["details"]["causes"][0]["field"], "spec.devices");

    let mut tainted = slice("tainted", "n", "gpu.example.com", 65);
    tainted["spec"]["devices"][0]["taints"] = json!([{"key": "k", "effect": "NoSchedule"}]);
    assert_eq!(client.json(Method::POST, SLICES, Some(&tainted)).await?.0, StatusCode::UNPROCESSABLE_ENTITY);

    let mut bad = slice("bad", "n", "gpu.example.com", 2);
    bad["spec"]["devices"][1]["name"] = json!("gpu-0");
    bad["spec"]["devices"][0]["attributes"] = (0..33).map(|i| (format!("a{i}"), json!({"int": i}))).collect();
    bad["spec"].as_object_mut().map(|s| s.remove("driver"));
    let (status, body) = client.json(Method::POST, SLICES, Some(&bad)).await?;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let fields: Vec<&str> =
        body["details"]["causes"].as_array().into_iter().flatten().filter_map(|c| c["field"].as_str()).collect();
    assert!(fields.contains(&"spec.driver"), "{fields:?}");
    assert!(fields.contains(&"spec.devices[1].name"), "{fields:?}");
    assert!(fields.contains(&"spec.devices[0].attributes"), "{fields:?}");
    assert!(
        body["message"].as_str().unwrap_or_default().starts_with("ResourceSlice.resource.k8s.io \"bad\" is invalid: [")
    );
    assert_eq!(server.slices().len(), 1);
    Ok(())
}

#[tokio::test]
async fn request_policies_are_validated_as_the_real_server_does() -> Result<()> {
    let (server, client) = start(Options::default()).await?;
    let with_policy = |name: &str, multi: bool, policy: Value| {
        let mut s = slice(name, "n", "gpu.example.com", 1);
        s["spec"]["devices"][0]["capacity"] = json!({"memory": {"value": "22784Mi", "requestPolicy": policy}});
        if multi {
            s["spec"]["devices"][0]["allowMultipleAllocations"] = json!(true);
        }
        s
    };
    let fields = |body: &Value| -> Vec<String> {
        body["details"]["causes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["field"].as_str().map(str::to_owned))
            .collect()
    };
    let good = json!({"default": "22Gi", "validRange": {"min": "1Gi", "step": "1Gi"}});
    let (status, created) = client.json(Method::POST, SLICES, Some(&with_policy("good", true, good.clone()))).await?;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let cases = [
        ("not-multi", false, good, "spec.devices[0].capacity[memory].requestPolicy"),
        (
            "off-step",
            true,
            json!({"default": "22784Mi", "validRange": {"min": "1Gi", "step": "1Gi"}}),
            "spec.devices[0].capacity[memory].requestPolicy.default",
        ),
        (
            "no-default",
            true,
            json!({"validRange": {"min": "1Gi"}}),
            "spec.devices[0].capacity[memory].requestPolicy.default",
        ),
        (
            "big-step",
            true,
            json!({"default": "1Gi", "validRange": {"min": "1Gi", "step": "22Gi"}}),
            "spec.devices[0].capacity[memory].requestPolicy.validRange.step",
        ),
    ];
    for (name, multi, policy, field) in cases {
        let (status, body) = client.json(Method::POST, SLICES, Some(&with_policy(name, multi, policy))).await?;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{name}: {body}");
        assert!(fields(&body).iter().any(|f| f == field), "{name}: {body}");
    }
    // Without the gate, the fields are dropped instead.
    server.set_consumable_capacity(false);
    let (status, created) =
        client.json(Method::POST, SLICES, Some(&with_policy("dropped", false, json!({"bogus": 1})))).await?;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["spec"]["devices"][0]["capacity"]["memory"], json!({"value": "22784Mi"}));
    Ok(())
}

#[tokio::test]
async fn v1beta1_shapes_round_trip() -> Result<()> {
    let opts = Options { versions: vec![ApiVersion::V1, ApiVersion::V1beta1], ..Options::default() };
    let (server, client) = start(opts).await?;
    let beta = "/apis/resource.k8s.io/v1beta1/resourceslices";
    let body = json!({
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceSlice",
        "metadata": {"name": "beta"},
        "spec": {"driver": "gpu.example.com", "nodeName": "n", "pool": {"name": "n", "generation": 0, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "basic": {"attributes": {"index": {"int": 0}}, "capacity": {"memory": {"value": "1Gi"}}}}]},
    });
    let (status, created) = client.json(Method::POST, beta, Some(&body)).await?;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(created["apiVersion"], "resource.k8s.io/v1beta1");
    assert_eq!(created["spec"]["devices"][0]["basic"]["attributes"]["index"]["int"], 0);
    let stored = server.slice("beta").unwrap_or_default();
    assert_eq!(
        stored["spec"]["devices"][0],
        json!({"name": "gpu-0", "attributes": {"index": {"int": 0}}, "capacity": {"memory": {"value": "1Gi"}}})
    );
    let (_, v1) = client.get(&format!("{SLICES}/beta")).await?;
    assert_eq!(v1["spec"]["devices"][0]["capacity"]["memory"]["value"], "1Gi");
    assert!(v1["spec"]["devices"][0].get("basic").is_none());
    let (response, _) = client.send(Method::GET, beta, None).await?;
    let warning = response.headers().get(http::header::WARNING).and_then(|w| w.to_str().ok()).unwrap_or_default();
    assert_eq!(
        warning,
        "299 - \"resource.k8s.io/v1beta1 ResourceSlice is deprecated in v1.35+, unavailable in v1.38+; \
         use resource.k8s.io/v1 ResourceSlice\""
    );
    let (response, _) = client.send(Method::GET, SLICES, None).await?;
    assert!(response.headers().get(http::header::WARNING).is_none());
    // A v1 body on the v1beta1 path is refused by apiVersion.
    assert_eq!(
        client.json(Method::POST, beta, Some(&slice("x", "n", "gpu.example.com", 1))).await?.0,
        StatusCode::BAD_REQUEST
    );

    let claim = ClaimBuilder::new("ns", "c")
        .request("gpu", "gpu.example.com")
        .allocated(AllocatedDevice::new("gpu", "gpu.example.com", "n", "gpu-0"))
        .opaque_config("FromClaim", &["gpu"], "gpu.example.com", json!({"sharing": "none"}))
        .on_node("n")
        .build();
    let uid = server.put_claim(claim)["metadata"]["uid"].clone();
    let (_, beta_claim) = client.get("/apis/resource.k8s.io/v1beta1/namespaces/ns/resourceclaims/c").await?;
    assert_eq!(beta_claim["apiVersion"], "resource.k8s.io/v1beta1");
    assert_eq!(beta_claim["metadata"]["uid"], uid);
    assert_eq!(beta_claim["spec"]["devices"]["requests"][0]["deviceClassName"], "gpu.example.com");
    assert!(beta_claim["spec"]["devices"]["requests"][0].get("exactly").is_none());
    let (_, v1_claim) = client.get("/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c").await?;
    assert_eq!(v1_claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"], "gpu.example.com");
    assert_eq!(v1_claim["status"]["allocation"]["devices"]["results"][0]["device"], "gpu-0");
    assert_eq!(v1_claim["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"], "none");
    Ok(())
}

#[tokio::test]
async fn create_with_resource_version_and_identical_update_behave_like_etcd() -> Result<()> {
    let (server, client) = start(Options::default()).await?;
    let mut with_rv = slice("s", "n", "gpu.example.com", 1);
    with_rv["metadata"]["resourceVersion"] = json!("5");
    let (status, body) = client.json(Method::POST, SLICES, Some(&with_rv)).await?;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body["message"], "resourceVersion should not be set on objects to be created");
    assert!(body.get("reason").is_none());

    let (_, created) = client.json(Method::POST, SLICES, Some(&slice("s", "n", "gpu.example.com", 1))).await?;
    let before = server.with_state(|s| s.resource_version());
    let (status, same) = client.json(Method::PUT, &format!("{SLICES}/s"), Some(&created)).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(same["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"]);
    assert_eq!(server.with_state(|s| s.resource_version()), before, "an identical update writes nothing");
    Ok(())
}

#[tokio::test]
async fn unsupported_requests_are_refused_with_status() -> Result<()> {
    let (_server, client) = start(Options::default()).await?;
    client.json(Method::POST, SLICES, Some(&slice("s", "n", "gpu.example.com", 1))).await?;
    let (status, body) = client.json(Method::PATCH, &format!("{SLICES}/s"), Some(&json!([]))).await?;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "JSON patch is not emulated");
    assert_eq!(body["kind"], "Status");
    let (status, _) = client.json(Method::DELETE, SLICES, None).await?;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "DeleteCollection is not emulated");
    let (status, body) = client.get("/apis/resource.k8s.io/v1/deviceclasses").await?;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["reason"], "NotFound");
    let mut huge = slice("huge", "n", "gpu.example.com", 1);
    huge["metadata"]["annotations"] = json!({"padding": "x".repeat(3 * 1024 * 1024)});
    let (status, body) = client.json(Method::POST, SLICES, Some(&huge)).await?;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body["reason"], "RequestEntityTooLarge");
    Ok(())
}

#[tokio::test]
async fn merge_patch_updates_like_put() -> Result<()> {
    let (server, client) = start(Options::default()).await?;
    let (_, created) = client.json(Method::POST, SLICES, Some(&slice("s", "n", "gpu.example.com", 1))).await?;
    let path = format!("{SLICES}/s");
    let patch = json!({"spec": {"pool": {"generation": 5}}});
    let (status, patched) = client.patch(&path, "application/merge-patch+json", &patch).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(patched["spec"]["pool"]["generation"], 5);
    assert_eq!(patched["spec"]["pool"]["resourceSliceCount"], 1);
    assert_eq!(patched["metadata"]["generation"], 2);
    let stale = json!({"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}, "spec": {"pool": {"generation": 6}}});
    let (status, _) = client.patch(&path, "application/merge-patch+json", &stale).await?;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, _) =
        client.patch(&path, "application/merge-patch+json", &json!({"spec": {"driver": "x.example.com"}})).await?;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(server.slice("s").unwrap_or_default()["spec"]["pool"]["generation"], 5);
    Ok(())
}

#[tokio::test]
async fn deleting_a_node_collects_the_slices_it_owns() -> Result<()> {
    let (server, client) = start(Options::default()).await?;
    let uid = server.add_node("node-a");
    assert_eq!(server.add_node("node-a"), uid, "adding a node again keeps it");
    let (_, node) = client.get("/api/v1/nodes/node-a").await?;
    assert_eq!((node["kind"].as_str(), node["apiVersion"].as_str()), (Some("Node"), Some("v1")));
    assert_eq!(node["metadata"]["uid"], uid);
    let mut owned = slice("owned", "node-a", "gpu.example.com", 1);
    owned["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": uid, "controller": true}]);
    client.json(Method::POST, SLICES, Some(&owned)).await?;
    client.json(Method::POST, SLICES, Some(&slice("unowned", "node-a", "gpu.example.com", 1))).await?;
    assert_eq!(server.delete_node("node-a"), Some(1));
    assert_eq!(server.delete_node("node-a"), None);
    assert!(server.slice("owned").is_none());
    assert!(server.slice("unowned").is_some());
    assert_eq!(client.get("/api/v1/nodes/node-a").await?.0, StatusCode::NOT_FOUND);
    Ok(())
}
