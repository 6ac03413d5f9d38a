//! Wiring for `edra run`: start-up order, task supervision and shutdown.
//!
//! Start: open state → discover devices → reach the API server → publish slices →
//! serve the DRA socket → serve the registration socket → ready. SIGTERM: stop accepting,
//! finish in-flight calls within the grace period, remove our sockets, flush state.

use crate::config::Config;

/// Why the agent stopped.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// Configuration that only shows itself as wrong at start (e.g. a malformed kubeconfig).
    #[error("{0}")]
    Config(String),
    /// Anything else.
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// The error and its causes on one line.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

/// Runs the agent on a new Tokio runtime until SIGTERM/SIGINT.
pub fn run_blocking(config: Config) -> Result<(), AppError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| AppError::Other(anyhow::anyhow!("cannot start the async runtime: {e}")))?;
    rt.block_on(run(config))
}

/// Runs the agent until SIGTERM/SIGINT.
pub async fn run(config: Config) -> Result<(), AppError> {
    let _ = config;
    Err(AppError::Other(anyhow::anyhow!("the agent is being assembled")))
}
