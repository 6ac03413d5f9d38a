//! Crash points for crash-consistency tests, in prepare and unprepare and in the state
//! store's steps under them (also reachable as `prepare::failpoint`).
//!
//! In debug builds, [`hit`] aborts the process when its name is listed in the
//! `FAILPOINT_EDRA` environment variable (comma-separated), as a kill -9 at that point
//! would. Release builds compile it to nothing. The variable deliberately does not start
//! with `EDRA_`, which is reserved for configuration keys.

/// The environment variable listing the points to abort at.
pub const ENV: &str = "FAILPOINT_EDRA";

/// Aborts the process if failpoint `name` is enabled (debug builds only).
#[inline]
pub fn hit(name: &str) {
    hit_after(name, || {});
}

/// [`hit`], running `before` first when failpoint `name` is enabled: a crash right after
/// `before` (debug builds only), such as sled's background flusher writing a change out.
#[inline]
pub fn hit_after(name: &str, before: impl FnOnce()) {
    #[cfg(debug_assertions)]
    if let Ok(list) = std::env::var(ENV)
        && list.split(',').any(|p| p.trim() == name)
    {
        before();
        eprintln!("edra: failpoint {name} hit; aborting");
        std::process::abort();
    }
    #[cfg(not(debug_assertions))]
    let _ = (name, before);
}

/// Whether any failpoint is listed (debug builds only). While one is, the agent opens its
/// state without sled's background flusher (`Store::open_without_flusher`):
/// a change kept in memory (a lazy release) is then lost at the failpoint, as a kill -9
/// right after the change loses it, rather than kept when the flusher happened to run in
/// between. A crash test sees the one outcome it asserts, not a race.
pub fn armed() -> bool {
    #[cfg(debug_assertions)]
    return std::env::var(ENV).is_ok_and(|list| list.split(',').any(|p| !p.trim().is_empty()));
    #[cfg(not(debug_assertions))]
    false
}

/// The failpoints, in the order a prepare and an unprepare pass them.
pub const POINTS: [&str; 20] = [
    "prepare-after-mig-intent",
    "prepare-after-started",
    "prepare-after-mig-created",
    "prepare-after-mig-recorded",
    "prepare-after-gpu-recorded",
    "prepare-after-compute-mode",
    "prepare-after-timeslice",
    "prepare-after-mps-recorded",
    "prepare-after-mps-started",
    "prepare-after-cdi-write",
    "prepare-before-completed",
    "prepare-after-record",
    "prepare-after-completed",
    "unprepare-after-cdi-remove",
    "unprepare-after-mps-stop",
    "unprepare-after-timeslice-reset",
    "unprepare-after-compute-mode-restore",
    "unprepare-after-mig-releasing",
    "unprepare-after-mig-destroyed",
    "unprepare-after-record-remove",
];
