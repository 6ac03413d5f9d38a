//! Makes the kubelet's registration dial acceptable to the HTTP/2 server.
//!
//! The kubelet dials the registration socket with the bare socket path as the gRPC
//! target, so its requests carry that path (percent-encoded by current grpc-go, raw by
//! older releases) as the HTTP/2 `:authority`. The `h2` crate rejects such a request
//! with `PROTOCOL_ERROR` before any service code runs, and no server setting changes
//! that. [`AuthorityFix`] wraps each accepted stream and rewrites the client-to-server
//! bytes: after the 24-byte client preface it follows the HTTP/2 frames, decodes every
//! header block (HEADERS plus CONTINUATION) with an HPACK decoder, replaces an
//! `:authority` that is not a valid URI authority with `localhost`, and re-encodes the
//! block with its own HPACK encoder. Every block is re-encoded, so the dynamic table the
//! server decodes with is always the encoder's own, and both tables stay consistent for
//! the life of the connection. Padding and priority fields of HEADERS frames are dropped;
//! blocks larger than one frame go out as HEADERS plus CONTINUATION frames of at most
//! 16 KiB (the size every HTTP/2 peer must accept). Other frames and the server-to-client
//! direction pass through untouched. A block is at most 1 MiB compressed and
//! 1 MiB decoded (references to the dynamic table make a small block decode to a large
//! list); a larger one closes the connection.
//!
//! Only a connection that needs it is rewritten. Its first header block is decoded and
//! checked; when its `:authority` is valid (the kubelet's DRA connection sends
//! `localhost`), the block goes on as the client sent it and so does everything after it,
//! unparsed: the server's HPACK table is then the client's own. Decoding every block
//! (Huffman strings, above all) was a third of the CPU time of a call answered from state.
//! A client keeps one authority for the life of a connection (grpc-go and tonic take it
//! from the dial target), so a connection that began valid stays valid; one that did not
//! would meet the server's own check, as without this adapter. A connection whose first
//! block needed the fix has every block re-encoded, as above.
//!
//! Table sizes: the client's encoder is bounded by the server's
//! `SETTINGS_HEADER_TABLE_SIZE`; tonic never changes it from the protocol default of
//! 4096 bytes, so the decoder allows at most that and the encoder (which never emits
//! size updates) uses exactly that, which is what the server's decoder starts with.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use loona_hpack::decoder::DecoderError;
use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

#[cfg(test)]
mod tests;

/// The HTTP/2 client connection preface.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// What replaces an invalid `:authority`.
pub const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

const FRAME_HEADER_LEN: usize = 9;
/// The largest frame this rewriter emits: the HTTP/2 default every peer accepts.
const MAX_OUT_FRAME: usize = 16_384;
/// The largest header block (compressed) this rewriter buffers.
const MAX_HEADER_BLOCK: usize = 1 << 20;
/// The largest decoded header list, counted as HTTP/2's `SETTINGS_MAX_HEADER_LIST_SIZE`
/// counts it (name + value + 32 per field): HPACK references to the dynamic table make a
/// small block decode to a large list, so the compressed size alone bounds nothing.
const MAX_HEADER_LIST: usize = 1 << 20;
/// The HPACK dynamic table size both sides use (the HTTP/2 default).
const HPACK_TABLE_SIZE: usize = 4096;

const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;

