//! An error response: HTTP status code and `Retry-After` header from the first bytes, then
//! the body, decoded as a `Status`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((head, body)) = data.split_first_chunk::<3>() else { return };
    let code = u16::from_be_bytes([head[0], head[1]]);
    let retry_after = match head[2] {
        0 => None,
        1 => Some(u64::MAX),
        n => Some(u64::from(n)),
    };
    let _ = edra::fuzzing::status(code, body, retry_after);
});
