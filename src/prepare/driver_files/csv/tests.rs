//! A Jetson's CSV lists on a fake root: what each kind of entry becomes, the spec built
//! from them, and hostile lists and files (skipped with a warning, or a clear error).

use std::path::Path;

use super::*;
use crate::prepare::{cdi, cdi_validate};
use crate::test_support::{captured_logs, tegra};

fn csv_dir(dir: &Path) -> PathBuf {
    dir.join("driver").join(CSV_DIR)
}

fn jetson(dir: &Path) -> tegra::FakeJetson {
    tegra::make(dir, &[("libcuda.so.1.1", b"cuda"), ("libnvrm_gpu.so", b"nvrm")])
}

#[test]
fn lines_are_parsed_and_what_is_not_an_entry_is_said() {
    let text = "# comment\n\n  LIB ,  /usr/lib/a.so \ndev, /dev/nvmap\nsym, /x/../etc/shadow\nfoo, /a\nno comma\n\
                dir, relative/path\nlib, /a\x1b[2J\nlib, /a::b\n";
    let mut skipped = Vec::new();
    let entries = parse(text, Path::new("t.csv"), &mut skipped);
    assert_eq!(
        entries,
        vec![
            Entry { kind: Kind::Lib, path: "/usr/lib/a.so".into() },
            Entry { kind: Kind::Dev, path: "/dev/nvmap".into() },
        ]
    );
    assert_eq!(skipped.len(), 6, "{skipped:?}");
    assert!(skipped[0].starts_with("t.csv:5: not an absolute path"), "{skipped:?}");
    assert!(
        skipped[1].contains("not dev, lib, sym or dir") && skipped[2].contains("not `<kind>, <path>`"),
        "{skipped:?}"
    );
}

#[test]
fn a_fake_orin_gives_nodes_libraries_links_and_folders() {
    let dir = tempfile::tempdir().expect("tempdir");
    let j = jetson(dir.path());
    let (root, dev) = (dir.path().join("driver"), dir.path().join("dev"));
    let (captured, guard) = captured_logs::CapturedLogs::start();
    let files = discover(&root, &dev).expect("found");
    drop(guard);
    let logs = captured.text();
    let lib = root.join(tegra::LIB_DIR);
    if j.nodes {
        assert_eq!(files.device_nodes, [dev.join("nvmap"), dev.join("nvhost-ctrl-gpu"), dev.join("nvgpu/igpu0/ctrl")]);
    } else {
        eprintln!("skipped the device-node part: mknod needs root");
    }
    assert_eq!(files.libraries, [lib.join("libcuda.so.1.1"), lib.join("libnvrm_gpu.so")]);
    assert_eq!(files.library_dirs, std::slice::from_ref(&lib));
    let links: Vec<(&str, &str)> = files.library_links.iter().map(|l| (l.name.as_str(), l.target.as_str())).collect();
    assert_eq!(links, [("libcuda.so.1", "libcuda.so.1.1"), ("libcuda.so", "libcuda.so.1")]);
    assert_eq!(files.directories, [root.join("usr/share/nvidia")]);
    // The entries this module lacks are counted in one warning.
    assert!(logs.contains("CSV entries missing on this host") && logs.contains("libnvidia-absent.so.1"), "{logs}");
}

#[test]
fn the_spec_carries_the_nodes_read_only_mounts_and_both_hooks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let j = jetson(dir.path());
    let (root, dev) = (dir.path().join("driver"), dir.path().join("dev"));
    let files = discover(&root, &dev).expect("found");
    let layout = cdi::SpecLayout {
        vendor: "k8s.gpu.edra.dev",
        dev_root: &dev,
        hook_binary: Path::new("/usr/bin/edra"),
        host_driver_root: None,
    };
    let device = crate::inventory::Device {
        name: "gpu-0".into(),
        kind: crate::inventory::DeviceKind::Gpu,
        uuid: "GPU-1".into(),
        index: 0,
        minor: 0,
        attributes: Default::default(),
        capacity: Default::default(),
        device_nodes: Vec::new(),
        shared: None,
        consumes: None,
    };
    let spec = cdi::build_spec(&layout, "0b7e4a3c-5d6f-4a1b-8c9d-0e1f2a3b4c5d", &[&device], &files);
    assert!(cdi_validate::validate(&spec).is_empty(), "{:?}", cdi_validate::validate(&spec));
    let edits = &spec.container_edits;
    if j.nodes {
        let paths: Vec<&str> = edits.device_nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(paths, ["/dev/nvmap", "/dev/nvhost-ctrl-gpu", "/dev/nvgpu/igpu0/ctrl"]);
    }
    let mounts: Vec<(&str, &str)> =
        edits.mounts.iter().map(|m| (m.container_path.as_str(), m.options[0].as_str())).collect();
    let lib = format!("/{}", tegra::LIB_DIR);
    assert_eq!(
        mounts,
        [
            (format!("{lib}/libcuda.so.1.1").as_str(), "ro"),
            (format!("{lib}/libnvrm_gpu.so").as_str(), "ro"),
            ("/usr/share/nvidia", "ro"),
        ]
    );
    let hooks: Vec<&[String]> = edits.hooks.iter().map(|h| &h.args[2..]).collect();
    assert_eq!(
        hooks[0],
        [
            "create-symlinks".to_string(),
            "--link".into(),
            format!("libcuda.so.1.1::{lib}/libcuda.so.1"),
            "--link".into(),
            format!("libcuda.so.1::{lib}/libcuda.so"),
        ]
    );
    assert_eq!(hooks[1], ["update-ldcache".to_string(), "--folder".into(), lib.clone()]);
    assert_eq!(hooks.len(), 2);
}

