//! What `/proc` says about a process's memory, for tests and benchmarks that watch the agent.

use std::collections::BTreeMap;

/// `/proc/<pid>/status` fields in KiB (VmRSS, VmHWM, RssAnon, RssFile, Threads...).
pub fn status(pid: u32) -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let n = v.split_whitespace().next()?.parse().ok()?;
            Some((k.to_string(), n))
        })
        .collect()
}

/// One mapping of `/proc/<pid>/smaps`.
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    /// Path or `[heap]`/`[stack]`...; empty for unnamed anonymous mappings (malloc arenas,
    /// large allocations, thread stacks).
    pub name: String,
    /// KiB.
    pub size: u64,
    pub rss: u64,
    pub anonymous: u64,
}

impl Mapping {
    /// The address range as /proc prints it, e.g. `7f64400ca000-7f6444000000`.
    pub fn range(&self) -> String {
        format!("{:x}-{:x}", self.start, self.end)
    }
}

/// Every mapping of `pid`, in address order; empty when the process is gone.
pub fn smaps(pid: u32) -> Vec<Mapping> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut out: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let first = parts.next().unwrap_or_default();
        if let Some((a, b)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
            let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else { continue };
            let perms = parts.next().unwrap_or_default().to_string();
            let name = line.split_whitespace().nth(5).unwrap_or_default().to_string();
            out.push(Mapping { start, end, perms, name, size: 0, rss: 0, anonymous: 0 });
        } else if let Some(m) = out.last_mut() {
            let v = parts.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            match first {
                "Size:" => m.size = v,
                "Rss:" => m.rss = v,
                "Anonymous:" => m.anonymous = v,
                _ => {}
            }
        }
    }
    out
}

/// Heaps of glibc's secondary malloc arenas among `maps` (from [`smaps`]): 64 MiB-aligned
/// reservations of 64 MiB, mapped read-write as far as they are used and PROT_NONE beyond.
pub fn malloc_arena_heaps(maps: &[Mapping]) -> usize {
    const HEAP_MAX: u64 = 64 << 20;
    let anon: Vec<&Mapping> = maps.iter().filter(|m| m.name.is_empty()).collect();
    anon.iter()
        .enumerate()
        .filter(|(i, m)| {
            let aligned = m.start % HEAP_MAX == 0 && m.perms.starts_with("rw");
            let reserved_end = match anon.get(i + 1) {
                Some(next) if next.start == m.end && next.perms.starts_with("---") => next.end,
                _ => m.end,
            };
            aligned && reserved_end - m.start == HEAP_MAX
        })
        .count()
}
