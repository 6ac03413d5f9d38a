//! How `edra run` sets up glibc's allocator: one malloc arena for the whole process.
//!
//! glibc gives threads their own arenas (up to eight per core), each a 64 MiB reservation
//! whose freed pages mostly stay resident. The agent has a dozen threads (two runtime
//! workers, Tokio's blocking pool for the durable commits, sled's I/O pool and log flusher)
//! that allocate little and rarely at the same time, so per-thread arenas buy no speed
//! and cost memory: with glibc's default, 10,000 prepare/unprepare cycles leave about ten
//! arenas and 0.3–0.5 MiB more anonymous memory than one shared arena holds, at the same
//! latency (docs/benchmarks.md, "Memory over cycles").
//!
//! The limit is set with `mallopt(M_ARENA_MAX, 1)` before the runtime starts any thread.
//! An operator's own setting wins: when `MALLOC_ARENA_MAX` is set, or `GLIBC_TUNABLES`
//! names `glibc.malloc.arena_max`, edra leaves the allocator alone. Other C libraries
//! (musl) have no arenas to limit; there this does nothing.
//!
//! After a spike (large API bodies read at once: `kube::body`) edra asks glibc to return
//! the free pages it keeps ([`release_free_memory`], `malloc_trim(0)`): glibc raises its
//! mmap threshold to the largest block freed, so later large buffers come from the heap,
//! and free heap pages stay resident until trimmed.

use std::ffi::OsStr;

/// The arena limit `edra run` applies.
pub const ARENA_MAX: i32 = 1;

/// Whether edra should set the arena limit itself, given the values of
/// `MALLOC_ARENA_MAX` and `GLIBC_TUNABLES` in its environment.
pub fn should_limit_arenas(malloc_arena_max: Option<&OsStr>, glibc_tunables: Option<&OsStr>) -> bool {
    let tunables_set_it = glibc_tunables
        .map(|t| t.to_string_lossy().split(':').any(|kv| kv.trim().starts_with("glibc.malloc.arena_max=")))
        .unwrap_or(false);
    malloc_arena_max.is_none() && !tunables_set_it
}

/// What [`limit_arenas`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArenaLimit {
    /// `mallopt` accepted the limit.
    Applied(i32),
    /// The environment sets the limit; it was left alone.
    FromEnvironment,
    /// Not glibc, or glibc refused the setting.
    Unavailable,
}

/// Limits glibc's malloc arenas to [`ARENA_MAX`] unless the environment sets a limit.
/// Call it before any thread that allocates is started.
pub fn limit_arenas() -> ArenaLimit {
    let env_limit = std::env::var_os("MALLOC_ARENA_MAX");
    let tunables = std::env::var_os("GLIBC_TUNABLES");
    if !should_limit_arenas(env_limit.as_deref(), tunables.as_deref()) {
        return ArenaLimit::FromEnvironment;
    }
    set_arena_max(ARENA_MAX)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_arena_max(n: i32) -> ArenaLimit {
    // SAFETY: mallopt only adjusts allocator parameters; M_ARENA_MAX takes any positive count.
    if unsafe { libc::mallopt(libc::M_ARENA_MAX, n) } == 1 { ArenaLimit::Applied(n) } else { ArenaLimit::Unavailable }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_arena_max(_n: i32) -> ArenaLimit {
    ArenaLimit::Unavailable
}

/// Returns free heap memory to the system (glibc's `malloc_trim(0)`; elsewhere nothing).
/// It walks the heap, so it is for after a spike, not for every allocation.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages of the allocator's own heap to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests;