/// Why the incoming byte stream could not be rewritten; the connection is closed.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    /// A HEADERS frame's padding or priority fields do not fit in the frame.
    #[error("HTTP/2 HEADERS frame on stream {stream} has padding or priority fields longer than the frame")]
    MalformedHeaders {
        /// The frame's stream.
        stream: u32,
    },
    /// A header block was interrupted by another frame, or a CONTINUATION came alone.
    #[error("HTTP/2 frame of type {frame_type:#x} on stream {stream} breaks a header block sequence")]
    BrokenBlockSequence {
        /// The offending frame's type.
        frame_type: u8,
        /// The offending frame's stream.
        stream: u32,
    },
    /// A header block grew beyond 1 MiB.
    #[error("HTTP/2 header block on stream {stream} is larger than {MAX_HEADER_BLOCK} bytes")]
    BlockTooLarge {
        /// The block's stream.
        stream: u32,
    },
    /// A header block decodes to more than 1 MiB of headers.
    #[error("HTTP/2 header block on stream {stream} decodes to more than {MAX_HEADER_LIST} bytes of headers")]
    HeaderListTooLarge {
        /// The block's stream.
        stream: u32,
    },
    /// The client's HPACK data could not be decoded.
    #[error("decoding the HPACK header block on stream {stream} failed")]
    Decode {
        /// The block's stream.
        stream: u32,
        /// What the decoder found.
        #[source]
        source: DecoderError,
    },
    /// Re-encoding a header block failed.
    #[error("re-encoding the HPACK header block on stream {stream} failed")]
    Encode {
        /// The block's stream.
        stream: u32,
        /// The write error.
        #[source]
        source: io::Error,
    },
}

/// A header block being collected from a HEADERS frame and its CONTINUATION frames.
struct Block {
    stream: u32,
    end_stream: bool,
    fragment: Vec<u8>,
}

#[derive(Clone, Copy)]
struct FrameHeader {
    len: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

enum State {
    /// Copying the client preface (bytes left).
    Preface(usize),
    /// Collecting the next 9-byte frame header.
    FrameHeader,
    /// Copying a frame payload unchanged (bytes left).
    Passthrough(usize),
    /// Collecting a HEADERS or CONTINUATION payload.
    BlockPayload(FrameHeader),
}

/// What the rewriter does with a connection's header blocks.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// No header block has ended yet: the first one decides.
    Undecided,
    /// The first block needed the fix: every block is decoded and re-encoded.
    Rewriting,
    /// The first block needed no fix: everything passes through unparsed.
    Transparent,
}

/// The incoming-direction rewriter: bytes in, rewritten bytes out. Pure (no I/O), so the
/// framing and HPACK handling are tested directly.
pub struct Rewriter {
    mode: Mode,
    state: State,
    pending: Vec<u8>,
    block: Option<Block>,
    /// The frames of the first header block as they came (while [`Mode::Undecided`]).
    raw: Vec<u8>,
    decoder: Decoder<'static>,
    encoder: Encoder<'static>,
    replaced: u64,
}

impl Default for Rewriter {
    fn default() -> Self {
        Self::new()
    }
}

