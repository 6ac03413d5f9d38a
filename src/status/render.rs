//! `edra status` output: text in the manner of `kubectl get` (fits 100 columns), wide text
//! (UUIDs, share IDs, MIG instances and MPS daemons on lines of their own), or the view as
//! JSON (schema [`super::SCHEMA`]). The view holds text from outside (API server errors,
//! claim and pod names, NVML's strings): its control characters are shown escaped
//! (`\u{1b}`, [`crate::util::escape_controls`]) in every output, never sent raw to the
//! terminal.

use std::fmt::Write as _;

use super::{ClaimStatus, GpuStatus, NodeStatus};
use crate::util::{escape_controls, escape_json_controls, quantity};

/// The width text output keeps to.
pub const WIDTH: usize = 100;

/// `3d4h`, `2h5m`, `4m10s`, `9s`.
pub fn age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

/// Rows as aligned columns, each line cut to [`WIDTH`] (the last column gives way).
fn table(header: &[&str], rows: &[Vec<String>], cut: bool) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let head: Vec<String> = header.iter().map(|h| (*h).to_string()).collect();
    for row in std::iter::once(&head).chain(rows) {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        let line = cells.join("  ");
        let line = line.trim_end();
        let line: String = if cut && line.chars().count() > WIDTH {
            let mut l: String = line.chars().take(WIDTH - 1).collect();
            l.push('…');
            l
        } else {
            line.to_string()
        };
        let _ = writeln!(out, "{line}");
    }
    out
}

/// `s` cut to `n` characters (the last one `…`) when `cut`.
fn fit(s: String, n: usize, cut: bool) -> String {
    if !cut || s.chars().count() <= n {
        return s;
    }
    let mut out: String = s.chars().take(n.saturating_sub(1)).collect();
    out.push('…');
    out
}

fn or_dash(v: &[String]) -> String {
    if v.is_empty() { "-".into() } else { v.join(",") }
}

fn gpu_row(g: &GpuStatus, now: i64, wide: bool) -> Vec<String> {
    let free = g.memory.saturating_sub(g.memory_shared);
    // Narrow: the key without the driver's domain; wide: `key=value:effect` whole.
    let taints: Vec<String> = g
        .taints
        .iter()
        .map(|t| {
            let shown = match wide {
                true => t.taint.clone(),
                // `xid=79` for NoSchedule (every fatal condition), `unmonitored=:None` otherwise.
                false => {
                    let key = t.taint.rsplit_once('/').map_or(t.taint.as_str(), |(_, k)| k);
                    key.strip_suffix(":NoSchedule").unwrap_or(key).to_string()
                }
            };
            format!("{shown} ({})", age(now - t.since))
        })
        .collect();
    let mut row = vec![
        g.name.clone(),
        g.health.clone(),
        g.compute_mode.clone(),
        if g.mig_mode { format!("on/{}", g.mig_instances.len()) } else { "off".into() },
        quantity(g.memory),
        quantity(g.memory_shared),
        if g.held_by.is_empty() { quantity(free) } else { "0".into() },
        g.shares.to_string(),
        or_dash(&g.held_by),
        g.mps_daemons.len().to_string(),
        or_dash(&taints),
    ];
    if wide {
        row.insert(1, g.uuid.clone());
        row.insert(2, g.product.clone());
    }
    row
}

fn claim_row(c: &ClaimStatus, now: i64, wide: bool) -> Vec<String> {
    let devices: Vec<String> = c
        .devices
        .iter()
        .map(|d| match (&d.share_id, wide) {
            (Some(id), false) => format!("{}#{}", d.device, id.get(..8).unwrap_or(id)),
            (Some(id), true) => format!("{}#{id}", d.device),
            (None, _) => d.device.clone(),
        })
        .collect();
    let mut strategies: Vec<String> = c.devices.iter().map(|d| d.strategy.clone()).collect();
    strategies.dedup();
    let memory: u64 = c.devices.iter().filter_map(|d| d.memory).sum();
    let pods = match &c.pods {
        Some(p) => or_dash(p),
        None => "?".into(),
    };
    let mut row = vec![
        fit(format!("{}/{}", c.namespace, c.name), 36, !wide),
        fit(or_dash(&devices), 30, !wide),
        strategies.join(","),
        if memory == 0 { "-".into() } else { quantity(memory) },
        pods,
        age(now - c.prepared_at),
    ];
    if wide {
        row.insert(1, c.uid.clone());
        row.push(c.phase.clone());
    }
    row
}

