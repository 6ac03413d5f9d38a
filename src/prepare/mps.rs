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

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::cdi::{self, Mount};
use super::plan::MpsPlan;
use super::{PrepareError, Preparer, failpoint, gpu_error};
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
        id: rec.claim.clone(),
        gpus: rec.gpus.clone(),
        active_thread_percentage: rec.active_thread_percentage,
        pinned_memory_mib: rec.pinned_memory_mib.clone(),
    }
}

/// Adds the MPS pipe and shm mounts and `CUDA_MPS_PIPE_DIRECTORY` to the spec's devices
/// of `record` that use MPS.
pub(super) fn add_edits(spec: &mut cdi::Spec, record: &ClaimRecord, settings: &mps::MpsSettings) {
    let dirs = settings.dirs(&record.uid);
    let mps_devices: Vec<String> = record
        .devices
        .iter()
        .filter(|d| d.config.sharing.strategy == crate::device_config::Strategy::Mps)
        .map(|d| cdi::device_name(&record.uid, &d.cdi_device()))
        .collect();
    let mount = |host: &Path, inside: &str| Mount {
        host_path: host.display().to_string(),
        container_path: inside.to_string(),
        options: MOUNT_OPTIONS.iter().map(|s| s.to_string()).collect(),
        mount_type: None,
    };
    for device in spec.devices.iter_mut().filter(|d| mps_devices.contains(&d.name)) {
        let edits = &mut device.container_edits;
        edits.env.push(format!("CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}"));
        edits.mounts.push(mount(&dirs.pipe, CONTAINER_PIPE_DIR));
        edits.mounts.push(mount(&dirs.shm, "/dev/shm"));
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
        let daemon = result.map_err(PrepareError::Mps)?;
        failpoint::hit("prepare-after-mps-started");
        rec.daemon = Some((daemon.pid, daemon.start_time));
        store.put_mps_daemon(rec)?;
        Ok(daemon)
    }

    /// Unprepare's MPS step (blocking I/O): stops the claim's daemon (`quit`, then SIGKILL
    /// after the grace period) and removes its directories. The record stays; the caller
    /// drops it with the claim's.
    pub(super) fn stop_mps(&self, uid: &str) -> Result<(), PrepareError> {
        let Some(rec) = self.inner.store.mps_daemon(uid)? else { return Ok(()) };
        let sup = &self.inner.mps;
        let daemon = identity(rec.daemon).filter(|d| sup.is_running(d)).or_else(|| sup.find(uid, rec.not_before));
        sup.stop(uid, daemon.as_ref()).map_err(PrepareError::Mps)?;
        failpoint::hit("unprepare-after-mps-stop");
        if let Some(d) = daemon {
            tracing::info!(claim.uid = uid, pid = d.pid, "MPS control daemon stopped");
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
        if let Some(d) = sup.find(uid, rec.not_before) {
            rec.daemon = Some((d.pid, d.start_time));
            store.put_mps_daemon(&rec)?;
            return Ok(MpsCheck::Adopted(d));
        }
        let was = rec.daemon;
        rec.restarts = rec.restarts.saturating_add(1);
        let d = self.run_daemon(&mut rec)?;
        self.inner.mps_stats.restarts.fetch_add(1, Relaxed);
        tracing::warn!(
            claim.uid = uid,
            was = ?was.map(|(pid, _)| pid),
            pid = d.pid,
            restarts = rec.restarts,
            "the claim's MPS control daemon was not running; started it again"
        );
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
            // A prepare in flight or one recovery rolls back is not supervised.
            if !store.claim(uid)?.is_some_and(|c| c.phase == Phase::PrepareCompleted) {
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
                    tracing::error!(
                        claim.uid = uid,
                        error = %crate::util::error_chain(&e),
                        retry_in_s = wait.as_secs(),
                        "cannot start the claim's MPS control daemon again; its pods cannot use the GPU until it runs"
                    );
                }
            }
        }
        self.inner.mps_stats.running.store(running, Relaxed);
        Ok(running)
    }

    /// Stops daemons and removes directories under `<runtime>/mps/` that no prepared or
    /// preparing claim owns (blocking I/O; recovery). Returns their names.
    pub(super) fn sweep_mps_orphans(&self) -> Result<Vec<String>, PrepareError> {
        let settings = &self.inner.settings.mps;
        let Ok(entries) = std::fs::read_dir(settings.runtime_dir.join("mps")) else { return Ok(Vec::new()) };
        let mut removed = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !cdi::is_valid_uid(&name) {
                continue;
            }
            let _held = self.inner.locks.lock_blocking(&name);
            if self.inner.store.mps_daemon(&name)?.is_some() || self.inner.store.claim(&name)?.is_some() {
                continue;
            }
            let daemon = self.inner.mps.find(&name, 0);
            self.inner.mps.stop(&name, daemon.as_ref()).map_err(PrepareError::Mps)?;
            tracing::info!(claim.uid = %name, pid = ?daemon.map(|d| d.pid), "stopped an MPS daemon no claim owns and removed its directories");
            removed.push(name);
        }
        Ok(removed)
    }
}
