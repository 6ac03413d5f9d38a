//! Unit tests of the `:authority` rewriter: framing (split reads, CONTINUATION, padding,
//! priority, large blocks), HPACK table consistency over many requests, bad input.

use super::*;
use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ENCODED_PATH: &[u8] = b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.edra.dev-reg.sock";
const RAW_PATH: &[u8] = b"/var/lib/kubelet/plugins_registry/gpu.edra.dev-reg.sock";

#[derive(Debug, PartialEq)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame_header(&mut out, payload.len(), kind, flags, stream);
    out.extend_from_slice(payload);
    out
}

/// Splits the rewriter's output (after the preface) into frames; panics on a short tail.
fn frames(bytes: &[u8]) -> Vec<Frame> {
    assert_eq!(&bytes[..24], PREFACE);
    let mut rest = &bytes[24..];
    let mut out = Vec::new();
    while !rest.is_empty() {
        let h = parse_frame_header(rest);
        out.push(Frame { kind: h.kind, flags: h.flags, stream: h.stream, payload: rest[9..9 + h.len].to_vec() });
        rest = &rest[9 + h.len..];
    }
    out
}

type Headers = Vec<(Vec<u8>, Vec<u8>)>;

/// Decodes every header block in `frames` the way the server would: one table for the
/// whole connection, HEADERS + CONTINUATION concatenated.
fn server_blocks(frames: &[Frame], decoder: &mut Decoder<'static>) -> Vec<Headers> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<u8>> = None;
    for f in frames {
        match f.kind {
            TYPE_HEADERS => {
                assert!(current.is_none(), "HEADERS inside a block");
                assert_eq!(f.flags & (FLAG_PADDED | FLAG_PRIORITY), 0, "padding/priority must be stripped");
                assert!(f.payload.len() <= MAX_OUT_FRAME);
                current = Some(f.payload.clone());
            }
            TYPE_CONTINUATION => {
                assert!(f.payload.len() <= MAX_OUT_FRAME);
                current.as_mut().expect("CONTINUATION without HEADERS").extend_from_slice(&f.payload);
            }
            _ => continue,
        }
        if f.flags & FLAG_END_HEADERS != 0 {
            let block = current.take().expect("block");
            blocks.push(decoder.decode(&block).expect("server-side decode"));
        }
    }
    assert!(current.is_none(), "unterminated header block");
    blocks
}

fn request_headers(authority: &[u8]) -> Headers {
    vec![
        (b":method".to_vec(), b"POST".to_vec()),
        (b":scheme".to_vec(), b"http".to_vec()),
        (b":path".to_vec(), b"/pluginregistration.Registration/GetInfo".to_vec()),
        (b":authority".to_vec(), authority.to_vec()),
        (b"content-type".to_vec(), b"application/grpc".to_vec()),
        (b"te".to_vec(), b"trailers".to_vec()),
    ]
}

fn encode(encoder: &mut Encoder<'static>, headers: &Headers) -> Vec<u8> {
    encoder.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
}

fn authority_of(headers: &Headers) -> &[u8] {
    &headers.iter().find(|(n, _)| n == b":authority").expect(":authority").1
}

fn client_stream(blocks: &[Vec<u8>]) -> Vec<u8> {
    let mut bytes = PREFACE.to_vec();
    bytes.extend(frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100])); // SETTINGS
    for (i, block) in blocks.iter().enumerate() {
        let stream = 1 + 2 * i as u32;
        bytes.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, stream, block));
        bytes.extend(frame(0x0, FLAG_END_STREAM, stream, &[0, 0, 0, 0, 0])); // empty gRPC message
    }
    bytes
}

fn rewrite(input: &[u8]) -> Result<(Vec<u8>, u64), RewriteError> {
    let mut rewriter = Rewriter::new();
    let mut out = Vec::new();
    rewriter.feed(input, &mut out)?;
    Ok((out, rewriter.replaced()))
}

#[test]
fn percent_encoded_and_raw_path_authorities_become_localhost() {
    for authority in [ENCODED_PATH, RAW_PATH, b"" as &[u8], b"a b", b"tmp%2Freg.sock"] {
        let block = encode(&mut Encoder::new(), &request_headers(authority));
        let (out, replaced) = rewrite(&client_stream(&[block])).expect("rewrite");
        assert_eq!(replaced, 1, "{}", String::from_utf8_lossy(authority));
        let blocks = server_blocks(&frames(&out), &mut Decoder::new());
        assert_eq!(blocks, vec![request_headers(b"localhost")]);
    }
}

