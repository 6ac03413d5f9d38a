//! What a CDI spec the self-test prepared names, checked on this host: the CDI rules,
//! every device node a character device with the driver's major and minor numbers
//! (`<proc>/devices`), and every file it mounts present. Also the node-wide
//! `driver-files` check: the driver's libraries and tools edra mounts into containers.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::time::Instant;

use super::{Check, Context, Status};
use crate::prepare::cdi::Spec;
use crate::prepare::driver_files::{self, HostRoots};

/// Reads and decodes the spec at `path`; failing that, the `cdi-spec` check.
pub fn read(path: &Path, gpu: &str) -> Result<Spec, Check> {
    let started = Instant::now();
    let fail = |detail: String| Check::fail("cdi-spec", Some(gpu), started, detail, "report this with the spec file");
    let bytes = std::fs::read(path).map_err(|e| fail(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_slice(&bytes).map_err(|e| fail(format!("{} is not a CDI spec edra reads: {e}", path.display())))
}

/// The `cdi-spec`, `device-nodes` and `driver-mounts` checks of `spec`.
pub fn check(ctx: &Context, gpu: &str, spec: &Spec) -> Vec<Check> {
    vec![rules(gpu, spec), device_nodes(ctx, gpu, spec), mounts(ctx, gpu, spec)]
}

fn rules(gpu: &str, spec: &Spec) -> Check {
    let started = Instant::now();
    let problems = crate::prepare::cdi_validate::validate(spec);
    if problems.is_empty() {
        let hooks: Vec<_> = spec.container_edits.hooks.iter().filter_map(|h| h.args.get(2).cloned()).collect();
        Check::pass(
            "cdi-spec",
            Some(gpu),
            started,
            format!(
                "CDI {} spec of kind {}: {} device(s), {} mounts, hooks: {}",
                spec.cdi_version,
                spec.kind,
                spec.devices.len(),
                spec.container_edits.mounts.len(),
                if hooks.is_empty() { "none".to_string() } else { hooks.join(", ") }
            ),
        )
    } else {
        Check::fail("cdi-spec", Some(gpu), started, problems.join("; "), "report this with the spec file")
    }
}

/// Character-device majors by name, from `<proc>/devices`.
pub fn char_majors(proc_root: &Path) -> BTreeMap<String, u32> {
    let text = std::fs::read_to_string(proc_root.join("devices")).unwrap_or_default();
    text.lines()
        .skip_while(|l| !l.starts_with("Character devices"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let (major, name) = l.trim().split_once(' ')?;
            Some((name.trim().to_string(), major.parse().ok()?))
        })
        .collect()
}

/// The (driver name in `<proc>/devices`, minor) a device node of this file name must have.
pub fn expected(file_name: &str) -> Option<(&'static str, u32)> {
    let number = |prefix: &str| file_name.strip_prefix(prefix).and_then(|n| n.parse::<u32>().ok());
    match file_name {
        "nvidiactl" => Some(("nvidia", 255)),
        "nvidia-modeset" => Some(("nvidia", 254)),
        "nvidia-uvm" => Some(("nvidia-uvm", 0)),
        "nvidia-uvm-tools" => Some(("nvidia-uvm", 1)),
        _ => number("nvidia-cap").map(|m| ("nvidia-caps", m)).or_else(|| number("nvidia").map(|m| ("nvidia", m))),
    }
}

/// What is wrong with device node `path` (a host path), if anything.
pub fn node_problem(path: &Path, majors: &BTreeMap<String, u32>) -> Option<String> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => return Some(format!("{}: {e}", path.display())),
    };
    if !meta.file_type().is_char_device() {
        return Some(format!("{} is not a character device", path.display()));
    }
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let (driver, want_minor) = expected(name)?;
    let want_major = majors.get(driver).or_else(|| majors.get("nvidia-frontend").filter(|_| driver == "nvidia"))?;
    (major != *want_major || minor != want_minor).then(|| {
        format!(
            "{} is {major}:{minor}, but the driver's {driver} devices are {want_major}:{want_minor}",
            path.display()
        )
    })
}

fn device_nodes(ctx: &Context, gpu: &str, spec: &Spec) -> Check {
    let started = Instant::now();
    let edits = std::iter::once(&spec.container_edits).chain(spec.devices.iter().map(|d| &d.container_edits));
    let nodes: Vec<String> =
        edits.flat_map(|e| e.device_nodes.iter()).map(|n| n.host_path.clone().unwrap_or(n.path.clone())).collect();
    if ctx.mock {
        return Check::skip(
            "device-nodes",
            Some(gpu),
            format!("the mock backend's device nodes are not real: {}", nodes.join(", ")),
        );
    }
    let majors = char_majors(&ctx.config.paths.proc_root);
    let problems: Vec<String> = nodes.iter().filter_map(|n| node_problem(Path::new(n), &majors)).collect();
    if nodes.is_empty() {
        Check::fail("device-nodes", Some(gpu), started, "the spec names no device node", "report this with the spec")
    } else if problems.is_empty() {
        Check::pass(
            "device-nodes",
            Some(gpu),
            started,
            format!("{} character devices as the driver has them: {}", nodes.len(), nodes.join(", ")),
        )
    } else {
        Check::fail(
            "device-nodes",
            Some(gpu),
            started,
            problems.join("; "),
            "create the device nodes with nvidia-modprobe (-c <minor>, -u for nvidia-uvm), or load the driver with \
             nvidia-persistenced running; check paths.dev_root",
        )
    }
}

