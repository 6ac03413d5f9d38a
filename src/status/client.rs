//! `edra status`'s side: one `GET /v1/status` on the running agent's socket, bounded in
//! time and size.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;

use super::NodeStatus;

/// How long a request may take.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// The largest answer read.
pub const MAX_BODY: usize = 16 << 20;

/// Why the running agent's view could not be had.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// Nothing listens on the socket.
    #[error(
        "cannot reach the running agent at {path}: {source}; is edra running on this node (systemctl status edra), \
         and are you root?"
    )]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The request failed or timed out.
    #[error("the running agent did not answer at {path}: {reason}")]
    Request {
        /// The socket.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The answer is not a view this edra reads.
    #[error("the running agent's answer cannot be read ({reason}); is it a different edra version?")]
    Decode {
        /// What went wrong.
        reason: String,
    },
}

/// The view of the agent serving `socket`.
pub async fn fetch(socket: &Path) -> Result<NodeStatus, StatusError> {
    let path = socket.to_path_buf();
    let request = |reason: String| StatusError::Request { path: path.clone(), reason };
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|source| StatusError::Connect { path: path.clone(), source })?;
    let exchange = async {
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| request(e.to_string()))?;
        tokio::spawn(conn);
        let req = http::Request::get("/v1/status")
            .header(http::header::HOST, "edra")
            .body(Empty::<Bytes>::new())
            .map_err(|e| request(e.to_string()))?;
        let res = sender.send_request(req).await.map_err(|e| request(e.to_string()))?;
        let status = res.status();
        let body = Limited::new(res.into_body(), MAX_BODY).collect().await.map_err(|e| request(e.to_string()))?;
        if !status.is_success() {
            return Err(request(format!("{status}: {}", String::from_utf8_lossy(&body.to_bytes()))));
        }
        serde_json::from_slice(&body.to_bytes()).map_err(|e| StatusError::Decode { reason: e.to_string() })
    };
    match tokio::time::timeout(TIMEOUT, exchange).await {
        Ok(r) => r,
        Err(_) => Err(request(format!("no answer within {}s", TIMEOUT.as_secs()))),
    }
}
