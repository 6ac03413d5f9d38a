//! A small scripted HTTPS server for the client's transport tests: real TCP on loopback,
//! real TLS (rustls, a throwaway CA from rcgen, optional client certificates), HTTP/1.1 and
//! HTTP/2. Each request is recorded and answered by a handler closure; streamed replies
//! (watches) are fed through a channel. Stopping it drops every open connection.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::{mpsc, oneshot};

use crate::kube::{Auth, Credentials, Pem, Secret};

/// A throwaway certificate authority.
pub struct Pki {
    pub ca_pem: String,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    pub fn new(name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Pki { ca_pem: issuer.pem(), issuer }
    }

    /// A leaf certificate and key (PEM) for these names, signed by this CA.
    pub fn leaf(&self, names: &[&str], cn: &str) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// A request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub headers: http::HeaderMap,
    pub body: Bytes,
    pub client_cert: bool,
    pub version: http::Version,
}

impl Seen {
    /// The value of a query parameter (raw, not decoded).
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query.split('&').find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_default()
    }
}

/// How to answer.
pub enum Reply {
    Json {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: String,
    },
    Stream {
        status: u16,
        rx: mpsc::UnboundedReceiver<Bytes>,
    },
    /// Never answer (to exercise timeouts).
    Hang,
}

impl Reply {
    pub fn json(status: u16, body: serde_json::Value) -> Reply {
        Reply::Json { status, headers: Vec::new(), body: body.to_string() }
    }
    pub fn status(code: u16, reason: &str, message: &str) -> Reply {
        Reply::json(
            code,
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": message, "code": code}),
        )
    }
    pub fn with_header(mut self, k: &'static str, v: &str) -> Reply {
        if let Reply::Json { headers, .. } = &mut self {
            headers.push((k, v.to_string()));
        }
        self
    }
}

pub type Handler = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

pub struct TestServer {
    pub addr: SocketAddr,
    /// TLS connections accepted so far.
    pub connections: Arc<std::sync::atomic::AtomicUsize>,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl TestServer {
    pub async fn start(pki: &Pki, handler: Handler) -> TestServer {
        Self::start_on(pki, "127.0.0.1:0".parse().unwrap(), handler).await
    }

    pub async fn start_on(pki: &Pki, addr: SocketAddr, handler: Handler) -> TestServer {
        Self::start_with_alpn(pki, addr, handler, &[b"h2", b"http/1.1"]).await
    }

    /// A server that offers only these ALPN protocols.
    pub async fn start_with_alpn(pki: &Pki, addr: SocketAddr, handler: Handler, alpn: &[&[u8]]) -> TestServer {
        let (cert, key) = pki.leaf(&["localhost", "127.0.0.1"], "kube-apiserver");
        let provider = crate::kube::tls::provider();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(pki.ca_pem.as_bytes()).unwrap()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .allow_unauthenticated()
            .build()
            .unwrap();
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes()).collect::<Result<_, _>>().unwrap(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (stop, mut stopped) = oneshot::channel();
        let seen2 = seen.clone();
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let conn_count = connections.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    acc = listener.accept() => {
                        let Ok((tcp, _)) = acc else { continue };
                        conn_count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let (acceptor, handler, seen) = (acceptor.clone(), handler.clone(), seen2.clone());
                        conns.spawn(async move {
                            let Ok(tls) = acceptor.accept(tcp).await else { return };
                            let client_cert = tls.get_ref().1.peer_certificates().is_some();
                            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                                let (handler, seen) = (handler.clone(), seen.clone());
                                async move { Ok::<_, Infallible>(answer(req, client_cert, &handler, &seen).await) }
                            });
                            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                                .serve_connection(TokioIo::new(tls), svc)
                                .await;
                        });
                    }
                }
            }
            conns.abort_all();
        });
        TestServer { addr, connections, seen, stop: Some(stop), task }
    }

    /// Stop accepting and drop every open connection.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = (&mut self.task).await;
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Credentials with a bearer token, trusting `pki`.
    pub fn token_credentials(&self, pki: &Pki, token: &str) -> Credentials {
        Credentials {
            server: self.url(),
            ca: Some(Pem::Data(pki.ca_pem.clone().into_bytes())),
            insecure_skip_tls_verify: false,
            tls_server_name: None,
            auth: Auth::Token(Secret::new(token)),
            identity: "test token".into(),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    req: Request<Incoming>,
    client_cert: bool,
    handler: &Handler,
    seen: &Mutex<Vec<Seen>>,
) -> Response<BoxBody<Bytes, Infallible>> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let s = Seen {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().unwrap_or("").to_string(),
        headers: parts.headers,
        body,
        client_cert,
        version: parts.version,
    };
    seen.lock().unwrap().push(s.clone());
    match handler(&s) {
        Reply::Json { status, headers, body } => {
            let mut b = Response::builder().status(status).header("content-type", "application/json");
            for (k, v) in headers {
                b = b.header(k, v);
            }
            b.body(Full::new(Bytes::from(body)).boxed()).unwrap()
        }
        Reply::Stream { status, rx } => {
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
            });
            Response::builder().status(status).body(BodyExt::boxed(StreamBody::new(stream))).unwrap()
        }
        Reply::Hang => std::future::pending().await,
    }
}
