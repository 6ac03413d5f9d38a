//! The health view: per GPU, the conditions edra knows of (a fatal XID, lost, not
//! monitored), when it first saw the GPU and when its last critical event came — a pure
//! state machine fed with [`Event`]s and the clock, so merging, never-downgrade and the
//! quiet period are tested without NVML or time passing.
//!
//! A condition's `since` is the taint's `timeAdded`: it is set when the condition appears
//! (or is raised from informational to fatal) and kept while the condition lasts, however
//! many events repeat it. A fatal condition clears once its GPU answers the probe and no
//! critical event came for the quiet period — an XID also as soon as NVML's recovery
//! action for the GPU reads "none"; "not monitored" clears when monitoring works.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// XID that NVML reports for a double-bit ECC error (NVIDIA's XID 48, "DBE").
pub const XID_DOUBLE_BIT_ECC: u64 = 48;
/// NVML's event data for an XID it cannot name.
pub const XID_UNKNOWN: u64 = 999;

/// What NVIDIA's XID catalog says an XID means, for the critical ones NVML reports; `None`
/// for others (the message then gives the number alone).
pub fn xid_meaning(xid: u64) -> Option<&'static str> {
    Some(match xid {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        45 => "preemptive cleanup after earlier errors",
        48 => "double-bit ECC error",
        61 => "internal micro-controller breakpoint",
        62 => "internal micro-controller halt",
        63 => "ECC page retirement or row remapping recorded",
        64 => "ECC page retirement or row remapping failed",
        68 => "video processor exception",
        69 => "graphics engine class error",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        109 => "context switch timeout",
        119 => "GSP RPC timeout",
        120 => "GSP error",
        121 => "C2C link corrected error",
        140 => "unrecovered ECC error",
        154 => "GPU recovery action changed",
        _ => return None,
    })
}
pub use crate::config::settings::DEFAULT_IGNORED_XIDS;

/// What is wrong with a GPU; also the taint key's name (`<driver>/<key>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConditionKind {
    /// A critical XID (or a double-bit ECC error, XID 48); the value is the XID.
    Xid,
    /// NVML lost the GPU (fell off the bus, or the probe cannot reach it).
    GpuLost,
    /// The GPU cannot be watched for events (it supports none of them).
    Unmonitored,
    /// The GPU's probe has not answered (an NVML call hangs): its health is unknown.
    Unresponsive,
}

impl ConditionKind {
    /// The taint key's name part: `xid`, `gpu-lost`, `unmonitored`.
    pub fn key(self) -> &'static str {
        match self {
            ConditionKind::Xid => "xid",
            ConditionKind::GpuLost => "gpu-lost",
            ConditionKind::Unmonitored => "unmonitored",
            ConditionKind::Unresponsive => "unresponsive",
        }
    }
}

/// One condition of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    /// What it is.
    pub kind: ConditionKind,
    /// The taint value (the XID for [`ConditionKind::Xid`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Fatal (NoSchedule) or informational (`None` effect).
    pub fatal: bool,
    /// When the condition appeared, in Unix seconds: the taint's `timeAdded`.
    pub since: i64,
    /// When an event last confirmed it, in Unix milliseconds (the quiet period counts
    /// from here).
    pub last_event_ms: u64,
    /// What happened, for people (the kubelet's health message, `edra doctor`).
    pub message: String,
}

/// A GPU's health.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuHealth {
    /// Its conditions, at most one per kind.
    #[serde(default)]
    pub conditions: BTreeMap<ConditionKind, Condition>,
    /// When edra first saw the GPU, in Unix seconds.
    #[serde(default)]
    pub first_seen: i64,
    /// When its last critical event came, in Unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_critical_ms: Option<u64>,
    /// Whether the last probe reached it (not persisted: every start probes afresh).
    #[serde(skip, default = "yes")]
    pub reachable: bool,
    /// Since when discovery no longer finds it, in Unix milliseconds; a GPU absent for
    /// the quiet period is forgotten with its conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub absent_since_ms: Option<u64>,
}

fn yes() -> bool {
    true
}

