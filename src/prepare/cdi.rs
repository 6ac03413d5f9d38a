//! CDI specs: the model edra writes, how a claim's spec is built, and atomic file writes.
//!
//! One transient spec per claim in the dynamic CDI directory, named
//! `<vendor>-<class>_<claimUID>.json` with kind `k8s.<driver>/claim` and device names
//! `<claimUID>-<device>` (never reused, since runtimes may cache specs). `cdiVersion` is the
//! lowest version covering the features the spec uses, as the CDI library computes it.
//!
//! Environment: with only the claim's `/dev/nvidiaN` (and MIG capability) nodes in the
//! container, CUDA and NVML enumerate exactly the GPUs they can open, so no
//! `CUDA_VISIBLE_DEVICES` is set (it would index into the already-filtered list and break
//! when a container requests only part of a claim). `NVIDIA_VISIBLE_DEVICES=void` keeps an
//! NVIDIA runtime, if one is configured, from injecting GPUs again. Each device adds
//! `EDRA_DEVICE_<NAME>_UUID=<uuid>` so tools can tell which GPU they were given.
//!
//! A Jetson's spec is built the same way from the files its CSV lists name: their device
//! nodes join the control nodes, their folders are mounted read-only like libraries.
//!
//! Hooks (`createContainer`, all run by the edra binary, in order): `create-symlinks` for
//! the driver's library links, `update-ldcache` for the library folders, and
//! `disable-device-node-modification` when the driver may create device nodes. Hooks need
//! no newer `cdiVersion`.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::driver_files::DriverFiles;
use crate::inventory::Device;

/// The CDI class of edra's per-claim specs.
pub const CLAIM_CLASS: &str = "claim";
/// Mount options for driver files.
pub const DRIVER_MOUNT_OPTIONS: [&str; 5] = ["ro", "nosuid", "nodev", "rbind", "rprivate"];
/// Mount options for the driver daemons' IPC sockets.
pub const IPC_MOUNT_OPTIONS: [&str; 5] = ["nosuid", "nodev", "rbind", "rprivate", "noexec"];
/// Control device nodes shared by all GPUs, added when they exist.
pub const CONTROL_NODES: [&str; 4] = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"];

/// A CDI spec (the subset of fields edra writes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Spec {
    /// The CDI version the file complies with.
    pub cdi_version: String,
    /// `vendor/class`.
    pub kind: String,
    /// Spec annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The devices.
    pub devices: Vec<CdiDevice>,
    /// Edits applied when any device of the spec is requested.
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

/// One CDI device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CdiDevice {
    /// Device name (unique in the spec).
    pub name: String,
    /// Device annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The device's edits.
    pub container_edits: ContainerEdits,
}

/// Container edits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `NAME=value` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// Mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// OCI hooks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
}

impl ContainerEdits {
    /// True when there is nothing to edit.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty() && self.device_nodes.is_empty() && self.mounts.is_empty() && self.hooks.is_empty()
    }
}

/// A device node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host, when it differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// cgroup permissions (`rwm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
}

/// A bind mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Target in the container.
    pub container_path: String,
    /// Mount options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    /// Mount type.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub mount_type: Option<String>,
}

/// An OCI hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Hook {
    /// When it runs (`createContainer`, ...).
    pub hook_name: String,
    /// Absolute path of the program.
    pub path: String,
    /// argv, including argv\[0\].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Timeout in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u32>,
}

/// Where a claim's spec comes from: names and host layout.
#[derive(Debug, Clone)]
pub struct SpecLayout<'a> {
    /// `k8s.<driver>`.
    pub vendor: &'a str,
    /// The device filesystem on the host.
    pub dev_root: &'a Path,
    /// The edra binary, run as the createContainer hook.
    pub hook_binary: &'a Path,
    /// Where the driver root is on the host, when edra sees it somewhere else (edra in a
    /// container with the host's `/` mounted at its driver root); `None`: the same place.
    pub host_driver_root: Option<&'a Path>,
}

/// The CDI vendor of a driver's specs: `k8s.<driver>`.
pub fn vendor(driver: &str) -> String {
    format!("k8s.{driver}")
}

/// The kind `vendor/class`.
pub fn kind(vendor: &str) -> String {
    format!("{vendor}/{CLAIM_CLASS}")
}

/// The spec file name of a claim: `<vendor>-<class>_<uid>.json`.
pub fn spec_file_name(vendor: &str, uid: &str) -> String {
    format!("{vendor}-{CLAIM_CLASS}_{uid}.json")
}

