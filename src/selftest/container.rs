//! An optional container run with a prepared claim's CDI devices: with `--image` and
//! podman (or the program `--runtime` names, which must take podman's arguments), the
//! image's command (default `nvidia-smi -L`) runs with the claim's devices and its output
//! is shown. podman reads specs from `/etc/cdi` and `/run/cdi` (4.3 from `/run/cdi` only,
//! and has no flag for another folder), so it runs in a mount namespace of its own
//! (`unshare --mount`) in which the self-test's CDI folder is bound over `/run/cdi`: the
//! node's own dynamic specs are never touched, and the runtime sees the self-test's.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::{Check, Context};

/// How long the container may run.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// Binds `$1` over `/run/cdi` and runs the rest (in the private namespace).
const BIND_AND_RUN: &str = r#"mkdir -p /run/cdi && mount --bind "$1" /run/cdi && shift && exec "$@""#;
/// How much of each output stream is kept.
const CAPTURE: usize = 64 << 10;
/// How much of its output is shown.
const OUTPUT_LIMIT: usize = 2048;

fn find_runtime(ctx: &Context) -> Option<PathBuf> {
    if let Some(r) = &ctx.options.runtime {
        return Some(r.clone());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("podman")).find(|p| p.is_file())
}

/// Runs `cmd` with its output captured (at most [`CAPTURE`] bytes of each stream kept), killed
/// after [`RUN_TIMEOUT`]: `None` then (its output, which its own children may still hold
/// open, is not waited for).
fn run_bounded(mut cmd: std::process::Command) -> std::io::Result<Option<std::process::Output>> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let out = crate::util::read_capped(child.stdout.take(), CAPTURE);
    let err = crate::util::read_capped(child.stderr.take(), CAPTURE);
    let Some(status) = crate::util::wait_bounded(&mut child, RUN_TIMEOUT, Duration::from_millis(20))? else {
        return Ok(None);
    };
    Ok(Some(std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }))
}

/// The `container` check for CDI devices `ids` of GPU `gpu`.
pub async fn check(ctx: &Context, gpu: &str, ids: &[String]) -> Check {
    let started = Instant::now();
    let Some(image) = &ctx.options.image else {
        return Check::skip("container", Some(gpu), "no --image given: no container was started");
    };
    let Some(runtime) = find_runtime(ctx) else {
        return Check::skip("container", Some(gpu), "no podman on PATH (or --runtime): no container was started");
    };
    let command = if ctx.options.command.is_empty() {
        vec!["nvidia-smi".to_string(), "-L".to_string()]
    } else {
        ctx.options.command.clone()
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Check::skip("container", Some(gpu), "not root: the container runs in a mount namespace of its own");
    }
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", BIND_AND_RUN, "sh"])
        .arg(&ctx.config.paths.cdi_dynamic_dir)
        .arg(&runtime)
        .args(["run", "--rm", "--network=none"]);
    for id in ids {
        cmd.arg("--device").arg(id);
    }
    cmd.arg(image).args(&command).stdin(Stdio::null());
    let what = format!("{} run {image} {}", runtime.display(), command.join(" "));
    let out = match tokio::task::spawn_blocking(move || run_bounded(cmd)).await {
        Ok(Ok(Some(out))) => out,
        Ok(Err(e)) => return Check::fail("container", Some(gpu), started, format!("cannot run {what}: {e}"), ""),
        Err(e) => return Check::fail("container", Some(gpu), started, format!("cannot run {what}: {e}"), ""),
        Ok(Ok(None)) => {
            let detail = format!("{what} did not end within {}s", RUN_TIMEOUT.as_secs());
            return Check::fail("container", Some(gpu), started, detail, "check the runtime and the image");
        }
    };
    let text = |b: &[u8]| {
        let s = String::from_utf8_lossy(b);
        let s = s.trim();
        s.char_indices().nth(OUTPUT_LIMIT).map_or(s.to_string(), |(i, _)| format!("{}…", &s[..i]))
    };
    if out.status.success() {
        Check::pass("container", Some(gpu), started, format!("{what}: {}", text(&out.stdout)))
    } else {
        Check::fail(
            "container",
            Some(gpu),
            started,
            format!("{what} exited with {}: {}", out.status, text(&out.stderr)),
            "the image must be local (podman images) and hold the command; the runtime must read CDI specs",
        )
    }
}
