//! The HTTP endpoint for Prometheus and health checks: `GET /metrics`, `/healthz`, `/readyz`.
//!
//! [`MetricsPort::bind`] binds the configured address at start. An address another
//! process holds does not stop edra (any user may bind a free port on the node first):
//! the error is logged with the fix, the kubelet is served regardless, and the address is
//! bound again with backoff until it is free. [`MetricsPort::serve`] answers on it until
//! shutdown, then lets open connections finish briefly and closes the rest. Plain HTTP/1.1
//! and HTTP/2 via hyper; nothing served here is secret: counts, states and error
//! messages that are also logged.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{self, AbortHandle, JoinHandle, JoinSet};
use tracing::{debug, info, warn};

use super::metrics::{Metrics, OPENMETRICS_CONTENT_TYPE};
use crate::plugin::RegistrationState;
use crate::publish::status::PublishStatus;
use crate::util::stopped;

/// How long open connections may finish after shutdown.
const DRAIN: Duration = Duration::from_secs(1);
/// How long a client may take from connecting (or from its last answer) to sending the
/// headers of a request: probes and scrapers send theirs at once.
const HEADER_TIMEOUT: Duration = Duration::from_secs(3);
/// Connections served at once (scrapers and probes need one or two). A new connection
/// over the limit closes the oldest open one, so connections that stall or idle can
/// never keep a liveness probe out.
const MAX_CONNECTIONS: usize = 64;
/// Pause after a failed accept (e.g. out of file descriptors), so it does not spin.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// Delays between tries to bind an address another process holds (jittered, doubling).
const REBIND_BASE: Duration = Duration::from_secs(1);
const REBIND_MAX: Duration = Duration::from_secs(30);

const TEXT: &str = "text/plain; charset=utf-8";

/// Why the endpoint could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Another process already listens on the address.
    #[error(
        "cannot serve metrics on {address}: the address is already in use; set metrics.address to a free port, or \"\" to disable metrics"
    )]
    AddressInUse {
        /// The configured address.
        address: SocketAddr,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Binding failed otherwise (no such local address, permission).
    #[error(
        "cannot serve metrics on {address}; set metrics.address to a local address and port, or \"\" to disable metrics"
    )]
    Bind {
        /// The configured address.
        address: SocketAddr,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// What `/readyz` checks (registered with the kubelet, slices in sync, the state store
/// usable) and `/healthz` (the state store usable).
#[derive(Debug, Clone)]
pub struct Readiness {
    /// The kubelet's verdict on the registration.
    pub registration: watch::Receiver<RegistrationState>,
    /// The publisher's status.
    pub publish: watch::Receiver<PublishStatus>,
    /// `Some(why)` while the state store is poisoned ([`crate::state::Store::health`]).
    pub state: watch::Receiver<Option<String>>,
}

impl Readiness {
    /// `Ok` while edra can do its work, else why not: a poisoned state store answers no
    /// kubelet call until it is re-opened.
    pub fn live(&self) -> Result<(), String> {
        match &*self.state.borrow() {
            None => Ok(()),
            Some(reason) => Err(format!(
                "state store unusable since a change could not be made durable: {reason}; free space or fix the disk \
                 under the state directory (edra re-opens it by itself)"
            )),
        }
    }

    /// `Ok` when ready, else why not, in a few words.
    pub fn check(&self) -> Result<(), String> {
        self.live()?;
        match &*self.registration.borrow() {
            RegistrationState::Registered => {}
            RegistrationState::Unknown => return Err("not registered with the kubelet".into()),
            RegistrationState::Refused(reason) => {
                return Err(format!("not registered with the kubelet: refused: {reason}"));
            }
        }
        let publish = self.publish.borrow();
        match (&publish.last_error, publish.in_sync) {
            (_, true) => Ok(()),
            (Some(error), false) => Err(format!("slices not published: {error}")),
            (None, false) => Err("slices not published yet".into()),
        }
    }
}

/// What the endpoint serves.
#[derive(Debug)]
pub struct Endpoints {
    /// Encoded for `/metrics`.
    pub metrics: Metrics,
    /// Checked for `/readyz`.
    pub readiness: Readiness,
}

impl Endpoints {
    /// The answer to one request.
    pub fn respond<B>(&self, req: &Request<B>) -> Response<Full<Bytes>> {
        let path = req.uri().path();
        if !matches!(path, "/metrics" | "/healthz" | "/readyz") {
            return text(StatusCode::NOT_FOUND, "not found; edra serves /metrics, /healthz and /readyz\n".into());
        }
        if req.method() != Method::GET && req.method() != Method::HEAD {
            let mut res = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD are allowed\n".into());
            res.headers_mut().insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
            return res;
        }
        match path {
            "/metrics" => match self.metrics.encode() {
                Ok(body) => {
                    let mut res = Response::new(Full::new(Bytes::from(body)));
                    let ct = header::HeaderValue::from_static(OPENMETRICS_CONTENT_TYPE);
                    res.headers_mut().insert(header::CONTENT_TYPE, ct);
                    res
                }
                Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding the metrics failed: {e}\n")),
            },
            "/healthz" => match self.readiness.live() {
                Ok(()) => text(StatusCode::OK, "ok\n".into()),
                Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
            },
            _ => match self.readiness.check() {
                Ok(()) => text(StatusCode::OK, "ok\n".into()),
                Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
            },
        }
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from(body)));
    *res.status_mut() = status;
    res.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(TEXT));
    res
}

/// The bound metrics address, not yet served.
#[derive(Debug)]
pub struct MetricsListener {
    listener: TcpListener,
    address: SocketAddr,
}

