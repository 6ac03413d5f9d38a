//! Tests of the update-ldcache hook on fake bundles in temp dirs, with the host's real
//! ldconfig and a real shared library compiled for the test.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

use crate::test_support::cc;

struct Bundle {
    _tmp: tempfile::TempDir,
    bundle: PathBuf,
    rootfs: PathBuf,
}

/// A bundle whose config.json names `root_path` (relative or absolute) as the rootfs.
fn bundle(relative_root: bool) -> Bundle {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("bundle");
    let rootfs = bundle.join("rootfs");
    std::fs::create_dir_all(rootfs.join("etc")).unwrap();
    let root_path = if relative_root { "rootfs".to_string() } else { rootfs.display().to_string() };
    let config = serde_json::json!({"ociVersion": "1.2.0", "root": {"path": root_path, "readonly": false}});
    std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();
    Bundle { _tmp: tmp, bundle, rootfs }
}

fn state(bundle: &Path) -> Vec<u8> {
    serde_json::json!({
        "ociVersion": "1.2.0", "id": "c1", "status": "creating", "pid": 4242,
        "bundle": bundle.display().to_string(), "annotations": {"a": "b"}
    })
    .to_string()
    .into_bytes()
}

/// Compiles a tiny shared library with SONAME `libedratest.so.1` into `dir`.
fn compile_library(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let src = dir.join("t.c");
    std::fs::write(&src, "int edra_test_answer(void) { return 42; }\n").unwrap();
    let out = dir.join("libedratest.so.1.0");
    if let Err(e) = cc::shared_library(&src, &out, "libedratest.so.1", &[]) {
        panic!("{e}");
    }
    std::fs::remove_file(src).unwrap();
}

#[test]
fn refreshes_the_cache_with_the_real_ldconfig() {
    let b = bundle(true);
    compile_library(&b.rootfs.join("usr/lib/edra-gpu"));
    let folders = [PathBuf::from("/usr/lib/edra-gpu")];
    update_ldcache(state(&b.bundle).as_slice(), &folders, None).unwrap();

    let conf = std::fs::read_to_string(b.rootfs.join(CONF_FILE)).unwrap();
    assert!(conf.lines().any(|l| l == "/usr/lib/edra-gpu"), "{conf}");
    let main = std::fs::read_to_string(b.rootfs.join("etc/ld.so.conf")).unwrap();
    assert!(main.starts_with(INCLUDE_LINE), "{main}");
    assert!(b.rootfs.join("etc/ld.so.cache").is_file(), "ldconfig wrote no cache");
    let ldconfig = find_ldconfig(None).unwrap();
    let listed = Command::new(ldconfig).arg("-r").arg(&b.rootfs).arg("-p").output().unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains("libedratest.so.1") && listed.contains("/usr/lib/edra-gpu/"), "{listed}");
    // ldconfig also made the SONAME link.
    assert!(b.rootfs.join("usr/lib/edra-gpu/libedratest.so.1").exists());

    // A second run is a no-op on ld.so.conf (the include is not added twice).
    update_ldcache(state(&b.bundle).as_slice(), &folders, None).unwrap();
    let main2 = std::fs::read_to_string(b.rootfs.join("etc/ld.so.conf")).unwrap();
    assert_eq!(main2.matches("ld.so.conf.d/*.conf").count(), 1);
}

#[test]
fn keeps_an_existing_ld_so_conf_and_accepts_an_absolute_root() {
    let b = bundle(false);
    std::fs::write(b.rootfs.join("etc/ld.so.conf"), "/opt/lib\n").unwrap();
    assert_eq!(rootfs_from_state(&state(&b.bundle)).unwrap(), b.rootfs);
    let _ = write_ld_conf(&b.rootfs, &[PathBuf::from("/usr/lib64")]).unwrap();
    let main = std::fs::read_to_string(b.rootfs.join("etc/ld.so.conf")).unwrap();
    assert_eq!(main, format!("{INCLUDE_LINE}\n/opt/lib\n"));
}