impl Default for GpuHealth {
    /// No conditions, reachable.
    fn default() -> Self {
        GpuHealth {
            conditions: BTreeMap::new(),
            first_seen: 0,
            last_critical_ms: None,
            reachable: true,
            absent_since_ms: None,
        }
    }
}

impl GpuHealth {
    /// A fatal condition, if any (lost first: it says the most).
    pub fn fatal(&self) -> Option<&Condition> {
        self.conditions.values().filter(|c| c.fatal).max_by_key(|c| c.kind == ConditionKind::GpuLost)
    }
}

/// What the event thread or the probe observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A critical XID on GPU `gpu` (its UUID).
    Xid { gpu: String, xid: u64 },
    /// A double-bit ECC error.
    DoubleBitEcc { gpu: String },
    /// The GPU is lost; `None` when NVML could not say which (then every GPU is).
    Lost { gpu: Option<String> },
    /// The GPU cannot be monitored, and why.
    Unmonitored { gpu: String, reason: String },
    /// The GPU is monitored (its events are registered).
    Monitored { gpu: String },
    /// The light probe reached the GPU (`true`) or not.
    Probe { gpu: String, ok: bool },
    /// The GPU's probe has not answered for `waited`.
    ProbeHung { gpu: String, waited: Duration },
    /// NVML's recovery action for the GPU is "none" (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`
    /// reads 0): the driver needs no reset or reboot, so an XID condition may clear now.
    NoRecoveryNeeded { gpu: String },
}

/// What applying events or the clock changed, for the log and the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A condition appeared (or became fatal).
    Raised { gpu: String, condition: Condition },
    /// An XID on the ignore list came (nothing else changes).
    Ignored { gpu: String, xid: u64 },
    /// A condition cleared after lasting `lasted`: the GPU answered and stayed quiet.
    Cleared { gpu: String, kind: ConditionKind, lasted: Duration },
    /// An XID condition cleared after lasting `lasted` because NVML says no recovery
    /// action is needed.
    ClearedByNvml { gpu: String, lasted: Duration },
    /// The GPU was gone from discovery for the quiet period: it and its conditions are
    /// forgotten.
    Forgotten { gpu: String, absent: Duration },
}

/// How events are judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    /// XIDs that are application errors: counted, never a condition.
    pub ignored_xids: BTreeSet<u64>,
    /// How long a reachable GPU must stay free of critical events before its fatal
    /// conditions clear.
    pub quiet_period: Duration,
}

/// Unix milliseconds of `t` (0 before the epoch, saturating far after it).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0)
}

/// Unix seconds of `t` (0 before the epoch).
pub fn unix_secs(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)).unwrap_or(0)
}

/// Every GPU's health, by UUID, plus the XIDs seen since start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthView {
    /// GPUs by UUID.
    pub gpus: BTreeMap<String, GpuHealth>,
    /// XIDs seen since start (ignored ones too), by (GPU UUID, XID).
    pub xids_seen: BTreeMap<(String, u64), u64>,
}

impl HealthView {
    /// A view holding persisted GPU health (conditions and their times).
    pub fn from_persisted(gpus: BTreeMap<String, GpuHealth>) -> Self {
        HealthView { gpus, xids_seen: BTreeMap::new() }
    }

    /// Notes the GPUs discovery finds now, all of them: a new one gets its first-seen
    /// time, one found again is no longer absent, and one not among them is absent from
    /// `now` on (until [`HealthView::recover`] forgets it). True when a GPU was added.
    pub fn saw(&mut self, uuids: impl IntoIterator<Item = String>, now: SystemTime) -> bool {
        let mut added = false;
        let present: BTreeSet<String> = uuids.into_iter().collect();
        for (uuid, g) in &mut self.gpus {
            match present.contains(uuid) {
                true => g.absent_since_ms = None,
                false => _ = g.absent_since_ms.get_or_insert(unix_ms(now)),
            }
        }
        for uuid in present {
            self.gpus.entry(uuid).or_insert_with(|| {
                added = true;
                GpuHealth { first_seen: unix_secs(now), ..GpuHealth::default() }
            });
        }
        added
    }

