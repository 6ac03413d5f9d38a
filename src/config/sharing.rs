//! `[sharing]`: how full GPUs are offered to claims — as shares of their memory
//! (consumable capacity), as replicas, or whole — and what edra enforces on a shared GPU
//! (`enforcement`, with `timeslice` for timeslicing).

use super::bounds;
use super::settings::{Enforcement, Fallback, GpuSelection, MemoryLimit, SharingMode, SharingSettings};
use super::source::{Raw, Reader, bytes, string, string_list};
use crate::device_config::Interval;

pub(super) fn read_sharing(r: &mut Reader) -> SharingSettings {
    let d = SharingSettings::default();
    let mut settings = SharingSettings {
        mode: r.get("sharing.mode", d.mode, |raw| match string(raw)?.as_str() {
            "shares" => Ok(SharingMode::Shares),
            "replicas" => Ok(SharingMode::Replicas),
            "exclusive" => Ok(SharingMode::Exclusive),
            other => Err(format!("expected shares, replicas or exclusive, found {other:?}")),
        }),
        gpus: r.get("sharing.gpus", d.gpus, selection),
        memory_step: r.get("sharing.memory_step", d.memory_step, |raw| {
            let (min, max) = bounds::SHARING_MEMORY_STEP;
            match bytes(raw)? {
                n if n < min || n > max => Err(format!("must be from 1Mi to 1Ti bytes, found {n}")),
                n if !n.is_multiple_of(1 << 20) => {
                    Err(format!("must be a whole number of MiB (such as \"512Mi\"), found {n}"))
                }
                n => Ok(n),
            }
        }),
        replicas: r.get("sharing.replicas", d.replicas, bounds::u32_in(bounds::SHARING_REPLICAS)),
        fallback: r.get("sharing.fallback", d.fallback, |raw: &Raw| match string(raw)?.as_str() {
            "exclusive" => Ok(Fallback::Exclusive),
            "replicas" => Ok(Fallback::Replicas),
            other => Err(format!("expected exclusive or replicas, found {other:?}")),
        }),
        enforcement: Enforcement::None,
        memory_limit: r.get("sharing.memory_limit", d.memory_limit, |raw: &Raw| match string(raw)?.as_str() {
            "advisory" => Ok(MemoryLimit::Advisory),
            "enforced" => Ok(MemoryLimit::Enforced),
            "auto" => Ok(MemoryLimit::Auto),
            other => Err(format!("expected advisory, enforced or auto, found {other:?}")),
        }),
    };
    settings.enforcement = enforcement(r, settings.mode);
    settings
}

/// The given enforcement, as written.
#[derive(Clone, Copy)]
enum Given {
    None,
    TimeSlicing,
    Mps,
}

/// `sharing.enforcement` with `sharing.timeslice`: `timeslice` alone means timeslicing with
/// that interval (as before `enforcement` existed); `timeslicing` alone uses `Default`;
/// contradictions are problems naming both keys.
fn enforcement(r: &mut Reader, mode: SharingMode) -> Enforcement {
    let given = r.opt("sharing.enforcement", |raw: &Raw| match string(raw)?.as_str() {
        "none" => Ok(Given::None),
        "timeslicing" => Ok(Given::TimeSlicing),
        "mps" => Ok(Given::Mps),
        other => Err(format!("expected none, timeslicing or mps, found {other:?}")),
    });
    let interval = r.opt("sharing.timeslice", |raw: &Raw| match string(raw)?.as_str() {
        "Default" => Ok(Interval::Default),
        "Short" => Ok(Interval::Short),
        "Medium" => Ok(Interval::Medium),
        "Long" => Ok(Interval::Long),
        other => Err(format!("expected Default, Short, Medium or Long, found {other:?}")),
    });
    let origin = r.origin_of("sharing.enforcement");
    let enforcement = match (given, interval) {
        (None, None) | (Some(Given::None), None) => return Enforcement::None,
        (None, Some(i)) => Enforcement::TimeSlicing(i),
        (Some(Given::TimeSlicing), i) => Enforcement::TimeSlicing(i.unwrap_or_default()),
        (Some(Given::Mps), None) => Enforcement::Mps,
        (Some(Given::None), Some(_)) => {
            r.problem(
                "sharing.enforcement",
                origin,
                "is \"none\" but sharing.timeslice is set, which time-slices shared GPUs; remove sharing.timeslice, \
                 or set sharing.enforcement = \"timeslicing\"",
            );
            return Enforcement::None;
        }
        (Some(Given::Mps), Some(_)) => {
            r.problem(
                "sharing.enforcement",
                origin,
                "is \"mps\" but sharing.timeslice is set: a GPU served by an MPS daemon runs in compute mode \
                 EXCLUSIVE_PROCESS and is not time-sliced; remove sharing.timeslice, or set sharing.enforcement = \
                 \"timeslicing\"",
            );
            return Enforcement::None;
        }
    };
    if mode == SharingMode::Exclusive && given.is_some() {
        r.problem(
            "sharing.enforcement",
            origin,
            format!(
                "is {:?} but sharing.mode is \"exclusive\", so no GPU is shared; remove sharing.enforcement, or set \
                 sharing.mode to \"shares\" or \"replicas\"",
                enforcement.name()
            ),
        );
    }
    enforcement
}

/// `["*"]` (every full GPU) or device names (`gpu-0`) and UUIDs (`GPU-...`).
pub(super) fn selection(raw: &Raw) -> Result<GpuSelection, String> {
    let items = string_list(raw)?;
    if items.iter().any(|s| s == "*") {
        return if items.len() == 1 {
            Ok(GpuSelection::All)
        } else {
            Err("\"*\" selects every GPU and cannot be combined with names".into())
        };
    }
    for s in &items {
        let name_ok = s.strip_prefix("gpu-").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        let uuid_ok = s.starts_with("GPU-") && s.len() <= 64;
        if !name_ok && !uuid_ok {
            return Err(format!("{s:?} is neither a GPU device name (gpu-0) nor a GPU UUID (GPU-...) nor \"*\""));
        }
    }
    Ok(GpuSelection::Listed(items))
}
