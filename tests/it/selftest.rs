//! `edra selftest` as a process against the NVML stand-in: a node laid out in a temp dir
//! (real ELF driver libraries, device nodes made with mknod, `<proc>/devices`), where every
//! check passes; then one broken thing at a time, each failing its own check with a fix.
//! Device nodes and the hooks' `ldconfig -r` need root: without it the tests say so and
//! stop (CI runs as root).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::cc::shared_library;
use crate::support::mps::{FakeMpsControl, is_root};
use crate::support::nvidia_smi::FakeNvidiaSmi;
use crate::support::nvml::{StubNvml, a100};

const VERSION: &str = "550.54.15";
const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";

/// A node in a temp dir with one A100 on the stand-in.
struct Node {
    dir: tempfile::TempDir,
    nvml: StubNvml,
    mps: FakeMpsControl,
}

fn mknod(path: &Path, major: u32, minor: u32) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a NUL-terminated path and plain integers.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(major, minor)) };
    assert_eq!(rc, 0, "mknod {}: {}", path.display(), std::io::Error::last_os_error());
}

impl Node {
    fn new(gpu_extra: &str, nvml_extra: &str) -> Node {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let conf =
            format!("driver;version={VERSION};cuda=12040\n{}{nvml_extra}", a100(0, 0, "00000000:3B:00.0", false));
        let conf = conf.replacen(";mig=0\n", &format!(";mig=0{gpu_extra}\n"), 1);
        let nvml = StubNvml::new(&conf);
        // nvml.library is a path under the driver root: the stand-in's folder is reached there.
        let stub_dir = nvml.dir.path();
        let inside = root.join("driver").join(stub_dir.strip_prefix("/").expect("an absolute temp dir"));
        std::fs::create_dir_all(inside.parent().expect("a parent")).expect("the stand-in's parent under the root");
        std::os::unix::fs::symlink(stub_dir, &inside).expect("link the stand-in's folder under the driver root");
        let libs = root.join("driver").join(LIB_DIR);
        std::fs::create_dir_all(&libs).expect("library folder");
        let src = root.join("lib.c");
        std::fs::write(&src, "int edra_selftest_library(void) { return 1; }\n").expect("lib.c");
        for (stem, soname) in [("libcuda.so", "libcuda.so.1"), ("libnvidia-ml.so", "libnvidia-ml.so.1")] {
            let file = format!("{stem}.{VERSION}");
            shared_library(&src, &libs.join(&file), soname, &[]).unwrap_or_else(|e| panic!("{e}"));
            std::os::unix::fs::symlink(&file, libs.join(soname)).expect("soname link");
        }
        FakeNvidiaSmi::install(&root.join("driver/usr/bin/nvidia-smi"));
        let mps = FakeMpsControl::install(&root.join("driver/usr/bin/nvidia-cuda-mps-control"));
        let dev = root.join("dev");
        std::fs::create_dir_all(&dev).expect("dev");
        for (name, major, minor) in [("nvidia0", 195, 0), ("nvidiactl", 195, 255), ("nvidia-uvm", 238, 0)] {
            if is_root() {
                mknod(&dev.join(name), major, minor);
            } else {
                std::fs::write(dev.join(name), b"").expect("a device node's stand-in");
            }
        }
        let proc = root.join("proc");
        std::fs::create_dir_all(proc.join("sys/kernel/random")).expect("proc");
        std::fs::write(proc.join("sys/kernel/random/boot_id"), "b00710\n").expect("boot id");
        std::fs::write(proc.join("devices"), "Character devices:\n195 nvidia\n238 nvidia-uvm\n\nBlock devices:\n")
            .expect("devices");
        std::fs::create_dir_all(root.join("sys")).expect("sys");
        std::fs::create_dir_all(root.join("work")).expect("work");
        Node { dir, nvml, mps }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn config(&self) -> PathBuf {
        let r = self.root().display();
        let text = format!(
            "backend = \"nvml\"\nnode_name = \"n1\"\n[nvml]\nlibrary = \"{}\"\n[paths]\ndriver_root = \"{r}/driver\"\n\
             dev_root = \"{r}/dev\"\nproc_root = \"{r}/proc\"\nsys_root = \"{r}/sys\"\nstate_dir = \"{r}/node-state\"\n\
             runtime_dir = \"{r}/node-run\"\n",
            self.nvml.library.display()
        );
        let file = self.root().join("edra.toml");
        std::fs::write(&file, text).expect("config");
        file
    }

    /// `edra selftest -o json <args>`: the exit code and the report.
    fn selftest(&self, args: &[&str]) -> (i32, Value, Duration) {
        let started = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_edra"))
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .arg("--config")
            .arg(self.config())
            .args(["selftest", "-o", "json", "--work-dir"])
            .arg(self.root().join("work"))
            .args(args)
            .output()
            .expect("run edra selftest");
        let took = started.elapsed();
        let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is no JSON report ({e}): {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code().unwrap_or(-1), report, took)
    }
}

/// The check called `name`: status, detail, fix.
fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {name} check in {report:#}"))
}

fn status(report: &Value, name: &str) -> String {
    check(report, name)["status"].as_str().unwrap_or_default().to_string()
}

fn root_or_skip() -> bool {
    if !is_root() {
        eprintln!("skipped: the self-test's device nodes (mknod) and hooks (ldconfig -r) need root");
    }
    is_root()
}

#[test]
fn every_check_passes_on_a_good_node_and_touches_nothing_of_the_node() {
    if !root_or_skip() {
        return;
    }
    let node = Node::new("", "");
    let (code, report, took) = node.selftest(&[]);
    assert_eq!(code, 0, "{report:#}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert_eq!(report["schema"], "edra.selftest/v1");
    assert_eq!(report["backend"], "nvml");
    for name in [
        "backend",
        "discovery",
        "slices",
        "driver-files",
        "health-events",
        "health-probe",
        "prepare-gpu",
        "cdi-spec",
        "device-nodes",
        "driver-mounts",
        "hooks",
        "unprepare-gpu",
        "prepare-shares",
    ] {
        assert_eq!(status(&report, name), "pass", "{name}: {:#}", check(&report, name));
    }
    for name in ["container", "time-slicing", "mps", "mig"] {
        assert_eq!(status(&report, name), "skip", "{name}");
    }
    let gpu = &report["gpus"][0];
    assert_eq!(gpu["uuid"], "GPU-00000000-0000-0000-0000-000000000000");
    assert_eq!((gpu["persistence"].as_bool(), gpu["mig_enabled"].as_bool()), (Some(true), Some(false)));
    assert_eq!(gpu["processes"], serde_json::json!([]));
    let hooks = check(&report, "hooks")["detail"].as_str().unwrap_or_default().to_string();
    assert!(hooks.contains("the linker cache lists libcuda.so.1, libnvidia-ml.so.1"), "{hooks}");
    assert!(hooks.contains("create-symlinks: 3 link(s) made"), "{hooks}");
    let shares = check(&report, "prepare-shares")["detail"].as_str().unwrap_or_default().to_string();
    assert!(shares.contains("two memory shares of 1Gi"), "{shares}");
    // Its own temporary folders are gone, and the node's state and runtime folders untouched.
    assert_eq!(std::fs::read_dir(node.root().join("work")).map(|d| d.count()).ok(), Some(0));
    assert!(!node.root().join("node-state").exists() && !node.root().join("node-run").exists());
}

#[test]
fn a_missing_library_fails_driver_files_with_the_key_to_set() {
    if !root_or_skip() {
        return;
    }
    let node = Node::new("", "");
    std::fs::remove_file(node.root().join("driver").join(LIB_DIR).join(format!("libcuda.so.{VERSION}"))).unwrap();
    let (code, report, _) = node.selftest(&[]);
    assert_eq!(code, 1);
    let c = check(&report, "driver-files");
    assert_eq!(c["status"], "fail", "{c:#}");
    assert!(c["detail"].as_str().unwrap().contains(&format!("libcuda.so.{VERSION}")), "{c:#}");
    assert!(c["fix"].as_str().unwrap().contains("paths.driver_root"), "{c:#}");
    assert_eq!(status(&report, "driver-mounts"), "warn", "the spec mounts no libcuda");
}

#[test]
fn a_missing_or_wrong_device_node_fails_device_nodes() {
    if !root_or_skip() {
        return;
    }
    let node = Node::new("", "");
    std::fs::remove_file(node.root().join("dev/nvidia-uvm")).unwrap();
    mknod(&node.root().join("dev/nvidia-uvm"), 238, 5);
    std::fs::remove_file(node.root().join("dev/nvidiactl")).unwrap();
    let (code, report, _) = node.selftest(&[]);
    assert_eq!(code, 1);
    let c = check(&report, "device-nodes");
    assert_eq!(c["status"], "fail", "{c:#}");
    let detail = c["detail"].as_str().unwrap();
    assert!(detail.contains("nvidia-uvm is 238:5, but the driver's nvidia-uvm devices are 238:0"), "{detail}");
    assert!(c["fix"].as_str().unwrap().contains("nvidia-modprobe"), "{c:#}");
    assert_eq!(status(&report, "prepare-gpu"), "pass", "a missing control node is left out of the spec");
}

#[test]
fn an_event_registration_that_fails_fails_health_events() {
    let node = Node::new("", "fail;call=nvmlDeviceRegisterEvents;code=999\n");
    let (code, report, _) = node.selftest(&[]);
    assert_eq!(code, 1);
    let c = check(&report, "health-events");
    assert_eq!(c["status"], "fail", "{c:#}");
    assert!(c["detail"].as_str().unwrap().contains("nvmlDeviceRegisterEvents failed"), "{c:#}");
    assert_eq!(status(&report, "health-probe"), "pass");
}

#[test]
fn a_gpu_that_processes_use_is_left_alone_even_when_settings_may_change() {
    let node = Node::new(";procs=4242:1073741824", "");
    let (code, report, _) = node.selftest(&["--change-gpu-settings"]);
    assert_eq!(code, 1);
    for name in ["time-slicing", "mps", "mig"] {
        let c = check(&report, name);
        assert_eq!(c["status"], "fail", "{c:#}");
        assert!(c["detail"].as_str().unwrap().contains("in use by pid 4242 (1024 MiB)"), "{c:#}");
    }
    assert_eq!(report["gpus"][0]["processes"], serde_json::json!([[4242, 1073741824u64]]));
    assert!(node.mps.calls().is_empty(), "no MPS daemon was started");
    let modes = std::fs::read_to_string(node.nvml.dir.path().join("nvml_stub.modes")).unwrap_or_default();
    assert!(modes.is_empty(), "no compute mode was set: {modes}");
}

#[test]
fn settings_are_exercised_and_put_back_on_an_idle_gpu_and_a_failing_mps_daemon_fails_mps() {
    if !root_or_skip() {
        return;
    }
    let node = Node::new("", "");
    let (code, report, _) = node.selftest(&["--change-gpu-settings"]);
    assert_eq!(code, 0, "{report:#}");
    let ts = check(&report, "time-slicing");
    assert_eq!(ts["status"], "pass", "{ts:#}");
    assert!(ts["detail"].as_str().unwrap().contains("compute mode Default as before"), "{ts:#}");
    assert_eq!(status(&report, "mps"), "pass", "{:#}", check(&report, "mps"));
    assert!(node.mps.running_daemons().is_empty(), "the MPS daemon was quit");
    assert_eq!(status(&report, "mig"), "skip", "MIG mode is off");

    std::fs::write(&node.mps.path, "#!/bin/sh\necho 'cannot start: no GPU access' >&2\nexit 3\n").unwrap();
    let (code, report, _) = node.selftest(&["--change-gpu-settings"]);
    assert_eq!(code, 1);
    let c = check(&report, "mps");
    assert_eq!(c["status"], "fail", "{c:#}");
    assert!(!c["fix"].as_str().unwrap().is_empty());
    assert_eq!(status(&report, "time-slicing"), "pass");
}

#[test]
fn the_mock_backend_passes_without_hardware_and_says_what_it_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_edra"))
        .env_clear()
        .args(["selftest", "--backend", "mock", "--node-name", "n1", "--work-dir"])
        .arg(dir.path())
        .output()
        .expect("run edra selftest");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.starts_with("edra ") && text.contains(" selftest, backend mock, node n1"), "{text}");
    assert!(text.contains("PASS    prepare-gpu"), "{text}");
    assert!(text.contains("SKIP    device-nodes"), "{text}");
    assert!(text.contains("0 failed"), "{text}");
    assert!(out.stderr.is_empty(), "no log lines by default: {}", String::from_utf8_lossy(&out.stderr));
}

