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

/// Returns once `shutdown` is true; never, if its sender is gone while it is false.
pub async fn stopped(shutdown: &mut tokio::sync::watch::Receiver<bool>) {
    if shutdown.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
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
