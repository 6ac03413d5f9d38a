use std::time::Duration;

use super::*;
use crate::test_support::gpu::FakeNvidiaSmi;

fn smi(path: PathBuf) -> NvidiaSmi {
    NvidiaSmi { path, library_dir: None, timeout: TIMEOUT }
}

#[test]
fn intervals_map_to_nvidia_smi_values() {
    let all = [Interval::Default, Interval::Short, Interval::Medium, Interval::Long];
    assert_eq!(all.map(interval_value), [0, 1, 2, 3]);
}

#[test]
fn the_binary_is_found_under_the_driver_root_unless_configured() {
    let root = Path::new("/run/nvidia/driver");
    assert_eq!(NvidiaSmi::new(None, root, None).path, root.join("usr/bin/nvidia-smi"));
    assert_eq!(NvidiaSmi::new(Some(Path::new("/opt/smi")), root, None).path, Path::new("/opt/smi"));
}

#[test]
fn set_timeslice_runs_compute_policy_with_the_uuid_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeNvidiaSmi::install(dir.path());
    smi(fake.path.clone()).set_timeslice("GPU-1234", 2).unwrap();
    assert_eq!(fake.calls(), vec!["compute-policy -i GPU-1234 --set-timeslice=2"]);
}

#[test]
fn a_failing_command_names_command_status_and_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeNvidiaSmi::install(dir.path());
    fake.fail("GPU-bad", "Insufficient Permissions");
    let s = smi(fake.path.clone());
    s.set_timeslice("GPU-good", 1).unwrap();
    let msg = s.set_timeslice("GPU-bad", 1).unwrap_err().to_string();
    assert!(msg.contains(&format!("{} compute-policy -i GPU-bad --set-timeslice=1", fake.path.display())), "{msg}");
    assert!(msg.contains("exit status 4") && msg.contains("Insufficient Permissions"), "{msg}");
}

#[test]
fn a_missing_binary_names_the_path_and_the_config_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("usr/bin/nvidia-smi");
    let msg = smi(path.clone()).set_timeslice("GPU-1", 0).unwrap_err().to_string();
    assert!(msg.contains(&path.display().to_string()) && msg.contains(CONFIG_KEY), "{msg}");
    // Present but not executable is no better.
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, "#!/bin/sh\n").unwrap();
    assert!(matches!(smi(path).check(), Err(GpuError::MissingBinary { .. })));
}

#[test]
fn a_hanging_command_is_killed_after_the_bound() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nvidia-smi");
    std::fs::write(&path, "#!/bin/sh\nexec sleep 600\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let s = NvidiaSmi { path, library_dir: None, timeout: Duration::from_millis(200) };
    let started = std::time::Instant::now();
    assert!(matches!(s.set_timeslice("GPU-1", 0), Err(GpuError::Timeout { .. })));
    assert!(started.elapsed() < Duration::from_secs(120), "the call was not bounded");
}