/// A busybox image imported into a podman store of the test's own; a wrapper script that
/// runs podman on that store is the `--runtime`.
fn busybox_image(node: &Node) -> Option<(String, PathBuf)> {
    let test = "a_container_runs_with_the_claims_devices";
    if !crate::runtime::have(test, &["podman", "runc", "busybox", "unshare", "mount", "tar"]) {
        return None;
    }
    let dir = node.root().join("podman");
    let rootfs = dir.join("rootfs");
    for sub in ["bin", "etc", "dev", "proc", "sys", "tmp"] {
        std::fs::create_dir_all(rootfs.join(sub)).unwrap();
    }
    let busybox = ["/bin/busybox", "/usr/bin/busybox"].into_iter().find(|p| Path::new(p).is_file()).unwrap();
    std::fs::copy(busybox, rootfs.join("bin/busybox")).unwrap();
    for tool in ["sh", "ls", "cat", "readlink"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(tool)).unwrap();
    }
    std::fs::write(
        dir.join("containers.conf"),
        "[containers]\ndefault_ulimits = []\n[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n",
    )
    .unwrap();
    let wrapper = dir.join("podman.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nCONTAINERS_CONF={d}/containers.conf exec podman --root {d}/root --runroot {d}/runroot \
             --storage-driver vfs \"$@\"\n",
            d = dir.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let tarball = dir.join("busybox.tar");
    let tar = Command::new("tar").arg("-C").arg(&rootfs).arg("-cf").arg(&tarball).arg(".").status().unwrap();
    assert!(tar.success());
    let tag = format!("localhost/edra-selftest-{}:latest", std::process::id());
    let import = Command::new(&wrapper).arg("import").arg(&tarball).arg(&tag).output().unwrap();
    assert!(import.status.success(), "podman import: {}", String::from_utf8_lossy(&import.stderr));
    let mut probe = Command::new(&wrapper);
    probe.args(["run", "--rm", "--network=none", &tag, "sh", "-c", "true"]);
    crate::runtime::runtime_runs(test, "podman", &mut probe).then_some((tag, wrapper))
}