    /// Applies one event at `now`; returns what changed.
    pub fn apply(&mut self, event: Event, now: SystemTime, rules: &Rules) -> Vec<Change> {
        match event {
            Event::Xid { gpu, xid } => {
                *self.xids_seen.entry((gpu.clone(), xid)).or_insert(0) += 1;
                if rules.ignored_xids.contains(&xid) {
                    return vec![Change::Ignored { gpu, xid }];
                }
                let message = match (xid, xid_meaning(xid)) {
                    (XID_UNKNOWN, _) => "NVML reported a critical XID it could not name (999)".to_string(),
                    (_, Some(meaning)) => format!("NVML reported critical XID {xid} ({meaning})"),
                    (_, None) => format!("NVML reported critical XID {xid}"),
                };
                self.raise(&gpu, ConditionKind::Xid, Some(xid.to_string()), true, message, now)
            }
            Event::DoubleBitEcc { gpu } => {
                *self.xids_seen.entry((gpu.clone(), XID_DOUBLE_BIT_ECC)).or_insert(0) += 1;
                let message = "NVML reported a double-bit ECC error (XID 48)".to_string();
                self.raise(&gpu, ConditionKind::Xid, Some(XID_DOUBLE_BIT_ECC.to_string()), true, message, now)
            }
            Event::Lost { gpu: Some(gpu) } => self.lose(&gpu, "NVML reports the GPU as lost", now),
            Event::Lost { gpu: None } => {
                let all: Vec<String> = self.gpus.keys().cloned().collect();
                all.iter().flat_map(|g| self.lose(g, "NVML reports a GPU as lost without naming it", now)).collect()
            }
            Event::Unmonitored { gpu, reason } => {
                let message = format!("not monitored for XID events: {reason}");
                self.raise(&gpu, ConditionKind::Unmonitored, None, false, message, now)
            }
            Event::Monitored { gpu } => self.clear(&gpu, ConditionKind::Unmonitored, now).into_iter().collect(),
            Event::Probe { gpu, ok: false } => {
                let answered = self.clear(&gpu, ConditionKind::Unresponsive, now);
                let mut changes = self.lose(&gpu, "the GPU does not answer (NVML cannot find it by its UUID)", now);
                changes.extend(answered);
                changes
            }
            Event::ProbeHung { gpu, waited } => {
                let message = format!(
                    "not answering the health probe for {}s (an NVML call hangs); its health is unknown until it answers",
                    waited.as_secs()
                );
                let changes = self.raise(&gpu, ConditionKind::Unresponsive, None, false, message, now);
                if let Some(g) = self.gpus.get_mut(&gpu) {
                    g.reachable = false;
                }
                changes
            }
            Event::NoRecoveryNeeded { gpu } => {
                if !self.gpus.get(&gpu).is_some_and(|g| g.reachable) {
                    return Vec::new();
                }
                match self.clear(&gpu, ConditionKind::Xid, now) {
                    Some(Change::Cleared { gpu, lasted, .. }) => vec![Change::ClearedByNvml { gpu, lasted }],
                    _ => Vec::new(),
                }
            }
            Event::Probe { gpu, ok: true } => {
                self.gpus
                    .entry(gpu.clone())
                    .or_insert_with(|| GpuHealth { first_seen: unix_secs(now), ..GpuHealth::default() })
                    .reachable = true;
                self.clear(&gpu, ConditionKind::Unresponsive, now).into_iter().collect()
            }
        }
    }

    /// Clears the fatal conditions of reachable GPUs whose last critical event is at least
    /// the quiet period old, and forgets the GPUs absent from discovery for the quiet
    /// period (a GPU removed for good keeps no condition in `health.json`).
    pub fn recover(&mut self, now: SystemTime, rules: &Rules) -> Vec<Change> {
        let mut changes = self.forget_absent(now, rules);
        changes.extend(self.clear_quiet(now, rules));
        changes
    }

