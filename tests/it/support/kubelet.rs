//! The kubelet's side of the plugin sockets, for tests.
//!
//! Two clients: tonic clients over a Unix socket (how the 1.34+ kubelet calls the DRA
//! socket, `:authority: localhost`), and [`RawH2`], a minimal HTTP/2 client that sends
//! exactly what the kubelet's registration dial sends: the socket path (percent-encoded,
//! or raw as older grpc-go did) as `:authority`. tonic clients cannot send such an
//! authority at all, which is why this one is written by hand.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use hyper_util::rt::TokioIo;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

use edra::plugin::proto::dra_v1::dra_plugin_client::DraPluginClient as V1Client;
use edra::plugin::proto::dra_v1beta1::dra_plugin_client::DraPluginClient as V1beta1Client;
use edra::plugin::proto::health_v1alpha1::dra_resource_health_client::DraResourceHealthClient as HealthClient;
use edra::plugin::proto::registration::registration_client::RegistrationClient;
use edra::plugin::proto::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};

/// A gRPC channel to a Unix socket (`:authority: localhost`).
pub async fn channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    Endpoint::try_from("http://localhost")?
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
}

/// A DRAPlugin v1 client on the DRA socket.
pub async fn dra_v1(path: &Path) -> V1Client<Channel> {
    V1Client::new(channel(path).await.expect("connect to the DRA socket"))
}

/// A DRAPlugin v1beta1 client on the DRA socket.
pub async fn dra_v1beta1(path: &Path) -> V1beta1Client<Channel> {
    V1beta1Client::new(channel(path).await.expect("connect to the DRA socket"))
}

/// A DRAResourceHealth v1alpha1 client on the DRA socket.
pub async fn health_v1alpha1(path: &Path) -> HealthClient<Channel> {
    HealthClient::new(channel(path).await.expect("connect to the DRA socket"))
}

/// A Registration client on the registration socket.
pub async fn registration(path: &Path) -> RegistrationClient<Channel> {
    RegistrationClient::new(channel(path).await.expect("connect to the registration socket"))
}

