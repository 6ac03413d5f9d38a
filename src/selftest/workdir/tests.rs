//! The self-test's folder: directories another user can change are refused with the fix;
//! a folder made in a sticky directory and one whose parent another user swaps for links
//! are still reached through the held descriptor, so no planted link is followed. The
//! parts with another user run the other user's steps as `nobody` (uid 65534) in a child
//! process and need root; without it they say so and stop.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use super::*;

const NOBODY: u32 = 65534;

fn root_or_skip(what: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped {what}: acting as another user (nobody) needs root");
    }
    root
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn chown(p: &Path, uid: u32) {
    std::os::unix::fs::chown(p, Some(uid), Some(uid)).unwrap();
}

/// `sh -c script` as nobody, with `args` as $1..., its stderr piped.
fn as_nobody(script: &str, args: &[&Path]) -> std::process::Child {
    Command::new("/bin/sh")
        .args(["-c", script, "sh"])
        .args(args)
        .uid(NOBODY)
        .gid(NOBODY)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("sh as nobody")
}

fn refusal(base: &Path) -> String {
    match WorkDir::new(base, "--work-dir") {
        Err(e @ WorkDirError::Unsafe { .. }) => e.to_string(),
        Err(e) => panic!("{}: not refused as unsafe but {e}", base.display()),
        Ok(w) => panic!("{}: accepted as {}", base.display(), w.path().display()),
    }
}

#[test]
fn a_directory_others_may_write_without_the_sticky_bit_is_refused_with_the_fix() {
    let top = tempfile::tempdir().unwrap();
    for (mode, who) in [(0o777, "writable by others (mode 777)"), (0o770, "writable by its group (mode 770)")] {
        chmod(top.path(), mode);
        let e = refusal(top.path());
        assert!(e.contains(&format!("refusing {} (--work-dir)", top.path().display())), "{e}");
        assert!(e.contains(who) && e.contains("without the sticky bit"), "{e}");
        assert!(e.contains("`--work-dir /var/tmp`") && e.contains("`chmod go-w`"), "{e}");
    }
    chmod(top.path(), 0o1777);
    let work = WorkDir::new(top.path(), "--work-dir").expect("a sticky directory, as /tmp");
    let meta = std::fs::metadata(work.path()).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o700, "the folder is edra's alone");
    assert!(work.path().starts_with("/proc"), "{}", work.path().display());
    drop(work);
    assert_eq!(std::fs::read_dir(top.path()).unwrap().count(), 0, "removed at the end");
}

#[test]
fn a_directory_another_user_owns_is_refused_even_sticky() {
    if !root_or_skip("a_directory_another_user_owns_is_refused_even_sticky") {
        return;
    }
    let top = tempfile::tempdir().unwrap();
    chown(top.path(), NOBODY);
    for mode in [0o755, 0o1777] {
        chmod(top.path(), mode);
        let e = refusal(top.path());
        assert!(e.contains("it is owned by uid 65534, not by root"), "{e}");
        assert!(e.contains("`--work-dir /var/tmp`"), "{e}");
    }
}

/// As nobody: while `$1` is there and `$1/stop` is not, rename every `edra-selftest-*` folder in `$1`
/// aside and put a link to `$2` in its place.
const RENAMER: &str = r#"while [ -d "$1" ] && [ ! -e "$1/stop" ]; do
  for d in "$1"/edra-selftest-*; do
    if [ -d "$d" ] && [ ! -L "$d" ] && mv "$d" "$d.aside" 2>/dev/null; then ln -s "$2" "$d"; fi
  done
done
exit 0"#;

/// A renamer that is killed if the test fails before stopping it.
struct Racer(std::process::Child);

impl Drop for Racer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A root-owned 0600 file that must stay as it is, in a folder nobody can enter.
fn victim(top: &Path) -> std::path::PathBuf {
    let victim = top.join("victim");
    std::fs::create_dir(&victim).unwrap();
    chmod(&victim, 0o700);
    std::fs::write(victim.join("db"), b"precious").unwrap();
    chmod(&victim.join("db"), 0o600);
    victim
}

