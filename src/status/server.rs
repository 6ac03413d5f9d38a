//! The agent's side of `edra status`: `GET /v1/status` over HTTP/1.1 on a Unix socket in
//! the runtime directory. The socket is 0600 from its creation
//! ([`crate::util::listen_private`]; connecting needs write permission on it), so only
//! root reaches it; the directory keeps its own mode (root's, 0755). Any other request is
//! 404.
//! Each answer is collected on a blocking thread from what the agent holds; a connection
//! is served for at most [`CONNECTION_LIMIT`], and the socket is removed at shutdown.

use std::convert::Infallible;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::collect::{StatusSources, collect};

/// How long one connection may stay open.
pub const CONNECTION_LIMIT: Duration = Duration::from_secs(10);

/// Why the status socket could not be served.
#[derive(Debug, thiserror::Error)]
pub enum StatusServeError {
    /// The runtime directory or the socket could not be made.
    #[error("cannot serve the status socket {path}")]
    Bind {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// The socket's path under `runtime_dir`.
pub fn socket_path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join(super::SOCKET)
}

/// Binds `<runtime_dir>/status.sock` (0600), replacing a socket a previous agent left.
pub fn bind(runtime_dir: &Path) -> Result<UnixListener, StatusServeError> {
    let path = socket_path(runtime_dir);
    crate::util::bind_replacing(&path).map_err(|source| StatusServeError::Bind { path, source })
}

/// Serves on `kept` (the status socket the previous edra kept open in systemd's fd store,
/// with its name there) when it is still `<runtime_dir>/status.sock`
/// ([`crate::util::fdstore::check_stored_socket`]); otherwise binds the path anew. Returns
/// the listener and its file's device and inode.
pub fn adopt_or_bind(
    runtime_dir: &Path,
    kept: Option<(String, OwnedFd)>,
) -> Result<(UnixListener, (u64, u64)), StatusServeError> {
    let path = socket_path(runtime_dir);
    let failed = |source| StatusServeError::Bind { path: path.clone(), source };
    if let Some((name, fd)) = kept {
        match crate::util::fdstore::check_stored_socket(fd.as_fd(), &name, &path) {
            Ok(file) => {
                let listener = std::os::unix::net::UnixListener::from(fd);
                listener.set_nonblocking(true).map_err(failed)?;
                return Ok((UnixListener::from_std(listener).map_err(failed)?, file));
            }
            Err(why) => warn!(path = %path.display(), reason = %why,
                "the status socket kept open across the restart is not edra's; binding anew"),
        }
    }
    let listener = bind(runtime_dir)?;
    let meta = std::fs::symlink_metadata(&path).map_err(failed)?;
    Ok((listener, (meta.dev(), meta.ino())))
}

/// Serves `listener` until `shutdown`, then removes the socket unless `keep_file` (systemd's
/// fd store keeps it listening for the next edra).
pub fn serve(
    listener: UnixListener,
    runtime_dir: &Path,
    sources: StatusSources,
    (mut shutdown, keep_file): (watch::Receiver<bool>, bool),
) -> JoinHandle<()> {
    let path = socket_path(runtime_dir);
    info!(path = %path.display(), "serving edra status");
    let sources = Arc::new(sources);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let sources = Arc::clone(&sources);
                        tokio::spawn(async move {
                            let service = hyper::service::service_fn(move |req| answer(Arc::clone(&sources), req));
                            let conn = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service);
                            if tokio::time::timeout(CONNECTION_LIMIT, conn).await.is_err() {
                                debug!("closing a status connection open too long");
                            }
                        });
                    }
                    Err(e) => {
                        warn!(error = %e, "accepting a status connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                _ = async { let _ = shutdown.wait_for(|s| *s).await; } => break,
            }
        }
        drop(listener);
        if !keep_file {
            let _ = std::fs::remove_file(&path);
            debug!("status socket removed");
        }
    })
}

async fn answer(
    sources: Arc<StatusSources>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, body: Vec<u8>| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
        r
    };
    if req.method() != Method::GET || req.uri().path() != "/v1/status" {
        return Ok(reply(StatusCode::NOT_FOUND, br#"{"error":"only GET /v1/status is served"}"#.to_vec()));
    }
    let view = tokio::task::spawn_blocking(move || collect(&sources)).await;
    Ok(match view.map(|v| serde_json::to_vec(&v)) {
        Ok(Ok(body)) => reply(StatusCode::OK, body),
        Ok(Err(e)) => reply(StatusCode::INTERNAL_SERVER_ERROR, format!(r#"{{"error":"{e}"}}"#).into_bytes()),
        Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, format!(r#"{{"error":"{e}"}}"#).into_bytes()),
    })
}
