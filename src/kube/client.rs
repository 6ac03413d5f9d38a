//! The HTTP side of the client: one pooled hyper-util client over rustls (HTTP/2 by ALPN,
//! HTTP/1.1 fallback), bearer tokens (re-read from their file when it changes), a
//! client-side rate limit, per-request timeouts, retries with jittered backoff, and
//! request statistics.
//!
//! Retry policy. Attempts are bounded (`max_attempts`, default 5) and so is the total time
//! (`retry_budget`, default 60 s). Never retried: any 4xx other than 429. Always retried:
//! 429 (after `Retry-After` when given, capped at [`super::MAX_RETRY_AFTER`]; a delay
//! beyond the retry budget returns the error at once; a value that is no delay, such as a
//! negative one, is ignored for the client's own backoff), 503 with `Retry-After`, and connect
//! failures (the request never left; except TLS verification failures, which retrying
//! cannot fix). Reads (GET) and preconditioned writes (PUT carries the object's
//! resourceVersion, DELETE carries uid + resourceVersion preconditions: a replay after an
//! unseen success yields 409/404, never a double write) are also retried on other 5xx,
//! timeouts and broken connections. POST (create, possibly with generateName) is NOT retried
//! after an ambiguous failure (5xx other than 503+Retry-After, timeout, connection lost after
//! sending): the object may have been created, and a replay would create a second one; the
//! error goes to the caller, whose reconcile loop lists and converges.
//!
//! Limits. A response body is read only up to what the request can return
//! (`body_limit`), and bodies of single objects read at once share a budget
//! ([`super::body`]); a request given a deadline (`Client::request_by`) is not sent when
//! the rate limit would hold it past that deadline ([`Error::Throttled`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri, header};
use http_body_util::{Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

use super::auth::{Auth, Credentials};
use super::backoff::{Backoff, RateLimiter, deadline_in};
use super::body::{BODY_BUDGET, BodyBudget, ReadError, Room, collect};
use super::credentials::read_token;
use super::error::find_tls_error;
use super::{Error, tls};

/// A request with a deadline is sent only if the server then has at least this long to
/// answer; otherwise it is refused as throttled rather than cut short and blamed on the
/// server.
const MIN_TIME_TO_ANSWER: Duration = Duration::from_secs(1);

type Http = hyper_util::client::legacy::Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Tunables of the client (from `config.kube` plus fixed policy).
#[derive(Debug, Clone, PartialEq)]
pub struct ClientSettings {
    /// Sustained requests per second (client-side rate limit).
    pub qps: f64,
    /// Requests allowed at once before the rate limit applies.
    pub burst: u32,
    /// Timeout of one request, including reading its body (watches: only the headers).
    pub request_timeout: Duration,
    /// Attempts per request, including the first.
    pub max_attempts: u32,
    /// Total time a request may spend in retries.
    pub retry_budget: Duration,
    /// First retry delay; doubles up to `retry_max_delay`, jittered.
    pub retry_base_delay: Duration,
    pub retry_max_delay: Duration,
    /// `timeoutSeconds` sent with each watch.
    pub watch_timeout_seconds: u32,
    /// First and maximum delay between watch reconnects after errors.
    pub watch_backoff_base: Duration,
    pub watch_backoff_max: Duration,
}

impl Default for ClientSettings {
    fn default() -> Self {
        ClientSettings {
            qps: 100.0,
            burst: 200,
            request_timeout: Duration::from_secs(30),
            max_attempts: 5,
            retry_budget: Duration::from_secs(60),
            retry_base_delay: Duration::from_millis(200),
            retry_max_delay: Duration::from_secs(5),
            watch_timeout_seconds: 290,
            watch_backoff_base: Duration::from_millis(500),
            watch_backoff_max: Duration::from_secs(30),
        }
    }
}

impl ClientSettings {
    pub fn from_config(k: &crate::config::KubeSettings) -> Self {
        ClientSettings { qps: k.qps, burst: k.burst, request_timeout: k.request_timeout, ..Default::default() }
    }
}

/// Requests by verb and response code (0 = no response), and bytes on the wire (bodies).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestStats {
    pub requests: BTreeMap<(String, u16), u64>,
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

impl RequestStats {
    /// Requests with this verb (`GET`, `LIST`, `WATCH`, `POST`, `PUT`, `DELETE`) and code.
    pub fn count(&self, verb: &str, code: u16) -> u64 {
        self.requests.get(&(verb.to_string(), code)).copied().unwrap_or(0)
    }
    /// All requests with this verb.
    pub fn verb_total(&self, verb: &str) -> u64 {
        self.requests.iter().filter(|((v, _), _)| v == verb).map(|(_, n)| n).sum()
    }
    pub fn total(&self) -> u64 {
        self.requests.values().sum()
    }
}

#[derive(Debug, Default)]
struct Stats {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    sent: AtomicU64,
    received: AtomicU64,
}

/// A bearer token file, re-read when its modification time changes or a minute passed.
#[derive(Debug)]
struct TokenFile {
    path: PathBuf,
    cache: Mutex<Option<(Option<SystemTime>, Instant, HeaderValue)>>,
}

impl TokenFile {
    fn header(&self) -> Result<HeaderValue, Error> {
        let mtime = std::fs::metadata(&self.path).and_then(|m| m.modified()).ok();
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((m, at, h)) = cache.as_ref()
            && *m == mtime
            && at.elapsed() < Duration::from_secs(60)
        {
            return Ok(h.clone());
        }
        let h = bearer(read_token(&self.path)?.expose(), &self.path.display().to_string())?;
        *cache = Some((mtime, Instant::now(), h.clone()));
        Ok(h)
    }
}

fn bearer(token: &str, origin: &str) -> Result<HeaderValue, Error> {
    let mut h = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| Error::CredentialFile {
        path: PathBuf::from(origin),
        problem: "the token contains characters not allowed in an HTTP header".into(),
    })?;
    h.set_sensitive(true);
    Ok(h)
}

