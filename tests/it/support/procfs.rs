//! What `/proc` says about a process's memory, for tests and benchmarks that watch the agent.

/// Heaps of glibc's secondary malloc arenas in `pid`: 64 MiB-aligned reservations of
/// 64 MiB, mapped read-write as far as they are used and PROT_NONE beyond.
pub fn malloc_arena_heaps(pid: u32) -> usize {
    const HEAP_MAX: u64 = 64 << 20;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    // (start, end, perms) of unnamed mappings.
    let anon: Vec<(u64, u64, String)> = maps
        .lines()
        .filter(|l| l.split_whitespace().nth(5).is_none())
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (a, b) = f.next()?.split_once('-')?;
            Some((u64::from_str_radix(a, 16).ok()?, u64::from_str_radix(b, 16).ok()?, f.next()?.to_string()))
        })
        .collect();
    anon.iter()
        .enumerate()
        .filter(|(i, (start, end, perms))| {
            let aligned = start % HEAP_MAX == 0 && perms.starts_with("rw");
            let reserved_end = match anon.get(i + 1) {
                Some((s2, e2, p2)) if s2 == end && p2.starts_with("---") => *e2,
                _ => *end,
            };
            aligned && reserved_end - start == HEAP_MAX
        })
        .count()
}
