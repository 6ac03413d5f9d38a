//! Self-tests of the test API server (`support::apiserver`), driven by a plain hyper +
//! rustls client over real TLS on loopback, independent of edra's own Kubernetes client.
//! This file holds the client; the tests are in the submodules.

mod auth;
mod crud;
mod faults;
mod fidelity;
mod reviews;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::support::apiserver::{Options, TestApiServer};

/// Which HTTP version to offer in ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    H2,
    Http11,
}

/// A minimal client: one new TLS connection per request.
pub struct Client {
    connector: TlsConnector,
    addr: std::net::SocketAddr,
    token: Option<String>,
    alpn: Alpn,
}

/// Client credentials.
pub enum Creds<'a> {
    None,
    Cert(&'a str, &'a str),
    Token(&'a str),
}

impl Client {
    pub fn new(server: &TestApiServer, creds: Creds<'_>, alpn: Alpn) -> Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(server.ca_pem().as_bytes()) {
            roots.add(cert?)?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let (mut config, token) = match creds {
            Creds::None => (builder.with_no_client_auth(), None),
            Creds::Token(token) => (builder.with_no_client_auth(), Some(token.to_owned())),
            Creds::Cert(cert_pem, key_pem) => {
                let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
                let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())?;
                (builder.with_client_auth_cert(certs, key)?, None)
            }
        };
        config.alpn_protocols = match alpn {
            Alpn::H2 => vec![b"h2".to_vec()],
            Alpn::Http11 => vec![b"http/1.1".to_vec()],
        };
        Ok(Self { connector: TlsConnector::from(Arc::new(config)), addr: server.addr(), token, alpn })
    }

    /// A client authenticated with a fresh certificate for `user` in `groups`.
    pub fn as_user(server: &TestApiServer, user: &str, groups: &[&str]) -> Result<Self> {
        let (cert, key) = server.issue_client_cert(user, groups)?;
        Self::new(server, Creds::Cert(&cert, &key), Alpn::H2)
    }

    /// Sends one request; returns the response with its streaming body and the negotiated ALPN.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(http::Response<Incoming>, Option<Vec<u8>>)> {
        self.send_typed(method, path, body, "application/json").await
    }

    /// PATCH with the given patch Content-Type.
    pub async fn patch(&self, path: &str, content_type: &str, patch: &Value) -> Result<(StatusCode, Value)> {
        let (response, _) = self.send_typed(Method::PATCH, path, Some(patch), content_type).await?;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        Ok((status, serde_json::from_slice(&bytes)?))
    }

    async fn send_typed(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        content_type: &str,
    ) -> Result<(http::Response<Incoming>, Option<Vec<u8>>)> {
        let tcp = TcpStream::connect(self.addr).await?;
        let tls = self.connector.connect(ServerName::try_from("localhost")?, tcp).await?;
        let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        let bytes = body.map(serde_json::to_vec).transpose()?.unwrap_or_default();
        let mut request = Request::builder()
            .method(method)
            .uri(format!("https://localhost:{}{path}", self.addr.port()))
            .header(header::ACCEPT, "application/json");
        if !bytes.is_empty() {
            request = request.header(header::CONTENT_TYPE, content_type);
        }
        if let Some(token) = &self.token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request.body(Full::new(Bytes::from(bytes)))?;
        let io = TokioIo::new(tls);
        let response = match self.alpn {
            Alpn::H2 => {
                let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
                tokio::spawn(conn);
                sender.send_request(request).await?
            }
            Alpn::Http11 => {
                let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
                tokio::spawn(conn);
                sender.send_request(request).await?
            }
        };
        Ok((response, alpn))
    }

    /// Sends a request and decodes the JSON answer.
    pub async fn json(&self, method: Method, path: &str, body: Option<&Value>) -> Result<(StatusCode, Value)> {
        let (response, _) = self.send(method, path, body).await?;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        let value = serde_json::from_slice(&bytes).with_context(|| format!("decoding {bytes:?}"))?;
        Ok((status, value))
    }

    pub async fn get(&self, path: &str) -> Result<(StatusCode, Value)> {
        self.json(Method::GET, path, None).await
    }

    /// Opens a watch and returns a line reader over its body.
    pub async fn watch(&self, path: &str) -> Result<(StatusCode, WatchReader)> {
        let (response, _) = self.send(Method::GET, path, None).await?;
        Ok((response.status(), WatchReader { body: response.into_body(), buf: Vec::new() }))
    }
}

/// Reads `{"type","object"}` JSON lines from a watch body.
pub struct WatchReader {
    body: Incoming,
    buf: Vec<u8>,
}

impl WatchReader {
    /// The next event, or `None` when the stream ended; fails if nothing arrives in 5 s.
    pub async fn next(&mut self) -> Result<Option<Value>> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return Ok(Some(serde_json::from_slice(&line)?));
            }
            let frame = tokio::time::timeout(Duration::from_secs(5), self.body.frame())
                .await
                .map_err(|_| anyhow!("no watch event within 5 s"))?;
            match frame {
                None => {
                    if self.buf.is_empty() {
                        return Ok(None);
                    }
                    bail!("watch ended inside a line: {:?}", String::from_utf8_lossy(&self.buf));
                }
                Some(frame) => {
                    if let Ok(data) = frame?.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    /// The next event that is not a BOOKMARK.
    pub async fn next_change(&mut self) -> Result<Value> {
        loop {
            let event = self.next().await?.ok_or_else(|| anyhow!("watch ended"))?;
            if event["type"] != "BOOKMARK" {
                return Ok(event);
            }
        }
    }
}

/// Starts a server with `opts` and an admin client (cert, group system:masters).
pub async fn start(opts: Options) -> Result<(TestApiServer, Client)> {
    let server = TestApiServer::start(opts).await?;
    let client = Client::as_user(&server, "admin", &["system:masters"])?;
    Ok((server, client))
}

pub const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// A valid v1 slice for `node` and `driver` with `devices` devices.
pub fn slice(name: &str, node: &str, driver: &str, devices: usize) -> Value {
    let devices: Vec<Value> = (0..devices)
        .map(|i| {
            json!({
                "name": format!("gpu-{i}"),
                "attributes": {"index": {"int": i}, "model": {"string": "Test GPU"}},
                "capacity": {"memory": {"value": "16Gi"}},
            })
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    })
}

pub fn rv(object: &Value) -> Result<u64> {
    object["metadata"]["resourceVersion"]
        .as_str()
        .ok_or_else(|| anyhow!("no resourceVersion in {object}"))?
        .parse()
        .context("resourceVersion is not an integer")
}
