//! Check: which GPU memory enforcement this node has for shares (`sharing.memory_limit`):
//! the per-cgroup limits of r615 drivers (NVML's `nvmlDeviceSetMemoryLimits_v1`, cgroup v2,
//! the kernel's dmem controller or the driver's own accounting), or none, and why.

use crate::config::Config;
use crate::gpu::memory_limit::{Detection, Host, detect};
use crate::sharing::MemoryLimit;

use super::{CheckResult, Status};

const NAME: &str = "gpu-memory-limits";

/// The check, detecting as the agent does at start.
pub fn check(cfg: &Config) -> CheckResult {
    let libraries = crate::inventory::host::library_candidates(&cfg.nvml.library, &cfg.paths.driver_root);
    let host = Host { libraries: &libraries, sys_root: &cfg.paths.sys_root, proc_root: &cfg.paths.proc_root };
    evaluate(cfg.sharing.memory_limit, &detect(&host).0)
}

/// The result for `asked` on a node where detection found `d`.
pub fn evaluate(asked: MemoryLimit, d: &Detection) -> CheckResult {
    let why = d.reasons.join("; ");
    let fix = "GPU memory limits per container need an NVIDIA driver of the r615 branch or newer (CUDA 13.4) and \
               cgroup v2 (kernel 6.14+ for the dmem controller; older kernels use the driver's accounting)";
    match (asked, d.backend) {
        (MemoryLimit::Advisory, Some(b)) => CheckResult::new(
            NAME,
            Status::Pass,
            format!("available ({why}), enforced by {}; not used: sharing.memory_limit = \"advisory\"", b.name()),
            "set sharing.memory_limit = \"enforced\" to give every share a hard limit",
        ),
        (_, Some(b)) => CheckResult::pass(
            NAME,
            format!("every share's containers get a hard GPU memory limit, enforced by {} ({why})", b.name()),
        ),
        (MemoryLimit::Advisory, None) => CheckResult::pass(
            NAME,
            format!("not available ({why}); shares' memory is advisory, as sharing.memory_limit = \"advisory\" asks"),
        ),
        (MemoryLimit::Auto, None) => {
            CheckResult::new(NAME, Status::Warn, format!("not available, so shares' memory is advisory: {why}"), fix)
        }
        (MemoryLimit::Enforced, None) => CheckResult::new(
            NAME,
            Status::Fail,
            format!("sharing.memory_limit = \"enforced\" but not available (edra refuses to start): {why}"),
            fix,
        ),
    }
}
