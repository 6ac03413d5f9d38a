//! GPU settings paths, only with `--change-gpu-settings` and only on GPUs no process uses:
//! a TimeSlicing claim (compute mode and time-slice through the agent's own code), an MPS
//! claim (a real control daemon started, checked, quit) and, on a GPU in MIG mode selected
//! for dynamic MIG, a claim of the smallest MIG profile (created, then destroyed). Each is
//! prepared and unprepared through the real preparer, which records every change before it
//! makes it and puts the GPU back at unprepare; the check compares the compute mode before
//! and after. Without the flag each is skipped, saying what it would change.

use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use super::claims::{self, Prep};
use super::discovery::GpuFacts;
use super::{Check, Context, Status};
use crate::inventory::{DeviceBackend, DeviceKind, Inventory};

/// The settings checks of every GPU.
pub async fn check(
    ctx: &Context,
    prep: &Prep,
    backend: &Arc<dyn DeviceBackend>,
    inv: &Inventory,
    facts: &[GpuFacts],
) -> Vec<Check> {
    let mut out = Vec::new();
    for (n, f) in (0u32..).zip(facts) {
        let gpu = Some(f.name.as_str());
        if ctx.jetson {
            out.push(Check::skip("time-slicing", gpu, "a Jetson's GPU is always time-shared: there is nothing to set"));
            out.push(Check::skip(
                "mps",
                gpu,
                format!("not offered on a Jetson: {}", crate::prepare::plan::MPS_ON_JETSON),
            ));
            out.push(Check::skip("mig", gpu, "a Jetson's integrated GPU has no MIG mode edra can use"));
            continue;
        }
        if !ctx.options.change_gpu_settings {
            out.push(Check::skip("time-slicing", gpu, "not run without --change-gpu-settings (would set the compute mode to Default and the time-slice, then restore them)"));
            out.push(Check::skip(
                "mps",
                gpu,
                "not run without --change-gpu-settings (would start an MPS control daemon for the GPU, then quit it)",
            ));
            out.push(Check::skip("mig", gpu, "not run without --change-gpu-settings (would create and destroy a MIG device of the smallest profile where MIG mode is on)"));
            continue;
        }
        if let Some(busy) = busy(f) {
            for name in ["time-slicing", "mps", "mig"] {
                out.push(Check::fail(
                    name,
                    gpu,
                    Instant::now(),
                    busy.clone(),
                    "stop them, or run without --change-gpu-settings",
                ));
            }
            continue;
        }
        let base = 500 + n * 10;
        out.push(
            strategy(
                ctx,
                prep,
                backend,
                f,
                base + 1,
                "time-slicing",
                json!({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Default"}}),
            )
            .await,
        );
        out.push(strategy(ctx, prep, backend, f, base + 2, "mps", json!({"strategy": "MPS"})).await);
        out.push(mig(ctx, prep, inv, f, base + 3).await);
    }
    out
}

/// Why the GPU must not be changed now, when processes use it.
fn busy(f: &GpuFacts) -> Option<String> {
    match &f.processes {
        Some(p) if p.is_empty() => None,
        Some(p) => {
            let pids: Vec<String> = p.iter().map(|(pid, mem)| format!("pid {pid} ({} MiB)", mem >> 20)).collect();
            Some(format!("the GPU is in use by {}: its settings are left alone", pids.join(", ")))
        }
        None => Some("NVML cannot list the GPU's processes, so it may be in use: its settings are left alone".into()),
    }
}

fn with_config(
    ctx: &Context,
    mut claim: k8s_openapi::api::resource::v1::ResourceClaim,
    sharing: serde_json::Value,
) -> k8s_openapi::api::resource::v1::ResourceClaim {
    let config = json!([{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": ctx.config.driver_name,
        "parameters": {"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig", "sharing": sharing}}}]);
    if let Some(devices) = claim.status.as_mut().and_then(|s| s.allocation.as_mut()).and_then(|a| a.devices.as_mut()) {
        devices.config = serde_json::from_value(config).ok();
    }
    claim
}

async fn strategy(
    ctx: &Context,
    prep: &Prep,
    backend: &Arc<dyn DeviceBackend>,
    f: &GpuFacts,
    n: u32,
    name: &'static str,
    sharing: serde_json::Value,
) -> Check {
    let started = Instant::now();
    let gpu = Some(f.name.as_str());
    let before = backend.compute_mode(&f.uuid).map(|m| format!("{m:?}")).unwrap_or_default();
    let claim = with_config(ctx, claims::claim(ctx, n, &[("gpu", &f.name, None, None)]), sharing);
    let prepared = claims::prepare(prep, claim).await;
    let during = backend.compute_mode(&f.uuid).map(|m| format!("{m:?}")).unwrap_or_default();
    let released = claims::unprepare(prep, n).await;
    let after = backend.compute_mode(&f.uuid).map(|m| format!("{m:?}")).unwrap_or_default();
    match (prepared, released) {
        (Ok(ids), Ok(())) if before == after => Check::pass(
            name,
            gpu,
            started,
            format!("prepared as {} (compute mode {during}), released; compute mode {after} as before", ids.join(",")),
        ),
        (Ok(_), Ok(())) => Check::fail(
            name,
            gpu,
            started,
            format!("compute mode was {before}, is {after} after the release"),
            "report this; set it back with nvidia-smi -c",
        ),
        (Err(e), _) | (_, Err(e)) => {
            Check::fail(name, gpu, started, e, "see the message; `edra doctor` checks the sharing tools")
        }
    }
}

async fn mig(ctx: &Context, prep: &Prep, inv: &Inventory, f: &GpuFacts, n: u32) -> Check {
    let started = Instant::now();
    let gpu = Some(f.name.as_str());
    if f.mig_enabled != Some(true) {
        return Check::skip("mig", gpu, "MIG mode is off: nothing to create (edra never changes the MIG mode)");
    }
    let carved = ctx.config.mig.published(inv, &Default::default(), true).inventory;
    let Some(slot) = carved
        .devices
        .iter()
        .filter_map(|d| match &d.kind {
            DeviceKind::MigSlot(s) if s.parent_uuid == f.uuid => Some((s.profile.slices, d.name.clone())),
            _ => None,
        })
        .min()
    else {
        return Check::new(
            "mig",
            gpu,
            Status::Warn,
            started,
            "MIG mode is on, but the GPU is not selected for dynamic MIG",
            "set mig.dynamic to list it (docs/mig.md)",
        );
    };
    let claim = claims::claim(ctx, n, &[("gpu", &slot.1, None, None)]);
    let prepared = claims::prepare(prep, claim).await;
    let released = claims::unprepare(prep, n).await;
    match (prepared, released) {
        (Ok(ids), Ok(())) => {
            Check::pass("mig", gpu, started, format!("{} created as {}, then destroyed", slot.1, ids.join(",")))
        }
        (Err(e), _) | (_, Err(e)) => Check::fail("mig", gpu, started, e, "see the message (docs/mig.md)"),
    }
}
