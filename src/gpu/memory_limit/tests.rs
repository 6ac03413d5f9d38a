use std::path::{Path, PathBuf};

use super::cgroup::{expand_slice, relative_path};
use super::wire::{Answer, Request, decode, encode};
use super::{Backend, Host, detect, parse_memacct_mode};

#[test]
fn systemd_paths_expand_like_runc() {
    let cases = [
        (
            "kubepods-burstable-pod1234.slice:cri-containerd:abc",
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/cri-containerd-abc.scope",
        ),
        ("machine.slice:libpod:0123", "machine.slice/libpod-0123.scope"),
        ("system.slice:runc:x", "system.slice/runc-x.scope"),
        (":runc:x", "system.slice/runc-x.scope"),
        ("-.slice:p:x", "p-x.scope"),
        ("user.slice:p:child.slice", "user.slice/child.slice"),
        ("a.slice::x", "a.slice/x.scope"),
    ];
    for (given, want) in cases {
        assert_eq!(relative_path(given), Ok(PathBuf::from(want)), "{given}");
    }
}

#[test]
fn cgroupfs_paths_are_taken_below_the_root() {
    assert_eq!(relative_path("/kubepods/burstable/pod1/abc"), Ok(PathBuf::from("kubepods/burstable/pod1/abc")));
    assert_eq!(relative_path("/libpod_parent/libpod-1"), Ok(PathBuf::from("libpod_parent/libpod-1")));
}

#[test]
fn hostile_or_unknown_paths_are_refused_with_the_reason() {
    let cases = [
        ("", "no linux.cgroupsPath"),
        ("relative/x", "is relative"),
        ("/a/../../etc", "'..'"),
        ("/a/./b", "'.'"),
        ("//a", "empty component"),
        ("/", "cgroup root"),
        ("a:b", "neither"),
        ("a:b:c:d", "neither"),
        ("bad:p:x", "not a systemd slice"),
        ("a--b.slice:p:x", "not a systemd slice"),
        ("a.slice:p:", "no unit name"),
        ("a.slice:p:x/../y", "'/'"),
        ("/a\0b", "NUL"),
    ];
    for (given, why) in cases {
        let e = relative_path(given).expect_err(given);
        assert!(e.contains(why), "{given:?}: {e}");
    }
    let long = format!("/{}", "a".repeat(super::cgroup::MAX_LEN));
    assert!(relative_path(&long).is_err());
    assert_eq!(expand_slice("-.slice"), Ok(PathBuf::new()));
}

#[test]
fn rm_memacct_mode_is_read_from_the_registry_dwords() {
    let p = |s: &str| parse_memacct_mode(s);
    assert_eq!(p("Foo: 1\nRegistryDwords: \"RmMemacctMode=1\"\n"), Some(1));
    assert_eq!(p("RegistryDwords: \"A=2;RmMemacctMode=0x3\"\n"), Some(3));
    assert_eq!(p("RegistryDwords: \"rmmemacctmode=0\""), Some(0));
    assert_eq!(p("RegistryDwords: \"\"\n"), None);
    assert_eq!(p("ModifyDeviceFiles: 1\n"), None);
}

