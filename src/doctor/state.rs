//! Check 8: edra's state directory. Its mode, whether the database is in use by a running
//! edra (sled holds an exclusive `flock` on its `db` file while open; the holder's pid comes
//! from `<proc>/locks`), its schema version and number of prepared claims, and the free
//! space on its filesystem. An idle database is opened through [`crate::state::Store`] (which
//! takes and releases the lock, and sets the directory's mode to 0700 after the mode was
//! reported); a database in use is never opened.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::host::{nearest_existing, writable};
use super::{CheckResult, Status};
use crate::state::{StateError, Store};

const NAME: &str = "state";
/// Below this much free space on the state filesystem the check warns.
pub const LOW_SPACE_BYTES: u64 = 100 << 20;

/// Whether another open file description holds sled's lock on `db`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lock {
    Free,
    /// Held; by this pid when `<proc>/locks` names it.
    Held(Option<u32>),
}

/// Tests the lock on `db` without keeping it: flock(LOCK_EX | LOCK_NB), released on close.
pub fn lock_state(db: &Path, proc_root: &Path) -> std::io::Result<Lock> {
    let file = File::open(db)?;
    // SAFETY: the descriptor belongs to `file`, which stays open for the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(Lock::Free);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
        return Err(err);
    }
    let meta = file.metadata()?;
    let read = || std::fs::read_to_string(proc_root.join("locks")).unwrap_or_default();
    Ok(Lock::Held(held_by(read, meta.dev(), meta.ino(), std::process::id())))
}

/// How often /proc/locks is read when a held lock does not show in it.
const LOCKS_READINGS: usize = 5;

/// [`lock_holder`] of a held lock in the text `read` returns. The kernel produces
/// /proc/locks a page at a time; a lock another process takes or drops between two pages
/// can make a held lock's line go missing from one reading. The lock is held, so its line
/// exists: a reading without it is read again, [`LOCKS_READINGS`] times at most.
fn held_by(mut read: impl FnMut() -> String, dev: u64, ino: u64, own_pid: u32) -> Option<u32> {
    (0..LOCKS_READINGS).find_map(|_| lock_holder(&read(), dev, ino, own_pid))
}

/// The pid holding a FLOCK on inode `ino` in a `/proc/locks` text: an entry on device
/// `dev` first, else one on the inode alone (overlay filesystems show the lower device).
/// Entries of `own_pid` (this process) are skipped only when another holder exists.
pub fn lock_holder(locks: &str, dev: u64, ino: u64, own_pid: u32) -> Option<u32> {
    let want_dev = format!("{:02x}:{:02x}", libc::major(dev), libc::minor(dev));
    let mut exact = Vec::new();
    let mut by_inode = Vec::new();
    for line in locks.lines() {
        let fields: Vec<&str> = line.split_whitespace().filter(|f| *f != "->").collect();
        // "1:" "FLOCK" "ADVISORY" "WRITE" pid "maj:min:ino" start end
        if fields.len() < 6 || fields[1] != "FLOCK" {
            continue;
        }
        let Ok(pid) = fields[4].parse::<u32>() else { continue };
        let Some((d, i)) = fields[5].rsplit_once(':') else { continue };
        if i.parse::<u64>().ok() != Some(ino) {
            continue;
        }
        if d == want_dev { exact.push(pid) } else { by_inode.push(pid) }
    }
    let pick = |v: &[u32]| v.iter().copied().find(|p| *p != own_pid).or(v.first().copied());
    pick(&exact).or_else(|| pick(&by_inode))
}

