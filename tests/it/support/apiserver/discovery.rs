//! Legacy (non-aggregated) discovery documents: `/version`, `/api`, `/api/v1`, `/apis`,
//! `/apis/resource.k8s.io` and `/apis/resource.k8s.io/{version}`.

use http::StatusCode;
use serde_json::{Value, json};

use super::Options;
use super::convert::ApiVersion;
use super::handler::Reply;

pub(crate) fn version(opts: &Options) -> Reply {
    let numbers: Vec<&str> = opts.git_version.trim_start_matches('v').split(['.', '-', '+']).collect();
    Reply::Json(
        StatusCode::OK,
        json!({
            "major": numbers.first().copied().unwrap_or("1"),
            "minor": numbers.get(1).copied().unwrap_or("0"),
            "emulationMajor": numbers.first().copied().unwrap_or("1"),
            "emulationMinor": numbers.get(1).copied().unwrap_or("0"),
            "gitVersion": opts.git_version,
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "go1.25.0",
            "compiler": "gc",
            "platform": "linux/amd64",
        }),
    )
}

pub(crate) fn core_group() -> Reply {
    Reply::Json(StatusCode::OK, json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}))
}

pub(crate) fn core_v1() -> Reply {
    Reply::Json(
        StatusCode::OK,
        json!({
            "kind": "APIResourceList",
            "groupVersion": "v1",
            "resources": [{"name": "nodes", "singularName": "node", "namespaced": false, "kind": "Node",
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]}],
        }),
    )
}

/// Served versions, most stable first (the first is the preferred version).
fn served(opts: &Options) -> Vec<ApiVersion> {
    let mut versions = opts.versions.clone();
    versions.sort();
    versions.dedup();
    versions
}

fn group_value(opts: &Options) -> Value {
    let versions: Vec<Value> =
        served(opts).into_iter().map(|v| json!({"groupVersion": v.group_version(), "version": v.as_str()})).collect();
    let preferred = versions.first().cloned().unwrap_or(Value::Null);
    json!({"name": "resource.k8s.io", "versions": versions, "preferredVersion": preferred})
}

pub(crate) fn apis(opts: &Options) -> Reply {
    let groups = if opts.versions.is_empty() { vec![] } else { vec![group_value(opts)] };
    Reply::Json(StatusCode::OK, json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
}

pub(crate) fn group(opts: &Options) -> Reply {
    if opts.versions.is_empty() {
        return Reply::Json(StatusCode::NOT_FOUND, super::status::ApiError::path_not_found().body);
    }
    let mut group = group_value(opts);
    group["kind"] = json!("APIGroup");
    group["apiVersion"] = json!("v1");
    Reply::Json(StatusCode::OK, group)
}

pub(crate) fn group_version(version: ApiVersion) -> Reply {
    let verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];
    Reply::Json(
        StatusCode::OK,
        json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": version.group_version(),
            "resources": [
                {"name": "resourceslices", "singularName": "resourceslice", "namespaced": false,
                 "kind": "ResourceSlice", "verbs": verbs},
                {"name": "resourceclaims", "singularName": "resourceclaim", "namespaced": true,
                 "kind": "ResourceClaim", "verbs": verbs},
            ],
        }),
    )
}
