use super::check_cdi_dir;
use crate::test_support::planted;

#[test]
fn the_write_check_removes_a_link_planted_under_its_name_without_writing_through_it() {
    use std::os::unix::fs::PermissionsExt;
    if !planted::is_root() {
        eprintln!("skipped: planting a link as another user needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let secret = tmp.path().join("secret");
    std::fs::write(&secret, "root's secret\n").unwrap();
    let cdi = tmp.path().join("cdi");
    std::fs::create_dir(&cdi).unwrap();
    let probe = cdi.join(format!(".edra-write-check-{}", std::process::id()));
    planted::link_as_nobody(&cdi, &secret, &probe);
    check_cdi_dir(&cdi).expect("the directory is writable");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root's secret\n", "not truncated through the link");
    assert!(std::fs::symlink_metadata(&probe).is_err(), "the planted link is gone");
}
