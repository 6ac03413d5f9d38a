use super::*;
use std::os::unix::fs::PermissionsExt;

#[test]
fn group_or_other_write_opens_a_directory_unless_it_is_roots_and_sticky() {
    assert!(!writable_by_others(0o755, 0));
    assert!(!writable_by_others(0o700, 1000));
    assert!(writable_by_others(0o775, 0));
    assert!(writable_by_others(0o757, 0));
    assert!(writable_by_others(0o777, 1000));
    assert!(!writable_by_others(0o1777, 0), "root's sticky directory, as /tmp");
    assert!(writable_by_others(0o1777, 1000), "another user's sticky directory is theirs to rename");
}

#[test]
fn only_existing_directories_others_can_write_are_named_with_their_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let paths = Paths::under(tmp.path());
    for d in [&paths.cdi_dynamic_dir, &paths.registry_dir, &paths.state_dir] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    assert_eq!(open_dirs(&paths, "gpu.edra.dev"), []);
    std::fs::set_permissions(&paths.cdi_dynamic_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::set_permissions(&paths.registry_dir, std::fs::Permissions::from_mode(0o770)).unwrap();
    let open = open_dirs(&paths, "gpu.edra.dev");
    let named: Vec<(&str, &std::path::Path, u32)> = open.iter().map(|o| (o.role, o.path.as_path(), o.mode)).collect();
    assert_eq!(
        named,
        [
            ("edra's CDI directory", paths.cdi_dynamic_dir.as_path(), 0o777),
            ("kubelet plugin registry", paths.registry_dir.as_path(), 0o770)
        ]
    );
    assert_eq!(open[0].fix(), format!("chmod go-w {}", paths.cdi_dynamic_dir.display()));
    assert_eq!(open[0].to_string(), format!("edra's CDI directory {} (mode 0777)", paths.cdi_dynamic_dir.display()));
}
