//! Property tests of the HTTP/2 `:authority` rewriter: arbitrary bytes after the preface
//! never panic, and a valid connection stays valid: whatever the split of the input, the
//! output is the preface plus well-formed frames, other frames pass unchanged and in order,
//! and every header block decodes (with one HPACK table for the connection, as the server
//! decodes) to the client's headers with only an invalid `:authority` replaced. A
//! connection whose first header block has a valid `:authority` reaches the server byte
//! for byte as it was sent, whatever follows.

use loona_hpack::{Decoder, Encoder};
use proptest::prelude::*;

use super::hostile::{bytes, config};
use crate::plugin::authority::{PREFACE, REPLACEMENT_AUTHORITY, Rewriter, write_frame_header};

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

type Headers = Vec<(Vec<u8>, Vec<u8>)>;

/// One thing the client sends.
#[derive(Debug, Clone)]
enum Sent {
    /// A header block, split into HEADERS + CONTINUATION payloads of `chunk` bytes.
    Block { headers: Headers, chunk: usize, pad: Option<u8>, priority: bool, end_stream: bool },
    /// Any other frame (DATA, SETTINGS, PING, WINDOW_UPDATE, unknown types).
    Frame { kind: u8, flags: u8, payload: Vec<u8> },
}

fn authority() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"localhost".to_vec()),
        Just(b"127.0.0.1:50051".to_vec()),
        Just(b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.edra.dev-reg.sock".to_vec()),
        Just(b"/var/lib/kubelet/plugins_registry/gpu.edra.dev-reg.sock".to_vec()),
        "[a-z0-9.:-]{0,40}".prop_map(String::into_bytes),
        prop::collection::vec(any::<u8>(), 0..64),
    ]
}

fn headers() -> impl Strategy<Value = Headers> {
    let extra = prop::collection::vec(
        (
            prop_oneof![Just(b"te".to_vec()), "[a-z-]{1,12}".prop_map(String::into_bytes)],
            prop::collection::vec(any::<u8>(), 0..300),
        ),
        0..6,
    );
    (authority(), extra).prop_map(|(authority, extra)| {
        let mut h: Headers = vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (b":path".to_vec(), b"/pluginregistration.Registration/GetInfo".to_vec()),
            (b":authority".to_vec(), authority),
        ];
        h.extend(extra);
        h
    })
}

fn sent() -> impl Strategy<Value = Sent> {
    let block = (headers(), 1usize..400, prop::option::of(any::<u8>()), any::<bool>(), any::<bool>()).prop_map(
        |(headers, chunk, pad, priority, end_stream)| Sent::Block { headers, chunk, pad, priority, end_stream },
    );
    let frame = (prop_oneof![Just(0x0u8), Just(0x4), Just(0x6), Just(0x8), 0xau8..=0xff], any::<u8>(), bytes(64))
        .prop_map(|(kind, flags, payload)| Sent::Frame { kind, flags, payload });
    prop_oneof![block, frame]
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    write_frame_header(out, payload.len(), kind, flags, stream);
    out.extend_from_slice(payload);
}

/// The client's bytes for `sent`, with one HPACK encoder for the connection.
fn client_bytes(sent: &[Sent]) -> Vec<u8> {
    let mut encoder = Encoder::new();
    let mut out = PREFACE.to_vec();
    for (i, s) in sent.iter().enumerate() {
        let stream = 1 + 2 * u32::try_from(i).expect("few frames");
        match s {
            Sent::Frame { kind, flags, payload } => frame(&mut out, *kind, *flags, stream, payload),
            Sent::Block { headers, chunk, pad, priority, end_stream } => {
                let block = encoder.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
                let mut chunks: Vec<&[u8]> = block.chunks(*chunk).collect();
                if chunks.is_empty() {
                    chunks.push(&[]);
                }
                let last = chunks.len() - 1;
                for (j, c) in chunks.iter().enumerate() {
                    let mut flags = if j == last { END_HEADERS } else { 0 };
                    if j > 0 {
                        frame(&mut out, CONTINUATION, flags, stream, c);
                        continue;
                    }
                    let mut payload = Vec::new();
                    if let Some(pad) = pad {
                        flags |= PADDED;
                        payload.push(*pad);
                    }
                    if *priority {
                        flags |= PRIORITY;
                        payload.extend_from_slice(&[0, 0, 0, 0, 16]);
                    }
                    if *end_stream {
                        flags |= END_STREAM;
                    }
                    payload.extend_from_slice(c);
                    payload.extend(std::iter::repeat_n(0, usize::from(pad.unwrap_or(0))));
                    frame(&mut out, HEADERS, flags, stream, &payload);
                }
            }
        }
    }
    out
}

/// What the server should see: per item, the frame or the headers (authority fixed).
#[derive(Debug, PartialEq)]
enum Seen {
    Frame { kind: u8, flags: u8, stream: u32, payload: Vec<u8> },
    Block { stream: u32, end_stream: bool, headers: Headers },
}

fn is_invalid(name: &[u8], value: &[u8]) -> bool {
    name == b":authority" && http::uri::Authority::try_from(value).is_err()
}

