//! The error type of the Kubernetes client: typed API errors decoded from the server's
//! `Status` body, plus transport, TLS, timeout, decoding and credential errors. Each
//! variant names the failed operation and keeps its cause.

use std::path::PathBuf;
use std::time::Duration;

/// The longest server-supplied retry delay edra accepts (`Retry-After` header or
/// `details.retryAfterSeconds`); a longer one is taken as this. It is also the client's
/// whole retry budget, so a capped delay ends the retries with the server's error at once.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// A server-supplied delay in seconds, capped at [`MAX_RETRY_AFTER`].
pub fn cap_retry_after(secs: u64) -> u64 {
    secs.min(MAX_RETRY_AFTER.as_secs())
}

/// The delay a `Retry-After` header gives, read as `details.retryAfterSeconds` is: any
/// non-negative decimal number of seconds (`2`, `0.5`, `1e308`), rounded up and capped at
/// [`MAX_RETRY_AFTER`]. Anything else (a negative number, `NaN`, an HTTP date, text) is no
/// delay: the client then retries on its own backoff.
pub fn parse_retry_after(header: &str) -> Option<u64> {
    let text = header.trim();
    let numeric = text.starts_with(|c: char| c.is_ascii_digit())
        && text.chars().all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'));
    if !numeric {
        return None;
    }
    if let Ok(u) = text.parse::<u64>() {
        return Some(cap_retry_after(u));
    }
    non_negative_seconds(text.parse::<f64>().ok()?)
}

/// Whole seconds from a non-negative number of seconds (rounded up, capped); `None` for a
/// negative one or NaN.
fn non_negative_seconds(f: f64) -> Option<u64> {
    // A float-to-integer `as` saturates: 1e300 (or infinity) becomes u64::MAX, then the cap.
    (f >= 0.0).then(|| cap_retry_after(f.ceil() as u64))
}

/// An error response from the API server, decoded from its `Status` body when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The operation, e.g. `GET /api/v1/nodes/n1`.
    pub operation: String,
    /// The HTTP status code.
    pub code: u16,
    /// The `Status.reason` (e.g. `NotFound`, `Conflict`), empty when the body had none.
    pub reason: String,
    /// The server's message, or the raw body when it was not a `Status`.
    pub message: String,
    /// Field-level causes (for 422 Invalid): `field: message`.
    pub causes: Vec<String>,
    /// `Retry-After` seconds, when the server sent the header or `details.retryAfterSeconds`,
    /// capped at [`MAX_RETRY_AFTER`].
    pub retry_after: Option<u64>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: HTTP {}", self.operation, self.code)?;
        if !self.reason.is_empty() {
            write!(f, " {}", self.reason)?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        if !self.causes.is_empty() {
            write!(f, " ({})", self.causes.join("; "))?;
        }
        Ok(())
    }
}

/// What to do when no source had credentials: the end of [`Error::NoCredentials`]'s message
/// (also `credentials::NO_CREDENTIALS_FIX`, where the search order is).
pub const NO_CREDENTIALS_FIX: &str = "set kubernetes.kubeconfig (--kubeconfig) or KUBECONFIG, run in a pod with a \
     service account, or run on a k3s node as root";

