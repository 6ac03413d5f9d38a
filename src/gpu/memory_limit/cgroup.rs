//! A container's cgroup (v2) from its OCI `linux.cgroupsPath`, as runc and crun place it.
//!
//! - systemd driver, `slice:prefix:name`: the unit is `prefix-name.scope` (or `name` when it
//!   ends in `.slice`) under the slice, whose name expands by its dashes
//!   (`kubepods-burstable-pod1.slice` → `/kubepods.slice/kubepods-burstable.slice/
//!   kubepods-burstable-pod1.slice`); an empty slice is `system.slice`, `-.slice` the root.
//!   containerd and CRI-O with the systemd cgroup driver, and podman on systemd, use this.
//! - cgroupfs driver: an absolute path below the cgroup root (`/kubepods/burstable/pod1/<id>`,
//!   podman's `/libpod_parent/libpod-<id>`).
//!
//! A relative path (which the OCI spec leaves to the runtime) and an empty one are refused:
//! the hook cannot know where the runtime put such a container. Components are checked
//! (no `.`, `..`, empty names or NUL), so the result never leaves the cgroup root. crun
//! may run the container's processes in a child cgroup of this one (`.../container`); a
//! limit on the parent covers it (both backends apply a limited ancestor to its
//! descendants).

use std::path::{Component, Path, PathBuf};

/// The longest `cgroupsPath` accepted.
pub const MAX_LEN: usize = 4096;

/// The container's cgroup, relative to the cgroup root (`kubepods.slice/.../x.scope`), from
/// `cgroups_path`; the error says what is wrong with it.
pub fn relative_path(cgroups_path: &str) -> Result<PathBuf, String> {
    if cgroups_path.is_empty() {
        return Err("config.json has no linux.cgroupsPath, so the container's cgroup is unknown".into());
    }
    if cgroups_path.len() > MAX_LEN || cgroups_path.contains('\0') {
        return Err(format!("linux.cgroupsPath is longer than {MAX_LEN} bytes or holds a NUL byte"));
    }
    let parts: Vec<&str> = cgroups_path.split(':').collect();
    let path = match parts.as_slice() {
        [slice, prefix, name] => systemd(slice, prefix, name)?,
        [_] if cgroups_path.starts_with('/') => PathBuf::from(cgroups_path.trim_start_matches('/')),
        [_] => {
            return Err(format!(
                "linux.cgroupsPath {cgroups_path:?} is relative; only absolute (cgroupfs) and slice:prefix:name \
                 (systemd) paths say where the container is"
            ));
        }
        _ => return Err(format!("linux.cgroupsPath {cgroups_path:?} is neither a path nor slice:prefix:name")),
    };
    check_components(&path, cgroups_path)?;
    Ok(path)
}

fn systemd(slice: &str, prefix: &str, name: &str) -> Result<PathBuf, String> {
    if name.is_empty() || name.contains('/') || prefix.contains('/') {
        return Err(format!("the systemd cgroupsPath {slice}:{prefix}:{name} has no unit name or a '/' in it"));
    }
    let mut path = if slice.is_empty() { PathBuf::from("system.slice") } else { expand_slice(slice)? };
    let unit = if name.ends_with(".slice") {
        name.to_string()
    } else if prefix.is_empty() {
        format!("{name}.scope")
    } else {
        format!("{prefix}-{name}.scope")
    };
    path.push(unit);
    Ok(path)
}

/// `a-b-c.slice` → `a.slice/a-b.slice/a-b-c.slice`; `-.slice` → the root.
pub fn expand_slice(slice: &str) -> Result<PathBuf, String> {
    let bad = || format!("{slice:?} is not a systemd slice name");
    let stem = slice.strip_suffix(".slice").filter(|s| !s.is_empty() && !slice.contains('/')).ok_or_else(bad)?;
    if stem == "-" {
        return Ok(PathBuf::new());
    }
    let mut path = PathBuf::new();
    let mut prefix = String::new();
    for part in stem.split('-') {
        if part.is_empty() {
            return Err(bad());
        }
        prefix.push_str(part);
        path.push(format!("{prefix}.slice"));
        prefix.push('-');
    }
    Ok(path)
}

fn check_components(path: &Path, given: &str) -> Result<(), String> {
    let mut n = 0;
    for c in path.components() {
        match c {
            Component::Normal(s) if !s.is_empty() && s != "." => n += 1,
            _ => return Err(format!("linux.cgroupsPath {given:?} has a '.', '..' or empty component")),
        }
    }
    // `//a` or `/a/./b` collapse in components(): compare the text too.
    if !path.as_os_str().is_empty() && (given.contains("/./") || given.contains("//") || given.ends_with("/.")) {
        return Err(format!("linux.cgroupsPath {given:?} has a '.' or empty component"));
    }
    if n == 0 {
        return Err(format!("linux.cgroupsPath {given:?} names the cgroup root, not a container's cgroup"));
    }
    Ok(())
}
