//! Check: a Jetson's container files. On a node whose backend is `tegra`, the platform's
//! CSV lists are read as a prepare reads them: what they give (device nodes, libraries,
//! links, folders), whether `libcuda` is among them for the hooks to link and cache, and
//! what sharing the platform allows (replicas and shares, advisory; no MPS, no time-slice
//! interval). Other nodes skip it.

use super::host::Discovered;
use super::{CheckResult, Status};
use crate::config::Config;
use crate::prepare::driver_files::csv;

const NAME: &str = "jetson";

/// What a Jetson's sharing is, in one sentence.
pub const SHARING: &str = "sharing: replicas and shares (time-shared, advisory: no memory isolation); \
                           no MPS, no time-slice interval";

/// The check.
pub fn check(cfg: &Config, discovered: Option<&Discovered>) -> CheckResult {
    if discovered.is_none_or(|d| d.backend != "tegra") {
        return CheckResult::skip(NAME, "not a Jetson (the backend is not tegra)");
    }
    let files = match csv::discover(&cfg.paths.driver_root, &cfg.paths.dev_root) {
        Ok(f) => f,
        Err(e) => {
            return CheckResult::new(
                NAME,
                Status::Fail,
                crate::util::error_chain(&e),
                "install JetPack's container lists (nvidia-container packages) or fix paths.driver_root; \
                 no claim on this node can be prepared without them",
            );
        }
    };
    let cuda = files
        .libraries
        .iter()
        .any(|l| l.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libcuda.so")));
    let detail = format!(
        "CSV lists give {} device nodes, {} libraries, {} links, {} folders; {SHARING}",
        files.device_nodes.len(),
        files.libraries.len(),
        files.library_links.len(),
        files.directories.len()
    );
    if files.device_nodes.is_empty() || !cuda {
        let missing = if cuda { "no device node" } else { "no libcuda.so library" };
        return CheckResult::new(
            NAME,
            Status::Warn,
            format!("{detail}; {missing} among them"),
            format!(
                "check {} and paths.dev_root: a CUDA container needs both",
                cfg.paths.driver_root.join(csv::CSV_DIR).display()
            ),
        );
    }
    CheckResult::pass(NAME, detail)
}