#[test]
fn bad_input_is_exit_code_two_with_a_clear_message() {
    let b = bundle(true);
    let cases: Vec<(Vec<u8>, Vec<PathBuf>, &str)> = vec![
        (b"{not json".to_vec(), vec![], "not valid OCI state JSON"),
        (br#"{"ociVersion":"1.2.0","id":"x"}"#.to_vec(), vec![], "not valid OCI state JSON"),
        (state(&b.bundle.join("missing")), vec![], "cannot read the bundle's config"),
        (state(&b.rootfs), vec![], "cannot read the bundle's config"),
        (state(&b.bundle), vec![PathBuf::from("usr/lib")], "must be an absolute path"),
        (state(&b.bundle), vec![PathBuf::from("/usr/../etc")], "must be an absolute path"),
    ];
    for (input, folders, fragment) in cases {
        let err = update_ldcache(input.as_slice(), &folders, Some(Path::new("/bin/false"))).unwrap_err();
        let msg = crate::util::error_chain(&err);
        assert!(msg.contains(fragment), "{msg:?} lacks {fragment:?}");
        assert_eq!(err.exit_code(), 2, "{msg}");
    }
    std::fs::write(b.bundle.join("config.json"), "{\"root\": {}}").unwrap();
    let err = update_ldcache(state(&b.bundle).as_slice(), &[], None).unwrap_err();
    assert!(err.to_string().contains("no usable root.path"), "{err}");
}

#[test]
fn ldconfig_failure_is_exit_code_one() {
    let b = bundle(true);
    let err = update_ldcache(state(&b.bundle).as_slice(), &[PathBuf::from("/usr/lib")], Some(Path::new("/bin/false")))
        .unwrap_err();
    assert_eq!(err.exit_code(), 1);
    assert!(err.to_string().contains("ldconfig failed"), "{err}");
}

#[test]
fn absolute_links_mean_the_containers_paths_never_the_hosts() {
    let b = bundle(true);
    let outside = b.bundle.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    // An absolute link naming a host folder is that path inside the container.
    std::os::unix::fs::symlink(&outside, b.rootfs.join("etc/ld.so.conf.d")).unwrap();
    let _ = write_ld_conf(&b.rootfs, &[PathBuf::from("/usr/lib")]).unwrap();
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing was written outside the rootfs");
    let inside = b.rootfs.join(outside.strip_prefix("/").unwrap()).join("00-edra-gpu.conf");
    assert!(inside.is_file(), "{} written", inside.display());
    // edra's own conf file as a symlink is refused, and the image is left as found.
    let b = bundle(true);
    std::fs::create_dir_all(b.rootfs.join("etc/ld.so.conf.d")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", b.rootfs.join(CONF_FILE)).unwrap();
    let err = write_ld_conf(&b.rootfs, &[PathBuf::from("/usr/lib")]).unwrap_err();
    assert!(matches!(err, HookError::Unsafe { .. }), "{err:?}");
    assert!(!b.rootfs.join("etc/ld.so.conf").exists());
}

#[test]
fn a_failed_read_says_read() {
    let tmp = tempfile::tempdir().unwrap();
    let err = read_file(tmp.path()).unwrap_err();
    assert!(matches!(err, HookError::Read { .. }), "{err:?}");
    assert!(err.to_string().starts_with("cannot read "), "{err}");
    assert_eq!(err.exit_code(), 1);
    // Too large to rewrite: refused whole, never truncated.
    let big = tmp.path().join("ld.so.conf");
    std::fs::write(&big, vec![b'#'; MAX_FILE as usize + 1]).unwrap();
    let err = read_file(&big).unwrap_err();
    assert!(crate::util::error_chain(&err).contains("larger than 1 MiB"), "{err}");
    std::fs::write(&big, vec![b'#'; MAX_FILE as usize]).unwrap();
    assert_eq!(read_file(&big).unwrap().len() as u64, MAX_FILE);
}

fn listed_in_cache(rootfs: &Path) -> String {
    let ldconfig = find_ldconfig(None).unwrap();
    let listed = Command::new(ldconfig).arg("-r").arg(rootfs).arg("-p").output().unwrap();
    String::from_utf8_lossy(&listed.stdout).into_owned()
}

#[test]
fn follows_an_ld_so_conf_d_link_that_stays_in_the_rootfs() {
    for target in ["../usr/etc/ld.so.conf.d", "/usr/etc/ld.so.conf.d"] {
        let b = bundle(true);
        std::fs::create_dir_all(b.rootfs.join("usr/etc/ld.so.conf.d")).unwrap();
        std::fs::write(b.rootfs.join("usr/etc/ld.so.conf.d/libc.conf"), "/usr/local/lib\n").unwrap();
        std::os::unix::fs::symlink(target, b.rootfs.join("etc/ld.so.conf.d")).unwrap();
        compile_library(&b.rootfs.join("usr/lib/edra-gpu"));
        update_ldcache(state(&b.bundle).as_slice(), &[PathBuf::from("/usr/lib/edra-gpu")], None)
            .unwrap_or_else(|e| panic!("{target}: {}", crate::util::error_chain(&e)));
        let conf = std::fs::read_to_string(b.rootfs.join("usr/etc/ld.so.conf.d/00-edra-gpu.conf")).unwrap();
        assert!(conf.lines().any(|l| l == "/usr/lib/edra-gpu"), "{target}: {conf}");
        assert_eq!(std::fs::read_link(b.rootfs.join("etc/ld.so.conf.d")).unwrap(), Path::new(target), "link kept");
        let listed = listed_in_cache(&b.rootfs);
        assert!(listed.contains("libedratest.so.1") && listed.contains("/usr/lib/edra-gpu/"), "{target}: {listed}");
    }
}

#[test]
fn refuses_links_that_leave_the_rootfs() {
    let b = bundle(true);
    let outside = b.bundle.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    // ../../outside from <rootfs>/etc is <bundle>/outside on the host: above the rootfs.
    std::os::unix::fs::symlink("../../outside", b.rootfs.join("etc/ld.so.conf.d")).unwrap();
    let err = write_ld_conf(&b.rootfs, &[PathBuf::from("/usr/lib")]).unwrap_err();
    assert!(matches!(err, HookError::Escapes { .. }), "{err:?}");
    assert!(err.to_string().contains("outside the container's root filesystem"), "{err}");
    assert_eq!(err.exit_code(), 1);
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing was written outside the rootfs");
    assert!(!b.rootfs.join("etc/ld.so.conf").exists(), "the image is left as found");
}

#[test]
fn a_non_utf8_ld_so_conf_is_kept_byte_for_byte() {
    let b = bundle(true);
    let original: &[u8] = b"# caf\xe9 \xff\xfe\n/opt/l\xe9b\n";
    std::fs::write(b.rootfs.join("etc/ld.so.conf"), original).unwrap();
    compile_library(&b.rootfs.join("usr/lib/edra-gpu"));
    update_ldcache(state(&b.bundle).as_slice(), &[PathBuf::from("/usr/lib/edra-gpu")], None)
        .unwrap_or_else(|e| panic!("{}", crate::util::error_chain(&e)));
    let main = std::fs::read(b.rootfs.join("etc/ld.so.conf")).unwrap();
    assert_eq!(main, [format!("{INCLUDE_LINE}\n").as_bytes(), original].concat());
    assert!(listed_in_cache(&b.rootfs).contains("libedratest.so.1"));
    // An include already there (among non-UTF-8 lines) is not added again.
    let with_include: &[u8] = b"\xe9\ninclude /etc/ld.so.conf.d/*.conf\n";
    std::fs::write(b.rootfs.join("etc/ld.so.conf"), with_include).unwrap();
    let _ = write_ld_conf(&b.rootfs, &[PathBuf::from("/usr/lib/edra-gpu")]).unwrap();
    assert_eq!(std::fs::read(b.rootfs.join("etc/ld.so.conf")).unwrap(), with_include);
}

#[test]
fn a_failed_hook_leaves_the_image_as_found() {
    use std::os::unix::fs::PermissionsExt;
    // No ld.so.conf.d before: the folder edra made goes again, ld.so.conf is restored.
    let b = bundle(true);
    let original: &[u8] = b"/opt/l\xe9b\n";
    std::fs::write(b.rootfs.join("etc/ld.so.conf"), original).unwrap();
    std::fs::set_permissions(b.rootfs.join("etc/ld.so.conf"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let err = update_ldcache(state(&b.bundle).as_slice(), &[PathBuf::from("/usr/lib")], Some(Path::new("/bin/false")))
        .unwrap_err();
    assert!(err.to_string().contains("ldconfig failed"), "{err}");
    assert!(!b.rootfs.join("etc/ld.so.conf.d").exists(), "no leftover ld.so.conf.d");
    assert_eq!(std::fs::read(b.rootfs.join("etc/ld.so.conf")).unwrap(), original);
    let mode = std::fs::metadata(b.rootfs.join("etc/ld.so.conf")).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o600, "mode restored");
    let names: Vec<_> = std::fs::read_dir(b.rootfs.join("etc")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["ld.so.conf"], "nothing else in /etc");

    // An existing folder and conf file: the folder stays, the file gets its old contents.
    let b = bundle(true);
    std::fs::create_dir_all(b.rootfs.join("etc/ld.so.conf.d")).unwrap();
    std::fs::write(b.rootfs.join(CONF_FILE), "/old\n").unwrap();
    let err = update_ldcache(state(&b.bundle).as_slice(), &[PathBuf::from("/usr/lib")], Some(Path::new("/bin/false")))
        .unwrap_err();
    assert_eq!(err.exit_code(), 1);
    assert_eq!(std::fs::read_to_string(b.rootfs.join(CONF_FILE)).unwrap(), "/old\n");
    assert!(!b.rootfs.join("etc/ld.so.conf").exists(), "no ld.so.conf left behind");
    let names: Vec<_> =
        std::fs::read_dir(b.rootfs.join("etc/ld.so.conf.d")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["00-edra-gpu.conf"], "no temp files");
}
