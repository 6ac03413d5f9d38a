//! Tests of the hook binary's installation on temp dirs.

use std::os::unix::fs::PermissionsExt;

use super::*;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[test]
fn copies_into_new_folders_with_mode_0755_and_leaves_no_temporary_file() {
    let tmp = tempfile::tempdir().unwrap();
    let source = tmp.path().join("edra");
    std::fs::write(&source, b"binary v1").unwrap();
    let dest = tmp.path().join("state/bin/edra");
    assert_eq!(install_from(&source, &dest).unwrap(), Installed::Copied { bytes: 9 });
    assert_eq!(std::fs::read(&dest).unwrap(), b"binary v1");
    assert_eq!(mode(&dest), 0o755);
    assert_eq!(mode(dest.parent().unwrap()), 0o755);
    let names: Vec<_> = std::fs::read_dir(dest.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["edra"]);
}

#[test]
fn the_same_bytes_are_left_alone_and_new_ones_replace_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let source = tmp.path().join("edra");
    let dest = tmp.path().join("edra-hook");
    std::fs::write(&source, b"binary v1").unwrap();
    install_from(&source, &dest).unwrap();
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&dest).unwrap());
    std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(install_from(&source, &dest).unwrap(), Installed::Unchanged { bytes: 9 });
    assert_eq!(std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&dest).unwrap()), inode);
    assert_eq!(mode(&dest), 0o755, "the mode is put right");
    // Same length, other bytes; then another length.
    for next in [&b"binary v2"[..], b"binary v10"] {
        std::fs::write(&source, next).unwrap();
        assert!(matches!(install_from(&source, &dest).unwrap(), Installed::Copied { .. }));
        assert_eq!(std::fs::read(&dest).unwrap(), next);
    }
}

#[test]
fn a_symlink_or_folder_at_the_destination_is_refused_and_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let source = tmp.path().join("edra");
    std::fs::write(&source, b"binary").unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::write(&elsewhere, b"not yours").unwrap();
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    let err = install_from(&source, &link).unwrap_err();
    assert!(matches!(err, InstallError::NotAFile(_)), "{err}");
    assert!(err.to_string().contains("not a regular file"), "{err}");
    assert_eq!(std::fs::read(&elsewhere).unwrap(), b"not yours");
    assert!(matches!(install_from(&source, tmp.path()).unwrap_err(), InstallError::NotAFile(_)));
}

#[test]
fn a_relative_destination_is_refused_with_an_example() {
    let err = install_from(Path::new("/proc/self/exe"), Path::new("bin/edra")).unwrap_err();
    assert!(err.to_string().contains("absolute path") && err.to_string().contains("/var/lib/edra/bin/edra"), "{err}");
}

#[test]
fn the_running_binary_is_copied() {
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("bin/edra");
    let Installed::Copied { bytes } = install(&dest).unwrap() else { panic!("not copied") };
    assert_eq!(bytes, std::fs::metadata(std::env::current_exe().unwrap()).unwrap().len());
}
