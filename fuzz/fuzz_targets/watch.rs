//! A watch stream body split into frames, and the same bytes as a LIST response, in the
//! wire version picked by the first byte.
#![no_main]

use edra::kube::ResourceApi;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&head, body)) = data.split_first() else { return };
    let api = ResourceApi::PREFERENCE[usize::from(head % 3)];
    let piece = usize::from(head / 3).max(1);
    let pieces: Vec<&[u8]> = body.chunks(piece).collect();
    let _ = edra::fuzzing::watch(api, &pieces);
    let _ = edra::fuzzing::slice_list(api, body);
});
