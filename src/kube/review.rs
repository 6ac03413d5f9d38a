//! Asking the API server about ourselves: who the credentials authenticate as
//! (`SelfSubjectReview`, authentication.k8s.io/v1) and whether they may perform an action
//! (`SelfSubjectAccessReview`, authorization.k8s.io/v1), plus the resource.k8s.io versions
//! the server serves. Used by `edra doctor`; nothing here changes cluster state.

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    FieldSelectorAttributes, ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use serde::Deserialize;

use super::client::operation;
use super::{Client, Error, request};

/// `POST` path of SelfSubjectAccessReviews.
pub const ACCESS_REVIEW_PATH: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
/// `POST` path of SelfSubjectReviews.
pub const SELF_REVIEW_PATH: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";

/// One action to ask about: `verb` on `resource` in API `group` (empty for the core group).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AccessCheck {
    pub verb: String,
    pub group: String,
    /// Plural resource name, e.g. `resourceslices`.
    pub resource: String,
    /// Namespace; `None` for cluster-scoped resources (or all namespaces).
    pub namespace: Option<String>,
    /// Object name; `None` for any object.
    pub name: Option<String>,
    /// Field selector the request would carry, e.g. `spec.nodeName=n1` (list and watch).
    pub field_selector: Option<String>,
    /// Subresource, e.g. `status`.
    pub subresource: Option<String>,
}

impl AccessCheck {
    /// `verb` on `resource` in `group`, any object, cluster scope.
    pub fn new(verb: &str, group: &str, resource: &str) -> Self {
        Self { verb: verb.into(), group: group.into(), resource: resource.into(), ..Default::default() }
    }

    /// The same check about the object called `name`.
    pub fn named(mut self, name: &str) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The same check on subresource `sub` (`resourceclaims/status`).
    pub fn subresource(mut self, sub: &str) -> Self {
        self.subresource = Some(sub.into());
        self
    }

    /// The same check for a request with this field selector.
    pub fn with_field_selector(mut self, selector: &str) -> Self {
        self.field_selector = Some(selector.into());
        self
    }

    /// `verb resource[.group][/name]` for messages.
    pub fn describe(&self) -> String {
        let mut out = format!("{} {}", self.verb, self.resource);
        if let Some(sub) = &self.subresource {
            out.push('/');
            out.push_str(sub);
        }
        if !self.group.is_empty() {
            out.push('.');
            out.push_str(&self.group);
        }
        if let Some(n) = &self.name {
            out.push('/');
            out.push_str(n);
        }
        if let Some(s) = &self.field_selector {
            out.push_str(&format!(" ({s})"));
        }
        out
    }

    fn to_review(&self) -> SelfSubjectAccessReview {
        SelfSubjectAccessReview {
            metadata: Default::default(),
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(self.verb.clone()),
                    group: Some(self.group.clone()),
                    resource: Some(self.resource.clone()),
                    subresource: self.subresource.clone(),
                    namespace: self.namespace.clone(),
                    name: self.name.clone(),
                    field_selector: self
                        .field_selector
                        .as_ref()
                        .map(|s| FieldSelectorAttributes { raw_selector: Some(s.clone()), requirements: None }),
                    ..Default::default()
                }),
                non_resource_attributes: None,
            },
            status: None,
        }
    }
}

/// The server's answer to an [`AccessCheck`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AccessDecision {
    pub allowed: bool,
    /// An authorizer explicitly denied (no other authorizer was asked).
    pub denied: bool,
    /// Why, when the server says (e.g. the RBAC rule or the node authorizer's reason).
    pub reason: String,
    /// An authorizer failed to evaluate the request.
    pub evaluation_error: String,
}

/// Who the credentials authenticate as.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubjectInfo {
    pub username: String,
    pub groups: Vec<String>,
}

impl SubjectInfo {
    /// The node name of a node identity (`system:node:<name>` in group `system:nodes`).
    pub fn node_name(&self) -> Option<&str> {
        let node = self.username.strip_prefix("system:node:")?;
        self.groups.iter().any(|g| g == "system:nodes").then_some(node)
    }
}

#[derive(Deserialize)]
struct ApiGroup {
    #[serde(default)]
    versions: Vec<GroupVersion>,
}

#[derive(Deserialize)]
struct GroupVersion {
    version: String,
}

impl Client {
    /// Asks whether these credentials may perform `check` (SelfSubjectAccessReview).
    pub async fn self_subject_access_review(&self, check: &AccessCheck) -> Result<AccessDecision, Error> {
        let body = serde_json::to_vec(&check.to_review())
            .map_err(|source| Error::Decode { operation: format!("POST {ACCESS_REVIEW_PATH}"), source })?;
        let req = request::post(ACCESS_REVIEW_PATH, body);
        let op = operation(&req);
        let body = self.request(req).await?;
        let review: SelfSubjectAccessReview =
            serde_json::from_slice(&body).map_err(|source| Error::Decode { operation: op, source })?;
        let status = review.status.unwrap_or_default();
        Ok(AccessDecision {
            allowed: status.allowed,
            denied: status.denied.unwrap_or(false),
            reason: status.reason.unwrap_or_default(),
            evaluation_error: status.evaluation_error.unwrap_or_default(),
        })
    }

    /// Asks who these credentials authenticate as (SelfSubjectReview, Kubernetes 1.28+).
    pub async fn self_subject_review(&self) -> Result<SubjectInfo, Error> {
        let review = SelfSubjectReview { metadata: Default::default(), status: None };
        let body = serde_json::to_vec(&review)
            .map_err(|source| Error::Decode { operation: format!("POST {SELF_REVIEW_PATH}"), source })?;
        let req = request::post(SELF_REVIEW_PATH, body);
        let op = operation(&req);
        let body = self.request(req).await?;
        let review: SelfSubjectReview =
            serde_json::from_slice(&body).map_err(|source| Error::Decode { operation: op, source })?;
        let user = review.status.and_then(|s| s.user_info).unwrap_or_default();
        Ok(SubjectInfo { username: user.username.unwrap_or_default(), groups: user.groups.unwrap_or_default() })
    }

    /// Every resource.k8s.io version the server serves (empty when the group is absent).
    pub async fn resource_api_versions(&self) -> Result<Vec<String>, Error> {
        let req = request::get("/apis/resource.k8s.io");
        let op = operation(&req);
        match self.request(req).await {
            Ok(body) => {
                let group: ApiGroup =
                    serde_json::from_slice(&body).map_err(|source| Error::Decode { operation: op, source })?;
                Ok(group.versions.into_iter().map(|v| v.version).collect())
            }
            Err(e) if e.is_not_found() => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests;