/// The claim UID in a spec file name of ours, if it is one.
pub fn uid_from_file_name<'a>(vendor: &str, file_name: &'a str) -> Option<&'a str> {
    let rest = file_name.strip_prefix(vendor)?.strip_prefix('-')?.strip_prefix(CLAIM_CLASS)?.strip_prefix('_')?;
    rest.strip_suffix(".json").filter(|u| is_valid_uid(u))
}

/// The CDI device name of `device` in claim `uid`.
pub fn device_name(uid: &str, device: &str) -> String {
    format!("{uid}-{device}")
}

/// The fully-qualified CDI ID of `device` in claim `uid`.
pub fn device_id(vendor: &str, uid: &str, device: &str) -> String {
    format!("{}={}", kind(vendor), device_name(uid, device))
}

/// True for a UID usable in file and CDI device names: a lowercase RFC 4122 UUID.
pub fn is_valid_uid(uid: &str) -> bool {
    let b = uid.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(c),
        })
}

fn container_path(dev_root: &Path, host: &Path) -> (String, Option<String>) {
    let inside = match host.strip_prefix(dev_root) {
        Ok(rel) => Path::new("/dev").join(rel),
        Err(_) => host.to_path_buf(),
    };
    let inside_s = inside.display().to_string();
    let host_s = host.display().to_string();
    if inside_s == host_s { (inside_s, None) } else { (inside_s, Some(host_s)) }
}

fn device_node(dev_root: &Path, host: &Path) -> DeviceNode {
    let (path, host_path) = container_path(dev_root, host);
    DeviceNode { path, host_path, permissions: Some("rwm".into()) }
}

/// The device nodes every device of a spec needs: the control nodes that exist, then the
/// driver files' own (a Jetson's), each once.
fn common_nodes(dev_root: &Path, files: &DriverFiles) -> Vec<DeviceNode> {
    let mut nodes: Vec<DeviceNode> = Vec::new();
    let control = CONTROL_NODES.iter().map(|name| dev_root.join(name)).filter(|host| host.exists());
    for host in control.chain(files.device_nodes.iter().cloned()) {
        let node = device_node(dev_root, &host);
        if !nodes.contains(&node) {
            nodes.push(node);
        }
    }
    nodes
}

/// Builds the spec of claim `uid` for `devices` (distinct devices of the claim).
pub fn build_spec(layout: &SpecLayout<'_>, uid: &str, devices: &[&Device], files: &DriverFiles) -> Spec {
    let mut common = ContainerEdits {
        env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
        device_nodes: common_nodes(layout.dev_root, files),
        ..Default::default()
    };
    let strip = |p: &Path| -> String {
        match p.strip_prefix(&files.root) {
            Ok(rel) => Path::new("/").join(rel).display().to_string(),
            Err(_) => p.display().to_string(),
        }
    };
    let on_host = |p: &Path| -> String {
        match (layout.host_driver_root, p.strip_prefix(&files.root)) {
            (Some(host_root), Ok(rel)) => host_root.join(rel).display().to_string(),
            _ => p.display().to_string(),
        }
    };
    for host in files.libraries.iter().chain(&files.binaries).chain(&files.firmware).chain(&files.directories) {
        common.mounts.push(Mount {
            host_path: on_host(host),
            container_path: strip(host),
            options: DRIVER_MOUNT_OPTIONS.iter().map(|s| s.to_string()).collect(),
            mount_type: None,
        });
    }
    for host in &files.ipc_paths {
        common.mounts.push(Mount {
            host_path: on_host(host),
            container_path: strip(host),
            options: IPC_MOUNT_OPTIONS.iter().map(|s| s.to_string()).collect(),
            mount_type: None,
        });
    }
    let hook = |command: &str, args: Vec<String>| {
        let binary = layout.hook_binary.display().to_string();
        let mut argv = vec![binary.clone(), "hook".into(), command.into()];
        argv.extend(args);
        Hook { hook_name: "createContainer".into(), path: binary, args: argv, env: Vec::new(), timeout: None }
    };
    if !files.library_links.is_empty() {
        let args = files
            .library_links
            .iter()
            .flat_map(|l| ["--link".to_string(), format!("{}::{}", l.target, strip(&l.dir.join(&l.name)))])
            .collect();
        common.hooks.push(hook("create-symlinks", args));
    }
    if !files.library_dirs.is_empty() {
        let args = files.library_dirs.iter().flat_map(|d| ["--folder".to_string(), strip(d)]).collect();
        common.hooks.push(hook("update-ldcache", args));
    }
    if files.modify_device_files {
        common.hooks.push(hook("disable-device-node-modification", Vec::new()));
    }
    let devices = devices
        .iter()
        .map(|d| CdiDevice {
            name: device_name(uid, &d.name),
            annotations: BTreeMap::new(),
            container_edits: ContainerEdits {
                env: vec![format!("EDRA_DEVICE_{}_UUID={}", env_suffix(&d.name), d.uuid)],
                device_nodes: d.device_nodes.iter().map(|n| device_node(layout.dev_root, n)).collect(),
                ..Default::default()
            },
        })
        .collect();
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: kind(layout.vendor),
        annotations: BTreeMap::new(),
        devices,
        container_edits: common,
    };
    spec.cdi_version = minimum_version(&spec).to_string();
    spec
}

