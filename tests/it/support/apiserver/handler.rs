//! Request entry point: reads the body, authenticates (client certificate of the
//! connection, else bearer token), routes the path, applies injected faults, dispatches to
//! discovery / slice / claim / node / review handlers, renders Status errors and logs the request.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::Value;

use super::authz::{self, Attributes};
use super::convert::{self, ApiVersion};
use super::faults::{self, FaultAction};
use super::meta::with_type;
use super::status::{ApiError, CLAIMS, NODES};
use super::store::RequestRecord;
use super::{Shared, UserInfo, discovery, pods, query, reviews, slices, watch};

pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

/// kube-apiserver's `--max-resource-write-bytes` default (3 MiB).
const MAX_REQUEST_BODY_BYTES: usize = 3 * 1024 * 1024;

/// A successful answer: a JSON document or a streaming body (watch).
pub(crate) enum Reply {
    Json(StatusCode, Value),
    Stream(Body),
}

/// The request as handlers see it.
pub(crate) struct Call<'a> {
    pub shared: &'a Arc<Shared>,
    pub user: &'a UserInfo,
    pub params: HashMap<String, String>,
    pub content_type: Option<String>,
    pub body: Bytes,
}

impl Call<'_> {
    /// The JSON body, or the real server's 400 for undecodable input.
    pub fn json_body(&self) -> Result<Value, ApiError> {
        // An absent Content-Type is read as JSON, like the real server does.
        if let Some(content_type) = &self.content_type
            && !content_type.starts_with("application/json")
        {
            return Err(ApiError::unsupported_media_type(content_type));
        }
        self.raw_json()
    }

    /// The body decoded as JSON whatever its Content-Type.
    pub fn raw_json(&self) -> Result<Value, ApiError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| ApiError::bad_request(format!("the body of the request could not be decoded as JSON: {e}")))
    }

    pub fn authorize(&self, attrs: &Attributes<'_>) -> Result<(), ApiError> {
        let state = self.shared.lock();
        authz::authorize(self.user, attrs, &state.forbid, state.node_authorizer)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    Version,
    CoreGroup,
    CoreV1,
    Apis,
    Group,
    GroupVersion(ApiVersion),
    Node(String),
    Pods,
    Slices(ApiVersion),
    Slice(ApiVersion, String),
    Claim(ApiVersion, String, String),
    ClaimStatus(ApiVersion, String, String),
    AccessReview,
    SelfReview,
    Unknown,
}

impl Route {
    fn parse(path: &str, served: &[ApiVersion]) -> Self {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let version = |v: &str| ApiVersion::parse(v).filter(|v| served.contains(v));
        match segments.as_slice() {
            ["version"] => Self::Version,
            ["api"] => Self::CoreGroup,
            ["api", "v1"] => Self::CoreV1,
            ["api", "v1", "nodes", name] => Self::Node((*name).to_owned()),
            ["api", "v1", "pods"] => Self::Pods,
            ["apis"] => Self::Apis,
            ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"] => Self::AccessReview,
            ["apis", "authentication.k8s.io", "v1", "selfsubjectreviews"] => Self::SelfReview,
            ["apis", "resource.k8s.io"] => Self::Group,
            ["apis", "resource.k8s.io", v, rest @ ..] => match (version(v), rest) {
                (Some(v), []) => Self::GroupVersion(v),
                (Some(v), ["resourceslices"]) => Self::Slices(v),
                (Some(v), ["resourceslices", name]) => Self::Slice(v, (*name).to_owned()),
                (Some(v), ["namespaces", ns, "resourceclaims", name]) => {
                    Self::Claim(v, (*ns).to_owned(), (*name).to_owned())
                }
                (Some(v), ["namespaces", ns, "resourceclaims", name, "status"]) => {
                    Self::ClaimStatus(v, (*ns).to_owned(), (*name).to_owned())
                }
                _ => Self::Unknown,
            },
            _ => Self::Unknown,
        }
    }

    /// The Kubernetes verb of `method` on this route.
    fn verb(&self, method: &Method, watch: bool) -> &'static str {
        let collection = matches!(self, Self::Slices(_) | Self::Pods);
        match (self, method) {
            (Self::Version | Self::CoreGroup | Self::CoreV1 | Self::Apis | Self::Group | Self::GroupVersion(_), _) => {
                "discovery"
            }
            (Self::Unknown, _) => "",
            (_, &Method::GET) if collection && watch => "watch",
            (_, &Method::GET) if collection => "list",
            (_, &Method::GET) => "get",
            (_, &Method::POST) => "create",
            (_, &Method::PUT) => "update",
            (_, &Method::PATCH) => "patch",
            (_, &Method::DELETE) if collection => "deletecollection",
            (_, &Method::DELETE) => "delete",
            _ => "",
        }
    }
}

