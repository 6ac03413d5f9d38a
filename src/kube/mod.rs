//! edra's own Kubernetes API client, on hyper 1 + rustls (ring): credentials from a
//! kubeconfig, `KUBECONFIG`, the in-cluster service account or the k3s kubeconfigs
//! ([`credentials`], [`kubeconfig`]; what they are: [`auth`]; their files read bounded: [`files`]); TLS with reloading client certificates ([`tls`]);
//! pure request builders ([`request`]); transport with rate limit, timeouts and retries
//! ([`client`]); the operations edra needs ([`api`]); version conversion of
//! resource.k8s.io objects ([`convert`]); a watcher of ResourceSlices and of this node's pods
//! ([`watcher`], [`pods`]); and
//! self-reviews of identity and permissions ([`review`]); bounds on what a claim body may
//! hold before it is decoded ([`shape`]); the client with its discovered
//! resource.k8s.io version as the agent shares it ([`cluster`]).

pub mod api;
pub mod auth;
pub mod backoff;
pub mod body;
pub mod client;
pub mod cluster;
pub mod convert;
pub mod credentials;
mod error;
pub mod files;
pub mod kubeconfig;
pub mod pods;
pub mod request;
pub mod review;
pub mod shape;
pub mod tls;
pub mod watcher;

pub use api::SliceList;
pub use auth::{Auth, Credentials, Pem, Secret};
pub use client::{Client, ClientSettings, RequestStats};
pub use cluster::Cluster;
pub use credentials::Sources;
pub use error::{ApiError, Error, MAX_RETRY_AFTER, decode_status};
pub use request::ResourceApi;
pub use review::{AccessCheck, AccessDecision, SubjectInfo};
pub use watcher::Event;

#[cfg(test)]
mod tests;
