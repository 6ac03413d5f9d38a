//! `edra hook disable-device-node-modification`: keeps NVML in a container from creating
//! device nodes.
//!
//! With `ModifyDeviceFiles: 1` in `/proc/driver/nvidia/params`, NVML creates missing
//! `/dev/nvidia*` nodes, which in a container would undo the device list the CDI spec gave
//! it. The hook writes a copy of the host's file saying `ModifyDeviceFiles: 0` (mode 0444)
//! to a fresh file on the host, bind-mounts the copy read-only over
//! `<rootfs>/proc/driver/nvidia/params`, and removes the host file (the mount keeps it alive).
//!
//! It does this in the mount namespace it runs in: the runtime runs `createContainer` hooks
//! in the container's mount namespace once the container's mounts (its `/proc` among them)
//! are set up, before pivot_root, so the rootfs is still at its host path and the host's
//! `/proc` is still at `/proc`. The OCI state's `pid` is not used: runc reports the
//! container's own view of it there (1, which on the host's procfs is the host's init) and
//! crun reports 0. The hook only mounts when `<rootfs>/proc` is a real directory holding a
//! procfs mount, so nothing from the image can redirect the mount, and the mount never lands
//! in the host's namespace (where the container's `/proc` is not mounted).

use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::HookError;

/// The driver's parameters, relative to a procfs root.
pub const PARAMS: &str = "driver/nvidia/params";

/// The host's parameters rewritten with `ModifyDeviceFiles: 0`; `None` when nothing needs
/// changing (the setting is absent or already 0).
pub fn rewrite(params: &str) -> Option<String> {
    let mut changed = false;
    let mut out = String::with_capacity(params.len());
    for line in params.split_inclusive('\n') {
        let (body, end) = line.strip_suffix('\n').map_or((line, ""), |b| (b, "\n"));
        match body.split_once(':') {
            Some((key, value)) if key.trim() == "ModifyDeviceFiles" && value.trim() != "0" => {
                out.push_str("ModifyDeviceFiles: 0");
                out.push_str(end);
                changed = true;
            }
            _ => out.push_str(line),
        }
    }
    changed.then_some(out)
}

/// The whole hook: state from `stdin`; when the host's `<proc_root>/driver/nvidia/params`
/// needs it, the read-only copy is mounted in the container. No driver: nothing to do.
pub fn disable(stdin: impl Read, proc_root: &Path) -> Result<(), HookError> {
    let container = super::read_state(stdin)?;
    let host_params = proc_root.join(PARAMS);
    let text = match std::fs::read_to_string(&host_params) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(HookError::ReadHost { path: host_params, source }),
    };
    let Some(new) = rewrite(&text) else { return Ok(()) };
    mount_copy(&container.rootfs, new.as_bytes())
}

/// Mounts `contents` read-only over `<rootfs>/proc/driver/nvidia/params` in the current
/// mount namespace. `<rootfs>/proc` must be a directory (not a symlink) with procfs mounted
/// on it, else [`HookError::NoProcfs`]; a container procfs without the file (no driver
/// entry to hide) is left alone.
pub fn mount_copy(rootfs: &Path, contents: &[u8]) -> Result<(), HookError> {
    let proc_dir = rootfs.join("proc");
    let is_procfs = std::fs::symlink_metadata(&proc_dir).is_ok_and(|m| m.is_dir()) && on_procfs(&proc_dir);
    if !is_procfs {
        return Err(HookError::NoProcfs { path: proc_dir });
    }
    let target = proc_dir.join(PARAMS);
    if !target.exists() {
        return Ok(());
    }
    mount_file(&target, contents)
}

/// Writes `contents` to a new 0444 file on the host, bind-mounts it read-only over `target`
/// in the current mount namespace, and removes the host file.
pub fn mount_file(target: &Path, contents: &[u8]) -> Result<(), HookError> {
    let err = |op: &'static str| move |source: io::Error| HookError::Mount { op, path: target.to_path_buf(), source };
    let source = write_copy(contents).map_err(err("write the parameters copy for"))?;
    let result = bind_read_only(&source, target).map_err(err("bind-mount the read-only copy"));
    let _ = std::fs::remove_file(&source);
    result
}

/// A new file in `/run` (or the temp folder) holding `contents`, mode 0444.
fn write_copy(contents: &[u8]) -> io::Result<PathBuf> {
    let dir = if Path::new("/run").is_dir() { PathBuf::from("/run") } else { std::env::temp_dir() };
    let path = dir.join(format!(".edra-nvidia-params-{}-{:08x}", std::process::id(), fastrand::u32(..)));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)?;
    let written = f.write_all(contents).and_then(|()| f.set_permissions(std::fs::Permissions::from_mode(0o444)));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    Ok(path)
}

fn cvt(rc: libc::c_int) -> io::Result<()> {
    if rc == -1 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

fn c_path(p: &Path) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::other("path contains a NUL byte"))
}

fn on_procfs(p: &Path) -> bool {
    let Ok(c) = c_path(p) else { return false };
    // SAFETY: statfs is plain old data, so all zeros is a valid value; `c` is a
    // NUL-terminated path and `st` is writable and outlives the call.
    let (rc, st) = unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        let rc = libc::statfs(c.as_ptr(), &mut st);
        (rc, st)
    };
    rc == 0 && st.f_type == libc::PROC_SUPER_MAGIC
}

/// Bind-mounts `src` over `dst`, then remounts the bind read-only, nosuid, nodev, noexec.
fn bind_read_only(src: &Path, dst: &Path) -> io::Result<()> {
    let (s, d) = (c_path(src)?, c_path(dst)?);
    let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: all pointers are NUL-terminated strings alive across the calls, or null where
    // mount(2) allows it (no filesystem type or data for bind mounts and remounts).
    unsafe {
        cvt(libc::mount(s.as_ptr(), d.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()))?;
        cvt(libc::mount(std::ptr::null(), d.as_ptr(), std::ptr::null(), flags, std::ptr::null()))
    }
}

#[cfg(test)]
mod tests;
