//! `[sharing]`: how full GPUs are offered to claims — as shares of their memory
//! (consumable capacity), as replicas, or whole.

use super::bounds;
use super::source::{Raw, Reader, bytes, string, string_list};
use crate::device_config::Interval;
use crate::sharing::{Fallback, GpuSelection, SharingMode, SharingSettings};

pub(super) fn read_sharing(r: &mut Reader) -> SharingSettings {
    let d = SharingSettings::default();
    SharingSettings {
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
        timeslice: r.opt("sharing.timeslice", |raw: &Raw| match string(raw)?.as_str() {
            "Default" => Ok(Interval::Default),
            "Short" => Ok(Interval::Short),
            "Medium" => Ok(Interval::Medium),
            "Long" => Ok(Interval::Long),
            other => Err(format!("expected Default, Short, Medium or Long, found {other:?}")),
        }),
    }
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