    fn forget_absent(&mut self, now: SystemTime, rules: &Rules) -> Vec<Change> {
        let quiet = u64::try_from(rules.quiet_period.as_millis()).unwrap_or(u64::MAX);
        let now = unix_ms(now);
        let gone: Vec<(String, u64)> = self
            .gpus
            .iter()
            .filter_map(|(uuid, g)| g.absent_since_ms.map(|since| (uuid.clone(), now.saturating_sub(since))))
            .filter(|(_, absent)| *absent >= quiet)
            .collect();
        for (uuid, _) in &gone {
            self.gpus.remove(uuid);
            self.xids_seen.retain(|(gpu, _), _| gpu != uuid);
        }
        gone.into_iter().map(|(gpu, ms)| Change::Forgotten { gpu, absent: Duration::from_millis(ms) }).collect()
    }

    fn clear_quiet(&mut self, now: SystemTime, rules: &Rules) -> Vec<Change> {
        let now_ms = unix_ms(now);
        let quiet = u64::try_from(rules.quiet_period.as_millis()).unwrap_or(u64::MAX);
        let due: Vec<(String, ConditionKind)> = self
            .gpus
            .iter()
            .filter(|(_, g)| g.reachable)
            .flat_map(|(uuid, g)| {
                g.conditions
                    .values()
                    .filter(|c| c.fatal && now_ms.saturating_sub(c.last_event_ms) >= quiet)
                    .map(|c| (uuid.clone(), c.kind))
                    .collect::<Vec<_>>()
            })
            .collect();
        due.into_iter().filter_map(|(gpu, kind)| self.clear(&gpu, kind, now)).collect()
    }

    fn lose(&mut self, gpu: &str, message: &str, now: SystemTime) -> Vec<Change> {
        let changes = self.raise(gpu, ConditionKind::GpuLost, None, true, message.to_string(), now);
        if let Some(g) = self.gpus.get_mut(gpu) {
            g.reachable = false;
        }
        changes
    }

    /// Adds or confirms a condition. An existing condition keeps its value and `since`
    /// unless the new one is more severe (informational → fatal): a later lesser event
    /// never downgrades a fatal condition.
    fn raise(
        &mut self,
        gpu: &str,
        kind: ConditionKind,
        value: Option<String>,
        fatal: bool,
        message: String,
        now: SystemTime,
    ) -> Vec<Change> {
        let now_ms = unix_ms(now);
        let g = self
            .gpus
            .entry(gpu.to_string())
            .or_insert_with(|| GpuHealth { first_seen: unix_secs(now), ..GpuHealth::default() });
        if fatal {
            g.last_critical_ms = Some(now_ms);
        }
        let incoming = Condition { kind, value, fatal, since: unix_secs(now), last_event_ms: now_ms, message };
        match g.conditions.get_mut(&kind) {
            Some(existing) => {
                if merge(existing, incoming) {
                    vec![Change::Raised { gpu: gpu.to_string(), condition: existing.clone() }]
                } else {
                    Vec::new()
                }
            }
            None => {
                g.conditions.insert(kind, incoming.clone());
                vec![Change::Raised { gpu: gpu.to_string(), condition: incoming }]
            }
        }
    }

    fn clear(&mut self, gpu: &str, kind: ConditionKind, now: SystemTime) -> Option<Change> {
        let c = self.gpus.get_mut(gpu)?.conditions.remove(&kind)?;
        let lasted = Duration::from_secs(u64::try_from(unix_secs(now).saturating_sub(c.since)).unwrap_or(0));
        Some(Change::Cleared { gpu: gpu.to_string(), kind, lasted })
    }
}

/// Merges a new occurrence into an existing condition of the same kind; true when the
/// condition as published (value, effect, `since`) changed. A more severe occurrence
/// replaces it (a new `since`: the effect changed); an equal or lesser one only moves
/// `last_event_ms` forward.
pub fn merge(existing: &mut Condition, incoming: Condition) -> bool {
    if incoming.fatal && !existing.fatal {
        *existing = incoming;
        return true;
    }
    if incoming.fatal == existing.fatal {
        existing.last_event_ms = existing.last_event_ms.max(incoming.last_event_ms);
    }
    false
}

#[cfg(test)]
mod tests;
