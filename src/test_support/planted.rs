//! Links planted by an unprivileged user, as an attacker on the node would.

use std::os::unix::process::CommandExt;
use std::path::Path;

/// The unprivileged user that plants links (`nobody`).
pub const NOBODY: u32 = 65534;

/// Whether this process runs as root, which planting as another user needs.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Gives `dir` to [`NOBODY`], then has that user create the link `link` → `target`
/// (`ln -s` run with its uid and gid). The caller makes `dir`'s ancestors traversable.
pub fn link_as_nobody(dir: &Path, target: &Path, link: &Path) {
    std::os::unix::fs::chown(dir, Some(NOBODY), Some(NOBODY)).expect("give the directory to nobody");
    let status = std::process::Command::new("ln")
        .arg("-s")
        .arg(target)
        .arg(link)
        .uid(NOBODY)
        .gid(NOBODY)
        .status()
        .expect("run ln as nobody");
    assert!(status.success(), "ln -s as nobody failed: {status}");
    let meta = std::fs::symlink_metadata(link).expect("the planted link");
    assert!(meta.file_type().is_symlink());
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), NOBODY, "the link belongs to nobody");
}
