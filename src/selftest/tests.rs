//! The self-test's pure parts: device numbers, slice limits, the report's exit code and
//! its text; the whole command runs against the NVML stand-in in tests/it/selftest.rs.

use std::collections::BTreeMap;
use std::time::Instant;

use super::discovery::slice_problems;
use super::spec::{char_majors, expected, node_problem};
use super::*;

const PROC_DEVICES: &str = "Character devices:\n  1 mem\n195 nvidia\n195 nvidiactl\n238 nvidia-uvm\n\
                            241 nvidia-caps\n\nBlock devices:\n  7 loop\n";

#[test]
fn the_driver_majors_come_from_proc_devices_character_section() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("devices"), PROC_DEVICES).unwrap();
    let majors = char_majors(dir.path());
    assert_eq!(majors.get("nvidia"), Some(&195));
    assert_eq!(majors.get("nvidia-uvm"), Some(&238));
    assert_eq!(majors.get("nvidia-caps"), Some(&241));
    assert_eq!(majors.get("loop"), None, "block devices are not character devices");
}

#[test]
fn each_node_name_has_its_driver_and_minor() {
    assert_eq!(expected("nvidia3"), Some(("nvidia", 3)));
    assert_eq!(expected("nvidiactl"), Some(("nvidia", 255)));
    assert_eq!(expected("nvidia-uvm"), Some(("nvidia-uvm", 0)));
    assert_eq!(expected("nvidia-uvm-tools"), Some(("nvidia-uvm", 1)));
    assert_eq!(expected("nvidia-cap12"), Some(("nvidia-caps", 12)));
    assert_eq!(expected("renderD128"), None);
}

#[test]
fn a_node_with_the_wrong_numbers_a_file_or_nothing_is_a_problem() {
    let dir = tempfile::tempdir().unwrap();
    let majors: BTreeMap<String, u32> = [("nvidia".to_string(), 195)].into();
    let missing = node_problem(&dir.path().join("nvidia0"), &majors).expect("a missing node");
    assert!(missing.contains("nvidia0"), "{missing}");
    std::fs::write(dir.path().join("nvidia1"), b"").unwrap();
    let file = node_problem(&dir.path().join("nvidia1"), &majors).expect("a plain file");
    assert!(file.contains("is not a character device"), "{file}");
    // Device numbers need mknod, which needs root.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped the device-number part: mknod needs root");
        return;
    }
    let mknod = |name: &str, major: u32, minor: u32| {
        let path = std::ffi::CString::new(dir.path().join(name).into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path and plain integers.
        let rc = unsafe { libc::mknod(path.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(major, minor)) };
        assert_eq!(rc, 0, "mknod {name}: {}", std::io::Error::last_os_error());
    };
    mknod("nvidia2", 195, 2);
    mknod("nvidia3", 195, 7);
    mknod("nvidia4", 1, 4);
    assert_eq!(node_problem(&dir.path().join("nvidia2"), &majors), None);
    let wrong_minor = node_problem(&dir.path().join("nvidia3"), &majors).unwrap();
    assert!(wrong_minor.contains("is 195:7, but the driver's nvidia devices are 195:3"), "{wrong_minor}");
    let wrong_major = node_problem(&dir.path().join("nvidia4"), &majors).unwrap();
    assert!(wrong_major.contains("is 1:4"), "{wrong_major}");
}

fn slice(devices: serde_json::Value) -> k8s_openapi::api::resource::v1::ResourceSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "s"},
        "spec": {"driver": "gpu.edra.dev", "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                 "nodeName": "n", "devices": devices}
    }))
    .unwrap()
}

#[test]
fn slices_past_the_api_limits_are_named() {
    let ok: Vec<_> = (0..128).map(|i| serde_json::json!({"name": format!("gpu-{i}")})).collect();
    assert!(slice_problems(&slice(serde_json::json!(ok))).is_empty());
    let many: Vec<_> = (0..129).map(|i| serde_json::json!({"name": format!("gpu-{i}")})).collect();
    assert_eq!(slice_problems(&slice(serde_json::json!(many))), ["129 devices in one slice (at most 128)"]);
    let attributes: serde_json::Map<_, _> = (0..33).map(|i| (format!("a{i}"), serde_json::json!({"int": i}))).collect();
    let bad = serde_json::json!([
        {"name": "GPU_0"},
        {"name": "gpu-1", "attributes": attributes},
        {"name": "gpu-2", "attributes": {"productName": {"string": "x".repeat(65)}}},
        {"name": "gpu-2"}
    ]);
    let problems = slice_problems(&slice(bad));
    assert_eq!(
        problems,
        [
            "device name \"GPU_0\" is not a DNS label",
            "gpu-1: 33 attributes and capacities (at most 32)",
            "gpu-2: attribute productName is longer than 64 bytes",
            "device name gpu-2 twice",
        ]
    );
}

fn report(statuses: &[Status]) -> Report {
    let checks = statuses
        .iter()
        .enumerate()
        .map(|(i, s)| Check::new("backend", Some(&format!("gpu-{i}")), *s, Instant::now(), "found\nit", "fix it"))
        .collect();
    let mut r = Report {
        schema: SCHEMA,
        version: crate::VERSION,
        backend: "mock".into(),
        node: "n1".into(),
        gpus: Vec::new(),
        checks,
        summary: Summary::default(),
    };
    r.finish(Instant::now());
    r
}

#[test]
fn only_a_failed_check_fails_the_run_and_texts_are_one_line() {
    assert_eq!(report(&[Status::Pass, Status::Skip, Status::Warn]).exit_code(), 0);
    let failed = report(&[Status::Pass, Status::Fail]);
    assert_eq!(failed.exit_code(), 1);
    assert_eq!((failed.summary.passed, failed.summary.failed), (1, 1));
    assert_eq!(failed.checks[0].detail, "found it");
    let text = render::text(&failed);
    assert!(text.contains("FAIL    backend  gpu-1"), "{text}");
    assert!(text.contains("fix: fix it"), "{text}");
    assert!(text.contains("1 passed, 0 warnings, 1 failed, 0 skipped"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&render::json(&failed)).unwrap();
    assert_eq!(json["schema"], "edra.selftest/v1");
    assert_eq!(json["checks"][1]["status"], "fail");
    assert_eq!(json["checks"][1]["gpu"], "gpu-1");
}

#[test]
fn text_from_outside_in_a_check_is_shown_escaped() {
    let check = Check::new("backend", None, Status::Fail, Instant::now(), "NVIDIA \x1b[2J\u{9b}H100", "fix\x07");
    assert_eq!(check.detail, "NVIDIA \\u{1b}[2J\\u{9b}H100");
    assert_eq!(check.fix, "fix\\u{7}");
}
