//! Listening and connection handling: binds 127.0.0.1 with `SO_REUSEADDR` (so a restart
//! gets the same port back), completes TLS, authenticates the client certificate once per
//! connection, and serves HTTP/1.1 or HTTP/2 with hyper-util's auto builder until the
//! connection ends or the handle drops every connection.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use super::{Shared, handler};

/// The value of the connection-kill channel: bumped generation, and whether to close
/// gracefully.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Shutdown {
    pub(crate) generation: u64,
    pub(crate) graceful: bool,
}

/// A listening socket on `addr` that can be re-bound right after it is closed.
pub(crate) fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Accepts connections until aborted; each connection runs in its own task that ends when
/// `kill` changes: at once, or after a graceful HTTP shutdown (GOAWAY / `Connection: close`
/// once in-flight requests finish) when the new value says `graceful`.
pub(crate) fn spawn_accept(
    listener: TcpListener,
    shared: Arc<Shared>,
    tls: Arc<rustls::ServerConfig>,
    kill: watch::Receiver<Shutdown>,
) -> JoinHandle<()> {
    let acceptor = TlsAcceptor::from(tls);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Typically EMFILE; back off briefly instead of spinning.
                    tracing::debug!(%error, "test API server accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let mut kill = kill.clone();
            kill.borrow_and_update();
            let gauge = ConnectionGauge::new(shared.clone());
            tokio::spawn(serve_connection(tcp, peer, acceptor.clone(), shared.clone(), kill, gauge));
        }
    })
}

/// Counts a connection as open for as long as it lives.
struct ConnectionGauge(Arc<Shared>);

impl ConnectionGauge {
    fn new(shared: Arc<Shared>) -> Self {
        shared.mutate(|s| {
            s.open_connections += 1;
            s.connections_accepted += 1;
        });
        Self(shared)
    }
}

impl Drop for ConnectionGauge {
    fn drop(&mut self) {
        self.0.mutate(|s| s.open_connections = s.open_connections.saturating_sub(1));
    }
}

async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    shared: Arc<Shared>,
    mut kill: watch::Receiver<Shutdown>,
    _gauge: ConnectionGauge,
) {
    let tls = tokio::select! {
        tls = acceptor.accept(tcp) => tls,
        _ = kill.changed() => return,
    };
    let tls = match tls {
        Ok(tls) => tls,
        Err(error) => {
            tracing::debug!(%peer, %error, "test API server TLS handshake failed");
            return;
        }
    };
    let cert_user = tls.get_ref().1.peer_certificates().and_then(|chain| {
        let chain: Vec<_> = chain.iter().map(|c| c.clone().into_owned()).collect();
        shared.pki.identify(&chain)
    });
    let service = service_fn(move |request| handler::handle(shared.clone(), cert_user.clone(), request));
    let builder = auto::Builder::new(TokioExecutor::new());
    let connection = builder.serve_connection(TokioIo::new(tls), service);
    tokio::pin!(connection);
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%peer, %error, "test API server connection ended with an error");
                }
                return;
            }
            changed = kill.changed() => {
                if changed.is_err() || !kill.borrow_and_update().graceful {
                    return;
                }
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}
