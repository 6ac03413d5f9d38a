use super::*;

fn os(s: &str) -> Option<&OsStr> {
    Some(OsStr::new(s))
}

#[test]
fn edra_sets_the_limit_when_the_environment_does_not() {
    assert!(should_limit_arenas(None, None));
    assert!(should_limit_arenas(None, os("glibc.malloc.tcache_count=0")));
    assert!(should_limit_arenas(None, os("glibc.malloc.arena_test=4:glibc.malloc.trim_threshold=1")));
}

#[test]
fn an_operators_limit_wins() {
    assert!(!should_limit_arenas(os("4"), None));
    assert!(!should_limit_arenas(os(""), None));
    assert!(!should_limit_arenas(None, os("glibc.malloc.arena_max=2")));
    assert!(!should_limit_arenas(None, os("glibc.malloc.mmap_threshold=65536:glibc.malloc.arena_max=8")));
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn glibc_accepts_the_limit() {
    // Raising the limit afterwards would not remove arenas already made; a limit this
    // high changes nothing for the other tests in this process.
    assert_eq!(set_arena_max(64), ArenaLimit::Applied(64));
}