/// Whether the first header block in `sent` needs no fix (the rewriter then passes the
/// whole connection through).
fn starts_valid(sent: &[Sent]) -> bool {
    sent.iter()
        .find_map(|s| match s {
            Sent::Block { headers, .. } => Some(!headers.iter().any(|(n, v)| is_invalid(n, v))),
            Sent::Frame { .. } => None,
        })
        .unwrap_or(true)
}

fn expected(sent: &[Sent]) -> (Vec<Seen>, u64) {
    let fix = !starts_valid(sent);
    let mut replaced = 0;
    let seen = sent
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let stream = 1 + 2 * u32::try_from(i).expect("few frames");
            match s {
                Sent::Frame { kind, flags, payload } => {
                    Seen::Frame { kind: *kind, flags: *flags, stream, payload: payload.clone() }
                }
                Sent::Block { headers, end_stream, .. } => {
                    let mut headers = headers.clone();
                    for (n, v) in headers.iter_mut().filter(|(n, v)| fix && is_invalid(n, v)) {
                        debug_assert_eq!(n, b":authority");
                        *v = REPLACEMENT_AUTHORITY.to_vec();
                        replaced += 1;
                    }
                    Seen::Block { stream, end_stream: *end_stream, headers }
                }
            }
        })
        .collect();
    (seen, replaced)
}

/// Parses the rewriter's output as the server would; any malformation fails the test.
fn server_view(bytes: &[u8]) -> Result<Vec<Seen>, String> {
    let rest = bytes.strip_prefix(PREFACE.as_slice()).ok_or("no preface")?;
    let mut decoder = Decoder::new();
    let mut rest = rest;
    let mut seen = Vec::new();
    let mut block: Option<(u32, bool, Vec<u8>)> = None;
    while !rest.is_empty() {
        let header = rest.get(..9).ok_or("a short frame header")?;
        let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        let (kind, flags) = (header[3], header[4]);
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]);
        let payload = rest.get(9..9 + len).ok_or("a short frame")?.to_vec();
        rest = &rest[9 + len..];
        match (kind, &mut block) {
            (HEADERS, None) => {
                if len > 16_384 {
                    return Err(format!("HEADERS of {len} bytes"));
                }
                let malformed = || format!("HEADERS of {len} bytes with flags {flags:#x}");
                let (mut start, mut end) = (0, payload.len());
                if flags & PADDED != 0 {
                    start = 1;
                    end =
                        end.checked_sub(usize::from(*payload.first().ok_or_else(malformed)?)).ok_or_else(malformed)?;
                }
                if flags & PRIORITY != 0 {
                    start += 5;
                }
                let fragment = payload.get(start..end).ok_or_else(malformed)?.to_vec();
                block = Some((stream, flags & END_STREAM != 0, fragment));
            }
            (CONTINUATION, Some((s, _, fragment))) if *s == stream && len <= 16_384 => fragment.extend(payload),
            (_, None) => seen.push(Seen::Frame { kind, flags, stream, payload }),
            _ => return Err(format!("frame type {kind:#x} inside a header block")),
        }
        if matches!(kind, HEADERS | CONTINUATION) && flags & END_HEADERS != 0 {
            let (stream, end_stream, fragment) = block.take().ok_or("END_HEADERS outside a block")?;
            let headers = decoder.decode(&fragment).map_err(|e| format!("server-side HPACK decode: {e:?}"))?;
            seen.push(Seen::Block { stream, end_stream, headers });
        }
    }
    if block.is_some() {
        return Err("an unterminated header block".into());
    }
    Ok(seen)
}

proptest! {
    #![proptest_config(config(1_500))]

    #[test]
    fn arbitrary_bytes_never_panic(input in bytes(2_048), piece in 1usize..300) {
        let mut stream = PREFACE.to_vec();
        stream.extend(input);
        let pieces: Vec<&[u8]> = stream.chunks(piece).collect();
        let _ = crate::fuzzing::authority(&pieces);
    }

    #[test]
    fn arbitrary_hpack_in_valid_frames_never_panics(
        blocks in prop::collection::vec((bytes(300), any::<u8>()), 1..6),
        piece in 1usize..300,
    ) {
        let mut stream = PREFACE.to_vec();
        for (block, flags) in &blocks {
            frame(&mut stream, HEADERS, flags | END_HEADERS, 1, block);
        }
        let pieces: Vec<&[u8]> = stream.chunks(piece).collect();
        let _ = crate::fuzzing::authority(&pieces);
    }

    #[test]
    fn valid_connections_stay_valid(sent in prop::collection::vec(sent(), 0..12), piece in 1usize..1_000) {
        let input = client_bytes(&sent);
        let mut rewriter = Rewriter::new();
        let mut out = Vec::new();
        for p in input.chunks(piece) {
            rewriter.feed(p, &mut out).map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        let (want, replaced) = expected(&sent);
        prop_assert_eq!(server_view(&out).map_err(TestCaseError::fail)?, want);
        prop_assert_eq!(rewriter.replaced(), replaced);
        if starts_valid(&sent) {
            prop_assert_eq!(out, input);
        }
    }
}
