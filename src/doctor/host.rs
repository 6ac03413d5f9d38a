//! Host checks: the device backend and its GPUs, device nodes, the kubelet's plugin and
//! registry directories, the CDI directories and edra's kubelet sockets; plus the small
//! filesystem helpers the other checks share (writability by access(2), the nearest
//! existing ancestor of a path).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use super::{CheckResult, Status};
use crate::config::{Config, Paths};
use crate::inventory::{Inventory, backend_from_config};

/// What the backend check found, for the device node check.
#[derive(Debug, Clone)]
pub struct Discovered {
    /// `nvml`, `tegra` or `mock`.
    pub backend: &'static str,
    pub inventory: Inventory,
}

/// Whether this process may create and remove entries in `dir` (access(2), W_OK | X_OK).
pub fn writable(dir: &Path) -> bool {
    let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else { return false };
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call; access only reads it.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// The path itself if it exists, else its closest existing ancestor.
pub fn nearest_existing(path: &Path) -> Option<&Path> {
    path.ancestors().find(|p| p.exists())
}

/// "missing, but `<ancestor>` is writable so it can be created" (true), or not (false).
fn creatable(path: &Path) -> bool {
    nearest_existing(path).is_some_and(|a| a.is_dir() && writable(a))
}

/// Check 1: the device backend loads and finds devices.
pub fn backend(cfg: &Config) -> (CheckResult, Option<Discovered>) {
    const NAME: &str = "backend";
    let fix = "check that the NVIDIA driver is loaded (nvidia-smi works), point nvml.library and \
               paths.driver_root at it, or use --backend mock to run without GPUs";
    let backend = match backend_from_config(cfg) {
        Ok(b) => b,
        Err(e) => return (CheckResult::new(NAME, Status::Fail, crate::util::error_chain(&e), fix), None),
    };
    let name = backend.name();
    let inventory = match backend.discover() {
        Ok(i) => i,
        Err(e) => {
            let detail = format!("{name} backend loaded but discovery failed: {}", crate::util::error_chain(&e));
            return (CheckResult::new(NAME, Status::Fail, detail, fix), None);
        }
    };
    let count = inventory.devices.len();
    let driver = inventory.driver_version.as_deref().unwrap_or("unknown");
    let cuda = inventory.cuda_driver_version.as_deref().unwrap_or("unknown");
    let result = if name == "mock" {
        CheckResult::new(
            NAME,
            Status::Warn,
            format!("mock backend in use: {count} mock devices (driver {driver} as configured); no real GPU is used"),
            "on a GPU node use --backend auto (or backend = \"nvml\")",
        )
    } else if name == "tegra" {
        let gpu = inventory.devices.first();
        let text = |k: &str| gpu.map(|g| g.text(k)).filter(|t| !t.is_empty()).unwrap_or_else(|| "unknown".into());
        let nvml = if inventory.driver_version.is_some() { format!("NVML driver {driver}") } else { "no NVML".into() };
        CheckResult::pass(
            NAME,
            format!(
                "Jetson {} ({}, L4T {}): 1 integrated GPU, {nvml}; memory is the system's RAM, shared with the CPU",
                text("model"),
                text("soc"),
                text("l4tRelease")
            ),
        )
    } else if count == 0 {
        CheckResult::new(
            NAME,
            Status::Warn,
            format!("NVML loaded (driver {driver}, CUDA {cuda}) but found no GPUs"),
            "check nvidia-smi -L; a GPU hidden by the kernel or the driver cannot be published",
        )
    } else {
        CheckResult::pass(NAME, format!("NVML driver {driver}, CUDA {cuda}, {count} devices"))
    };
    (result, Some(Discovered { backend: name, inventory }))
}

/// Check 2: every discovered device's nodes, and the control nodes, are character devices.
pub fn device_nodes(cfg: &Config, discovered: Option<&Discovered>) -> CheckResult {
    const NAME: &str = "device-nodes";
    let Some(d) = discovered else {
        return CheckResult::skip(NAME, "no devices were discovered (see the backend check)");
    };
    if d.backend == "tegra" {
        return CheckResult::skip(NAME, "a Jetson's device nodes come from its CSV lists (see the jetson check)");
    }
    let mock = d.backend == "mock";
    let mut missing = Vec::new();
    let mut not_char = Vec::new();
    let mut total = 0;
    for node in d.inventory.devices.iter().flat_map(|dev| dev.device_nodes.iter()) {
        total += 1;
        match std::fs::metadata(node) {
            Err(_) => missing.push(node.display().to_string()),
            Ok(m) if !m.file_type().is_char_device() => not_char.push(node.display().to_string()),
            Ok(_) => {}
        }
    }
    let dev = &cfg.paths.dev_root;
    let control: Vec<PathBuf> = ["nvidiactl", "nvidia-uvm"].iter().map(|n| dev.join(n)).collect();
    let control_missing: Vec<String> = control
        .iter()
        .filter(|p| !std::fs::metadata(p).is_ok_and(|m| m.file_type().is_char_device()))
        .map(|p| p.display().to_string())
        .collect();
    if mock {
        if missing.is_empty() && not_char.is_empty() {
            return CheckResult::pass(NAME, format!("all {total} device nodes of the mock devices exist"));
        }
        return CheckResult::new(
            NAME,
            Status::Warn,
            format!(
                "{} of {total} device nodes missing or not character devices under {} (expected with the mock backend)",
                missing.len() + not_char.len(),
                dev.display()
            ),
            "nothing to do for the mock backend; containers get no real GPU",
        );
    }
    if !missing.is_empty() || !not_char.is_empty() {
        let mut parts = Vec::new();
        if !missing.is_empty() {
            parts.push(format!("missing: {}", missing.join(", ")));
        }
        if !not_char.is_empty() {
            parts.push(format!("not character devices: {}", not_char.join(", ")));
        }
        return CheckResult::new(
            NAME,
            Status::Fail,
            parts.join("; "),
            "create the GPU device nodes (nvidia-modprobe -c=<minor>, or load the driver with nvidia-persistenced) \
             and check paths.dev_root",
        );
    }
    if !control_missing.is_empty() {
        return CheckResult::new(
            NAME,
            Status::Warn,
            format!("{total} GPU device nodes present; control nodes missing: {}", control_missing.join(", ")),
            "CUDA needs them: run nvidia-modprobe -u -c=0 (creates nvidiactl and nvidia-uvm) at boot",
        );
    }
    CheckResult::pass(NAME, format!("{total} GPU device nodes and the control nodes are character devices"))
}

/// Check 3: the kubelet's plugin and registry directories exist and edra may write them.
pub fn kubelet_dirs(paths: &Paths) -> CheckResult {
    const NAME: &str = "kubelet-dirs";
    let root_fix = "run edra as root (the kubelet's directories belong to root)";
    let reg = &paths.registry_dir;
    if !reg.is_dir() {
        return CheckResult::new(
            NAME,
            Status::Fail,
            format!("the kubelet's plugin registry directory {} does not exist", reg.display()),
            "is the kubelet running on this node? if its root is not /var/lib/kubelet, set kubelet.root_dir \
             (or kubelet.registry_dir)",
        );
    }
    if !writable(reg) {
        return CheckResult::new(NAME, Status::Fail, format!("{} is not writable by edra", reg.display()), root_fix);
    }
    let plugins = &paths.plugins_dir;
    if !plugins.is_dir() {
        if creatable(plugins) {
            return CheckResult::new(
                NAME,
                Status::Warn,
                format!("registry {} is fine; plugins directory {} is missing", reg.display(), plugins.display()),
                "edra creates it at start; if the kubelet uses another directory set kubelet.plugins_dir",
            );
        }
        return CheckResult::new(
            NAME,
            Status::Fail,
            format!("plugins directory {} is missing and cannot be created", plugins.display()),
            "set kubelet.root_dir / kubelet.plugins_dir to the kubelet's, and run edra as root",
        );
    }
    if !writable(plugins) {
        return CheckResult::new(
            NAME,
            Status::Fail,
            format!("{} is not writable by edra", plugins.display()),
            root_fix,
        );
    }
    CheckResult::pass(
        NAME,
        format!("plugins {} and registry {} exist and are writable", plugins.display(), reg.display()),
    )
}

/// The claim UIDs of edra's spec files (`k8s.<driver>-claim_<uid>.json`) in `dir`, sorted.
pub fn edra_spec_uids(dir: &Path, driver: &str) -> Vec<String> {
    let vendor = crate::prepare::cdi::vendor(driver);
    let mut uids: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            crate::prepare::cdi::uid_from_file_name(&vendor, &name).map(str::to_string)
        })
        .collect();
    uids.sort();
    uids
}

