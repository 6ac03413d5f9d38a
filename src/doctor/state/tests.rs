//! Unit tests of the state check: a missing directory, modes, a fresh and a populated
//! database, a database held open by a running store (detected, never opened), `/proc/locks`
//! parsing and the free-space figure.

use std::os::unix::fs::PermissionsExt;

use super::*;

/// Creates a store in `dir` and closes it. flock belongs to the open file, and a copy of
/// the descriptor can outlive the store for a moment (a process another test forks keeps
/// it until its exec; sled's I/O threads finish on their own): wait, bounded, until the
/// lock is free, so the checks below see a closed database as a stopped agent leaves it.
fn closed_store(dir: &Path) {
    drop(Store::open(dir).unwrap());
    wait_unlocked(dir);
}

fn wait_unlocked(dir: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while lock_state(&dir.join("db"), Path::new("/proc")).unwrap() != Lock::Free {
        assert!(std::time::Instant::now() < deadline, "{} stays locked after the store closed", dir.display());
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn missing_dir_under_a_writable_parent_passes() {
    let d = tempfile::tempdir().unwrap();
    let r = state_dir(&d.path().join("state"), Path::new("/proc"), &[]);
    assert_eq!(r.status, Status::Pass, "{r:?}");
    assert!(r.detail.contains("does not exist yet") && r.detail.contains("free"), "{}", r.detail);
    assert!(!d.path().join("state").exists(), "the doctor must not create it");
}

#[test]
fn open_mode_warns_and_an_idle_database_is_read() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("state");
    closed_store(&dir);
    let r = state_dir(&dir, Path::new("/proc"), &[]);
    assert_eq!(r.status, Status::Pass, "{r:?}");
    assert!(r.detail.contains("mode 0700") && r.detail.contains("0 prepared claims"), "{}", r.detail);
    assert!(r.detail.contains(&format!("schema {}", crate::state::SCHEMA_VERSION)), "{}", r.detail);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let r = state_dir(&dir, Path::new("/proc"), &[]);
    assert_eq!(r.status, Status::Warn);
    assert!(r.detail.contains("mode 0755") && r.fix.contains("chmod 700"), "{r:?}");
}

#[test]
fn database_in_use_is_reported_with_the_pid_and_not_opened() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("state");
    let running = Store::open(&dir).unwrap();
    let r = state_dir(&dir, Path::new("/proc"), &[]);
    assert_eq!(r.status, Status::Pass, "{r:?}");
    assert!(r.detail.contains("in use by a running edra"), "{}", r.detail);
    assert!(r.detail.contains(&format!("pid {}", std::process::id())), "{}", r.detail);
    // The running store still works: the doctor did not take its lock.
    assert!(running.claims().unwrap().is_empty());
    assert_eq!(lock_state(&dir.join("db"), Path::new("/proc")).unwrap(), Lock::Held(Some(std::process::id())));
    drop(running);
    wait_unlocked(&dir);
}

#[test]
fn spec_files_without_a_claim_record_warn() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("state");
    closed_store(&dir);
    let r = state_dir(&dir, Path::new("/proc"), &["uid-1".to_string()]);
    assert_eq!(r.status, Status::Warn, "{r:?}");
    assert!(r.detail.contains("1 CDI spec files of claims edra does not record"), "{}", r.detail);
    assert!(r.fix.contains("restart"), "{}", r.fix);
}

#[test]
fn not_a_directory_fails() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("state");
    std::fs::write(&f, b"").unwrap();
    assert_eq!(state_dir(&f, Path::new("/proc"), &[]).status, Status::Fail);
}

#[test]
fn proc_locks_parsing() {
    let dev = libc::makedev(0xfd, 1);
    let text = "1: POSIX  ADVISORY  WRITE 900 fd:01:77 0 EOF\n\
                2: FLOCK  ADVISORY  WRITE 4242 00:2c:77 0 EOF\n\
                3: FLOCK  ADVISORY  WRITE 1234 fd:01:77 0 EOF\n\
                3: -> FLOCK  ADVISORY  WRITE 999 fd:01:77 0 EOF\n\
                garbage\n";
    assert_eq!(lock_holder(text, dev, 77, 1), Some(1234));
    assert_eq!(lock_holder(text, dev, 77, 1234), Some(999), "another holder wins over our own pid");
    assert_eq!(lock_holder(text, libc::makedev(8, 2), 77, 1), Some(4242), "by inode on another device");
    assert_eq!(lock_holder(text, dev, 78, 1), None);
}

/// A reading of `/proc/locks` that misses the held lock's line (other processes took and
/// dropped locks while the kernel produced it page by page) is read again, a bounded
/// number of times.
#[test]
fn a_reading_of_proc_locks_without_the_held_lock_is_read_again() {
    let dev = libc::makedev(0xfd, 1);
    let other = "1: FLOCK  ADVISORY  WRITE 900 fd:01:78 0 EOF\n";
    let ours = "1: FLOCK  ADVISORY  WRITE 4242 fd:01:77 0 EOF\n";
    let readings = |texts: Vec<&'static str>| {
        let mut texts = texts.into_iter();
        let count = std::cell::Cell::new(0);
        let found = held_by(
            || {
                count.set(count.get() + 1);
                texts.next().unwrap_or(other).to_string()
            },
            dev,
            77,
            1,
        );
        (found, count.get())
    };
    assert_eq!(readings(vec![other, other, ours]), (Some(4242), 3));
    assert_eq!(readings(vec![ours]), (Some(4242), 1), "read once when the line is there");
    assert_eq!(readings(vec![]), (None, LOCKS_READINGS), "then given up on");
}

#[test]
fn free_space_and_units() {
    assert!(free_bytes(Path::new("/")).is_some());
    assert!(free_bytes(Path::new("/nonexistent/x")).is_none());
    assert_eq!(human(512), "512 B");
    assert_eq!(human(150 << 20), "150.0 MiB");
}
