//! `sharing.memory_limit` at start: what this node can enforce, the refusal (exit 64) when
//! `enforced` was asked of a node that cannot, the warning when `auto` falls back to
//! advisory, and the control the preparer sets and clears limits with.

use std::sync::Arc;

use tracing::{info, warn};

use super::AppError;
use crate::config::Config;
use crate::gpu::memory_limit::exits::CgroupExits;
use crate::gpu::memory_limit::{Host, cgroup_root, detect};
use crate::prepare::memory_limit::{MemoryLimits, server};
use crate::sharing::MemoryLimit;

/// Detects memory-limit support and applies `sharing.memory_limit`: `enforced` on a node
/// without it is a configuration error; `auto` there warns and stays advisory. The control
/// is returned whenever NVML has the calls, so limits an earlier run set are cleared even
/// with enforcement now off.
pub(super) fn from_config(config: &Config) -> Result<Option<MemoryLimits>, AppError> {
    let libraries = crate::inventory::host::library_candidates(&config.nvml.library, &config.paths.driver_root);
    let host = Host { libraries: &libraries, sys_root: &config.paths.sys_root, proc_root: &config.paths.proc_root };
    let (detection, control) = detect(&host);
    let asked = config.sharing.memory_limit;
    let enforce = match (asked, detection.backend) {
        (MemoryLimit::Advisory, _) => false,
        (MemoryLimit::Enforced | MemoryLimit::Auto, Some(_)) => {
            info!(backend = ?detection.backend, "{}; every share's containers get a hard limit", detection.summary());
            true
        }
        (MemoryLimit::Enforced, None) => {
            return Err(AppError::Config(format!(
                "sharing.memory_limit = \"enforced\", but this node cannot enforce GPU memory limits per container: \
                 {}. Run a driver of the r615 branch or newer (CUDA 13.4) on cgroup v2, or set sharing.memory_limit \
                 to \"auto\" (enforced where possible) or \"advisory\"",
                detection.reasons.join("; ")
            )));
        }
        (MemoryLimit::Auto, None) => {
            warn!(
                "sharing.memory_limit = \"auto\": {}; shares' memory stays advisory on this node (`edra doctor` says \
                 what is missing)",
                detection.summary()
            );
            false
        }
    };
    Ok(control.map(|c| MemoryLimits {
        control: Arc::new(c),
        cgroup_root: cgroup_root(&config.paths.sys_root),
        enforce,
        socket: server::socket_path(&config.paths.runtime_dir),
        exits: if enforce { exit_watcher() } else { None },
    }))
}

/// The inotify instance that sees containers exit, or a warning and none.
fn exit_watcher() -> Option<Arc<CgroupExits>> {
    match CgroupExits::new() {
        Ok(w) => Some(Arc::new(w)),
        Err(e) => {
            warn!(error = %e, "cannot watch cgroups for containers' exit (inotify); GPU memory limits are cleared at \
                unprepare only, which leaves the dmem backend's reservation on the pod's cgroup until it goes");
            None
        }
    }
}
