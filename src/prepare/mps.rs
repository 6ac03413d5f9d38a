//! A claim's MPS control daemon: started at prepare after its GPUs' compute mode was set
//! to EXCLUSIVE_PROCESS, stopped at unprepare before the compute mode is put back, adopted
//! or started again by recovery, and kept running by [`Preparer::check_mps_daemons`].
//!
//! The daemon is recorded in state (`state::MpsDaemonRecord`) before it starts, with the
//! clock tick just before the start, and again with its pid and start time once it
//! answers. A crash between the two leaves a record without a pid: the daemon is then found
//! through its pid file, as a process of the MPS control binary started after the recorded
//! tick (never a pid the kernel gave to something else). Restarts keep the claim's
//! directories: the claim's containers have them bind-mounted.
//!
//! With `sharing.enforcement = "mps"` a shared GPU has one daemon too, held by the GPU's
//! shares rather than by a claim: its records are keyed by the holder `shared:gpu-0` (as
//! its GPU change record is) and its directories are `<runtime>/mps/shared-gpu-0`. The
//! first share starts it, later shares reuse it, the last share's release stops it; each
//! share's containers get its pipe and shm directories and their own pinned memory limit
//! (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`). Supervision, adoption and the orphan sweep treat
//! it as a claim's daemon, under the GPU's lock.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::GpuChangeError;
use super::cdi::{self, Mount};
use super::plan::MpsPlan;
use super::{PrepareError, Preparer, SHARED_HOLDER, failpoint, gpu_error, shared_holder};
use crate::gpu::ComputeMode;
use crate::gpu::mps::{self, DaemonIdentity, DaemonSpec, MpsDaemons};
use crate::state::{ClaimRecord, GPU_CHANGE_SCHEMA, GpuChange, MPS_DAEMON_SCHEMA, MpsDaemonRecord, Phase};

/// Where a container finds the MPS pipe directory.
pub const CONTAINER_PIPE_DIR: &str = "/tmp/nvidia-mps";
/// Mount options of the pipe and shm directories in containers.
pub const MOUNT_OPTIONS: [&str; 4] = ["rw", "nosuid", "nodev", "bind"];
/// First wait before a daemon that failed to start again is tried again; doubles up to
/// [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// Longest wait between attempts to start a failing daemon again.
const MAX_RETRY: Duration = Duration::from_secs(60);

/// What a check of a prepared claim's daemon found or did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MpsCheck {
    /// The claim has no daemon.
    NoDaemon,
    /// The recorded daemon runs.
    Running(DaemonIdentity),
    /// A daemon whose pid was not recorded yet (a crash) runs; it is recorded now.
    Adopted(DaemonIdentity),
    /// The daemon was gone and was started again.
    Restarted(DaemonIdentity),
}

/// Retry state of daemons that failed to start again: claim UID → (next try, wait after it).
pub(super) type Retries = std::sync::Mutex<HashMap<String, (Instant, Duration)>>;

fn identity(pair: Option<(u32, u64)>) -> Option<DaemonIdentity> {
    pair.map(|(pid, start_time)| DaemonIdentity { pid, start_time })
}

fn spec_of(rec: &MpsDaemonRecord) -> DaemonSpec {
    DaemonSpec {
        id: daemon_id(&rec.claim),
        gpus: rec.gpus.clone(),
        active_thread_percentage: rec.active_thread_percentage,
        pinned_memory_mib: rec.pinned_memory_mib.clone(),
    }
}

/// The daemon ID (its directory name) of holder `holder`: a claim's UID, or
/// `shared-gpu-0` for the shares of `gpu-0` (holder `shared:gpu-0`).
pub(crate) fn daemon_id(holder: &str) -> String {
    match holder.strip_prefix(SHARED_HOLDER) {
        Some(gpu) => format!("shared-{gpu}"),
        None => holder.to_string(),
    }
}

/// The holder of the daemon whose directory is `name`: a claim UID, or a shared GPU's
/// holder for `shared-gpu-0`; `None` for names edra does not make.
pub(super) fn holder_of_dir(name: &str) -> Option<String> {
    if cdi::is_valid_uid(name) {
        return Some(name.to_string());
    }
    let gpu = name.strip_prefix("shared-")?;
    let valid = gpu.strip_prefix("gpu-").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    valid.then(|| shared_holder(gpu))
}