#[test]
fn links_and_folders_out_of_the_root_are_skipped_with_a_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    jetson(dir.path());
    let root = dir.path().join("driver");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).expect("mkdir");
    std::fs::write(outside.join("secret.so"), b"s").expect("write");
    std::os::unix::fs::symlink(outside.join("secret.so"), root.join(tegra::LIB_DIR).join("libescape.so"))
        .expect("link");
    std::os::unix::fs::symlink(&outside, root.join("usr/evil")).expect("link");
    std::fs::write(
        csv_dir(dir.path()).join("evil.csv"),
        format!(
            "sym, /{}/libescape.so\nlib, /usr/evil/secret.so\ndir, /{}/libcuda.so.1.1\n",
            tegra::LIB_DIR,
            tegra::LIB_DIR
        ),
    )
    .expect("write");
    let (captured, guard) = captured_logs::CapturedLogs::start();
    let files = discover(&root, &dir.path().join("dev")).expect("found");
    drop(guard);
    let logs = captured.text();
    assert!(!files.libraries.iter().any(|l| l.starts_with(&outside) || l.ends_with("secret.so")), "{files:?}");
    assert!(!files.library_links.iter().any(|l| l.name == "libescape.so"), "{files:?}");
    assert!(logs.contains("the link leads out of the root"), "{logs}");
    assert!(logs.contains("its folder leads out of"), "{logs}");
    assert!(logs.contains("not of that type on this host"), "{logs}");
}

#[test]
fn missing_unreadable_huge_or_linked_lists_are_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, dev) = (dir.path().join("driver"), dir.path().join("dev"));
    let e = discover(&root, &dev).expect_err("no folder");
    assert!(e.to_string().contains("no CSV files in") && e.to_string().contains("paths.driver_root"), "{e}");
    jetson(dir.path());
    let csv = csv_dir(dir.path());
    std::fs::write(csv.join("huge.csv"), vec![b'#'; (MAX_FILE_BYTES + 1) as usize]).expect("write");
    let e = discover(&root, &dev).expect_err("huge");
    assert!(crate::util::error_chain(&e).contains("larger than"), "{}", crate::util::error_chain(&e));
    std::fs::remove_file(csv.join("huge.csv")).expect("rm");
    std::os::unix::fs::symlink("/etc/passwd", csv.join("linked.csv")).expect("link");
    let e = discover(&root, &dev).expect_err("a link");
    assert!(crate::util::error_chain(&e).contains("symbolic link"), "{}", crate::util::error_chain(&e));
    std::fs::remove_file(csv.join("linked.csv")).expect("rm");
    let many = "lib, /usr/lib/x.so\n".repeat(MAX_ENTRIES + 1);
    std::fs::write(csv.join("many.csv"), many).expect("write");
    let e = discover(&root, &dev).expect_err("too many");
    assert!(e.to_string().contains("more than 8192 entries"), "{e}");
    std::fs::remove_file(csv.join("many.csv")).expect("rm");
    std::fs::write(csv.join("bytes.csv"), b"lib, /usr/lib/\xff.so\n").expect("write");
    assert!(matches!(discover(&root, &dev), Err(CsvError::Read { .. })));
}

#[test]
fn a_list_of_which_nothing_exists_here_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = csv_dir(dir.path());
    std::fs::create_dir_all(&csv).expect("mkdir");
    std::fs::write(csv.join("drivers.csv"), "lib, /usr/lib/libcuda.so.1\ndev, /dev/nvmap\n").expect("write");
    let e = discover(&dir.path().join("driver"), &dir.path().join("dev")).expect_err("nothing");
    assert!(e.to_string().contains("none of the 2 entries"), "{e}");
}
