use super::*;
use crate::sharing::Enforcement;

fn exe(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn tools_and_daemons_are_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let (smi, control, run) = (tmp.path().join("bin/nvidia-smi"), tmp.path().join("bin/mps"), tmp.path().join("run"));
    let r = sharing(&smi, &control, &run, Path::new("/proc"), Enforcement::None);
    assert_eq!(r.status, Status::Warn);
    assert!(r.detail.contains("TimeSlicing: ") && r.detail.contains("MPS: "), "{}", r.detail);
    assert!(r.fix.contains("paths.nvidia_smi"), "{}", r.fix);
    exe(&smi);
    let r = sharing(&smi, &control, &run, Path::new("/proc"), Enforcement::None);
    assert!(r.fix.contains("claims asking for MPS will fail") && r.fix.contains("paths.mps_control"), "{}", r.fix);
    let r = sharing(&smi, &control, &run, Path::new("/proc"), Enforcement::Mps);
    assert!(
        r.fix.contains("claims asking for MPS, and every share (sharing.enforcement = \"mps\"), will fail"),
        "{}",
        r.fix
    );
    exe(&control);
    let r = sharing(&smi, &control, &run, Path::new("/proc"), Enforcement::None);
    assert_eq!(
        (r.status, r.detail.as_str()),
        (Status::Pass, "nvidia-smi and nvidia-cuda-mps-control found; no MPS daemons")
    );

    // A live daemon (this process stands in for it) and a dead one.
    let live = run.join("mps/aaaa/pipe");
    std::fs::create_dir_all(&live).unwrap();
    std::fs::write(live.join(PID_FILE), format!("{}\n", std::process::id())).unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let dead = run.join("mps/bbbb/pipe");
    std::fs::create_dir_all(&dead).unwrap();
    std::fs::write(dead.join(PID_FILE), format!("{dead_pid}\n")).unwrap();
    std::fs::create_dir_all(run.join("mps/cccc")).unwrap();
    std::fs::create_dir_all(run.join("mps/shared-gpu-1")).unwrap();
    let r = sharing(&smi, &control, &run, Path::new("/proc"), Enforcement::None);
    assert_eq!(r.status, Status::Warn);
    let expected = format!(
        "4 MPS daemons: claim aaaa: pid {} running; claim bbbb: not running (its pid file names {dead_pid}); claim cccc: not running (no pid file); shared GPU gpu-1: not running (no pid file)",
        std::process::id()
    );
    assert_eq!(r.detail, expected);
    assert!(r.fix.contains(&run.join("mps/bbbb/log/control.log").display().to_string()), "{}", r.fix);
}