fn intact(victim: &Path) {
    assert_eq!(std::fs::read(victim.join("db")).unwrap(), b"precious", "the victim file was overwritten");
    let names: Vec<_> = std::fs::read_dir(victim).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["db"], "something was written into the victim folder");
}

/// The store opened at `work/state`, with a write that reaches the disk.
fn use_store(work: &WorkDir) {
    let store = crate::state::Store::open(&work.path().join("state")).expect("open the store");
    store.sync().expect("sync the store");
}

#[test]
fn a_racing_renamer_gets_a_nobody_owned_directory_refused_and_cannot_swap_in_a_sticky_one() {
    if !root_or_skip("a_racing_renamer_gets_a_nobody_owned_directory_refused_and_cannot_swap_in_a_sticky_one") {
        return;
    }
    let top = tempfile::tempdir().unwrap();
    chmod(top.path(), 0o755);
    let victim = victim(top.path());
    let owned = top.path().join("nobodys");
    std::fs::create_dir(&owned).unwrap();
    chown(&owned, NOBODY);
    let sticky = top.path().join("sticky");
    std::fs::create_dir(&sticky).unwrap();
    chmod(&sticky, 0o1777);
    let mut racers = [Racer(as_nobody(RENAMER, &[&owned, &victim])), Racer(as_nobody(RENAMER, &[&sticky, &victim]))];
    for _ in 0..20 {
        let e = refusal(&owned);
        assert!(e.contains("owned by uid 65534"), "{e}");
        let work = WorkDir::new(&sticky, "TMPDIR").expect("a root-owned sticky directory");
        use_store(&work);
        drop(work);
    }
    for dir in [&owned, &sticky] {
        std::fs::write(dir.join("stop"), b"").unwrap();
    }
    for racer in &mut racers {
        let out = racer.0.wait().unwrap();
        assert!(out.success(), "the renamer failed");
    }
    intact(&victim);
    let left: Vec<_> = std::fs::read_dir(&sticky).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["stop"], "every folder was removed and none could be swapped");
}

#[test]
fn a_folder_whose_parent_another_user_swaps_for_links_is_still_reached_by_descriptor() {
    if !root_or_skip("a_folder_whose_parent_another_user_swaps_for_links_is_still_reached_by_descriptor") {
        return;
    }
    // top (root, 0755) / nobodys (nobody's) / shared (root, 1777, as /tmp): the base
    // itself is safe, but nobody may rename it away, since its parent is nobody's.
    let top = tempfile::tempdir().unwrap();
    chmod(top.path(), 0o755);
    let victim = victim(top.path());
    let parent = top.path().join("nobodys");
    std::fs::create_dir(&parent).unwrap();
    chown(&parent, NOBODY);
    let base = parent.join("shared");
    std::fs::create_dir(&base).unwrap();
    chmod(&base, 0o1777);
    let e = refusal(&base);
    assert!(e.contains("the directory above it") && e.contains("owned by uid 65534"), "{e}");
    // The folder made all the same, as if the parent had been swapped after the checks.
    let held = std::fs::File::open(&base).unwrap();
    let work = WorkDir::make(held, &base, 0).expect("a root-owned sticky directory");
    let name = work.name.clone();
    // nobody swaps the base for a folder of its own in which edra's folder's name is a
    // link to the victim's folder.
    let swap = r#"mv "$1/shared" "$1/aside" && mkdir "$1/shared" && ln -s "$2" "$1/shared/$3""#;
    let name_path = Path::new(&name);
    let out = as_nobody(swap, &[&parent, &victim, name_path]).wait_with_output().unwrap();
    assert!(out.status.success(), "the swap as nobody: {}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::symlink_metadata(base.join(&name)).unwrap().is_symlink());
    use_store(&work);
    intact(&victim);
    assert!(parent.join("aside").join(&name).join("state").is_dir(), "the store is in the folder edra made");
    drop(work);
    assert!(!parent.join("aside").join(&name).exists(), "the folder is removed where it is now");
    assert!(std::fs::symlink_metadata(base.join(&name)).unwrap().is_symlink(), "the planted link is left alone");
    intact(&victim);
}