/// Free bytes for unprivileged users on the filesystem holding `path` (statvfs).
pub fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: zeroed statvfs is a valid value of this plain C struct; statvfs fills it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` is a valid out-pointer; both outlive the call.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail.saturating_mul(st.f_frsize))
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{bytes} B") } else { format!("{v:.1} {}", UNITS[u]) }
}

/// What the state check found: the worst status so far, notes and fixes.
struct Findings {
    status: Status,
    notes: Vec<String>,
    fixes: Vec<String>,
}

impl Findings {
    fn warn(&mut self, note: String, fix: impl Into<String>) {
        self.status = self.status.max(Status::Warn);
        self.notes.push(note);
        self.fixes.push(fix.into());
    }
}

/// Check 8: the state directory at `dir`; `spec_uids` are the claims of edra's CDI spec
/// files, compared with the prepared claims when the database can be read.
pub fn state_dir(dir: &Path, proc_root: &Path, spec_uids: &[String]) -> CheckResult {
    let shown = dir.display();
    let mut found = Findings { status: Status::Pass, notes: Vec::new(), fixes: Vec::new() };
    let Some(existing) = nearest_existing(dir) else {
        return CheckResult::new(NAME, Status::Fail, format!("no part of {shown} exists"), "check paths.state_dir");
    };
    if existing != dir {
        if !(existing.is_dir() && writable(existing)) {
            return CheckResult::new(
                NAME,
                Status::Fail,
                format!("{shown} does not exist and {} is not writable", existing.display()),
                "run edra as root, or set paths.state_dir (--state-dir) to a writable directory",
            );
        }
        found.notes.push(format!("{shown} does not exist yet; edra creates it (mode 0700) at start"));
    } else if let Err(failed) = existing_dir(dir, proc_root, spec_uids, &mut found) {
        return failed;
    }
    match free_bytes(existing) {
        Some(free) if free < LOW_SPACE_BYTES => found.warn(
            format!("only {} free", human(free)),
            "free disk space: edra cannot record prepared claims on a full disk",
        ),
        Some(free) => found.notes.push(format!("{} free", human(free))),
        None => {}
    }
    CheckResult::new(NAME, found.status, found.notes.join("; "), found.fixes.join("; "))
}

/// The state directory as it is: its mode, then the database in it.
fn existing_dir(dir: &Path, proc_root: &Path, spec_uids: &[String], found: &mut Findings) -> Result<(), CheckResult> {
    let shown = dir.display();
    let meta = match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => m,
        _ => {
            return Err(CheckResult::new(
                NAME,
                Status::Fail,
                format!("{shown} is not a directory"),
                "check paths.state_dir",
            ));
        }
    };
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        found.warn(
            format!("{shown} has mode {mode:04o}, not 0700"),
            format!("chmod 700 {shown} (edra also resets it at start)"),
        );
    } else {
        found.notes.push(format!("{shown} (mode {mode:04o})"));
    }
    let db = dir.join("db");
    if !db.exists() {
        found.notes.push("no database yet; edra creates it at start".into());
        return Ok(());
    }
    database(dir, &db, proc_root, spec_uids, found)
}

/// The database: left alone while a running edra holds it, otherwise opened to compare its
/// prepared claims with the spec files.
fn database(
    dir: &Path,
    db: &Path,
    proc_root: &Path,
    spec_uids: &[String],
    found: &mut Findings,
) -> Result<(), CheckResult> {
    match lock_state(db, proc_root) {
        Ok(Lock::Held(pid)) => {
            let by = pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
            found.notes.push(format!("database in use by a running edra{by}; not opened"));
        }
        Ok(Lock::Free) => match Store::open(dir) {
            Ok(store) => recorded_claims(&store, spec_uids, found),
            Err(StateError::Open { ref source, .. }) if source.to_string().contains("lock") => {
                found.notes.push("database in use by a running edra; not opened".into());
            }
            Err(e) => {
                return Err(CheckResult::new(
                    NAME,
                    Status::Fail,
                    crate::util::error_chain(&e),
                    "run as root; a corrupt or newer database: move the state directory aside",
                ));
            }
        },
        Err(e) => {
            return Err(CheckResult::new(
                NAME,
                Status::Fail,
                format!("cannot open {}: {e}", db.display()),
                "run edra doctor as root (the user edra runs as)",
            ));
        }
    }
    Ok(())
}

/// The schema and prepared claims of an opened store, and spec files no claim accounts for.
fn recorded_claims(store: &Store, spec_uids: &[String], found: &mut Findings) {
    let schema = store.schema_version().map(|v| v.to_string()).unwrap_or_else(|_| "unknown".into());
    match store.claims() {
        Ok(c) => {
            found.notes.push(format!("schema {schema}, {} prepared claims", c.len()));
            let orphans = spec_uids.iter().filter(|u| !c.iter().any(|r| &r.uid == *u)).count();
            if orphans > 0 {
                found.warn(
                    format!("{orphans} CDI spec files of claims edra does not record"),
                    "edra removes orphaned spec files at start: restart it",
                );
            }
        }
        Err(e) => found.warn(
            format!("schema {schema}; {}", crate::util::error_chain(&e)),
            "upgrade edra, or move the state directory aside",
        ),
    }
}

#[cfg(test)]
mod tests;