#[derive(Debug)]
enum Authz {
    None,
    Static(HeaderValue),
    File(TokenFile),
}

/// The Kubernetes API client. Cheap to clone; clones share connections, rate limit and stats.
#[derive(Clone)]
pub struct Client {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    http: Http,
    server: String,
    identity: String,
    authz: Authz,
    limiter: RateLimiter,
    pub(super) settings: ClientSettings,
    stats: Stats,
    user_agent: HeaderValue,
    budget: BodyBudget,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("server", &self.inner.server).field("identity", &self.inner.identity).finish()
    }
}

/// When a request must be done, and whether it may wait in the rate limit's queue.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pace {
    /// All done by then (no deadline: however long it takes).
    pub(super) until: Option<Instant>,
    /// Wait for a token (in time for `until`); otherwise only a token free at once, never
    /// queueing ahead of requests that wait for theirs ([`Error::Throttled`] otherwise):
    /// for work nobody waits for yet.
    pub(super) queue: bool,
}

/// Why one attempt failed, for the retry decision.
enum Failure {
    /// The server answered with an error status.
    Status(Error, Option<u64>),
    /// Connecting failed: the request never left.
    Connect(Error),
    /// The request may have reached the server (broken connection, timeout).
    Ambiguous(Error),
    /// The request could not be built (e.g. the token file is unreadable): not retried.
    Fatal(Error),
}

impl Client {
    /// Resolve credentials (configured kubeconfig, KUBECONFIG, in-cluster, k3s) and build
    /// the TLS configuration. No network traffic.
    pub fn from_config(cfg: &crate::config::Config) -> Result<Client, Error> {
        // vars_os: `std::env::vars` panics on a non-UTF-8 variable; such variables are skipped.
        let env = std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
        let sources = super::Sources::from_settings(&cfg.kube, env);
        let creds = super::credentials::resolve(&sources)?;
        Client::new(creds, ClientSettings::from_config(&cfg.kube))
    }