fn authenticate(shared: &Shared, cert_user: Option<UserInfo>, headers: &HeaderMap) -> Option<UserInfo> {
    if cert_user.is_some() {
        return cert_user;
    }
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return None;
    }
    shared.lock().tokens.0.get(token).cloned()
}

fn is_watch(params: &HashMap<String, String>) -> bool {
    matches!(params.get("watch").map(String::as_str), Some("true" | "1"))
}

/// Counts a request as in flight until its response head is ready or it is dropped.
struct InFlight(Arc<Shared>);

impl InFlight {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.mutate(|s| s.in_flight += 1);
        Self(shared.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.mutate(|s| s.in_flight = s.in_flight.saturating_sub(1));
    }
}

pub(crate) async fn handle(
    shared: Arc<Shared>,
    cert_user: Option<UserInfo>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let started = Instant::now();
    let _in_flight = InFlight::new(&shared);
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let path = parts.uri.path().to_owned();
    let query = parts.uri.query().map(str::to_owned);
    let params = query::parse(query.as_deref());
    let route = Route::parse(&path, &shared.opts.versions);
    let verb = route.verb(&parts.method, is_watch(&params));
    let user = authenticate(&shared, cert_user, &parts.headers);
    let request_bytes = body.len();
    let outcome = match &user {
        None => Err(ApiError::unauthorized()),
        Some(_) if request_bytes > MAX_REQUEST_BODY_BYTES => Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {MAX_REQUEST_BODY_BYTES}"),
            None,
        )),
        Some(user) => {
            let content_type = parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let call = Call { shared: &shared, user, params, content_type, body };
            serve(&call, &route, &parts.method, &path, verb).await
        }
    };
    let (mut response, response_bytes) = render(outcome);
    if user.is_some()
        && let Some(warning) = deprecation_warning(&route, &shared.opts.git_version)
        && let Ok(value) = http::HeaderValue::from_str(&warning)
    {
        response.headers_mut().insert(header::WARNING, value);
    }
    let status = response.status().as_u16();
    tracing::debug!(method = %parts.method, %path, status, user = user.as_ref().map(|u| u.user.as_str()), "test API server request");
    shared.mutate(|s| {
        let seq = s.log.len();
        s.log.push(RequestRecord {
            seq,
            method: parts.method.clone(),
            path,
            query,
            verb,
            user: user.map(|u| u.user),
            status,
            request_bytes,
            response_bytes,
            at: started,
            duration: started.elapsed(),
        });
    });
    Ok(response)
}

async fn serve(
    call: &Call<'_>,
    route: &Route,
    method: &Method,
    path: &str,
    verb: &'static str,
) -> Result<Reply, ApiError> {
    let fault = call.shared.mutate(|s| {
        let fault = faults::take(&mut s.faults, method, path);
        s.faults_applied += usize::from(fault.is_some());
        fault
    });
    match fault {
        Some(FaultAction::InternalError) => return Err(ApiError::internal("injected fault".to_owned())),
        Some(FaultAction::InternalErrorSaying(message)) => return Err(ApiError::internal(message)),
        Some(FaultAction::TooManyRequests { retry_after_secs }) => {
            return Err(ApiError::too_many_requests(retry_after_secs));
        }
        Some(FaultAction::Throttled { code, header_secs, details_secs }) => {
            return Err(ApiError::throttled(code, header_secs, details_secs));
        }
        Some(FaultAction::Delay(delay)) => tokio::time::sleep(delay).await,
        None => {}
    }
    match (route, verb) {
        (Route::Version, _) if method == Method::GET => Ok(discovery::version(&call.shared.opts)),
        (Route::CoreGroup, _) if method == Method::GET => Ok(discovery::core_group()),
        (Route::CoreV1, _) if method == Method::GET => Ok(discovery::core_v1()),
        (Route::Apis, _) if method == Method::GET => Ok(discovery::apis(&call.shared.opts)),
        (Route::Group, _) if method == Method::GET => Ok(discovery::group(&call.shared.opts)),
        (Route::GroupVersion(v), _) if method == Method::GET => Ok(discovery::group_version(*v)),
        (Route::Pods, "list") => pods::list(call),
        (Route::Pods, "watch") => watch::start_pods(call),
        (Route::Slices(v), "list") => slices::list(call, *v),
        (Route::Slices(v), "watch") => watch::start(call, *v),
        (Route::Slices(v), "create") => slices::create(call, *v),
        (Route::Slice(v, name), "get") => slices::get(call, *v, name),
        (Route::Slice(v, name), "update") => slices::update(call, *v, name),
        (Route::Slice(v, name), "delete") => slices::delete(call, *v, name),
        (Route::Slice(v, name), "patch") => slices::patch(call, *v, name),
        (Route::Claim(v, ns, name), "get") => claim_get(call, *v, ns, name),
        (Route::ClaimStatus(v, ns, name), "patch") => super::claim_status::apply(call, *v, ns, name),
        (Route::Node(name), "get") => node_get(call, name),
        (Route::AccessReview, "create") => reviews::access_review(call),
        (Route::SelfReview, "create") => reviews::self_review(call),
        (Route::Unknown, _) => Err(ApiError::path_not_found()),
        _ => Err(ApiError::method_not_allowed(method.as_str())),
    }
}

