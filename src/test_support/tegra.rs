//! A fake Jetson (AGX Orin, JetPack 6) under a temp dir, laid out as `Paths::under` lays a
//! node out: the L4T release file and the CSV lists under `driver/`, the device tree and
//! `meminfo` under `proc/`, the SoC family under `sys/`, and the device nodes the CSV lists
//! name under `dev/` (character devices made with mknod when the test runs as root; without
//! root none is made, and [`FakeJetson::nodes`] is false). The CSV files name libraries,
//! links and a folder of the fake driver root, plus entries this "module" lacks, as the
//! real lists (written for every Jetson module) do.

use std::path::{Path, PathBuf};

/// The library folder of the fake root (JetPack's own).
pub const LIB_DIR: &str = "usr/lib/aarch64-linux-gnu/nvidia";
/// The L4T release line of JetPack 6.2.
pub const RELEASE: &str = "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8 01:49:37 UTC 2025\n";
/// The device tree's model.
pub const MODEL: &str = "NVIDIA Jetson AGX Orin Developer Kit";
/// `MemTotal` in kB.
pub const MEM_KB: u64 = 64_335_836;
/// Device nodes listed, with their (made-up) numbers; the last is listed but never made.
pub const DEVICES: [(&str, u32, u32); 4] =
    [("nvmap", 10, 125), ("nvhost-ctrl-gpu", 486, 0), ("nvgpu/igpu0/ctrl", 488, 0), ("nvhost-absent", 0, 0)];

/// What was made.
#[derive(Debug, Clone)]
pub struct FakeJetson {
    /// The sandbox (`Paths::under` of it is the node).
    pub dir: PathBuf,
    /// Whether the device nodes were made (root only).
    pub nodes: bool,
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    std::fs::write(path, bytes).expect("write");
}

fn mknod(path: &Path, major: u32, minor: u32) -> bool {
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else { return false };
    // SAFETY: a valid NUL-terminated path; mknod has no other preconditions.
    unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(major, minor)) == 0 }
}

/// Makes the fake Jetson under `dir`; `libraries` are (file name, contents) put in
/// [`LIB_DIR`] and listed as `lib` entries (with `libcuda.so.1` → the first and
/// `libcuda.so` → `libcuda.so.1` made as links and listed as `sym`).
pub fn make(dir: &Path, libraries: &[(&str, &[u8])]) -> FakeJetson {
    let driver = dir.join("driver");
    write(&driver.join("etc/nv_tegra_release"), RELEASE.as_bytes());
    write(&dir.join("sys/devices/soc0/family"), b"Tegra234\n");
    write(&dir.join("proc/device-tree/model"), format!("{MODEL}\0").as_bytes());
    write(
        &dir.join("proc/device-tree/compatible"),
        b"nvidia,p3737-0000+p3701-0005\0nvidia,p3701-0005\0nvidia,tegra234\0",
    );
    write(&dir.join("proc/meminfo"), format!("MemTotal:       {MEM_KB} kB\nMemFree:        1024 kB\n").as_bytes());
    let mut nodes = true;
    for (name, major, minor) in &DEVICES[..DEVICES.len() - 1] {
        nodes &= mknod(&dir.join("dev").join(name), *major, *minor);
    }
    let mut devices = String::from("# devices\n");
    for (name, _, _) in DEVICES {
        devices.push_str(&format!("dev, /dev/{name}\n"));
    }
    let mut drivers = String::from("# drivers\n");
    for (name, contents) in libraries {
        write(&driver.join(LIB_DIR).join(name), contents);
        drivers.push_str(&format!("lib, /{LIB_DIR}/{name}\n"));
    }
    if let Some((first, _)) = libraries.first() {
        std::os::unix::fs::symlink(first, driver.join(LIB_DIR).join("libcuda.so.1")).expect("link");
        std::os::unix::fs::symlink("libcuda.so.1", driver.join(LIB_DIR).join("libcuda.so")).expect("link");
        drivers.push_str(&format!("sym, /{LIB_DIR}/libcuda.so.1\nsym, /{LIB_DIR}/libcuda.so\n"));
    }
    drivers.push_str("lib, /usr/lib/aarch64-linux-gnu/nvidia/libnvidia-absent.so.1\n");
    write(&driver.join("usr/share/nvidia/firmware.txt"), b"firmware\n");
    let l4t = "dir, /usr/share/nvidia\n";
    let csv = driver.join("etc/nvidia-container-runtime/host-files-for-container.d");
    write(&csv.join("devices.csv"), devices.as_bytes());
    write(&csv.join("drivers.csv"), drivers.as_bytes());
    write(&csv.join("l4t.csv"), l4t.as_bytes());
    FakeJetson { dir: dir.to_path_buf(), nodes }
}