    /// A client for these credentials. No network traffic.
    pub fn new(creds: Credentials, settings: ClientSettings) -> Result<Client, Error> {
        let server = creds.server.trim_end_matches('/').to_string();
        let uri: Uri = server
            .parse()
            .map_err(|e| Error::TlsConfig { problem: format!("server {server:?} is not a valid URL: {e}") })?;
        if uri.scheme_str() != Some("https") || uri.authority().is_none() {
            return Err(Error::TlsConfig { problem: format!("server {server:?} must be an https:// URL") });
        }
        let tls = tls::client_config(&creds)?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(settings.request_timeout));
        let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_only();
        let builder = match &creds.tls_server_name {
            Some(name) => {
                let name = rustls::pki_types::ServerName::try_from(name.clone()).map_err(|e| Error::TlsConfig {
                    problem: format!("tls-server-name {name:?} is not a valid server name: {e}"),
                })?;
                builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
            }
            None => builder,
        };
        let connector = builder.enable_all_versions().wrap_connector(http);
        let http = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        let authz = match &creds.auth {
            Auth::Token(t) => Authz::Static(bearer(t.expose(), "token")?),
            Auth::TokenFile(p) => Authz::File(TokenFile { path: p.clone(), cache: Mutex::new(None) }),
            Auth::None | Auth::ClientCert { .. } => Authz::None,
        };
        let user_agent = HeaderValue::from_str(&format!("edra/{}", crate::util::VERSION))
            .unwrap_or_else(|_| HeaderValue::from_static("edra"));
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                server,
                identity: creds.identity.clone(),
                authz,
                limiter: RateLimiter::new(settings.qps, settings.burst),
                settings,
                stats: Stats::default(),
                user_agent,
                budget: BodyBudget::new(BODY_BUDGET, OBJECT_BODY_LIMIT),
            }),
        })
    }

    /// The API server's address.
    pub fn server_url(&self) -> &str {
        &self.inner.server
    }

    /// Where the identity came from, e.g. "client certificate … from /var/lib/rancher/…".
    pub fn identity(&self) -> &str {
        &self.inner.identity
    }

    /// The bytes held by response bodies ([`super::body`]).
    pub fn body_budget(&self) -> &BodyBudget {
        &self.inner.budget
    }

    /// A snapshot of the request counters.
    pub fn stats(&self) -> RequestStats {
        let requests = self.inner.stats.requests.lock().unwrap_or_else(|p| p.into_inner()).clone();
        RequestStats {
            requests,
            bytes_sent: self.inner.stats.sent.load(Ordering::Relaxed),
            bytes_received: self.inner.stats.received.load(Ordering::Relaxed),
        }
    }

    pub(super) fn record_received(&self, n: usize) {
        self.inner.stats.received.fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn record(&self, verb: &str, code: u16) {
        let mut m = self.inner.stats.requests.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((verb.to_string(), code)).or_default() += 1;
    }

    /// Turn a path-only request into a full one with server, auth and user agent.
    fn prepare(&self, req: &Request<Bytes>) -> Result<Request<Full<Bytes>>, Error> {
        let op = operation(req);
        let pq = req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let uri: Uri = format!("{}{}", self.inner.server, pq)
            .parse()
            .map_err(|e: http::uri::InvalidUri| Error::Transport { operation: op.clone(), source: Box::new(e) })?;
        let mut out = Request::builder().method(req.method().clone()).uri(uri);
        for (k, v) in req.headers() {
            out = out.header(k, v);
        }
        out = out.header(header::USER_AGENT, self.inner.user_agent.clone());
        match &self.inner.authz {
            Authz::None => {}
            Authz::Static(h) => out = out.header(header::AUTHORIZATION, h.clone()),
            Authz::File(f) => out = out.header(header::AUTHORIZATION, f.header()?),
        }
        out.body(Full::new(req.body().clone())).map_err(|e| Error::Transport { operation: op, source: Box::new(e) })
    }

    /// Take a token of the rate limit: in time to leave [`MIN_TIME_TO_ANSWER`] before
    /// `until` when given (else refuse at once with [`Error::Throttled`]), or only one
    /// free at once when the pace does not queue; otherwise however long it takes.
    async fn throttle(&self, req: &Request<Bytes>, pace: Pace) -> Result<(), Error> {
        let limiter = &self.inner.limiter;
        let Some(until) = pace.until else {
            limiter.acquire().await;
            return Ok(());
        };
        let send_by =
            if pace.queue { until.checked_sub(MIN_TIME_TO_ANSWER).unwrap_or(until) } else { Instant::now().min(until) };
        limiter.acquire_by(send_by).await.map_err(|t| Error::Throttled {
            operation: operation(req),
            qps: self.inner.settings.qps,
            burst: self.inner.settings.burst,
            queued: t.queued,
            wait: t.wait,
        })
    }

    /// Send once after taking a token of the rate limit; returns the response with its
    /// headers (body not read) unless the request timeout or `until` passes first. The
    /// timeout starts once the request leaves, not while it waits for its token.
    async fn send(&self, req: &Request<Bytes>, pace: Pace) -> Result<(Response<Incoming>, Instant), Failure> {
        let op = operation(req);
        let until = pace.until;
        let full = self.prepare(req).map_err(Failure::Fatal)?;
        tracing::Instrument::instrument(self.throttle(req, pace), tracing::trace_span!("http.throttle"))
            .await
            .map_err(Failure::Fatal)?;
        let started = Instant::now();
        let timeout = self.inner.settings.request_timeout;
        let per_attempt = deadline_in(timeout);
        let deadline = until.map_or(per_attempt, |u| u.min(per_attempt));
        self.inner.stats.sent.fetch_add(u64::try_from(req.body().len()).unwrap_or(u64::MAX), Ordering::Relaxed);
        let headers = tracing::trace_span!("http.headers");
        match tracing::Instrument::instrument(tokio::time::timeout_at(deadline, self.inner.http.request(full)), headers)
            .await
        {
            Err(_) => {
                self.record(verb(req), 0);
                Err(Failure::Ambiguous(Error::Timeout {
                    operation: op,
                    after: deadline.saturating_duration_since(started),
                }))
            }
            Ok(Err(e)) => {
                self.record(verb(req), 0);
                let connect = e.is_connect();
                let err = match find_tls_error(&e) {
                    Some(source) => Error::Tls { operation: op, source },
                    None => Error::Transport { operation: op, source: Box::new(e) },
                };
                Err(if connect { Failure::Connect(err) } else { Failure::Ambiguous(err) })
            }
            Ok(Ok(resp)) => {
                self.record(verb(req), resp.status().as_u16());
                Ok((resp, deadline))
            }
        }
    }

    /// Read a whole body before `deadline` into `room`, at most `limit` bytes of it (a
    /// longer one is an error as soon as its length shows, from `Content-Length` or while
    /// reading); `None`: the body outgrew its room ([`ReadError::Crowded`]).
    async fn read_body(
        &self,
        op: &str,
        resp: Response<Incoming>,
        deadline: Instant,
        (limit, room): (BodyLimit, Room),
    ) -> Result<Option<Bytes>, Error> {
        let too_large = || Error::TooLarge { operation: op.to_string(), what: limit.what, limit: limit.bytes };
        let declared = resp.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| usize::try_from(n).map_or(true, |n| n > limit.bytes)) {
            return Err(too_large());
        }
        let timeout = self.inner.settings.request_timeout;
        let body = Limited::new(resp.into_body(), limit.bytes);
        let collected = match tokio::time::timeout_at(deadline, collect(body, declared, limit.bytes, room)).await {
            Err(_) => return Err(Error::Timeout { operation: op.to_string(), after: timeout }),
            Ok(Err(ReadError::Crowded)) => return Ok(None),
            Ok(Err(ReadError::Body(e))) if e.is::<LengthLimitError>() => return Err(too_large()),
            Ok(Err(ReadError::Body(e))) => return Err(Error::Transport { operation: op.to_string(), source: e }),
            Ok(Ok(b)) => b,
        };
        self.record_received(collected.len());
        Ok(Some(collected))
    }

    /// One attempt, body included, within one request timeout (and before `until`). A body
    /// that outgrows the room it was given is read again with all the room it may need.
    async fn attempt(&self, req: &Request<Bytes>, pace: Pace) -> Result<Bytes, Failure> {
        let op = operation(req);
        let limit = body_limit(req);
        let mut large = false;
        loop {
            let room = self
                .inner
                .budget
                .room_by(limit.bytes, large, pace.until)
                .await
                .ok_or_else(|| Failure::Fatal(Error::Timeout { operation: op.clone(), after: Duration::ZERO }))?;
            let (resp, deadline) = self.send(req, pace).await?;
            let status = resp.status();
            let retry_after = retry_after(&resp);
            let body = self.read_body(&op, resp, deadline, (limit, room));
            let body = tracing::Instrument::instrument(body, tracing::trace_span!("http.body")).await.map_err(|e| {
                // A server that sends more than the object can be will do so again.
                if e.is_too_large() { Failure::Fatal(e) } else { Failure::Ambiguous(e) }
            })?;
            let Some(body) = body else {
                // With all the room it may need a body cannot outgrow it; were it to, say so.
                if large {
                    let e = Error::TooLarge { operation: op, what: limit.what, limit: limit.bytes };
                    return Err(Failure::Fatal(e));
                }
                large = true;
                continue;
            };
            if status.is_success() {
                return Ok(body);
            }
            let err = Error::from_status(op, status.as_u16(), &body, retry_after);
            let ra = err.api().and_then(|a| a.retry_after);
            return Err(Failure::Status(err, ra));
        }
    }

    /// Send with the retry policy (module doc) and return the successful body.
    pub(super) async fn request(&self, req: Request<Bytes>) -> Result<Bytes, Error> {
        self.request_by(req, None).await
    }

    /// Like [`Client::request`], all done by `until` when given: attempts are cut short
    /// at it, and a request the rate limit would hold past it is not sent
    /// ([`Error::Throttled`]).
    pub(super) async fn request_by(&self, req: Request<Bytes>, until: Option<Instant>) -> Result<Bytes, Error> {
        self.request_paced(req, Pace { until, queue: true }).await
    }

    /// [`Client::request_by`] at pace `pace`.
    pub(super) async fn request_paced(&self, req: Request<Bytes>, pace: Pace) -> Result<Bytes, Error> {
        let until = pace.until;
        let s = &self.inner.settings;
        let budget = deadline_in(s.retry_budget);
        let deadline = until.map_or(budget, |u| u.min(budget));
        let mut backoff = Backoff::new(s.retry_base_delay, s.retry_max_delay);
        let post = req.method() == Method::POST;
        let mut attempt = 1u32;
        loop {
            let failure = match self.attempt(&req, pace).await {
                Ok(body) => return Ok(body),
                Err(f) => f,
            };
            let (err, delay) = match failure {
                Failure::Status(err, ra) => {
                    let code = err.status().unwrap_or(0);
                    let retriable = code == 429
                        || (code == 503 && ra.is_some())
                        || (!post && StatusCode::from_u16(code).is_ok_and(|c| c.is_server_error()));
                    if !retriable {
                        return Err(err);
                    }
                    let d = ra.map(Duration::from_secs).unwrap_or_else(|| backoff.next_delay());
                    (err, d)
                }
                // A certificate the client does not trust will not become trusted on retry.
                Failure::Connect(err) if err.is_tls() => return Err(err),
                Failure::Connect(err) => (err, backoff.next_delay()),
                Failure::Ambiguous(err) if !post => (err, backoff.next_delay()),
                Failure::Ambiguous(err) | Failure::Fatal(err) => return Err(err),
            };
            // A delay that does not fit in the clock is certainly beyond the deadline.
            if attempt >= s.max_attempts || Instant::now().checked_add(delay).is_none_or(|at| at > deadline) {
                return Err(err);
            }
            tracing::debug!(operation = %operation(&req), error = %err, ?delay, attempt, "retrying request");
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    /// Start a streaming request (watch): one attempt, the timeout covers only the headers.
    pub(super) async fn stream(&self, req: Request<Bytes>) -> Result<Incoming, Error> {
        let op = operation(&req);
        let resp = match self.send(&req, Pace { until: None, queue: true }).await {
            Ok((r, _)) => r,
            Err(Failure::Status(e, _) | Failure::Connect(e) | Failure::Ambiguous(e) | Failure::Fatal(e)) => {
                return Err(e);
            }
        };
        let status = resp.status();
        if status.is_success() {
            return Ok(resp.into_body());
        }
        let ra = retry_after(&resp);
        let deadline = deadline_in(self.inner.settings.request_timeout);
        let body = self.read_body(&op, resp, deadline, (body_limit(&req), Room::uncounted())).await?;
        Err(Error::from_status(op, status.as_u16(), &body.unwrap_or_default(), ra))
    }
}

/// The most a response body may hold, by what was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BodyLimit {
    pub bytes: usize,
    /// What was asked for, for the error message.
    pub what: &'static str,
}