/// The error for a failed daemon of `holder`.
fn mps_error(holder: &str) -> impl FnOnce(mps::MpsError) -> PrepareError {
    let gpu = holder.strip_prefix(SHARED_HOLDER).map(str::to_string);
    move |source| match gpu {
        Some(gpu) => GpuChangeError::SharedMps { gpu, source }.into(),
        None => GpuChangeError::Mps(source).into(),
    }
}

/// The pipe and shm mounts of daemon `id`'s directories, as containers get them.
fn daemon_mounts(settings: &mps::MpsSettings, id: &str) -> [Mount; 2] {
    let dirs = settings.dirs(id);
    let mount = |host: &Path, inside: &str| Mount {
        host_path: host.display().to_string(),
        container_path: inside.to_string(),
        options: MOUNT_OPTIONS.iter().map(|s| s.to_string()).collect(),
        mount_type: None,
    };
    [mount(&dirs.pipe, CONTAINER_PIPE_DIR), mount(&dirs.shm, "/dev/shm")]
}

/// Adds the MPS pipe and shm mounts and `CUDA_MPS_PIPE_DIRECTORY` to the spec's devices
/// of `record` that use MPS.
pub(super) fn add_edits(spec: &mut cdi::Spec, record: &ClaimRecord, settings: &mps::MpsSettings) {
    let mps_devices: Vec<String> = record
        .devices
        .iter()
        .filter(|d| d.config.sharing.strategy == crate::device_config::Strategy::Mps)
        .map(|d| cdi::device_name(&record.uid, &d.cdi_device()))
        .collect();
    for device in spec.devices.iter_mut().filter(|d| mps_devices.contains(&d.name)) {
        let edits = &mut device.container_edits;
        edits.env.push(format!("CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}"));
        edits.mounts.extend(daemon_mounts(settings, &record.uid));
    }
}

/// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` for a share of `memory` bytes: `<ordinal>=<size>`,
/// ordinal 0 (the GPU's daemon serves that one GPU, so its clients see it as device 0),
/// the size in whole MiB, rounded down so the limit never exceeds the share (at least 1M).
pub fn pinned_limit_env(memory: u64) -> String {
    format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={}M", (memory >> 20).max(1))
}

/// Adds, to each device of `record` that is a share of a GPU served by its shared MPS
/// daemon (`shared` names those GPUs), the daemon's pipe and shm mounts,
/// `CUDA_MPS_PIPE_DIRECTORY` and the share's pinned memory limit.
pub(super) fn add_share_edits(
    spec: &mut cdi::Spec,
    record: &ClaimRecord,
    settings: &mps::MpsSettings,
    shared: &[String],
) {
    for d in record.devices.iter().filter(|d| !d.admin_access) {
        let Some(share) = d.share.as_ref().filter(|s| shared.contains(&s.gpu)) else { continue };
        if d.config.sharing.strategy != crate::device_config::Strategy::Exclusive {
            continue;
        }
        let name = cdi::device_name(&record.uid, &d.cdi_device());
        let Some(device) = spec.devices.iter_mut().find(|x| x.name == name) else { continue };
        let edits = &mut device.container_edits;
        edits.env.push(format!("CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}"));
        edits.env.push(pinned_limit_env(share.memory));
        edits.mounts.extend(daemon_mounts(settings, &daemon_id(&shared_holder(&share.gpu))));
    }
}

impl Preparer {
    /// Prepare's MPS step (blocking I/O): EXCLUSIVE_PROCESS on the claim's full GPUs, each
    /// recorded before it is set, then the daemon, recorded before it starts.
    pub(super) fn start_mps(&self, uid: &str, plan: &MpsPlan) -> Result<(), PrepareError> {
        let (store, modes) = (&self.inner.store, &self.inner.compute_modes);
        for (device, uuid) in &plan.full_gpus {
            let gpu_err = |action| gpu_error(action, uuid);
            let previous = modes.compute_mode(uuid).map_err(gpu_err("read the compute mode"))?;
            store.put_gpu_change(&GpuChange {
                schema: GPU_CHANGE_SCHEMA,
                uuid: uuid.clone(),
                device: device.clone(),
                claim: uid.to_string(),
                previous_compute_mode: previous,
                compute_mode: ComputeMode::ExclusiveProcess,
                timeslice: None,
            })?;
            failpoint::hit("prepare-after-gpu-recorded");
            self.set_mode(uuid, ComputeMode::ExclusiveProcess).map_err(gpu_err("set the compute mode"))?;
            failpoint::hit("prepare-after-compute-mode");
        }
        let mut rec = MpsDaemonRecord {
            schema: MPS_DAEMON_SCHEMA,
            claim: uid.to_string(),
            gpus: plan.gpus.clone(),
            active_thread_percentage: plan.active_thread_percentage,
            pinned_memory_mib: plan.pinned_memory_mib.clone(),
            not_before: 0,
            daemon: None,
            restarts: 0,
        };
        self.run_daemon(&mut rec)?;
        Ok(())
    }

