//! The hooks of a CDI spec the self-test prepared, run as a container runtime would run
//! them (OCI state on stdin) against a scratch root filesystem: the driver's SONAME
//! libraries are copied in, then `create-symlinks` must leave the links it names and
//! `update-ldcache` a linker cache that lists those libraries. The
//! `disable-device-node-modification` hook mounts in the namespace it runs in, so it is
//! only named, never run here.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Check, Context, Status};
use crate::prepare::cdi::{Hook, Spec};

/// How long one hook may run.
const HOOK_TIMEOUT: Duration = Duration::from_secs(30);
/// The libraries copied into the scratch root (at most this many bytes in all).
const COPY_BUDGET: u64 = 1 << 30;
/// Libraries whose SONAME the linker cache must list afterwards.
const MUST_BE_CACHED: [&str; 2] = ["libcuda.so.1", "libnvidia-ml.so.1"];

/// The `hooks` check of `spec` for GPU `gpu`.
pub fn check(ctx: &Context, gpu: &str, spec: &Spec) -> Check {
    let started = Instant::now();
    let hooks: Vec<&Hook> = spec.container_edits.hooks.iter().collect();
    if hooks.is_empty() {
        return Check::skip("hooks", Some(gpu), "the spec has no hooks (no driver libraries were found to mount)");
    }
    match run_all(ctx, gpu, spec, &hooks) {
        Ok(done) => Check::pass("hooks", Some(gpu), started, done.join("; ")),
        Err((detail, fix)) => Check::new("hooks", Some(gpu), Status::Fail, started, detail, fix),
    }
}

fn run_all(ctx: &Context, gpu: &str, spec: &Spec, hooks: &[&Hook]) -> Result<Vec<String>, (String, String)> {
    let bundle = ctx.work.join(format!("bundle-{gpu}"));
    let rootfs = bundle.join("rootfs");
    let io = |e: std::io::Error| (format!("cannot make the scratch root {}: {e}", rootfs.display()), String::new());
    std::fs::create_dir_all(rootfs.join("etc")).map_err(io)?;
    std::fs::write(bundle.join("config.json"), br#"{"ociVersion":"1.0.2","root":{"path":"rootfs"}}"#).map_err(io)?;
    let copied = copy_libraries(spec, &rootfs).map_err(io)?;
    let state = serde_json::json!({"ociVersion": "1.0.2", "id": format!("edra-selftest-{gpu}"),
        "status": "creating", "pid": 0, "bundle": bundle});
    let mut done = Vec::new();
    for hook in hooks {
        let name = hook.args.get(2).cloned().unwrap_or_default();
        if name == "disable-device-node-modification" {
            done.push(format!("{name}: named, not run (it mounts in the namespace it runs in)"));
            continue;
        }
        run_hook(hook, &state.to_string()).map_err(|e| {
            let fix = if e.contains("chroot") || e.contains("Operation not permitted") {
                "run the self-test as root (the update-ldcache hook runs ldconfig -r, which needs it)"
            } else {
                "see the message; `edra hook --help` describes the hooks"
            };
            (format!("{name}: {e}"), fix.to_string())
        })?;
        done.push(verify(&name, hook, &rootfs, &copied)?);
    }
    Ok(done)
}

/// Copies the spec's library mounts whose names are in [`MUST_BE_CACHED`]'s families into
/// `rootfs` at their container paths; returns the SONAMEs copied.
fn copy_libraries(spec: &Spec, rootfs: &Path) -> std::io::Result<Vec<&'static str>> {
    let mut budget = COPY_BUDGET;
    let mut copied = Vec::new();
    for m in &spec.container_edits.mounts {
        let Some(name) = Path::new(&m.container_path).file_name().and_then(|n| n.to_str()) else { continue };
        let Some(soname) = MUST_BE_CACHED.iter().find(|s| name.starts_with(&s[..s.len() - 1])) else { continue };
        let size = std::fs::metadata(&m.host_path).map(|md| md.len()).unwrap_or(u64::MAX);
        if size > budget {
            continue;
        }
        budget -= size;
        let to = rootfs.join(m.container_path.trim_start_matches('/'));
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::copy(&m.host_path, &to)?;
        copied.push(*soname);
    }
    Ok(copied)
}

fn run_hook(hook: &Hook, state: &str) -> Result<(), String> {
    let mut child = Command::new(&hook.path)
        .args(hook.args.iter().skip(1))
        .env_clear()
        .envs(hook.env.iter().filter_map(|e| e.split_once('=')))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", hook.path))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(state.as_bytes());
    }
    match crate::util::wait_bounded(&mut child, HOOK_TIMEOUT, Duration::from_millis(5)) {
        Ok(Some(status)) if status.success() => Ok(()),
        Ok(Some(status)) => {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut std::io::Read::take(&mut e, 4096), &mut err);
            }
            Err(format!("exited with {status}: {}", err.trim()))
        }
        Ok(None) => Err(format!("still running after {}s", HOOK_TIMEOUT.as_secs())),
        Err(e) => Err(format!("cannot wait for it: {e}")),
    }
}

/// What `hook` left in `rootfs`, or why it is not what it should be.
fn verify(name: &str, hook: &Hook, rootfs: &Path, copied: &[&str]) -> Result<String, (String, String)> {
    let fix = || "report this with the spec file and the scratch root's listing".to_string();
    match name {
        "create-symlinks" => {
            let links: Vec<(String, PathBuf)> = hook
                .args
                .windows(2)
                .filter(|w| w[0] == "--link")
                .filter_map(|w| {
                    w[1].split_once("::").map(|(t, l)| (t.to_string(), rootfs.join(l.trim_start_matches('/'))))
                })
                .collect();
            for (target, link) in &links {
                match std::fs::read_link(link) {
                    Ok(t) if t == Path::new(target) => {}
                    Ok(t) => {
                        return Err((
                            format!("{name}: {} points to {}, not {target}", link.display(), t.display()),
                            fix(),
                        ));
                    }
                    Err(e) => return Err((format!("{name}: {} was not created: {e}", link.display()), fix())),
                }
            }
            Ok(format!("{name}: {} link(s) made", links.len()))
        }
        "update-ldcache" => {
            let cache = std::fs::read(rootfs.join("etc/ld.so.cache"))
                .map_err(|e| (format!("{name}: no linker cache was written: {e}"), fix()))?;
            let missing: Vec<&&str> =
                copied.iter().filter(|s| !cache.windows(s.len()).any(|w| w == s.as_bytes())).collect();
            if missing.is_empty() {
                Ok(format!(
                    "{name}: the linker cache lists {}",
                    if copied.is_empty() { "its folders".to_string() } else { copied.join(", ") }
                ))
            } else {
                Err((format!("{name}: the linker cache does not list {missing:?}"), fix()))
            }
        }
        other => Ok(format!("{other}: ran")),
    }
}