#[test]
fn wire_lines_round_trip_and_are_bounded() {
    let req = Request {
        claim: "u".into(),
        device: "gpu-0".into(),
        share_id: Some("s".into()),
        cgroup: "a.slice/b.scope".into(),
        container: "c".into(),
    };
    assert_eq!(decode::<Request>(&encode(&req)), Ok(req));
    assert!(decode::<Request>(br#"{"claim":"u","device":"d","cgroup":"c","extra":1}"#).is_err());
    assert!(decode::<Answer>(&vec![b' '; super::wire::MAX_LINE + 1]).unwrap_err().contains("longer"));
}

/// A fake host: `<root>/sys/fs/cgroup` with `controllers`, `<root>/proc/driver/nvidia/params`.
fn host_dir(controllers: Option<&str>, capacity: Option<&str>, params: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let cg = dir.path().join("sys/fs/cgroup");
    std::fs::create_dir_all(&cg).unwrap();
    if let Some(c) = controllers {
        std::fs::write(cg.join("cgroup.controllers"), c).unwrap();
    }
    if let Some(c) = capacity {
        std::fs::write(cg.join("dmem.capacity"), c).unwrap();
    }
    let nv = dir.path().join("proc/driver/nvidia");
    std::fs::create_dir_all(&nv).unwrap();
    if let Some(p) = params {
        std::fs::write(nv.join("params"), p).unwrap();
    }
    dir
}

fn run_detect(dir: &Path, libraries: &[PathBuf]) -> super::Detection {
    let sys = dir.join("sys");
    let proc = dir.join("proc");
    detect(&Host { libraries, sys_root: &sys, proc_root: &proc }).0
}

#[test]
fn without_an_nvml_library_nothing_is_available_and_every_reason_is_said() {
    let dir = host_dir(Some("cpu memory"), None, None);
    let d = run_detect(dir.path(), &[dir.path().join("absent.so")]);
    assert_eq!(d.backend, None);
    assert!(d.summary().contains("not available") && d.summary().contains("cannot load"), "{}", d.summary());
    let dir = host_dir(None, None, None);
    let d = run_detect(dir.path(), &[]);
    assert!(d.reasons.iter().any(|r| r.contains("not a cgroup v2")), "{:?}", d.reasons);
    assert_eq!(Backend::Dmem.name(), "the kernel's dmem cgroup controller");
}

#[test]
fn the_doctor_says_which_enforcement_and_why() {
    use crate::doctor::Status;
    use crate::doctor::memory_limit::evaluate;
    use crate::sharing::MemoryLimit;
    let none = super::Detection {
        backend: None,
        reasons: vec!["libnvidia-ml.so.1 has no nvmlDeviceSetMemoryLimits_v1".into()],
    };
    let dmem = super::Detection { backend: Some(Backend::Dmem), reasons: vec!["cgroup v2 with dmem".into()] };
    let r = evaluate(MemoryLimit::Enforced, &none);
    assert_eq!(r.status, Status::Fail);
    assert!(r.detail.contains("refuses to start") && r.detail.contains("has no nvmlDeviceSetMemoryLimits_v1"), "{r:?}");
    assert_eq!(evaluate(MemoryLimit::Auto, &none).status, Status::Warn);
    assert_eq!(evaluate(MemoryLimit::Advisory, &none).status, Status::Pass);
    let r = evaluate(MemoryLimit::Auto, &dmem);
    assert!(r.status == Status::Pass && r.detail.contains("dmem cgroup controller"), "{r:?}");
}

#[test]
fn populated_is_read_from_cgroup_events() {
    use super::exits::{parse_populated, populated};
    assert_eq!(parse_populated("populated 1\nfrozen 0\n"), Some(true));
    assert_eq!(parse_populated("populated 0\nfrozen 0\n"), Some(false));
    assert_eq!(parse_populated("frozen 0\n"), None);
    assert_eq!(parse_populated("populated 2\n"), None);
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(populated(dir.path()), None, "no cgroup.events: not a cgroup");
    std::fs::write(dir.path().join("cgroup.events"), "populated 0\nfrozen 0\n").unwrap();
    assert_eq!(populated(dir.path()), Some(false));
    // A link planted as cgroup.events is not followed.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("cgroup.events"), "populated 1\n").unwrap();
    std::fs::remove_file(dir.path().join("cgroup.events")).unwrap();
    std::os::unix::fs::symlink(other.path().join("cgroup.events"), dir.path().join("cgroup.events")).unwrap();
    assert_eq!(populated(dir.path()), None);
}

#[test]
fn the_watch_says_when_a_watched_cgroup_events_file_changes_and_only_then() {
    use super::exits::CgroupExits;
    let exits = CgroupExits::new().unwrap();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for d in [&a, &b] {
        std::fs::write(d.path().join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
    }
    exits.watch(a.path()).unwrap();
    exits.watch(a.path()).unwrap();
    assert!(!exits.drain().unwrap(), "nothing changed yet");
    std::fs::write(b.path().join("cgroup.events"), "populated 0\nfrozen 0\n").unwrap();
    assert!(!exits.drain().unwrap(), "b is not watched");
    std::fs::write(a.path().join("cgroup.events"), "populated 0\nfrozen 0\n").unwrap();
    assert!(exits.drain().unwrap(), "a changed");
    assert!(!exits.drain().unwrap(), "drained");
    let gone = a.path().join("gone");
    let err = exits.watch(&gone).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
}