fn mounts(ctx: &Context, gpu: &str, spec: &Spec) -> Check {
    let started = Instant::now();
    let mounts = &spec.container_edits.mounts;
    let missing: Vec<&str> =
        mounts.iter().map(|m| m.host_path.as_str()).filter(|p| std::fs::symlink_metadata(p).is_err()).collect();
    let has = |name: &str| mounts.iter().any(|m| m.container_path.contains(name));
    if !missing.is_empty() {
        return Check::fail(
            "driver-mounts",
            Some(gpu),
            started,
            format!("{} of {} mounted files are missing: {}", missing.len(), mounts.len(), missing.join(", ")),
            "the driver changed under edra (an upgrade without a restart?): restart edra",
        );
    }
    // A Jetson's CSV lists may leave NVML out: libcuda is what CUDA programs need.
    let has_driver = has("libcuda.so") && (ctx.jetson || has("libnvidia-ml.so"));
    if !ctx.mock && !has_driver {
        return Check::new(
            "driver-mounts",
            Some(gpu),
            Status::Warn,
            started,
            format!("{} files mounted, but not libcuda and libnvidia-ml", mounts.len()),
            "CUDA programs in the container will not find the driver: set paths.driver_root to where the driver's \
             lib64 or usr/lib folders are (see the driver-files check)",
        );
    }
    Check::pass("driver-mounts", Some(gpu), started, format!("all {} mounted files exist", mounts.len()))
}

/// The node-wide `driver-files` check: what edra would mount into GPU containers.
pub fn check_driver_files(ctx: &Context, version: Option<&str>) -> Check {
    let started = Instant::now();
    let root = &ctx.config.paths.driver_root;
    let Some(version) = version.filter(|_| !ctx.mock) else {
        return Check::skip("driver-files", None, "the mock backend has no driver version to look for");
    };
    let host = HostRoots { sys_root: ctx.config.paths.sys_root.clone(), proc_root: ctx.config.paths.proc_root.clone() };
    let files = driver_files::discover(root, version, &host);
    let has = |name: &str| lists_library(&files.libraries, name);
    let detail = format!(
        "under {}: {} libraries of driver {version} in {}, tools: {}, {} firmware file(s)",
        root.display(),
        files.libraries.len(),
        files.library_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
        files.binaries.iter().filter_map(|b| b.file_name()).map(|n| n.to_string_lossy()).collect::<Vec<_>>().join(", "),
        files.firmware.len()
    );
    if has("libcuda.so.") && has("libnvidia-ml.so.") {
        Check::pass("driver-files", None, started, detail)
    } else {
        Check::fail(
            "driver-files",
            None,
            started,
            format!("libcuda.so.{version} or libnvidia-ml.so.{version} not found; {detail}"),
            format!(
                "set paths.driver_root to the folder that holds the driver's lib64 (or usr/lib) and bin folders \
                 (e.g. /usr/local/nvidia or /run/nvidia/driver); searched: {}",
                driver_files::LIBRARY_DIRS.join(", ")
            ),
        )
    }
}

/// Whether `libraries` holds a file whose name starts with `prefix` (e.g. `libcuda.so.`).
fn lists_library(libraries: &[std::path::PathBuf], prefix: &str) -> bool {
    libraries.iter().any(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix)))
}

/// The node-wide `driver-files` check on a Jetson: what its CSV lists give.
pub fn check_jetson_files(ctx: &Context) -> Check {
    let started = Instant::now();
    let paths = &ctx.config.paths;
    match driver_files::csv::discover(&paths.driver_root, &paths.dev_root) {
        Ok(files) => {
            let cuda = lists_library(&files.libraries, "libcuda.so");
            let detail = format!(
                "CSV lists under {}: {} device nodes, {} libraries, {} links, {} folders",
                paths.driver_root.join(driver_files::csv::CSV_DIR).display(),
                files.device_nodes.len(),
                files.libraries.len(),
                files.library_links.len(),
                files.directories.len()
            );
            if cuda && !files.device_nodes.is_empty() {
                Check::pass("driver-files", None, started, detail)
            } else {
                Check::fail(
                    "driver-files",
                    None,
                    started,
                    format!("{detail}; libcuda or the device nodes are missing"),
                    "install JetPack's CUDA and container lists (nvidia-container packages); check paths.dev_root",
                )
            }
        }
        Err(e) => Check::fail(
            "driver-files",
            None,
            started,
            crate::util::error_chain(&e),
            "install JetPack's container lists (nvidia-container packages) or fix paths.driver_root",
        ),
    }
}
