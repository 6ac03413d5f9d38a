//! Check: GPU health as edra last recorded it (`<state_dir>/health.json`, written by the
//! running agent): every unhealthy or unmonitored device and why, read without asking
//! the agent. The devices of a GPU come from the inventory the doctor discovered.

use std::path::Path;

use crate::config::Config;
use crate::health::{ConditionKind, GpuHealth, store};
use crate::inventory::Inventory;

use super::{CheckResult, Status};

const NAME: &str = "gpu-health";

/// The check.
pub fn check(cfg: &Config, inventory: Option<&Inventory>) -> CheckResult {
    gpu_health(&cfg.paths.state_dir, inventory, cfg.health.quiet_period)
}

/// The check on an explicit state directory.
pub fn gpu_health(state_dir: &Path, inventory: Option<&Inventory>, quiet: std::time::Duration) -> CheckResult {
    let gpus = match store::load(state_dir) {
        Ok(g) => g,
        Err(e) => {
            return CheckResult::new(
                NAME,
                Status::Warn,
                crate::util::error_chain(&e),
                format!("edra rewrites {} at the next health change; remove it if it is not edra's", store::FILE_NAME),
            );
        }
    };
    let troubled: Vec<(&String, &GpuHealth)> = gpus.iter().filter(|(_, g)| !g.conditions.is_empty()).collect();
    if troubled.is_empty() {
        return CheckResult::pass(NAME, "no GPU has a health condition");
    }
    let mut lines = Vec::new();
    let mut fatal = false;
    for (uuid, g) in &troubled {
        let devices: Vec<&str> = inventory
            .map(|inv| {
                inv.devices
                    .iter()
                    .filter(|d| crate::health::gpu_of(d) == uuid.as_str())
                    .map(|d| d.name.as_str())
                    .collect()
            })
            .unwrap_or_default();
        let who = if devices.is_empty() { uuid.to_string() } else { format!("{} ({uuid})", devices.join(", ")) };
        for c in g.conditions.values() {
            fatal |= c.fatal;
            let state = if c.fatal { "unhealthy" } else { "not monitored" };
            let since = k8s_openapi::jiff::Timestamp::from_second(c.since).map(|t| t.to_string()).unwrap_or_default();
            let taint = match (c.kind, &c.value) {
                (ConditionKind::Xid, Some(v)) => format!("{}={v}", c.kind.key()),
                _ => c.kind.key().to_string(),
            };
            lines.push(format!("{who} {state} since {since}: {} (taint {taint})", c.message));
        }
    }
    let fix = if fatal {
        format!(
            "check the GPU (nvidia-smi -q, the kernel log's NVRM Xid lines); edra removes the taint by itself once the \
             GPU answers with no critical event for {} (health.quiet_period); a GPU reset or reboot may be needed",
            crate::config::bounds::show(quiet)
        )
    } else {
        "the GPU supports no XID events: failures show only when it stops answering; nothing to fix".to_string()
    };
    CheckResult::new(NAME, Status::Warn, lines.join("; "), fix)
}

#[cfg(test)]
mod tests;