impl MetricsListener {
    /// Binds `address`. Must be called from within a Tokio runtime.
    pub fn bind(address: SocketAddr) -> Result<Self, HttpError> {
        let bound = std::net::TcpListener::bind(address)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .and_then(TcpListener::from_std);
        let listener = bound.map_err(|source| {
            if source.kind() == io::ErrorKind::AddrInUse {
                HttpError::AddressInUse { address, source }
            } else {
                HttpError::Bind { address, source }
            }
        })?;
        let address = listener.local_addr().map_err(|source| HttpError::Bind { address, source })?;
        Ok(MetricsListener { listener, address })
    }

    /// The address actually bound (the real port when port 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    /// Serves `endpoints` until `shutdown` turns true; the task ends once the open
    /// connections are done (or closed after a short drain).
    pub fn serve(self, endpoints: Endpoints, shutdown: watch::Receiver<bool>) -> JoinHandle<()> {
        info!(address = %self.address, "serving /metrics, /healthz and /readyz");
        tokio::spawn(accept_loop(self.listener, Arc::new(endpoints), shutdown))
    }
}

/// The metrics address at start: bound, or held by another process (edra then serves the
/// kubelet without it and binds it once it is free).
#[derive(Debug)]
pub enum MetricsPort {
    Bound(MetricsListener),
    Taken(SocketAddr),
}

impl MetricsPort {
    /// Binds `address`. An address in use is logged at ERROR with the fix and kept to be
    /// bound later; any other failure (no such local address, no permission) is returned.
    pub fn bind(address: SocketAddr) -> Result<Self, HttpError> {
        match MetricsListener::bind(address) {
            Ok(listener) => Ok(MetricsPort::Bound(listener)),
            Err(HttpError::AddressInUse { source, .. }) => {
                tracing::error!(
                    error = %source,
                    "/metrics, /healthz and /readyz are not served: another process holds {address} (edra doctor \
                     names it); edra serves the kubelet without them and binds {address} as soon as it is free; \
                     stop that process, or set metrics.address to a free port"
                );
                Ok(MetricsPort::Taken(address))
            }
            Err(e) => Err(e),
        }
    }

    /// Serves `endpoints` until `shutdown` turns true; a taken address is bound again with
    /// backoff (1 s doubling to 30 s) and served from then on.
    pub fn serve(self, endpoints: Endpoints, mut shutdown: watch::Receiver<bool>) -> JoinHandle<()> {
        let address = match self {
            MetricsPort::Bound(listener) => return listener.serve(endpoints, shutdown),
            MetricsPort::Taken(address) => address,
        };
        tokio::spawn(async move {
            let mut backoff = crate::kube::backoff::Backoff::new(REBIND_BASE, REBIND_MAX);
            loop {
                if crate::util::until_stopped(tokio::time::sleep(backoff.next_delay()), &mut shutdown).await.is_none() {
                    return;
                }
                match MetricsListener::bind(address) {
                    Ok(listener) => {
                        info!(%address, attempts = backoff.attempts(), "the metrics address is free again");
                        return listener.serve(endpoints, shutdown).await.unwrap_or_default();
                    }
                    Err(e) => debug!(error = %crate::util::error_chain(&e), "the metrics address is still taken"),
                }
            }
        })
    }
}

async fn accept_loop(listener: TcpListener, endpoints: Arc<Endpoints>, mut shutdown: watch::Receiver<bool>) {
    let mut connections = JoinSet::new();
    // Open connections, oldest first.
    let mut open: VecDeque<(task::Id, AbortHandle)> = VecDeque::new();
    loop {
        tokio::select! {
            _ = stopped(&mut shutdown) => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    if open.len() >= MAX_CONNECTIONS
                        && let Some((_, oldest)) = open.pop_front()
                    {
                        warn!(%peer, limit = MAX_CONNECTIONS, "too many metrics connections; closing the oldest");
                        oldest.abort();
                    }
                    debug!(%peer, "metrics connection");
                    let handle = connections.spawn(connection(stream, Arc::clone(&endpoints), shutdown.clone()));
                    open.push_back((handle.id(), handle));
                }
                Err(e) => {
                    warn!(error = %e, "accepting a metrics connection failed");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                }
            },
            Some(done) = connections.join_next_with_id(), if !connections.is_empty() => {
                let id = match &done {
                    Ok((id, ())) => *id,
                    Err(e) => e.id(),
                };
                open.retain(|(open_id, _)| *open_id != id);
            }
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(DRAIN, async { while connections.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        debug!(open = connections.len(), "closing metrics connections still open");
        connections.shutdown().await;
    }
    debug!("metrics endpoint stopped");
}

async fn connection(stream: TcpStream, endpoints: Arc<Endpoints>, mut shutdown: watch::Receiver<bool>) {
    // hyper's header timeout starts only once HTTP/1 is chosen: a client that connects and
    // sends nothing (or too little to tell HTTP/1 from HTTP/2) is closed here instead.
    let requested = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&requested);
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        seen.store(true, Ordering::Relaxed);
        let res = endpoints.respond(&req);
        async move { Ok::<_, Infallible>(res) }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let silent = async {
        tokio::time::sleep(HEADER_TIMEOUT).await;
        if requested.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
    };
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = silent => {
            debug!("closing a metrics connection that sent no request in time");
            return;
        }
        _ = stopped(&mut shutdown) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        debug!(error = %e, "metrics connection ended with an error");
    }
}

#[cfg(test)]
mod tests;