/// Discovery documents (`/version`, `/api`, `/apis/<group>[/<version>]`) are a few KiB.
pub const DISCOVERY_BODY_LIMIT: usize = 1 << 20;
/// One object: the API server stores at most about 1.5 MiB per object (etcd's request
/// limit) and accepts writes of at most 3 MiB; its JSON stays far below this, which is
/// also the limit of one watch event.
pub const OBJECT_BODY_LIMIT: usize = 16 << 20;
/// A list of this node's ResourceSlices.
pub const LIST_BODY_LIMIT: usize = 64 << 20;

/// The body limit of a request (watches: of its error body; events have their own).
pub(super) fn body_limit(req: &Request<Bytes>) -> BodyLimit {
    let path = req.uri().path().trim_end_matches('/');
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let discovery =
        matches!(segments.as_slice(), ["version"] | ["api"] | ["apis"] | ["api", _] | ["apis", _] | ["apis", _, _]);
    if discovery {
        BodyLimit { bytes: DISCOVERY_BODY_LIMIT, what: "a discovery document" }
    } else if verb(req) == "LIST" && path == super::request::PODS_PATH {
        BodyLimit { bytes: LIST_BODY_LIMIT, what: "a list of one node's pods" }
    } else if verb(req) == "LIST" {
        BodyLimit { bytes: LIST_BODY_LIMIT, what: "a list of one node's ResourceSlices" }
    } else {
        BodyLimit { bytes: OBJECT_BODY_LIMIT, what: "one object" }
    }
}

fn retry_after(resp: &Response<Incoming>) -> Option<u64> {
    resp.headers().get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(super::error::parse_retry_after)
}

/// `GET /path` (without the query, which may be long).
pub(super) fn operation(req: &Request<Bytes>) -> String {
    format!("{} {}", verb(req), req.uri().path())
}

/// The verb for statistics: LIST and WATCH are told apart from GET.
fn verb(req: &Request<Bytes>) -> &'static str {
    let query = req.uri().query().unwrap_or("");
    match *req.method() {
        Method::GET if query.split('&').any(|p| p == "watch=true") => "WATCH",
        Method::GET
            if req.uri().path().ends_with("/resourceslices") || req.uri().path() == super::request::PODS_PATH =>
        {
            "LIST"
        }
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        _ => "OTHER",
    }
}