impl Rewriter {
    /// A rewriter for a new server-side connection (expects the client preface first).
    pub fn new() -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(HPACK_TABLE_SIZE);
        let mut encoder = Encoder::new();
        encoder.set_max_table_size(HPACK_TABLE_SIZE);
        Rewriter {
            mode: Mode::Undecided,
            state: State::Preface(PREFACE.len()),
            pending: Vec::new(),
            block: None,
            raw: Vec::new(),
            decoder,
            encoder,
            replaced: 0,
        }
    }

    /// How many `:authority` values were replaced so far.
    pub fn replaced(&self) -> u64 {
        self.replaced
    }

    /// Whether the connection's first header block needed no fix, so that every byte from
    /// here on passes through as it is (and [`Rewriter::feed`] only copies).
    pub fn is_transparent(&self) -> bool {
        self.mode == Mode::Transparent
    }

    /// Consumes `input` (any split of the stream) and appends what the server should
    /// read to `out`. Incomplete frame headers and header blocks are kept for the next
    /// call.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        while !input.is_empty() {
            if self.mode == Mode::Transparent {
                out.extend_from_slice(input);
                return Ok(());
            }
            match self.state {
                State::Preface(left) | State::Passthrough(left) => {
                    let take = left.min(input.len());
                    out.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    self.state = match (&self.state, left - take) {
                        (_, 0) => State::FrameHeader,
                        (State::Preface(_), rest) => State::Preface(rest),
                        (_, rest) => State::Passthrough(rest),
                    };
                }
                State::FrameHeader => {
                    input = self.fill(input, FRAME_HEADER_LEN);
                    if self.pending.len() < FRAME_HEADER_LEN {
                        return Ok(());
                    }
                    let header = parse_frame_header(&self.pending);
                    self.start_frame(header, out)?;
                }
                State::BlockPayload(header) => {
                    input = self.fill(input, header.len);
                    if self.pending.len() < header.len {
                        return Ok(());
                    }
                    let payload = std::mem::take(&mut self.pending);
                    self.state = State::FrameHeader;
                    if self.mode == Mode::Undecided {
                        self.raw.extend_from_slice(&payload);
                    }
                    self.block_frame(header, &payload, out)?;
                }
            }
        }
        Ok(())
    }

    /// Moves bytes from `input` into `pending` until it holds `want` bytes.
    fn fill<'i>(&mut self, input: &'i [u8], want: usize) -> &'i [u8] {
        let take = want.saturating_sub(self.pending.len()).min(input.len());
        self.pending.extend_from_slice(&input[..take]);
        &input[take..]
    }

    fn start_frame(&mut self, header: FrameHeader, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let in_block = self.block.is_some();
        let block_frame = match header.kind {
            TYPE_HEADERS => !in_block,
            TYPE_CONTINUATION => in_block,
            _ => !in_block,
        };
        if !block_frame {
            return Err(RewriteError::BrokenBlockSequence { frame_type: header.kind, stream: header.stream });
        }
        if header.kind == TYPE_HEADERS || header.kind == TYPE_CONTINUATION {
            if header.len > MAX_HEADER_BLOCK {
                return Err(RewriteError::BlockTooLarge { stream: header.stream });
            }
            if self.mode == Mode::Undecided {
                self.raw.extend_from_slice(&self.pending);
            }
            self.pending.clear();
            self.state = State::BlockPayload(header);
            if header.len == 0 {
                self.state = State::FrameHeader;
                self.block_frame(header, &[], out)?;
            }
        } else {
            out.extend_from_slice(&self.pending);
            self.pending.clear();
            self.state = if header.len == 0 { State::FrameHeader } else { State::Passthrough(header.len) };
        }
        Ok(())
    }

    /// Handles one complete HEADERS or CONTINUATION payload.
    fn block_frame(&mut self, header: FrameHeader, payload: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        if header.kind == TYPE_HEADERS {
            let fragment = strip_headers_payload(header, payload)?;
            self.block = Some(Block {
                stream: header.stream,
                end_stream: header.flags & FLAG_END_STREAM != 0,
                fragment: fragment.to_vec(),
            });
        } else {
            match self.block.as_mut() {
                Some(block) if block.stream == header.stream => {
                    if block.fragment.len() + payload.len() > MAX_HEADER_BLOCK {
                        return Err(RewriteError::BlockTooLarge { stream: header.stream });
                    }
                    block.fragment.extend_from_slice(payload);
                }
                _ => {
                    return Err(RewriteError::BrokenBlockSequence { frame_type: header.kind, stream: header.stream });
                }
            }
        }
        if header.flags & FLAG_END_HEADERS != 0
            && let Some(block) = self.block.take()
        {
            self.finish_block(block, out)?;
        }
        Ok(())
    }

    fn finish_block(&mut self, block: Block, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let stream = block.stream;
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut list_size = 0usize;
        self.decoder
            .decode_with_cb(&block.fragment, |name, value| {
                list_size = list_size.saturating_add(name.len()).saturating_add(value.len()).saturating_add(32);
                if list_size <= MAX_HEADER_LIST {
                    headers.push((name.into_owned(), value.into_owned()));
                }
            })
            .map_err(|source| RewriteError::Decode { stream, source })?;
        if list_size > MAX_HEADER_LIST {
            return Err(RewriteError::HeaderListTooLarge { stream });
        }
        let is_invalid = |(name, value): &(Vec<u8>, Vec<u8>)| {
            name == b":authority" && http::uri::Authority::try_from(value.as_slice()).is_err()
        };
        if self.mode == Mode::Undecided {
            let raw = std::mem::take(&mut self.raw);
            if !headers.iter().any(is_invalid) {
                // The server decodes the client's own bytes, so its table is the client's
                // and nothing after this needs to be looked at.
                out.extend_from_slice(&raw);
                self.mode = Mode::Transparent;
                return Ok(());
            }
            self.mode = Mode::Rewriting;
        }
        for header in headers.iter_mut().filter(|h| is_invalid(h)) {
            tracing::debug!(
                stream,
                authority = %String::from_utf8_lossy(&header.1),
                "replacing an :authority the HTTP/2 server would reject with localhost"
            );
            header.1 = REPLACEMENT_AUTHORITY.to_vec();
            self.replaced += 1;
        }
        let mut encoded = Vec::with_capacity(block.fragment.len() + 16);
        self.encoder
            .encode_into(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())), &mut encoded)
            .map_err(|source| RewriteError::Encode { stream, source })?;
        write_block(stream, block.end_stream, &encoded, out);
        Ok(())
    }
}

