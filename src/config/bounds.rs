//! The ranges of edra's numeric keys (durations, rates, counts). A value outside its range
//! is a configuration problem naming the key and the range (exit 64), never a value that
//! overflows a clock or a conversion later. docs/configuration.md lists the same ranges.

use std::time::Duration;

use super::source::{Raw, duration, uint};

/// An inclusive range of durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationRange {
    pub min: Duration,
    pub max: Duration,
}

/// `kubernetes.request_timeout`: a request needs a moment; more than five minutes only
/// hides a dead connection (prepares are cut at 20 s anyway).
pub const REQUEST_TIMEOUT: DurationRange = DurationRange { min: Duration::from_secs(1), max: Duration::from_secs(300) };
/// `publish.rediscovery_interval`: from every second to once a day.
pub const REDISCOVERY_INTERVAL: DurationRange =
    DurationRange { min: Duration::from_secs(1), max: Duration::from_secs(86_400) };
/// `plugin.shutdown_grace`: zero (abort calls at once) up to ten minutes.
pub const SHUTDOWN_GRACE: DurationRange = DurationRange { min: Duration::ZERO, max: Duration::from_secs(600) };
/// `plugin.handover_timeout`: a second at least (calls in flight need a moment), up to
/// two minutes (a rolling update waits on it).
pub const HANDOVER_TIMEOUT: DurationRange =
    DurationRange { min: Duration::from_secs(1), max: Duration::from_secs(120) };
/// `mps.ready_timeout`: a daemon needs a moment; the kubelet's call lasts 45 s at most,
/// and a prepare waits for its daemon within it.
pub const MPS_READY_TIMEOUT: DurationRange =
    DurationRange { min: Duration::from_secs(1), max: Duration::from_secs(40) };
/// `mps.quit_grace`: zero (kill at once) up to a minute.
pub const MPS_QUIT_GRACE: DurationRange = DurationRange { min: Duration::ZERO, max: Duration::from_secs(60) };
/// `mps.check_interval`: from every second to once an hour.
pub const MPS_CHECK_INTERVAL: DurationRange =
    DurationRange { min: Duration::from_secs(1), max: Duration::from_secs(3600) };

/// `health.probe_interval`: from ten times a second to once an hour.
pub const HEALTH_PROBE_INTERVAL: DurationRange =
    DurationRange { min: Duration::from_millis(100), max: Duration::from_secs(3600) };
/// `health.quiet_period`: from a second to a day.
pub const HEALTH_QUIET_PERIOD: DurationRange =
    DurationRange { min: Duration::from_secs(1), max: Duration::from_secs(86_400) };
/// `claims.check_interval`: from every second to once a day.
pub const CLAIMS_CHECK_INTERVAL: DurationRange =
    DurationRange { min: Duration::from_secs(1), max: Duration::from_secs(86_400) };
/// `claims.release_after`: from at once to a week.
pub const CLAIMS_RELEASE_AFTER: DurationRange =
    DurationRange { min: Duration::ZERO, max: Duration::from_secs(7 * 86_400) };
/// `health.ignored_xids`: XIDs are small numbers; NVML's "unknown" is 999.
pub const XID: (u64, u64) = (1, 65_535);

/// `kubernetes.qps`: one request every ten seconds up to 10,000 per second.
pub const QPS: (f64, f64) = (0.1, 10_000.0);
/// `kubernetes.burst`.
pub const BURST: (u64, u64) = (1, 10_000);
/// `mock.gpus`.
pub const MOCK_GPUS: (u64, u64) = (0, 64);
/// `mock.multiprocessors`: more than any GPU has, far from overflowing MIG arithmetic.
pub const MOCK_MULTIPROCESSORS: (u64, u64) = (1, 10_000);
/// `sharing.memory_step`: 1 MiB to 1 TiB.
pub const SHARING_MEMORY_STEP: (u64, u64) = (1 << 20, 1 << 40);
/// `sharing.replicas`: a replica per GPU is no sharing; more than 64 do not fit one slice.
pub const SHARING_REPLICAS: (u64, u64) = (2, 64);
/// `mock.memory`: 1 MiB to 1 PiB (1024Ti).
pub const MOCK_MEMORY: (u64, u64) = (1 << 20, 1 << 50);

/// Renders a duration the way the configuration is written (`500ms`, `30s`, `10m`, `24h`).
pub fn show(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 => "0s".into(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}

/// A duration within `range`.
pub fn duration_in(range: DurationRange) -> impl Fn(&Raw) -> Result<Duration, String> {
    move |raw| {
        let d = duration(raw)?;
        if d < range.min || d > range.max {
            return Err(format!("must be from {} to {}, found {}", show(range.min), show(range.max), shown_raw(raw)));
        }
        Ok(d)
    }
}

/// A number within `min..=max`.
pub fn f64_in((min, max): (f64, f64)) -> impl Fn(&Raw) -> Result<f64, String> {
    move |raw| {
        let v = match raw {
            // Integers beyond 2^53 round; they are out of range anyway.
            Raw::Toml(toml::Value::Integer(i)) => *i as f64,
            Raw::Toml(toml::Value::Float(f)) => *f,
            Raw::Text(s) => s.trim().parse::<f64>().map_err(|_| format!("expected a number, found {s:?}"))?,
            Raw::Toml(other) => return Err(format!("expected a number, found {}", other.type_str())),
        };
        // NaN fails both comparisons, so it is tested on its own.
        if v.is_nan() || v < min || v > max {
            return Err(format!("must be from {min} to {max}, found {}", shown_raw(raw)));
        }
        Ok(v)
    }
}

/// A whole number within `min..=max`.
pub fn uint_in((min, max): (u64, u64)) -> impl Fn(&Raw) -> Result<u64, String> {
    move |raw| {
        let n = uint(raw).map_err(|e| format!("{e} (allowed: {min} to {max})"))?;
        if n < min || n > max {
            return Err(format!("must be from {min} to {max}, found {n}"));
        }
        Ok(n)
    }
}

/// A whole number within `min..=max` that fits a `u32` (every such range does).
pub fn u32_in(range: (u64, u64)) -> impl Fn(&Raw) -> Result<u32, String> {
    let check = uint_in(range);
    move |raw| {
        let n = check(raw)?;
        u32::try_from(n).map_err(|_| format!("{n} is too large"))
    }
}

/// The value as the user wrote it, for messages.
fn shown_raw(raw: &Raw) -> String {
    match raw {
        Raw::Toml(toml::Value::String(s)) | Raw::Text(s) => format!("{s:?}"),
        // `1e-300`, not three hundred digits.
        Raw::Toml(toml::Value::Float(f)) if *f != 0.0 && !(1e-3..1e6).contains(&f.abs()) => format!("{f:e}"),
        Raw::Toml(v) => v.to_string(),
    }
}
