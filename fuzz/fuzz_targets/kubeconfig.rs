//! A kubeconfig file, parsed and turned into credentials (current context, then a named one).
#![no_main]

use std::path::PathBuf;
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;

/// An empty folder the file "lives" in, so relative certificate and token paths find nothing.
static DIR: LazyLock<tempfile::TempDir> = LazyLock::new(|| tempfile::tempdir().expect("a temporary folder"));

fuzz_target!(|data: &[u8]| {
    let path: PathBuf = DIR.path().join("kubeconfig");
    let _ = edra::fuzzing::kubeconfig(&path, data, None);
    let _ = edra::fuzzing::kubeconfig(&path, data, Some("edra"));
});