    /// Records the daemon (without a pid), starts it, records its pid and start time.
    fn run_daemon(&self, rec: &mut MpsDaemonRecord) -> Result<DaemonIdentity, PrepareError> {
        let store = &self.inner.store;
        rec.not_before = mps::clock_ticks_now(Path::new("/proc"));
        rec.daemon = None;
        store.put_mps_daemon(rec)?;
        failpoint::hit("prepare-after-mps-recorded");
        let started = Instant::now();
        let result = self.inner.mps.start(&spec_of(rec));
        self.inner.mps_stats.start(result.is_ok(), started.elapsed());
        let daemon = result.map_err(mps_error(&rec.claim))?;
        failpoint::hit("prepare-after-mps-started");
        rec.daemon = Some((daemon.pid, daemon.start_time));
        store.put_mps_daemon(rec)?;
        Ok(daemon)
    }

    /// The first share of a GPU with `sharing.enforcement = "mps"` (blocking I/O; the
    /// caller holds the GPU's lock): EXCLUSIVE_PROCESS and the GPU's daemon, each recorded
    /// before it is made, held by the GPU's shares. The daemon sets no limits of its own:
    /// each share's limit is in its containers' environment.
    pub(super) fn start_shared_mps(&self, device: &str, uuid: &str) -> Result<(), PrepareError> {
        let plan = MpsPlan {
            gpus: vec![uuid.to_string()],
            full_gpus: vec![(device.to_string(), uuid.to_string())],
            active_thread_percentage: None,
            pinned_memory_mib: Vec::new(),
        };
        let holder = shared_holder(device);
        self.start_mps(&holder, &plan)?;
        tracing::info!(gpu = %uuid, device, mps.id = %daemon_id(&holder), "shared GPU's MPS control daemon started by its first share");
        Ok(())
    }

    /// A later share of a GPU whose first share set it up (blocking I/O; the caller holds
    /// the GPU's lock): its daemon runs, is adopted, or is started again now.
    pub(super) fn reuse_shared_mps(&self, holder: &str) -> Result<(), PrepareError> {
        match self.ensure_mps(holder)? {
            MpsCheck::NoDaemon | MpsCheck::Running(_) => {}
            MpsCheck::Adopted(d) | MpsCheck::Restarted(d) => {
                tracing::info!(
                    holder,
                    pid = d.pid,
                    "a share found its GPU's MPS control daemon not recorded as running; it runs now"
                )
            }
        }
        Ok(())
    }

    /// Unprepare's MPS step (blocking I/O): stops the daemon of `uid` (a claim, or a shared
    /// GPU's holder) — `quit`, then SIGKILL after the grace period — and removes its
    /// directories. The record stays; the caller drops it.
    pub(super) fn stop_mps(&self, uid: &str) -> Result<(), PrepareError> {
        let Some(rec) = self.inner.store.mps_daemon(uid)? else { return Ok(()) };
        let sup = &self.inner.mps;
        let id = daemon_id(uid);
        let daemon = identity(rec.daemon).filter(|d| sup.is_running(d)).or_else(|| sup.find(&id, rec.not_before));
        sup.stop(&id, daemon.as_ref()).map_err(mps_error(uid))?;
        failpoint::hit("unprepare-after-mps-stop");
        if let Some(d) = daemon {
            tracing::info!(holder = uid, pid = d.pid, "MPS control daemon stopped");
        }
        self.inner.mps_retries.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(uid);
        Ok(())
    }

