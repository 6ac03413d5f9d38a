//! Tests of the update-ldcache hook on fake bundles in temp dirs, with the host's real
//! ldconfig and a real shared library compiled for the test.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

/// The tests' C compiler helper (honours `CC`), shared with the integration tests.
mod cc {
    include!("../tests/it/support/cc.rs");
}

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
    write_ld_conf(&b.rootfs, &[PathBuf::from("/usr/lib64")]).unwrap();
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
        let msg = crate::app::error_chain(&err);
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
fn refuses_to_write_through_symlinks_in_the_rootfs() {
    let b = bundle(true);
    let outside = b.bundle.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, b.rootfs.join("etc/ld.so.conf.d")).unwrap();
    let err = write_ld_conf(&b.rootfs, &[PathBuf::from("/usr/lib")]).unwrap_err();
    assert!(matches!(err, HookError::Unsafe { .. }), "{err:?}");
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing was written outside the rootfs");
}