/// Everything that can go wrong talking to the API server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// 404: the object does not exist.
    #[error("not found: {0}")]
    NotFound(ApiError),
    /// 409: a stale `resourceVersion`, a failed precondition, or the name already exists.
    #[error("conflict: {0}")]
    Conflict(ApiError),
    /// 403: authenticated but not allowed; the server's message says by which rule.
    #[error("forbidden: {0}; check the RBAC rules (and node authorization) for edra's identity")]
    Forbidden(ApiError),
    /// 401: the credentials were not accepted.
    #[error("unauthorized: {0}; the client certificate or token was rejected, check that it is current")]
    Unauthorized(ApiError),
    /// 410: the requested resourceVersion is too old (watch and list).
    #[error("gone: {0}")]
    Gone(ApiError),
    /// 422: the object failed validation.
    #[error("invalid: {0}")]
    Invalid(ApiError),
    /// 429: throttled by the server, still so after retrying.
    #[error("too many requests: {0}")]
    TooManyRequests(ApiError),
    /// 5xx: the server failed, still so after retrying.
    #[error("server error: {0}")]
    ServerError(ApiError),
    /// Any other error status (e.g. 400, 405).
    #[error("request failed: {0}")]
    Api(ApiError),
    /// The connection failed or broke.
    #[error("{operation}: connection to the API server failed: {source}")]
    Transport {
        operation: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The TLS handshake failed (untrusted server certificate, rejected client certificate).
    #[error(
        "{operation}: TLS handshake with the API server failed: {source}; check the certificate authority and the client certificate"
    )]
    Tls {
        operation: String,
        #[source]
        source: rustls::Error,
    },
    /// edra's own client-side rate limit would hold the request past its deadline, so it
    /// was not sent: the API server was not asked.
    #[error(
        "{operation}: not sent: edra's own client-side rate limit (kubernetes.qps = {qps}, kubernetes.burst = {burst}) has {queued} requests queued ahead, a wait of {wait:.1?} that would pass this request's deadline; the API server was not asked. Raise kubernetes.qps and kubernetes.burst if this is normal load"
    )]
    Throttled { operation: String, qps: f64, burst: u32, queued: u64, wait: Duration },
    /// The response body is larger than what edra asked for can be: not read further, not
    /// retried.
    #[error(
        "{operation}: the response is larger than {} MiB, the most {what} can be; the API server or a proxy in front of it is misbehaving (not retried)",
        limit >> 20
    )]
    TooLarge { operation: String, what: &'static str, limit: usize },
    /// No response (or body) within the timeout.
    #[error("{operation}: no response within {after:?}")]
    Timeout { operation: String, after: Duration },
    /// The response was not the JSON we expected.
    #[error("{operation}: cannot decode the response: {source}")]
    Decode {
        operation: String,
        #[source]
        source: serde_json::Error,
    },
    /// An object could not be encoded or converted for the chosen API version.
    #[error("{operation}: cannot convert the object: {problem}")]
    Convert { operation: String, problem: String },
    /// A kubeconfig file is unusable.
    #[error("kubeconfig {path}: {problem}")]
    Kubeconfig { path: PathBuf, problem: String },
    /// In-cluster (service account) credentials are unusable.
    #[error("in-cluster credentials in {dir}: {problem}")]
    InCluster { dir: PathBuf, problem: String },
    /// A credential file (token, certificate, key) could not be read at request time.
    #[error("credential file {path}: {problem}")]
    CredentialFile { path: PathBuf, problem: String },
    /// No credentials found anywhere.
    #[error(
        "no usable Kubernetes credentials; tried, in order:\n  - {}\n{}",
        tried.join("\n  - "),
        NO_CREDENTIALS_FIX
    )]
    NoCredentials { tried: Vec<String> },
    /// The TLS client configuration could not be built.
    #[error("building the TLS configuration: {problem}")]
    TlsConfig { problem: String },
    /// The server does not serve a resource.k8s.io version edra speaks.
    #[error(
        "the API server (Kubernetes {server_version}) serves no resource.k8s.io version edra supports (v1, v1beta2, v1beta1; served: {served}); use Kubernetes 1.34+ (DRA is on by default), or on 1.32/1.33 enable the DynamicResourceAllocation feature gate and --runtime-config=resource.k8s.io/v1beta1=true"
    )]
    NoResourceApi { server_version: String, served: String },
}

impl Error {
    /// The API error behind this error, if it came from an HTTP status.
    pub fn api(&self) -> Option<&ApiError> {
        match self {
            Error::NotFound(e)
            | Error::Conflict(e)
            | Error::Forbidden(e)
            | Error::Unauthorized(e)
            | Error::Gone(e)
            | Error::Invalid(e)
            | Error::TooManyRequests(e)
            | Error::ServerError(e)
            | Error::Api(e) => Some(e),
            _ => None,
        }
    }