#[test]
fn valid_authorities_are_kept() {
    for authority in [b"localhost" as &[u8], b"example.com:8080", b"[::1]:50051", b"user@host"] {
        let block = encode(&mut Encoder::new(), &request_headers(authority));
        let (out, replaced) = rewrite(&client_stream(&[block])).expect("rewrite");
        assert_eq!(replaced, 0);
        assert_eq!(server_blocks(&frames(&out), &mut Decoder::new()), vec![request_headers(authority)]);
    }
}

#[test]
fn other_frames_pass_through_byte_for_byte() {
    let block = encode(&mut Encoder::new(), &request_headers(b"localhost"));
    let input = client_stream(&[block]);
    let (out, _) = rewrite(&input).expect("rewrite");
    let (ins, outs) = (frames(&input), frames(&out));
    assert_eq!(ins.len(), outs.len());
    for (i, o) in ins.iter().zip(&outs) {
        if i.kind != TYPE_HEADERS {
            assert_eq!(i, o);
        }
    }
}

#[test]
fn any_split_of_the_input_gives_the_same_output() {
    let mut encoder = Encoder::new();
    let blocks: Vec<_> = (0..3).map(|_| encode(&mut encoder, &request_headers(ENCODED_PATH))).collect();
    let input = client_stream(&blocks);
    let (whole, _) = rewrite(&input).expect("rewrite");
    for chunk in [1, 2, 5, 9, 10, 31, 100] {
        let mut rewriter = Rewriter::new();
        let mut out = Vec::new();
        for piece in input.chunks(chunk) {
            rewriter.feed(piece, &mut out).expect("rewrite");
        }
        assert_eq!(out, whole, "chunk size {chunk}");
        assert_eq!(rewriter.replaced(), 3);
    }
}

#[test]
fn continuation_frames_are_joined_and_padding_and_priority_stripped() {
    let block = encode(&mut Encoder::new(), &request_headers(ENCODED_PATH));
    let (a, rest) = block.split_at(7);
    let (b, c) = rest.split_at(20);
    let mut headers_payload = vec![3]; // pad length
    headers_payload.extend([0x80, 0, 0, 0, 15]); // exclusive dependency on 0, weight 15
    headers_payload.extend(a);
    headers_payload.extend([0, 0, 0]);
    let mut input = PREFACE.to_vec();
    input.extend(frame(TYPE_HEADERS, FLAG_PADDED | FLAG_PRIORITY | FLAG_END_STREAM, 5, &headers_payload));
    input.extend(frame(TYPE_CONTINUATION, 0, 5, b));
    input.extend(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 5, c));
    let (out, replaced) = rewrite(&input).expect("rewrite");
    assert_eq!(replaced, 1);
    let out_frames = frames(&out);
    assert_eq!(out_frames.len(), 1);
    assert_eq!(out_frames[0].flags, FLAG_END_STREAM | FLAG_END_HEADERS);
    assert_eq!(out_frames[0].stream, 5);
    assert_eq!(server_blocks(&out_frames, &mut Decoder::new()), vec![request_headers(b"localhost")]);
}

#[test]
fn a_large_block_is_split_into_continuation_frames() {
    let mut headers = request_headers(ENCODED_PATH);
    headers.push((b"x-large".to_vec(), vec![b'v'; 40 * 1024]));
    let block = encode(&mut Encoder::new(), &headers);
    let mut input = PREFACE.to_vec();
    let mut chunks = block.chunks(16_384).peekable();
    let mut kind = TYPE_HEADERS;
    while let Some(chunk) = chunks.next() {
        let flags = if chunks.peek().is_none() { FLAG_END_HEADERS } else { 0 };
        input.extend(frame(kind, flags, 1, chunk));
        kind = TYPE_CONTINUATION;
    }
    let mut rewriter = Rewriter::new();
    let mut out = Vec::new();
    for piece in input.chunks(1000) {
        rewriter.feed(piece, &mut out).expect("rewrite");
    }
    let out_frames = frames(&out);
    assert!(out_frames.len() >= 3, "40 KiB needs at least three frames");
    assert_eq!(out_frames[0].kind, TYPE_HEADERS);
    assert!(out_frames[1..].iter().all(|f| f.kind == TYPE_CONTINUATION));
    assert_eq!(out_frames.iter().filter(|f| f.flags & FLAG_END_HEADERS != 0).count(), 1);
    headers[3].1 = b"localhost".to_vec();
    assert_eq!(server_blocks(&out_frames, &mut Decoder::new()), vec![headers]);
}

