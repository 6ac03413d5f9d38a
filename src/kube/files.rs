//! Reading the credential files a kubeconfig or the service account names (the
//! kubeconfig itself, CA, client certificate and key, bearer token): only a regular file,
//! after following links (the kubelet's `kubelet-client-current.pem` is one), and only up
//! to a limit. The file is opened with `O_NONBLOCK`, so a FIFO put at the path does not
//! hang the open, and checked with `fstat` before a byte is read; a device, FIFO, socket
//! or directory is refused, and so is a file past the limit (read with `take(limit + 1)`,
//! so a file growing while it is read is caught too).

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The most a kubeconfig, CA, certificate, key or token file may hold: real ones are a
/// few KiB (a kubeconfig with hundreds of embedded clusters stays below it).
pub const MAX_CREDENTIAL_FILE: u64 = 1 << 20;

/// The bytes of the regular file at `path` (links followed), at most `limit` of them; the
/// error is a sentence without the path (callers' errors name it).
pub fn read_regular(path: &Path, limit: u64) -> Result<Vec<u8>, String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("cannot open it: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("cannot read its metadata: {e}"))?;
    let kind = meta.file_type();
    let found = if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        ""
    };
    if !found.is_empty() {
        return Err(format!("it is {found}, not a regular file; point at the file itself"));
    }
    let too_big = || format!("it is larger than {} KiB, more than such a file holds; check the path", limit >> 10);
    if meta.len() > limit {
        return Err(too_big());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes).map_err(|e| format!("cannot read it: {e}"))?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > limit {
        return Err(too_big());
    }
    Ok(bytes)
}

/// [`read_regular`] as UTF-8 text.
pub fn read_regular_text(path: &Path, limit: u64) -> Result<String, String> {
    String::from_utf8(read_regular(path, limit)?).map_err(|_| "it is not UTF-8 text".to_string())
}