    /// The HTTP status code, if the server answered.
    pub fn status(&self) -> Option<u16> {
        self.api().map(|e| e.code)
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound(_))
    }
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Conflict(_))
    }
    pub fn is_gone(&self) -> bool {
        matches!(self, Error::Gone(_))
    }
    pub fn is_forbidden(&self) -> bool {
        matches!(self, Error::Forbidden(_))
    }
    pub fn is_unauthorized(&self) -> bool {
        matches!(self, Error::Unauthorized(_))
    }
    pub fn is_invalid(&self) -> bool {
        matches!(self, Error::Invalid(_))
    }
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }
    pub fn is_tls(&self) -> bool {
        matches!(self, Error::Tls { .. })
    }
    /// The response was larger than its operation allows.
    pub fn is_too_large(&self) -> bool {
        matches!(self, Error::TooLarge { .. })
    }
    /// Held back by edra's own rate limit; never sent.
    pub fn is_throttled(&self) -> bool {
        matches!(self, Error::Throttled { .. })
    }

    /// Classify an error status and its body into a typed error.
    pub fn from_status(operation: String, code: u16, body: &[u8], retry_after_header: Option<u64>) -> Error {
        let api = decode_status(operation, code, body, retry_after_header);
        match code {
            401 => Error::Unauthorized(api),
            403 => Error::Forbidden(api),
            404 => Error::NotFound(api),
            409 => Error::Conflict(api),
            410 => Error::Gone(api),
            422 => Error::Invalid(api),
            429 => Error::TooManyRequests(api),
            500..=599 => Error::ServerError(api),
            _ => Error::Api(api),
        }
    }
}

/// The parts of `meta/v1 Status` edra reads.
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct Status {
    kind: String,
    message: String,
    reason: String,
    details: Option<StatusDetails>,
}

#[derive(serde::Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct StatusDetails {
    causes: Vec<StatusCause>,
    /// Any JSON number (the API says int32; a hostile server may send anything).
    retry_after_seconds: Option<serde_json::Number>,
}

/// Seconds from a JSON number: negative is none, fractions round up, huge is capped.
fn seconds(n: &serde_json::Number) -> Option<u64> {
    if let Some(u) = n.as_u64() {
        return Some(cap_retry_after(u));
    }
    non_negative_seconds(n.as_f64()?)
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct StatusCause {
    field: String,
    message: String,
}

/// Decode a `Status` body; a body that is not one becomes the message (truncated).
pub fn decode_status(operation: String, code: u16, body: &[u8], retry_after_header: Option<u64>) -> ApiError {
    let retry_after_header = retry_after_header.map(cap_retry_after);
    match serde_json::from_slice::<Status>(body) {
        Ok(s) if s.kind == "Status" || !s.message.is_empty() => {
            let details = s.details.unwrap_or_default();
            let causes = details
                .causes
                .into_iter()
                .map(|c| if c.field.is_empty() { c.message } else { format!("{}: {}", c.field, c.message) })
                .collect();
            ApiError {
                operation,
                code,
                reason: s.reason,
                message: s.message,
                causes,
                retry_after: retry_after_header.or(details.retry_after_seconds.as_ref().and_then(seconds)),
            }
        }
        _ => {
            let text = String::from_utf8_lossy(body);
            let message: String = text.trim().chars().take(512).collect();
            ApiError {
                operation,
                code,
                reason: String::new(),
                message,
                causes: Vec::new(),
                retry_after: retry_after_header,
            }
        }
    }
}

/// Find a rustls error anywhere in an error's source chain (also inside `io::Error`s).
pub fn find_tls_error(err: &(dyn std::error::Error + 'static)) -> Option<rustls::Error> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(t) = e.downcast_ref::<rustls::Error>() {
            return Some(t.clone());
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && let Some(t) = find_tls_error(inner)
        {
            return Some(t);
        }
        cur = e.source();
    }
    None
}
