//! A hook's inputs: the OCI state on stdin and the bundle's config.json (split at the first
//! 0xff byte, which UTF-8 JSON never has), then the `--link` argument and the driver's
//! params file as text.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;

/// The bundle folder whose config.json each input rewrites.
static BUNDLE: LazyLock<tempfile::TempDir> = LazyLock::new(|| tempfile::tempdir().expect("a temporary folder"));

fuzz_target!(|data: &[u8]| {
    let (state, config) = match data.iter().position(|&b| b == 0xff) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b""[..]),
    };
    let _ = edra::fuzzing::hook_state(BUNDLE.path(), state, config);
    let text = String::from_utf8_lossy(data);
    let _ = edra::fuzzing::hook_args(&text, &text);
});