#[test]
fn dynamic_tables_stay_consistent_over_200_requests() {
    // The client indexes the authority once and then refers to it; fresh header names
    // fill the table until old entries are evicted.
    let mut client = Encoder::new();
    let mut expected = Vec::new();
    let mut blocks = Vec::new();
    for i in 0..200 {
        let mut headers = request_headers(if i % 2 == 0 { ENCODED_PATH } else { RAW_PATH });
        headers.push((format!("x-seq-{i}").into_bytes(), format!("value-{i}").into_bytes()));
        let mut block = Vec::new();
        if i == 100 {
            // Size update to 0 (clears the table), then back to 4096: the client starts over.
            block.extend([0x20, 0x3f, 0xe1, 0x1f]);
            client = Encoder::new();
        }
        block.extend(encode(&mut client, &headers));
        blocks.push(block);
        headers[3].1 = b"localhost".to_vec();
        expected.push(headers);
    }
    let input = client_stream(&blocks);
    let mut rewriter = Rewriter::new();
    let mut out = Vec::new();
    for piece in input.chunks(777) {
        rewriter.feed(piece, &mut out).expect("rewrite");
    }
    assert_eq!(rewriter.replaced(), 200);
    let decoded = server_blocks(&frames(&out), &mut Decoder::new());
    assert_eq!(decoded.len(), 200);
    for (got, want) in decoded.iter().zip(&expected) {
        assert_eq!(authority_of(got), b"localhost");
        assert_eq!(got, want);
    }
}

#[test]
fn broken_sequences_and_bad_hpack_are_errors() {
    let block = encode(&mut Encoder::new(), &request_headers(ENCODED_PATH));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("lone continuation", frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &block)),
        ("interrupted block", [frame(TYPE_HEADERS, 0, 1, &block), frame(0x0, 0, 1, b"x")].concat()),
        (
            "continuation for another stream",
            [frame(TYPE_HEADERS, 0, 1, &block), frame(TYPE_CONTINUATION, 4, 3, b"")].concat(),
        ),
        ("padding longer than frame", frame(TYPE_HEADERS, FLAG_PADDED | FLAG_END_HEADERS, 1, &[200, 1, 2])),
        ("empty padded frame", frame(TYPE_HEADERS, FLAG_PADDED | FLAG_END_HEADERS, 1, &[])),
        ("priority longer than frame", frame(TYPE_HEADERS, FLAG_PRIORITY | FLAG_END_HEADERS, 1, &[1, 2])),
        ("index out of range", frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &[0xff, 0x7f])),
        ("truncated literal", frame(TYPE_HEADERS, FLAG_END_HEADERS, 1, &[0x40, 0x10, b'a'])),
    ];
    for (name, frames) in cases {
        let input = [PREFACE.as_slice(), &frames].concat();
        assert!(rewrite(&input).is_err(), "{name}");
    }
}

#[test]
fn a_header_block_that_decodes_to_more_than_1_mib_is_refused() {
    // HPACK amplification: one 4,000-byte value in the dynamic table, then 16 KiB of
    // one-byte references to it decode to 64 MiB of headers (a 1 MiB block to 4 GiB).
    let mut block = vec![0x40, 0x01, b'x', 0x7f, 0xa1, 0x1e]; // literal, indexed: "x", 4,000-byte value
    block.extend(std::iter::repeat_n(b'v', 4000));
    block.extend(std::iter::repeat_n(0xbe, 16 << 10)); // index 62: the entry just added
    assert!(Decoder::new().decode(&block[..4006 + 2]).is_ok_and(|h| h.len() == 3), "the block is valid HPACK");
    let mut input = PREFACE.to_vec();
    let mut chunks = block.chunks(MAX_OUT_FRAME).peekable();
    let mut kind = TYPE_HEADERS;
    while let Some(chunk) = chunks.next() {
        let flags = if chunks.peek().is_none() { FLAG_END_HEADERS } else { 0 };
        input.extend(frame(kind, flags, 1, chunk));
        kind = TYPE_CONTINUATION;
    }
    match rewrite(&input) {
        Err(RewriteError::HeaderListTooLarge { stream: 1 }) => {}
        other => panic!("expected HeaderListTooLarge, got {:?}", other.map(|(out, _)| out.len())),
    }
}

#[test]
fn random_input_never_panics() {
    let mut rng = fastrand::Rng::with_seed(7);
    for _ in 0..2000 {
        let len = rng.usize(0..200);
        let mut input = PREFACE.to_vec();
        let kinds = [TYPE_HEADERS, TYPE_CONTINUATION, 0x0, 0x4];
        for _ in 0..rng.usize(1..4) {
            let payload: Vec<u8> = (0..rng.usize(0..len.max(1))).map(|_| rng.u8(..)).collect();
            input.extend(frame(kinds[rng.usize(..kinds.len())], rng.u8(..), rng.u32(..4), &payload));
        }
        let mut rewriter = Rewriter::new();
        let mut out = Vec::new();
        for piece in input.chunks(rng.usize(1..64)) {
            if rewriter.feed(piece, &mut out).is_err() {
                break;
            }
        }
    }
}