fn parse_frame_header(bytes: &[u8]) -> FrameHeader {
    let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
    let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff;
    FrameHeader { len, kind: bytes[3], flags: bytes[4], stream }
}

/// The header block fragment of a HEADERS payload, without padding and priority fields.
fn strip_headers_payload(header: FrameHeader, payload: &[u8]) -> Result<&[u8], RewriteError> {
    let malformed = || RewriteError::MalformedHeaders { stream: header.stream };
    let mut start = 0;
    let mut end = payload.len();
    if header.flags & FLAG_PADDED != 0 {
        let pad = usize::from(*payload.first().ok_or_else(malformed)?);
        start = 1;
        end = end.checked_sub(pad).ok_or_else(malformed)?;
    }
    if header.flags & FLAG_PRIORITY != 0 {
        start += 5;
    }
    payload.get(start..end).ok_or_else(malformed)
}

/// Writes an encoded block as HEADERS (+ CONTINUATION) frames of at most [`MAX_OUT_FRAME`].
fn write_block(stream: u32, end_stream: bool, block: &[u8], out: &mut Vec<u8>) {
    let mut chunks = block.chunks(MAX_OUT_FRAME).peekable();
    let mut first = true;
    loop {
        let chunk = chunks.next().unwrap_or(&[]);
        let last = chunks.peek().is_none();
        let kind = if first { TYPE_HEADERS } else { TYPE_CONTINUATION };
        let mut flags = if last { FLAG_END_HEADERS } else { 0 };
        if first && end_stream {
            flags |= FLAG_END_STREAM;
        }
        write_frame_header(out, chunk.len(), kind, flags, stream);
        out.extend_from_slice(chunk);
        first = false;
        if last {
            return;
        }
    }
}

/// Appends a 9-byte frame header; `len` is at most [`MAX_OUT_FRAME`].
pub(crate) fn write_frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
}

/// A server-side stream whose incoming bytes go through a [`Rewriter`].
pub struct AuthorityFix<IO> {
    inner: IO,
    rewriter: Rewriter,
    out: Vec<u8>,
    out_pos: usize,
    scratch: Vec<u8>,
}

impl<IO> AuthorityFix<IO> {
    /// Wraps a freshly accepted stream.
    pub fn new(inner: IO) -> Self {
        AuthorityFix { inner, rewriter: Rewriter::new(), out: Vec::new(), out_pos: 0, scratch: vec![0; 16 * 1024] }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &IO {
        &self.inner
    }

    /// How many `:authority` values were replaced on this connection.
    pub fn replaced(&self) -> u64 {
        self.rewriter.replaced()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for AuthorityFix<IO> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_pos == this.out.len() && this.rewriter.is_transparent() {
                // Nothing left to look at: read straight into the caller's buffer.
                if !this.scratch.is_empty() {
                    this.scratch = Vec::new();
                    this.out = Vec::new();
                    this.out_pos = 0;
                }
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            if this.out_pos < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.out_pos);
                buf.put_slice(&this.out[this.out_pos..this.out_pos + n]);
                this.out_pos += n;
                if this.out_pos == this.out.len() {
                    this.out.clear();
                    this.out_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut read = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            let filled = read.filled();
            if filled.is_empty() {
                return Poll::Ready(Ok(()));
            }
            this.rewriter.feed(filled, &mut this.out).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<IO> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