#[test]
fn a_container_runs_with_the_claims_devices() {
    let node = Node::new("", "");
    let Some((image, wrapper)) = busybox_image(&node) else { return };
    let runtime = wrapper.to_str().unwrap();
    let script = "ls -l /dev/nvidia0; readlink /usr/lib/x86_64-linux-gnu/libcuda.so.1";
    let (code, report, _) = node.selftest(&["--image", &image, "--runtime", runtime, "--", "sh", "-c", script]);
    let c = check(&report, "container");
    assert_eq!(c["status"], "pass", "{c:#}");
    assert_eq!(code, 0, "{report:#}");
    let detail = c["detail"].as_str().unwrap();
    assert!(detail.contains("195,") && detail.contains("/dev/nvidia0"), "the GPU's device node: {detail}");
    assert!(detail.contains(&format!("libcuda.so.{VERSION}")), "the driver's library link: {detail}");
    // The node's own CDI folder was never used.
    assert!(!Path::new("/run/cdi").read_dir().is_ok_and(|mut d| {
        d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().contains("5e1f7e57-0000-4000-8000")))
    }));
}

#[test]
fn a_backend_that_does_not_load_is_named_in_the_header_and_the_failed_check() {
    let node = Node::new("", "");
    let (code, report, _) = node.selftest(&["--set", "nvml.library=/nowhere/libnvidia-ml.so.1"]);
    assert_ne!(code, 0, "{report:#}");
    // The configured kind, before any backend could name itself.
    assert_eq!(report["backend"], "nvml", "{report:#}");
    assert_eq!(status(&report, "backend"), "fail");
    let detail = check(&report, "backend")["detail"].as_str().unwrap_or_default().to_string();
    assert!(detail.contains("/nowhere/libnvidia-ml.so.1"), "{detail}");
}