/// The view as text; `wide` adds UUIDs, share IDs, MIG instances and MPS daemons. Every
/// text in the view is shown with its control characters escaped.
pub fn text(s: &NodeStatus, wide: bool) -> String {
    match escaped(s) {
        Some(shown) => layout(&shown, wide),
        // Not met (the view is plain data): escape all but the layout's own line breaks.
        None => layout(s, wide).split('\n').map(escape_controls).collect::<Vec<_>>().join("\n"),
    }
}

/// `s` with the control characters of each of its texts escaped. The view is walked as
/// JSON, so a field added later is covered without a word here.
fn escaped(s: &NodeStatus) -> Option<NodeStatus> {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::String(t) => {
                if let std::borrow::Cow::Owned(e) = escape_controls(t) {
                    *t = e;
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            serde_json::Value::Object(fields) => fields.values_mut().for_each(walk),
            _ => {}
        }
    }
    let mut v = serde_json::to_value(s).ok()?;
    walk(&mut v);
    serde_json::from_value(v).ok()
}

fn layout(s: &NodeStatus, wide: bool) -> String {
    let mut out = String::new();
    let yes_no = |b: bool, yes: &str, no: &str| if b { yes.to_string() } else { no.to_string() };
    let _ = writeln!(
        out,
        "NODE {}  edra {} ({})  up {}  kubelet {}  slices {}  pods {}",
        s.node,
        s.version,
        s.backend,
        age(s.now - s.started_at),
        yes_no(s.kubelet_registered, "registered", "NOT registered"),
        yes_no(s.slices_in_sync, "in sync", "NOT in sync"),
        yes_no(s.pods_known, "known", "unknown (pod watch not current)"),
    );
    if let Some(e) = &s.publish_error {
        let _ = writeln!(out, "last publish error: {e}");
    }
    let _ = writeln!(out);
    let mut header =
        vec!["GPU", "HEALTH", "MODE", "MIG", "MEMORY", "SHARED", "FREE", "SHARES", "HELD BY", "MPS", "TAINTS"];
    if wide {
        header.splice(1..1, ["UUID", "PRODUCT"]);
    }
    let rows: Vec<Vec<String>> = s.gpus.iter().map(|g| gpu_row(g, s.now, wide)).collect();
    out.push_str(&table(&header, &rows, !wide));
    if wide {
        details(&mut out, s);
    }
    let _ = writeln!(out);
    if s.claims.is_empty() {
        let _ = writeln!(out, "No claims prepared.");
        return out;
    }
    let mut header = vec!["CLAIM", "DEVICES", "STRATEGY", "MEMORY", "PODS", "AGE"];
    if wide {
        header.insert(1, "UID");
        header.push("PHASE");
    }
    let rows: Vec<Vec<String>> = s.claims.iter().map(|c| claim_row(c, s.now, wide)).collect();
    out.push_str(&table(&header, &rows, !wide));
    out
}

/// MIG instances, MPS daemons and conditions, a line each.
fn details(out: &mut String, s: &NodeStatus) {
    for g in &s.gpus {
        for m in &g.mig_instances {
            let _ = writeln!(
                out,
                "  {}: MIG {} gi {} ci {} at {} {} ({}{})",
                g.name,
                m.profile,
                m.gi,
                m.ci.map_or("-".into(), |c| c.to_string()),
                m.placement,
                m.uuid.as_deref().unwrap_or("-"),
                m.owner,
                m.claim.as_deref().map(|c| format!(" for {c}")).unwrap_or_default()
            );
        }
        for d in &g.mps_daemons {
            let _ = writeln!(
                out,
                "  {}: MPS daemon for {} pid {} up {} restarts {}",
                g.name,
                d.claim,
                d.pid.map_or("-".into(), |p| p.to_string()),
                d.uptime.map_or("-".into(), |u| age(i64::try_from(u).unwrap_or(i64::MAX))),
                d.restarts
            );
        }
        for c in &g.conditions {
            let _ = writeln!(out, "  {}: {} since {} ago: {}", g.name, c.kind, age(s.now - c.since), c.message);
        }
    }
}

/// The view as pretty JSON with a final newline; control characters in its strings are
/// JSON escapes (`\u001b`, `\u009b`), none raw.
pub fn json(s: &NodeStatus) -> String {
    let mut out =
        serde_json::to_string_pretty(s).unwrap_or_else(|e| serde_json::json!({"error": e.to_string()}).to_string());
    out.push('\n');
    escape_json_controls(&out).into_owned()
}
