//! Small helpers every layer uses and that depend on nothing else in edra: the version
//! string, the one-line rendering of an error with its causes, and waiting for shutdown.

/// edra's version, from Cargo.toml.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The error and its causes on one line.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    out
}

/// Returns once `shutdown` is true, or its sender is gone (as `edra run` stops then too).
pub async fn stopped(shutdown: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Runs `work` unless `shutdown` turns true first (`None` then).
pub async fn until_stopped<T>(
    work: impl std::future::Future<Output = T>,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
) -> Option<T> {
    tokio::select! {
        out = work => Some(out),
        () = stopped(shutdown) => None,
    }
}

/// Puts a new file or link at `path` atomically: `create` makes it at `tmp` (a name in the
/// same directory; a stale one left there is removed first), then it is renamed over
/// `path`. On failure `tmp` is removed and `path` is left as it was.
pub fn replace_atomically(
    path: &std::path::Path,
    tmp: &std::path::Path,
    create: impl FnOnce(&std::path::Path) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let result = (|| {
        match std::fs::remove_file(tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        create(tmp)?;
        std::fs::rename(tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    result
}

/// [`replace_atomically`] with a regular file holding `contents` with permissions `mode`,
/// created exclusively without following links and synced to disk before the rename.
pub fn write_atomically(
    path: &std::path::Path,
    tmp: &std::path::Path,
    contents: &[u8],
    mode: u32,
) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    replace_atomically(path, tmp, |tmp| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(contents)?;
        f.sync_all()
    })
}

/// `v` as the API server's canonical Quantity text, which it returns unchanged: a
/// multiple of 1024 (from 1024 up) in binary-SI form with the largest exact suffix
/// (`85899345920` → `80Gi`), anything else in decimal-SI form with the largest exact
/// power-of-1000 suffix (`108` → `108`, `2000` → `2k`). The server keeps the format it
/// parsed but rewrites the number canonically, so a plain integer is not always returned
/// unchanged (`85000000000` comes back as `85G`); writing the canonical text keeps a
/// read-back slice equal to the desired one.
pub fn quantity(v: u64) -> String {
    if v >= 1024 && v.is_multiple_of(1024) {
        let mut n = v;
        let mut i = 0;
        while n.is_multiple_of(1024) && i < 6 {
            n /= 1024;
            i += 1;
        }
        return format!("{n}{}", ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][i]);
    }
    if v == 0 {
        return "0".into();
    }
    let mut n = v;
    let mut i = 0;
    while n.is_multiple_of(1000) && i < 6 {
        n /= 1000;
        i += 1;
    }
    format!("{n}{}", ["", "k", "M", "G", "T", "P", "E"][i])
}