fn claim_get(call: &Call<'_>, version: ApiVersion, namespace: &str, name: &str) -> Result<Reply, ApiError> {
    let (claim, on_node) = {
        let state = call.shared.lock();
        let node = call.user.user.strip_prefix("system:node:").unwrap_or_default();
        let on_node =
            state.claim_nodes.get(&(namespace.to_owned(), name.to_owned())).is_some_and(|nodes| nodes.contains(node))
                || (!node.is_empty() && state.pod_on_node_uses_claim(node, namespace, name));
        (state.claim(namespace, name), on_node)
    };
    let attrs = Attributes {
        verb: "get",
        resource: CLAIMS,
        namespace: Some(namespace),
        name: Some(name),
        selector_node: None,
        existing_node: None,
        new_node: None,
        claim_on_node: on_node,
    };
    call.authorize(&attrs)?;
    let claim = claim.ok_or_else(|| ApiError::not_found(CLAIMS, name))?;
    let out = with_type(&convert::claim_out(version, &claim), version.as_str(), "ResourceClaim");
    Ok(Reply::Json(StatusCode::OK, out))
}

fn node_get(call: &Call<'_>, name: &str) -> Result<Reply, ApiError> {
    let attrs = Attributes { name: Some(name), ..Attributes::new("get", NODES) };
    call.authorize(&attrs)?;
    let node = call.shared.lock().nodes.get(name).cloned().ok_or_else(|| ApiError::not_found(NODES, name))?;
    Ok(Reply::Json(StatusCode::OK, with_type(&node, "v1", "Node")))
}

/// The `Warning: 299` header the real server adds for a deprecated version, from the
/// release that deprecated it (v1beta1: 1.35, removed 1.38; v1beta2: 1.36, removed 1.39).
fn deprecation_warning(route: &Route, git_version: &str) -> Option<String> {
    let (version, kind) = match route {
        Route::Slices(v) | Route::Slice(v, _) => (*v, "ResourceSlice"),
        Route::Claim(v, _, _) | Route::ClaimStatus(v, _, _) => (*v, "ResourceClaim"),
        _ => return None,
    };
    let (deprecated, removed) = match version {
        ApiVersion::V1beta1 => (35, 38),
        ApiVersion::V1beta2 => (36, 39),
        ApiVersion::V1 => return None,
    };
    let minor: u32 = git_version.trim_start_matches('v').split('.').nth(1)?.parse().ok()?;
    (minor >= deprecated).then(|| {
        format!(
            "299 - \"{} {kind} is deprecated in v1.{deprecated}+, unavailable in v1.{removed}+; use resource.k8s.io/v1 {kind}\"",
            version.group_version()
        )
    })
}

fn render(outcome: Result<Reply, ApiError>) -> (Response<Body>, usize) {
    let (status, value, retry_after) = match outcome {
        Ok(Reply::Stream(body)) => {
            let response = Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "application/json")
                .body(body)
                .unwrap_or_else(|_| Response::new(empty()));
            return (response, 0);
        }
        Ok(Reply::Json(status, value)) => (status, value, None),
        Err(err) => (err.code, err.body, err.retry_after),
    };
    let bytes = serde_json::to_vec(&value).unwrap_or_default();
    let len = bytes.len();
    let mut builder = Response::builder().status(status).header(header::CONTENT_TYPE, "application/json");
    if let Some(secs) = retry_after {
        builder = builder.header(header::RETRY_AFTER, secs.to_string());
    }
    let response =
        builder.body(Full::new(Bytes::from(bytes)).boxed_unsync()).unwrap_or_else(|_| Response::new(empty()));
    (response, len)
}

pub(crate) fn empty() -> Body {
    Full::new(Bytes::new()).boxed_unsync()
}
