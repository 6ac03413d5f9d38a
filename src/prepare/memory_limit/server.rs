//! The agent's memory-limit socket, `<runtime_dir>/memory-limit.sock`: 0600 from its
//! creation ([`crate::util::listen_private`]), and a peer must be root or the agent's own
//! user. One request line, one answer line ([`wire`]); a connection gets
//! [`CONNECTION_LIMIT`] in all. The socket is removed at shutdown.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::gpu::memory_limit::wire;
use crate::prepare::Preparer;

/// How long one connection may take, the agent's NVML call included.
pub const CONNECTION_LIMIT: Duration = Duration::from_secs(30);

/// The socket's path under `runtime_dir`.
pub fn socket_path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join(wire::SOCKET)
}

/// Binds the socket (0600) at `path`, replacing a socket a previous agent left.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    crate::util::bind_replacing(path)
}

/// Serves `listener` (bound at `path`) for `preparer` until `shutdown`, then removes it.
pub fn serve(
    listener: UnixListener,
    path: PathBuf,
    preparer: Preparer,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    info!(path = %path.display(), "serving GPU memory limit requests of edra's hook");
    tokio::spawn(async move {
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let preparer = preparer.clone();
                        tokio::spawn(async move {
                            if tokio::time::timeout(CONNECTION_LIMIT, answer(stream, preparer)).await.is_err() {
                                debug!("closing a memory-limit connection open too long");
                            }
                        });
                    }
                    Err(e) => {
                        warn!(error = %e, "accepting a memory-limit connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                _ = async { let _ = shutdown.wait_for(|s| *s).await; } => break,
            }
        }
        drop(listener);
        let _ = std::fs::remove_file(&path);
    })
}

async fn answer(stream: UnixStream, preparer: Preparer) {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    match stream.peer_cred() {
        Ok(c) if c.uid() == 0 || c.uid() == me => {}
        Ok(c) => {
            warn!(uid = c.uid(), "refused a memory-limit request from a user that is neither root nor edra's");
            return;
        }
        Err(e) => {
            warn!(error = %e, "cannot tell who sent a memory-limit request; refused");
            return;
        }
    }
    let (read, mut write) = stream.into_split();
    let mut line = Vec::new();
    let limit = u64::try_from(wire::MAX_LINE + 1).unwrap_or(u64::MAX);
    let got = BufReader::new(read).take(limit).read_until(b'\n', &mut line).await;
    let reply = match got {
        Err(e) => wire::Answer::refused(format!("cannot read the request: {e}")),
        Ok(_) => match wire::decode::<wire::Request>(&line) {
            Err(e) => wire::Answer::refused(format!("the request is not valid: {e}")),
            Ok(req) => tokio::task::spawn_blocking(move || preparer.apply_memory_limit(&req))
                .await
                .unwrap_or_else(|e| wire::Answer::refused(format!("internal task failed: {e}"))),
        },
    };
    let _ = write.write_all(&wire::encode(&reply)).await;
    let _ = write.shutdown().await;
}
