//! Entry points for the fuzz targets in `fuzz/` and the property tests: one function per
//! parser that takes outside input, each a thin wrapper that runs the same code the agent
//! and the hooks run. Not part of edra's API; see docs/building.md ("Fuzzing").
//!
//! Every function takes raw bytes and must return for every input: an error is a fine
//! answer, a panic (an abort in release builds) or unbounded memory is a bug.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::kube::{self, ResourceApi};
use crate::plugin::authority::{RewriteError, Rewriter};
use crate::prepare::config;

/// The driver name the configs are decoded for.
pub const DRIVER: &str = "gpu.edra.dev";

/// A kubeconfig file at `path` (UTF-8, as edra reads it) with `context` (or its
/// current-context) turned into credentials; errors are formatted as edra prints them.
/// Relative file references resolve against `path`'s folder.
pub fn kubeconfig(path: &Path, text: &[u8], context: Option<&str>) -> Result<kube::Credentials, String> {
    let text = std::str::from_utf8(text).map_err(|e| e.to_string())?;
    let files = [(path.to_path_buf(), text)];
    kube::kubeconfig::from_texts(&files, context).map_err(|e| e.to_string())
}

/// An opaque `parameters` object decoded as a `GpuConfig`.
pub fn gpu_config(params: &[u8]) -> Result<config::GpuConfig, String> {
    let v: Value = serde_json::from_slice(params).map_err(|e| e.to_string())?;
    config::decode(DRIVER, 0, &v).map_err(|e| e.to_string())
}

/// A ResourceClaim as the API server sends it in `api`'s wire version, with the configs of
/// all its allocation results resolved, as preparing it does.
pub fn claim_configs(api: ResourceApi, body: &[u8]) -> Result<Vec<config::GpuConfig>, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let claim = kube::convert::claim_from_wire(api, v).map_err(|e| e.to_string())?;
    let results = claim.status.as_ref().and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref());
    let requests: Vec<&str> =
        results.iter().flat_map(|d| d.results.iter().flatten()).map(|r| r.request.as_str()).collect();
    config::resolve(DRIVER, &claim, &requests).map_err(|e| e.to_string())
}

/// An error response body decoded into the typed error edra acts on, and its message.
pub fn status(code: u16, body: &[u8], retry_after_header: Option<u64>) -> (kube::Error, String) {
    let err = kube::Error::from_status("GET /fuzz".into(), code, body, retry_after_header);
    let message = err.to_string();
    (err, message)
}

/// What a watch stream does with `body`, fed in the given pieces: per complete line the
/// version it resumes from (`None` = relist) and the event, if any.
pub fn watch(api: ResourceApi, pieces: &[&[u8]]) -> Vec<(Option<String>, Option<kube::Event>)> {
    let mut lines = kube::watcher::LineBuffer::default();
    let mut rv = String::from("1");
    let mut out = Vec::new();
    for piece in pieces {
        lines.push(piece);
        while let Some(line) = lines.next_line() {
            let (next, event) = kube::watcher::apply_line(api, rv.clone(), &line);
            if let Some(next) = &next {
                rv.clone_from(next);
            }
            if let Some(kube::Event::Error(e)) = &event {
                let _ = e.to_string();
            }
            out.push((next, event));
        }
    }
    out
}

/// A LIST response of ResourceSlices in `api`'s wire version.
pub fn slice_list(api: ResourceApi, body: &[u8]) -> Result<kube::SliceList, String> {
    kube::api::decode_slice_list(api, "LIST resourceslices", body).map_err(|e| e.to_string())
}

/// The client-to-server bytes of an HTTP/2 connection through the `:authority` rewriter,
/// fed in the given pieces: what the server would read, or why the connection is closed.
pub fn authority(pieces: &[&[u8]]) -> Result<Vec<u8>, RewriteError> {
    let mut rewriter = Rewriter::new();
    let mut out = Vec::new();
    for piece in pieces {
        rewriter.feed(piece, &mut out)?;
    }
    Ok(out)
}

/// The OCI state JSON a hook reads on stdin, with the bundle's `config.json` contents.
/// `config` is written to `<bundle>/config.json`; the state is read as given, and again
/// with its `bundle` pointed at `bundle` when it is a JSON object, so the config is parsed
/// whatever bundle the input names.
pub fn hook_state(bundle: &Path, state: &[u8], config: &[u8]) -> Vec<Result<crate::hook::Container, String>> {
    let mut out = vec![crate::hook::read_state(state).map_err(|e| e.to_string())];
    if std::fs::write(bundle.join("config.json"), config).is_err() {
        return out;
    }
    if let Ok(Value::Object(mut m)) = serde_json::from_slice::<Value>(state) {
        m.insert("bundle".into(), Value::String(bundle.to_string_lossy().into_owned()));
        let state = Value::Object(m).to_string();
        out.push(crate::hook::read_state(state.as_bytes()).map_err(|e| e.to_string()));
    }
    out
}

/// A hook's `--link TARGET::LINK` argument and the driver's `params` file as the
/// device-node hook rewrites it.
pub fn hook_args(link: &str, params: &str) -> (Result<PathBuf, String>, Option<String>) {
    let link = crate::hook::symlinks::parse_link(link).map(|l| l.link).map_err(|e| e.to_string());
    (link, crate::hook::device_params::rewrite(params))
}

#[cfg(test)]
mod tests;
