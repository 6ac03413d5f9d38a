//! Client-to-server HTTP/2 bytes through the `:authority` rewriter, in pieces of a size
//! picked by the first byte (the client preface is supplied, so frames start at once).
#![no_main]

use edra::plugin::authority::PREFACE;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&head, frames)) = data.split_first() else { return };
    let mut stream = PREFACE.to_vec();
    stream.extend_from_slice(frames);
    let piece = usize::from(head).max(1);
    let pieces: Vec<&[u8]> = stream.chunks(piece).collect();
    let _ = edra::fuzzing::authority(&pieces);
});