fn env_suffix(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect()
}

/// For a temp file of [`write_spec`] (`.<spec file name>.tmp-<pid>-<random>`) of `vendor`:
/// the claim UID and the pid of the process that wrote it.
pub fn temp_file_owner<'a>(vendor: &str, file_name: &'a str) -> Option<(&'a str, u32)> {
    let (spec, rest) = file_name.strip_prefix('.')?.split_once(".tmp-")?;
    let uid = uid_from_file_name(vendor, spec)?;
    let (pid, random) = rest.split_once('-')?;
    if random.len() != 8 || !random.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some((uid, pid.parse().ok()?))
}

/// Writes `spec` to `path` atomically: temp file in the same directory, write, fsync,
/// rename, fsync the directory. Mode 0644 (runtimes read it; it holds no secrets).
pub fn write_spec(path: &Path, spec: &Spec) -> io::Result<()> {
    let dir = path.parent().ok_or_else(|| io::Error::other("spec path has no directory"))?;
    let file_name = path.file_name().ok_or_else(|| io::Error::other("spec path has no file name"))?;
    let tmp: PathBuf =
        dir.join(format!(".{}.tmp-{}-{:08x}", file_name.to_string_lossy(), std::process::id(), fastrand::u32(..)));
    let bytes = serde_json::to_vec_pretty(spec).map_err(io::Error::other)?;
    // The directory is there but for the first spec (or after someone removed it): it is
    // made when the write finds it missing, not looked up before every write.
    match crate::util::write_atomically(path, &tmp, &bytes, 0o644) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir)?;
            crate::util::write_atomically(path, &tmp, &bytes, 0o644)?;
        }
        other => other?,
    }
    crate::state::sync_path(dir)
}

/// Removes a spec file; a missing file is fine.
pub fn remove_spec(path: &Path) -> io::Result<()> {
    // The directory is not synced: a removal a crash undoes leaves a spec that either
    // still has its claim's record (which a lazy release may bring back too) or has none,
    // and recovery removes specs without a record.
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Versions known to the reference library from 0.3.0 on, oldest first (0.1.0 and 0.2.0
/// are accepted and rank as 0.3.0).
pub const ORDERED: [&str; 8] = ["0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"];
pub(super) fn rank(version: &str) -> Option<usize> {
    match version.trim_start_matches('v') {
        "0.1.0" | "0.2.0" => Some(0),
        v => ORDERED.iter().position(|o| *o == v),
    }
}

/// The lowest version covering the features `spec` uses.
pub fn minimum_version(spec: &Spec) -> &'static str {
    let mut need = 0usize;
    let edits = std::iter::once(&spec.container_edits).chain(spec.devices.iter().map(|d| &d.container_edits));
    for e in edits {
        if e.mounts.iter().any(|m| m.mount_type.is_some()) {
            need = need.max(1);
        }
        if e.device_nodes.iter().any(|n| n.host_path.is_some()) {
            need = need.max(2);
        }
    }
    if spec.devices.iter().any(|d| d.name.starts_with(|c: char| c.is_ascii_digit())) {
        need = need.max(2);
    }
    let class = spec.kind.split_once('/').map_or("", |(_, c)| c);
    if !spec.annotations.is_empty() || spec.devices.iter().any(|d| !d.annotations.is_empty()) || class.contains('.') {
        need = need.max(3);
    }
    ORDERED[need]
}
