//! The CDI rules every spec edra writes must follow (the minimum `cdiVersion` of a spec is
//! the model's, [`super::cdi::minimum_version`]).
//!
//! The rules are those of the CDI specification and its reference library: known version
//! not older than the features used, `vendor/class` kind syntax, device name syntax,
//! at least one device, unique names, required fields, absolute paths, known hook names.

use std::collections::BTreeSet;

pub use super::cdi::minimum_version;
use super::cdi::{ContainerEdits, Spec, rank};

const HOOK_NAMES: [&str; 5] = ["createRuntime", "createContainer", "startContainer", "poststart", "poststop"];

fn name_part_ok(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphabetic()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'))
}

/// True for a valid CDI kind `vendor/class`.
pub fn kind_ok(kind: &str) -> bool {
    match kind.split_once('/') {
        Some((vendor, class)) => {
            vendor.len() <= 253 && class.len() <= 63 && name_part_ok(vendor) && name_part_ok(class)
        }
        None => false,
    }
}

/// True for a valid CDI device name.
pub fn device_name_ok(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b':'))
}

fn check_edits(edits: &ContainerEdits, at: &str, out: &mut Vec<String>) {
    let abs = |p: &str| p.starts_with('/');
    for e in &edits.env {
        if !e.contains('=') || e.starts_with('=') {
            out.push(format!("{at}: env entry {e:?} is not NAME=value"));
        }
    }
    for n in &edits.device_nodes {
        if !abs(&n.path) {
            out.push(format!("{at}: device node path {:?} is not absolute", n.path));
        }
        if n.host_path.as_deref().is_some_and(|h| !abs(h)) {
            out.push(format!("{at}: device node hostPath {:?} is not absolute", n.host_path));
        }
        if let Some(p) = &n.permissions
            && (p.is_empty() || !p.chars().all(|c| matches!(c, 'r' | 'w' | 'm')))
        {
            out.push(format!("{at}: device node permissions {p:?} are not a combination of r, w and m"));
        }
    }
    for m in &edits.mounts {
        if !abs(&m.host_path) || !abs(&m.container_path) {
            out.push(format!("{at}: mount {:?} -> {:?} needs absolute paths", m.host_path, m.container_path));
        }
    }
    for h in &edits.hooks {
        if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
            out.push(format!("{at}: hook name {:?} is not one of {}", h.hook_name, HOOK_NAMES.join(", ")));
        }
        if !abs(&h.path) {
            out.push(format!("{at}: hook path {:?} is not absolute", h.path));
        }
        if h.timeout == Some(0) {
            out.push(format!("{at}: hook timeout must be positive"));
        }
    }
}

/// Every rule `spec` breaks; empty when it is valid.
pub fn validate(spec: &Spec) -> Vec<String> {
    let mut out = Vec::new();
    match rank(&spec.cdi_version) {
        None => out.push(format!("cdiVersion {:?} is not a known CDI version", spec.cdi_version)),
        Some(have) => {
            let need = minimum_version(spec);
            if rank(need).is_some_and(|n| have < n) {
                out.push(format!(
                    "cdiVersion {} is older than {need}, which the spec's features need",
                    spec.cdi_version
                ));
            }
        }
    }
    if !kind_ok(&spec.kind) {
        out.push(format!("kind {:?} is not vendor/class", spec.kind));
    }
    if spec.devices.is_empty() {
        out.push("the spec has no devices".into());
    }
    let mut seen = BTreeSet::new();
    for d in &spec.devices {
        if !device_name_ok(&d.name) {
            out.push(format!("device name {:?} is not a valid CDI device name", d.name));
        }
        if !seen.insert(d.name.as_str()) {
            out.push(format!("device name {:?} appears twice", d.name));
        }
        check_edits(&d.container_edits, &format!("device {}", d.name), &mut out);
    }
    check_edits(&spec.container_edits, "spec", &mut out);
    out
}
