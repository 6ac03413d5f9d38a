//! create-symlinks on temp rootfs trees: parsing, creation, idempotence, replacement, and
//! symlinked folders resolved inside the rootfs (never outside it).

use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Path, PathBuf};

use super::*;

fn spec(target: &str, link: &str) -> LinkSpec {
    LinkSpec { target: target.into(), link: link.into() }
}

fn target_of(p: &Path) -> PathBuf {
    std::fs::read_link(p).unwrap()
}

#[test]
fn parses_target_then_link_and_rejects_bad_links() {
    assert_eq!(
        parse_link("libcuda.so.1::/usr/lib64/libcuda.so").unwrap(),
        spec("libcuda.so.1", "/usr/lib64/libcuda.so")
    );
    assert_eq!(parse_link("a::b::/x").unwrap(), spec("a::b", "/x"), "split at the last '::'");
    for bad in ["", "x", "::/x", "t::", "t::rel/x", "t::/a/../x", "t::/a/./x", "t::/", "t\0::/x", "t::/x\ny"] {
        let e = parse_link(bad).unwrap_err();
        assert!(matches!(e, HookError::Link { .. }), "{bad:?}: {e}");
        assert_eq!(e.exit_code(), 2);
    }
}

#[test]
fn creates_folders_and_links_then_leaves_right_links_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let rootfs = tmp.path();
    let link = spec("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so");
    assert_eq!(create_link(rootfs, &link).unwrap(), LinkOutcome::Written);
    let path = rootfs.join("usr/lib/x86_64-linux-gnu/libcuda.so");
    assert_eq!(target_of(&path), Path::new("libcuda.so.1"));
    let mode = std::fs::metadata(rootfs.join("usr/lib")).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o755);
    let inode = std::fs::symlink_metadata(&path).unwrap().ino();
    assert_eq!(create_link(rootfs, &link).unwrap(), LinkOutcome::Unchanged);
    assert_eq!(std::fs::symlink_metadata(&path).unwrap().ino(), inode, "untouched");

    assert_eq!(
        create_link(rootfs, &spec("libcuda.so.2", "/usr/lib/x86_64-linux-gnu/libcuda.so")).unwrap(),
        LinkOutcome::Written
    );
    assert_eq!(target_of(&path), Path::new("libcuda.so.2"), "a wrong link is replaced");
    std::fs::write(rootfs.join("usr/lib/x86_64-linux-gnu/libfoo.so"), b"stub").unwrap();
    create_link(rootfs, &spec("libfoo.so.1", "/usr/lib/x86_64-linux-gnu/libfoo.so")).unwrap();
    assert_eq!(target_of(&rootfs.join("usr/lib/x86_64-linux-gnu/libfoo.so")), Path::new("libfoo.so.1"));
    let names: Vec<_> =
        std::fs::read_dir(rootfs.join("usr/lib/x86_64-linux-gnu")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 2, "no temp names left: {names:?}");

    std::fs::create_dir(rootfs.join("usr/lib/dir.so")).unwrap();
    let e = create_link(rootfs, &spec("x", "/usr/lib/dir.so")).unwrap_err();
    assert!(matches!(e, HookError::Unsafe { .. }), "{e}");
    std::fs::write(rootfs.join("usr/file"), b"").unwrap();
    let e = create_link(rootfs, &spec("x", "/usr/file/y")).unwrap_err();
    assert!(matches!(e, HookError::Unsafe { .. }), "a file is not a folder: {e}");
}

#[test]
fn symlinked_folders_resolve_inside_the_rootfs() {
    let tmp = tempfile::tempdir().unwrap();
    let rootfs = tmp.path().join("rootfs");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(rootfs.join("usr/lib64")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    // usrmerge: /lib64 → usr/lib64 (relative) works as in the container.
    symlink("usr/lib64", rootfs.join("lib64")).unwrap();
    create_link(&rootfs, &spec("libcuda.so.1", "/lib64/libcuda.so")).unwrap();
    assert_eq!(target_of(&rootfs.join("usr/lib64/libcuda.so")), Path::new("libcuda.so.1"));
    // Absolute and '..'-laden links point at the rootfs's own folders, never the host's.
    symlink(&outside, rootfs.join("abs")).unwrap();
    symlink("../../../../../outside", rootfs.join("usr/up")).unwrap();
    create_link(&rootfs, &spec("t", "/abs/a")).unwrap();
    create_link(&rootfs, &spec("t", "/usr/up/b")).unwrap();
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing written outside the rootfs");
    let inside = rootfs.join(outside.strip_prefix("/").unwrap());
    assert_eq!(target_of(&inside.join("a")), Path::new("t"));
    assert_eq!(target_of(&rootfs.join("outside/b")), Path::new("t"));
    // A loop is refused, not followed forever.
    symlink("loop2", rootfs.join("loop1")).unwrap();
    symlink("loop1", rootfs.join("loop2")).unwrap();
    let e = create_link(&rootfs, &spec("t", "/loop1/x")).unwrap_err();
    assert!(matches!(e, HookError::Unsafe { .. }), "{e}");
}

#[test]
fn the_hook_reads_the_state_and_checks_arguments_first() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("bundle");
    std::fs::create_dir_all(bundle.join("rootfs")).unwrap();
    std::fs::write(bundle.join("config.json"), r#"{"root": {"path": "rootfs"}}"#).unwrap();
    let state = serde_json::json!({"ociVersion": "1.2.0", "id": "c", "status": "creating", "pid": 7, "bundle": bundle})
        .to_string();
    let links =
        ["libcuda.so.1::/usr/lib64/libcuda.so".to_string(), "libcuda.so.550.54.15::/usr/lib64/libcuda.so.1".into()];
    create_symlinks(state.as_bytes(), &links).unwrap();
    assert_eq!(target_of(&bundle.join("rootfs/usr/lib64/libcuda.so.1")), Path::new("libcuda.so.550.54.15"));
    let e = create_symlinks(&b"not json"[..], &["bad".into()]).unwrap_err();
    assert!(matches!(e, HookError::Link { .. }), "arguments are checked before stdin: {e}");
    let e = create_symlinks(&b"{}"[..], &links).unwrap_err();
    assert_eq!(e.exit_code(), 2, "{e}");
}
