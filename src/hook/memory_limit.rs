//! `edra hook apply-memory-limit`: the `createContainer` hook each share's CDI device
//! carries when `sharing.memory_limit` is enforced. It reads the OCI state from stdin (at
//! most 1 MiB), the bundle's `config.json` (opened without following a symlink or blocking,
//! refused unless a regular file, at most [`MAX_CONFIG`]: [`super::read_bundle_file`]),
//! turns `linux.cgroupsPath` into the container's cgroup
//! ([`crate::gpu::memory_limit::cgroup`]) and asks the agent to record and set the share's
//! limit on it ([`crate::gpu::memory_limit::wire`]). The agent may be restarting: the
//! connection is tried again for up to [`CONNECT_BUDGET`]. Any failure exits non-zero, so
//! the runtime does not start the container and the kubelet tries again: a share never
//! runs without its limit. Exit codes: 2 bad input (state, config.json, cgroupsPath), 1
//! the agent could not be reached or refused.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::cli::ApplyMemoryLimitArgs;
use crate::gpu::memory_limit::{cgroup, wire};

/// The largest `config.json` read.
pub const MAX_CONFIG: u64 = 8 << 20;
/// How long the hook keeps trying to reach the agent.
pub const CONNECT_BUDGET: Duration = Duration::from_secs(20);
/// How long the agent may take to answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the hook failed.
#[derive(Debug, thiserror::Error)]
pub enum LimitHookError {
    /// The state, config.json or its cgroupsPath is unusable.
    #[error("{0}")]
    Input(String),
    /// The agent could not be reached within the budget.
    #[error(
        "cannot reach the edra agent at {} within {}s ({reason}); is it running? The container is not started and \
         the kubelet tries again",
        socket.display(), CONNECT_BUDGET.as_secs()
    )]
    Unreachable {
        /// The socket.
        socket: PathBuf,
        /// The last error.
        reason: String,
    },
    /// The agent answered with a refusal or not at all.
    #[error("the edra agent did not set the GPU memory limit: {0}")]
    Refused(String),
}

impl LimitHookError {
    /// 2 for bad input, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Input(_) => 2,
            Self::Unreachable { .. } | Self::Refused(_) => 1,
        }
    }
}

#[derive(Deserialize)]
struct State {
    #[serde(default)]
    id: String,
    bundle: PathBuf,
}

#[derive(Deserialize, Default)]
struct Config {
    #[serde(default)]
    linux: Linux,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Linux {
    #[serde(default)]
    cgroups_path: String,
}

/// The whole hook: state from `stdin`, the cgroup from config.json, the request to the agent.
pub fn apply(stdin: impl Read, args: &ApplyMemoryLimitArgs) -> Result<(), super::HookError> {
    let (id, cgroups_path) = container(stdin)?;
    let rel = cgroup::relative_path(&cgroups_path).map_err(LimitHookError::Input)?;
    let req = wire::Request {
        claim: args.claim.clone(),
        device: args.device.clone(),
        share_id: args.share_id.clone(),
        cgroup: rel.display().to_string(),
        container: id,
    };
    let answer = ask(&args.socket, &req)?;
    if !answer.ok {
        return Err(LimitHookError::Refused(answer.error).into());
    }
    Ok(())
}

/// The container ID and `linux.cgroupsPath` of the container whose state is on `stdin`.
fn container(stdin: impl Read) -> Result<(String, String), LimitHookError> {
    let input = |m: String| LimitHookError::Input(m);
    let mut state = Vec::new();
    stdin.take(1 << 20).read_to_end(&mut state).map_err(|e| input(format!("cannot read the container state: {e}")))?;
    let state: State = serde_json::from_slice(&state)
        .map_err(|e| input(format!("the container state on stdin is not OCI state JSON with a bundle: {e}")))?;
    let path = state.bundle.join("config.json");
    let text = super::read_bundle_file(&path, MAX_CONFIG)
        .map_err(|e| input(format!("cannot read {}: {e}", path.display())))?;
    let config: Config = serde_json::from_slice(&text)
        .map_err(|e| input(format!("{} is not a valid OCI config: {e}", path.display())))?;
    Ok((state.id, config.linux.cgroups_path))
}

/// Sends `req` to the agent at `socket` and reads its answer, reconnecting while the
/// agent is not there (restarting) for up to [`CONNECT_BUDGET`].
fn ask(socket: &Path, req: &wire::Request) -> Result<wire::Answer, LimitHookError> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(50);
    let mut stream = loop {
        match UnixStream::connect(socket) {
            Ok(s) => break s,
            Err(e) if started.elapsed() + pause < CONNECT_BUDGET => {
                let _ = e;
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(e) => {
                return Err(LimitHookError::Unreachable { socket: socket.to_path_buf(), reason: e.to_string() });
            }
        }
    };
    let refused = |what: &str, e: io::Error| LimitHookError::Refused(format!("{what}: {e}"));
    stream.set_read_timeout(Some(ANSWER_TIMEOUT)).map_err(|e| refused("cannot set a timeout", e))?;
    stream.set_write_timeout(Some(ANSWER_TIMEOUT)).map_err(|e| refused("cannot set a timeout", e))?;
    stream.write_all(&wire::encode(req)).map_err(|e| refused("cannot send the request", e))?;
    let mut line = Vec::new();
    let limit = u64::try_from(wire::MAX_LINE + 1).unwrap_or(u64::MAX);
    BufReader::new(stream.take(limit))
        .read_until(b'\n', &mut line)
        .map_err(|e| refused("no answer (the agent may have stopped; the kubelet tries again)", e))?;
    if line.is_empty() {
        return Err(LimitHookError::Refused(
            "the agent closed the connection without answering (it may have stopped; the kubelet tries again)".into(),
        ));
    }
    wire::decode(&line).map_err(|e| LimitHookError::Refused(format!("the agent's answer is not valid: {e}")))
}

#[cfg(test)]
mod tests;