type Duplex = tokio::io::DuplexStream;

/// Writes `input` in 13-byte pieces into a stream wrapped in [`AuthorityFix`] and reads
/// it all back through the adapter; returns what was read, the adapter and the client's
/// reading half (for what the server writes).
async fn read_through_adapter(input: Vec<u8>) -> (Vec<u8>, AuthorityFix<Duplex>, tokio::io::ReadHalf<Duplex>) {
    let (client, server) = tokio::io::duplex(64);
    let mut fixed = AuthorityFix::new(server);
    let (client_read, mut client_write) = tokio::io::split(client);
    let writer = tokio::spawn(async move {
        for piece in input.chunks(13) {
            client_write.write_all(piece).await.expect("write");
        }
        client_write.shutdown().await.expect("shutdown");
    });
    let mut got = Vec::new();
    fixed.read_to_end(&mut got).await.expect("read");
    writer.await.expect("writer");
    (got, fixed, client_read)
}

#[tokio::test]
async fn the_stream_adapter_rewrites_reads_and_passes_writes() {
    let block = encode(&mut Encoder::new(), &request_headers(ENCODED_PATH));
    let input = client_stream(&[block]);
    let (expected, _) = rewrite(&input).expect("rewrite");
    let (got, mut fixed, mut client_read) = read_through_adapter(input).await;
    assert_eq!(got, expected);
    assert_eq!(fixed.replaced(), 1);
    fixed.write_all(b"server bytes are untouched").await.expect("write");
    fixed.flush().await.expect("flush");
    let mut back = [0u8; 26];
    client_read.read_exact(&mut back).await.expect("read back");
    assert_eq!(&back, b"server bytes are untouched");
}

#[test]
fn a_connection_whose_first_request_is_valid_passes_through_untouched() {
    // After a first request with a valid authority nothing is parsed any more: a later
    // block is not rewritten, and not even decoded (the last one is not valid HPACK).
    let mut encoder = Encoder::new();
    let mut first_payload = vec![2]; // pad length
    first_payload.extend([0, 0, 0, 0, 16]); // priority fields
    first_payload.extend(encode(&mut encoder, &request_headers(b"localhost")));
    first_payload.extend([0, 0]);
    let mut input = PREFACE.to_vec();
    input.extend(frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100])); // SETTINGS
    input.extend(frame(TYPE_HEADERS, FLAG_PADDED | FLAG_PRIORITY | FLAG_END_HEADERS, 1, &first_payload));
    input.extend(frame(0x0, FLAG_END_STREAM, 1, &[0, 0, 0, 0, 0]));
    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 3, &encode(&mut encoder, &request_headers(ENCODED_PATH))));
    input.extend(frame(TYPE_HEADERS, FLAG_END_HEADERS, 5, &[0xff, 0x7f]));
    for chunk in [1, 7, 9, 64, input.len()] {
        let mut rewriter = Rewriter::new();
        let mut out = Vec::new();
        for piece in input.chunks(chunk) {
            rewriter.feed(piece, &mut out).expect("nothing after the first request is parsed");
        }
        assert_eq!(out, input, "chunk size {chunk}");
        assert!(rewriter.is_transparent());
        assert_eq!(rewriter.replaced(), 0);
    }
}

#[test]
fn a_connection_whose_first_request_needed_the_fix_is_rewritten_throughout() {
    let mut client = Encoder::new();
    let sent = [ENCODED_PATH, b"localhost", RAW_PATH, b"example.com:8080"];
    let blocks: Vec<_> = sent.iter().map(|a| encode(&mut client, &request_headers(a))).collect();
    let mut rewriter = Rewriter::new();
    let mut out = Vec::new();
    rewriter.feed(&client_stream(&blocks), &mut out).expect("rewrite");
    assert!(!rewriter.is_transparent());
    assert_eq!(rewriter.replaced(), 2);
    let got: Vec<_> =
        server_blocks(&frames(&out), &mut Decoder::new()).iter().map(|h| authority_of(h).to_vec()).collect();
    assert_eq!(got, [b"localhost" as &[u8], b"localhost", b"localhost", b"example.com:8080"]);
}

#[tokio::test]
async fn the_stream_adapter_reads_a_valid_connection_as_it_came() {
    let mut encoder = Encoder::new();
    let blocks: Vec<_> = (0..3).map(|_| encode(&mut encoder, &request_headers(b"localhost"))).collect();
    let input = client_stream(&blocks);
    let (got, fixed, _client_read) = read_through_adapter(input.clone()).await;
    assert_eq!(got, input);
    assert_eq!(fixed.replaced(), 0);
}