    /// Makes sure prepared claim `uid`'s daemon runs (blocking I/O; the caller holds the
    /// claim's lock): adopts it, or starts it again.
    pub(crate) fn ensure_mps(&self, uid: &str) -> Result<MpsCheck, PrepareError> {
        let store = &self.inner.store;
        let Some(mut rec) = store.mps_daemon(uid)? else { return Ok(MpsCheck::NoDaemon) };
        let sup = &self.inner.mps;
        if let Some(d) = identity(rec.daemon).filter(|d| sup.is_running(d)) {
            return Ok(MpsCheck::Running(d));
        }
        if let Some(d) = sup.find(&daemon_id(uid), rec.not_before) {
            rec.daemon = Some((d.pid, d.start_time));
            store.put_mps_daemon(&rec)?;
            return Ok(MpsCheck::Adopted(d));
        }
        let was = rec.daemon;
        rec.restarts = rec.restarts.saturating_add(1);
        let d = self.run_daemon(&mut rec)?;
        self.inner.mps_stats.restarts.fetch_add(1, Relaxed);
        let was = was.map(|(pid, _)| pid);
        if uid.starts_with(SHARED_HOLDER) {
            tracing::warn!(
                holder = uid,
                ?was,
                pid = d.pid,
                restarts = rec.restarts,
                "the shared GPU's MPS control daemon was not running; started it again"
            );
        } else {
            tracing::warn!(
                claim.uid = uid,
                ?was,
                pid = d.pid,
                restarts = rec.restarts,
                "the claim's MPS control daemon was not running; started it again"
            );
        }
        Ok(MpsCheck::Restarted(d))
    }

    /// One pass of MPS supervision (blocking I/O): every prepared claim's daemon is
    /// checked and started again when it died; a daemon that fails to start is tried again
    /// after 1 s, then twice as long each time up to a minute. Returns how many run.
    pub fn check_mps_daemons(&self) -> Result<u64, PrepareError> {
        let store = &self.inner.store;
        let mut running = 0u64;
        for rec in store.mps_daemons()? {
            let uid = rec.claim.as_str();
            let _held = self.inner.locks.lock_blocking(uid);
            // A prepare in flight or one recovery rolls back is not supervised; a shared
            // GPU's daemon is while the GPU has shares (a share's prepare holds its lock).
            let supervised = match uid.strip_prefix(SHARED_HOLDER) {
                Some(gpu) => !store.shares_of(gpu)?.is_empty(),
                None => store.claim(uid)?.is_some_and(|c| c.phase == Phase::PrepareCompleted),
            };
            if !supervised {
                continue;
            }
            let retries = &self.inner.mps_retries;
            let waiting = retries
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(uid)
                .is_some_and(|(next, _)| Instant::now() < *next);
            let alive =
                identity(store.mps_daemon(uid)?.and_then(|r| r.daemon)).is_some_and(|d| self.inner.mps.is_running(&d));
            if waiting && !alive {
                continue;
            }
            match self.ensure_mps(uid) {
                Ok(MpsCheck::NoDaemon) => {}
                Ok(MpsCheck::Running(_) | MpsCheck::Adopted(_) | MpsCheck::Restarted(_)) => {
                    running += 1;
                    retries.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(uid);
                }
                Err(e) => {
                    let mut map = retries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    let wait = map.get(uid).map_or(FIRST_RETRY, |(_, w)| (*w * 2).min(MAX_RETRY));
                    map.insert(uid.to_string(), (Instant::now() + wait, wait));
                    let (error, retry_in_s) = (crate::util::error_chain(&e), wait.as_secs());
                    if uid.starts_with(SHARED_HOLDER) {
                        tracing::error!(holder = uid, %error, retry_in_s, "cannot start the shared GPU's MPS control daemon again; the pods of its shares cannot use the GPU until it runs");
                    } else {
                        tracing::error!(claim.uid = uid, %error, retry_in_s, "cannot start the claim's MPS control daemon again; its pods cannot use the GPU until it runs");
                    }
                }
            }
        }
        self.inner.mps_stats.running.store(running, Relaxed);
        Ok(running)
    }

    /// Stops daemons and removes directories under `<runtime>/mps/` that no prepared or
    /// preparing claim, nor a shared GPU's record, owns (blocking I/O; recovery). Returns
    /// their names.
    pub(super) fn sweep_mps_orphans(&self) -> Result<Vec<String>, PrepareError> {
        let settings = &self.inner.settings.mps;
        let Ok(entries) = std::fs::read_dir(settings.runtime_dir.join("mps")) else { return Ok(Vec::new()) };
        let mut removed = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(holder) = holder_of_dir(&name) else { continue };
            let _held = self.inner.locks.lock_blocking(&holder);
            if self.inner.store.mps_daemon(&holder)?.is_some() || self.inner.store.claim(&holder)?.is_some() {
                continue;
            }
            let daemon = self.inner.mps.find(&name, 0);
            self.inner.mps.stop(&name, daemon.as_ref()).map_err(mps_error(&holder))?;
            tracing::info!(mps.id = %name, pid = ?daemon.map(|d| d.pid), "stopped an MPS daemon nothing owns and removed its directories");
            removed.push(name);
        }
        Ok(removed)
    }
}