/// Check 4: edra's CDI directory is (or can be made) writable; the other spec dirs exist.
pub fn cdi_dirs(paths: &Paths, driver: &str) -> CheckResult {
    const NAME: &str = "cdi-dirs";
    let dynamic = &paths.cdi_dynamic_dir;
    let dynamic_note = if dynamic.is_dir() {
        if !writable(dynamic) {
            return CheckResult::new(
                NAME,
                Status::Fail,
                format!("edra's CDI directory {} is not writable", dynamic.display()),
                "run edra as root, or set cdi.dynamic_dir to a directory the runtime reads and edra may write",
            );
        }
        format!("edra can write {} ({} edra claim specs)", dynamic.display(), edra_spec_uids(dynamic, driver).len())
    } else if dynamic.exists() {
        return CheckResult::new(
            NAME,
            Status::Fail,
            format!("edra's CDI directory {} exists but is not a directory", dynamic.display()),
            "remove it, or set cdi.dynamic_dir",
        );
    } else if creatable(dynamic) {
        format!("{} does not exist yet and will be created", dynamic.display())
    } else {
        return CheckResult::new(
            NAME,
            Status::Fail,
            format!("edra's CDI directory {} is missing and cannot be created", dynamic.display()),
            "create it (mkdir -p) or run edra as root",
        );
    };
    let missing: Vec<String> =
        paths.cdi_spec_dirs.iter().filter(|d| *d != dynamic && !d.is_dir()).map(|d| d.display().to_string()).collect();
    if missing.is_empty() {
        return CheckResult::pass(NAME, dynamic_note);
    }
    CheckResult::new(
        NAME,
        Status::Warn,
        format!("{dynamic_note}; spec directories missing: {}", missing.join(", ")),
        "create them (mkdir -p) or remove them from cdi.spec_dirs",
    )
}

