//! The self-test's health step: the agent's own health backend registers its event set
//! on every GPU (as `edra run` does on its health thread), and the light probe answers.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{Check, Context, Status};
use crate::health::HealthBackend;
use crate::health::view::Event;
use crate::inventory::Inventory;

/// How long the registration may take before the GPUs it did not report are failed.
const REGISTRATION_WAIT: Duration = Duration::from_secs(5);

/// A `health-events` and a `health-probe` check per GPU.
pub async fn check(ctx: &Context, backend_name: &str, inv: &Inventory) -> Vec<Check> {
    let gpus = super::gpus(inv);
    let uuids: Vec<String> = gpus.iter().map(|(_, u)| u.clone()).collect();
    let health = crate::health::backend_for(&ctx.config, backend_name);
    let supported = if backend_name == "nvml" { supported_events(ctx, &uuids) } else { BTreeMap::new() };
    let (registered, waited) = {
        let health = health.clone();
        let uuids = uuids.clone();
        tokio::task::spawn_blocking(move || registrations(health.as_ref(), &uuids)).await.unwrap_or_default()
    };
    let mut out = Vec::new();
    for (name, uuid) in &gpus {
        let started = Instant::now().checked_sub(waited).unwrap_or_else(Instant::now);
        let types = supported.get(uuid).map(|t| format!(" (the GPU supports: {t})")).unwrap_or_default();
        out.push(match registered.get(uuid) {
            Some(Ok(())) => Check::pass(
                "health-events",
                Some(name),
                started,
                format!("registered for critical XID and double-bit ECC events{types}"),
            ),
            Some(Err(reason)) if reason == crate::health::NO_TEGRA_EVENTS => Check::new(
                "health-events",
                Some(name),
                Status::Warn,
                started,
                format!("not monitored: {reason}"),
                "the platform has no XID events: edra reports the GPU's health as unknown (never healthy); the probe \
                 still notices a lost GPU",
            ),
            Some(Err(reason)) if !reason.starts_with("it supports neither") => Check::fail(
                "health-events",
                Some(name),
                started,
                format!("the event registration failed: {reason}{types}"),
                "edra cannot taint this GPU on an XID: check the driver (dmesg, nvidia-smi -q) and that edra runs as \
                 root; until then the probe alone notices a lost GPU",
            ),
            Some(Err(reason)) => Check::new(
                "health-events",
                Some(name),
                Status::Warn,
                started,
                format!("not monitored: {reason}{types}"),
                "edra cannot taint this GPU on an XID; the probe still notices a lost GPU. Check the driver \
                 (nvidia-smi -q -d ECC) and that edra runs as root",
            ),
            None => Check::fail(
                "health-events",
                Some(name),
                started,
                format!("the event registration did not report within {}s{types}", REGISTRATION_WAIT.as_secs()),
                "NVML hangs on nvmlDeviceRegisterEvents: check the driver (dmesg, nvidia-smi)",
            ),
        });
        out.push(probe(health.as_ref(), name, uuid).await);
    }
    out
}

/// Runs the backend's watch until every GPU is reported monitored or not (or
/// [`REGISTRATION_WAIT`] passes), then stops it; returns what each GPU got and how long it took.
fn registrations(health: &dyn HealthBackend, uuids: &[String]) -> (BTreeMap<String, Result<(), String>>, Duration) {
    let started = Instant::now();
    let seen: Mutex<BTreeMap<String, Result<(), String>>> = Mutex::default();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let sink = |e: Event| {
                let mut seen = seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                match e {
                    Event::Monitored { gpu } => {
                        seen.insert(gpu, Ok(()));
                    }
                    Event::Unmonitored { gpu, reason } => {
                        seen.insert(gpu, Err(reason));
                    }
                    _ => {}
                }
            };
            health.watch(uuids, &sink, &stop);
        });
        while started.elapsed() < REGISTRATION_WAIT {
            let done = seen.lock().map(|m| uuids.iter().all(|u| m.contains_key(u))).unwrap_or(true);
            if done {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::SeqCst);
    });
    let waited = started.elapsed();
    (seen.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner), waited)
}

/// The event types each GPU supports, as NVML names them.
fn supported_events(ctx: &Context, uuids: &[String]) -> BTreeMap<String, String> {
    let Ok(nvml) = crate::inventory::nvml::NvmlBackend::load(&ctx.config) else { return BTreeMap::new() };
    uuids
        .iter()
        .filter_map(|u| {
            let device = nvml.nvml().device_by_uuid(u.as_str()).ok()?;
            let text = match device.supported_event_types() {
                Ok(t) => format!("{t:?}"),
                Err(e) => format!("unreadable: {e}"),
            };
            Some((u.clone(), text))
        })
        .collect()
}

async fn probe(health: &dyn HealthBackend, name: &str, uuid: &str) -> Check {
    let started = Instant::now();
    let ok = health.probe(uuid);
    let took = started.elapsed();
    if ok {
        Check::pass("health-probe", Some(name), started, format!("the GPU answered in {:.1} ms", ms(took)))
    } else {
        Check::fail(
            "health-probe",
            Some(name),
            started,
            format!("the GPU did not answer the probe ({:.1} ms)", ms(took)),
            "the GPU may be lost: check nvidia-smi and dmesg for XID 79; a reset or reboot may be needed",
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
