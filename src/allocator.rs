//! Process-wide allocator settings, applied once at start before any thread exists.
//!
//! glibc's malloc gives each thread that contends for a lock its own arena (up to eight per
//! core). edra's threads — two Tokio workers, the blocking pool that runs the durable sled
//! commits and CDI file writes, sled's own flusher and thread pool — allocate in one arena
//! and free in another, and the free space each arena keeps is not returned to the kernel.
//! A heap profile over thousands of prepare/unprepare cycles shows the live heap flat while
//! anonymous resident memory crept up by ~100 bytes per cycle: that was arena retention, not
//! a leak. Two arenas are plenty for a process whose hot path is a handful of small
//! allocations per gRPC call. Other C libraries (musl) have no such arenas; there this
//! module does nothing.

/// The number of malloc arenas edra uses, unless `MALLOC_ARENA_MAX` is set in the
/// environment (an operator's setting wins; glibc reads it itself).
pub const ARENA_MAX: i32 = 2;

/// What [`limit_arenas`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArenaLimit {
    /// `mallopt(M_ARENA_MAX, ARENA_MAX)` took effect.
    Applied,
    /// `MALLOC_ARENA_MAX` is set; glibc applies it, edra leaves it alone.
    FromEnvironment,
    /// Not glibc, or glibc refused the setting.
    Unavailable,
}

/// Caps glibc's malloc arenas at [`ARENA_MAX`]. Call first thing in `main`, before any
/// thread starts: arenas already created by other threads stay.
pub fn limit_arenas() -> ArenaLimit {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return ArenaLimit::FromEnvironment;
    }
    set_arena_max(ARENA_MAX)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_arena_max(n: i32) -> ArenaLimit {
    // SAFETY: mallopt only changes a malloc tunable; M_ARENA_MAX with a positive value is
    // valid at any time and returns 1 on success, 0 on error.
    let rc = unsafe { libc::mallopt(libc::M_ARENA_MAX, n) };
    if rc == 1 { ArenaLimit::Applied } else { ArenaLimit::Unavailable }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_arena_max(_n: i32) -> ArenaLimit {
    ArenaLimit::Unavailable
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn glibc_accepts_the_arena_limit() {
        assert_eq!(set_arena_max(ARENA_MAX), ArenaLimit::Applied);
    }

    #[test]
    fn environment_setting_is_left_to_glibc() {
        // Only observable through the environment check; the variable is read, never set here.
        let expected = if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
            ArenaLimit::FromEnvironment
        } else if cfg!(all(target_os = "linux", target_env = "gnu")) {
            ArenaLimit::Applied
        } else {
            ArenaLimit::Unavailable
        };
        assert_eq!(limit_arenas(), expected);
    }
}