/// Check: no directory edra uses (CDI, kubelet plugin, state, runtime) lets group or
/// others write in it ([`crate::dirmode`]).
pub fn dir_modes(paths: &Paths, driver: &str) -> CheckResult {
    const NAME: &str = "dir-modes";
    let open = crate::dirmode::open_dirs(paths, driver);
    if open.is_empty() {
        let n = crate::dirmode::dirs(paths, driver).len();
        return CheckResult::pass(
            NAME,
            format!("none of the {n} CDI, kubelet, state and runtime directories is writable by group or others"),
        );
    }
    let named: Vec<String> = open.iter().map(ToString::to_string).collect();
    let fix: Vec<String> = open.iter().map(crate::dirmode::OpenDir::fix).collect();
    CheckResult::new(
        NAME,
        Status::Fail,
        format!(
            "writable by users other than its owner: {}; they could plant CDI specs, sockets or links that reach every \
             container on the node",
            named.join(", ")
        ),
        fix.join("; "),
    )
}

fn is_socket(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket())
}

/// Check 9: edra's DRA and registration sockets are in place (when the agent runs), and
/// the kubelet registered them: `registered` is what the running agent says (its status
/// socket), `None` when it did not answer.
pub fn registration(cfg: &Config, registered: Option<bool>) -> CheckResult {
    const NAME: &str = "registration";
    let dra = cfg.paths.dra_socket(&cfg.driver_name);
    let reg = cfg.paths.registration_socket(&cfg.driver_name);
    match (is_socket(&dra), is_socket(&reg)) {
        (true, true) if registered == Some(false) => CheckResult::new(
            NAME,
            Status::Warn,
            format!("sockets in place, not registered by the kubelet (edra serves {})", reg.display()),
            format!(
                "is the kubelet running, with its plugin registry at {}? (its --root-dir; kubelet.root_dir or \
                 kubelet.registry_dir in edra's config); the kubelet registers a new socket there within seconds",
                cfg.paths.registry_dir.display()
            ),
        ),
        (true, true) => CheckResult::pass(
            NAME,
            format!(
                "DRA socket {} and registration socket {} are in place{}",
                dra.display(),
                reg.display(),
                if registered == Some(true) { ", registered by the kubelet" } else { "" }
            ),
        ),
        (false, false) => CheckResult::new(
            NAME,
            Status::Warn,
            format!("no edra sockets ({}, {}): edra is not running", dra.display(), reg.display()),
            "start edra (systemctl start edra); the kubelet registers it within seconds",
        ),
        (true, false) | (false, true) => {
            let (present, absent) = if is_socket(&dra) { (&dra, &reg) } else { (&reg, &dra) };
            CheckResult::new(
                NAME,
                Status::Warn,
                format!("{} exists but {} does not", present.display(), absent.display()),
                "restart edra; a socket left by an edra that did not stop cleanly is replaced at start",
            )
        }
    }
}

#[cfg(test)]
mod tests;