/// The `:authority` the kubelet's grpc-go sends when dialing a bare socket path.
pub fn percent_encoded(path: &Path) -> String {
    path.to_string_lossy().replace('%', "%25").replace('/', "%2F")
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;

/// How a raw unary call ended.
#[derive(Debug)]
pub enum RawOutcome {
    /// The server answered; `grpc_status` comes from the trailers (or trailers-only headers).
    Answer { grpc_status: Option<String>, grpc_message: Option<String>, body: Vec<u8> },
    /// The server reset the stream with this HTTP/2 error code.
    Reset(u32),
    /// The server closed the connection (GOAWAY with this code, or EOF as `None`).
    Closed(Option<u32>),
}

/// A minimal HTTP/2 client on a Unix socket that behaves like the kubelet's registration
/// dial: it sends literal (never indexed) header fields and any `:authority` it is given.
pub struct RawH2 {
    stream: UnixStream,
    next_stream: u32,
    decoder: loona_hpack::Decoder<'static>,
    path: PathBuf,
}

impl RawH2 {
    /// Connects and sends the client preface and an empty SETTINGS frame.
    pub async fn connect(path: &Path) -> std::io::Result<RawH2> {
        let mut stream = UnixStream::connect(path).await?;
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        stream.write_all(&hello).await?;
        Ok(RawH2 { stream, next_stream: 1, decoder: loona_hpack::Decoder::new(), path: path.to_path_buf() })
    }

    /// Connects and sends nothing: the server, once it accepted the connection, sends its
    /// SETTINGS and waits for the client preface (its handshake). See
    /// [`RawH2::wait_server_settings`] and [`RawH2::send_preface`].
    pub async fn connect_silent(path: &Path) -> std::io::Result<RawH2> {
        let stream = UnixStream::connect(path).await?;
        Ok(RawH2 { stream, next_stream: 1, decoder: loona_hpack::Decoder::new(), path: path.to_path_buf() })
    }

    /// Reads until the server's SETTINGS frame: the server has accepted the connection.
    pub async fn wait_server_settings(&mut self) -> std::io::Result<()> {
        loop {
            let mut head = [0u8; 9];
            self.stream.read_exact(&mut head).await?;
            let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
            let mut payload = vec![0; len];
            self.stream.read_exact(&mut payload).await?;
            if head[3] == SETTINGS && head[4] & ACK == 0 {
                return Ok(());
            }
        }
    }

    /// Sends the client preface and an empty SETTINGS frame (after [`RawH2::connect_silent`]).
    pub async fn send_preface(&mut self) -> std::io::Result<()> {
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        self.stream.write_all(&hello).await
    }

    /// The socket this client is connected to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads (and discards) until the server closes the connection.
    pub async fn wait_closed(&mut self) {
        let mut sink = Vec::new();
        // EOF or a reset: either way the server's end is gone.
        let _ = self.stream.read_to_end(&mut sink).await;
    }

    /// One unary gRPC call with the given `:authority`.
    pub async fn unary(&mut self, authority: &str, method: &str, message: &[u8]) -> std::io::Result<RawOutcome> {
        self.unary_with(authority, method, message, &[], usize::MAX).await
    }

    /// One unary gRPC call with extra header fields, its header block sent in frames of
    /// at most `frame_size` bytes (HEADERS, then CONTINUATION frames).
    pub async fn unary_with(
        &mut self,
        authority: &str,
        method: &str,
        message: &[u8],
        extra: &[(&str, &str)],
        frame_size: usize,
    ) -> std::io::Result<RawOutcome> {
        let id = self.next_stream;
        self.next_stream += 2;
        let mut block = Vec::new();
        for (name, value) in [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", method),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("user-agent", "grpc-go/1.79.3"),
            ("te", "trailers"),
        ] {
            literal(&mut block, name.as_bytes(), value.as_bytes());
        }
        for (name, value) in extra {
            literal(&mut block, name.as_bytes(), value.as_bytes());
        }
        let mut body = vec![0];
        body.extend((message.len() as u32).to_be_bytes());
        body.extend(message);
        let mut out = Vec::new();
        let mut chunks = block.chunks(frame_size.min(16_384)).peekable();
        let mut kind = HEADERS;
        while let Some(chunk) = chunks.next() {
            let flags = if chunks.peek().is_none() { END_HEADERS } else { 0 };
            out.extend(frame(kind, flags, id, chunk));
            kind = CONTINUATION;
        }
        out.extend(frame(DATA, END_STREAM, id, &body));
        self.stream.write_all(&out).await?;
        self.read_answer(id).await
    }

    async fn read_answer(&mut self, id: u32) -> std::io::Result<RawOutcome> {
        let mut fields: Vec<(String, String)> = Vec::new();
        let mut body = Vec::new();
        let mut block = Vec::new();
        loop {
            let mut head = [0u8; 9];
            if self.stream.read_exact(&mut head).await.is_err() {
                return Ok(RawOutcome::Closed(None));
            }
            let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
            let (kind, flags) = (head[3], head[4]);
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            let mut payload = vec![0; len];
            self.stream.read_exact(&mut payload).await?;
            match kind {
                SETTINGS if flags & ACK == 0 => self.stream.write_all(&frame(SETTINGS, ACK, 0, &[])).await?,
                PING if flags & ACK == 0 => self.stream.write_all(&frame(PING, ACK, 0, &payload)).await?,
                GOAWAY => {
                    let code = payload.get(4..8).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
                    return Ok(RawOutcome::Closed(code));
                }
                RST_STREAM if stream == id => {
                    return Ok(RawOutcome::Reset(u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])));
                }
                HEADERS | CONTINUATION if stream == id => {
                    block.extend(&payload);
                    if flags & END_HEADERS != 0 {
                        let decoded = self.decoder.decode(&block).map_err(std::io::Error::other)?;
                        block.clear();
                        fields.extend(decoded.into_iter().map(|(n, v)| {
                            (String::from_utf8_lossy(&n).into_owned(), String::from_utf8_lossy(&v).into_owned())
                        }));
                    }
                    if flags & END_STREAM != 0 {
                        break;
                    }
                }
                DATA if stream == id => {
                    body.extend(&payload);
                    if flags & END_STREAM != 0 {
                        break;
                    }
                }
                _ => {}
            }
        }
        let field = |name: &str| fields.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v.clone());
        let body = if body.len() >= 5 { body[5..].to_vec() } else { Vec::new() };
        Ok(RawOutcome::Answer { grpc_status: field("grpc-status"), grpc_message: field("grpc-message"), body })
    }

    /// `GetInfo` as the kubelet sends it.
    pub async fn get_info(&mut self, authority: &str) -> Result<PluginInfo, RawOutcome> {
        let outcome = self
            .unary(authority, "/pluginregistration.Registration/GetInfo", &InfoRequest {}.encode_to_vec())
            .await
            .map_err(|_| RawOutcome::Closed(None))?;
        decode_ok(outcome)
    }

    /// `NotifyRegistrationStatus` as the kubelet sends it.
    pub async fn notify(
        &mut self,
        authority: &str,
        status: RegistrationStatus,
    ) -> Result<RegistrationStatusResponse, RawOutcome> {
        let method = "/pluginregistration.Registration/NotifyRegistrationStatus";
        let outcome =
            self.unary(authority, method, &status.encode_to_vec()).await.map_err(|_| RawOutcome::Closed(None))?;
        decode_ok(outcome)
    }
}

fn decode_ok<M: Message + Default>(outcome: RawOutcome) -> Result<M, RawOutcome> {
    match outcome {
        RawOutcome::Answer { grpc_status: Some(status), body, .. } if status == "0" => {
            M::decode(Bytes::from(body)).map_err(|_| RawOutcome::Closed(None))
        }
        other => Err(other),
    }
}

/// An HPACK "literal header field never indexed" with a literal name (RFC 7541 §6.2.3).
fn literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x10);
    integer(out, name.len());
    out.extend(name);
    integer(out, value.len());
    out.extend(value);
}

/// An HPACK string length with a 7-bit prefix and no Huffman coding.
fn integer(out: &mut Vec<u8>, mut n: usize) {
    if n < 127 {
        out.push(n as u8);
        return;
    }
    out.push(127);
    n -= 127;
    while n >= 128 {
        out.push((n % 128) as u8 | 0x80);
        n /= 128;
    }
    out.push(n as u8);
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}
