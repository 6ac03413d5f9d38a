//! Recovery at start, and again after the state store was re-opened: make the state
//! store, the CDI directory and the node agree again.
//!
//! A crash (kill -9, power cut) can leave PrepareStarted records, PrepareCompleted ones
//! whose devices were not all taken yet (see [`crate::state`]), partly written or
//! orphaned spec files and GPUs whose compute mode or time-slice edra changed; a reboot
//! clears the CDI directory under /var/run and the GPUs' settings. Recovery rolls back
//! PrepareStarted records and those cut-short PrepareCompleted ones (spec, GPU settings as
//! the GPU change records say, device holdings, MPS daemons), keeps the other
//! PrepareCompleted ones (the kubelet may call prepare again for their pods), sets their
//! GPU settings again, adopts their MPS daemons (or starts them again) and re-writes their
//! missing specs, stops MPS daemons no claim owns, removes spec files of edra's kind that
//! no record owns and temp files whose writer is gone, drops device holdings and shares whose claim has no record (a lazy release cut
//! short), and stores the boot ID. Each claim is handled under its lock, so recovery can run
//! while the kubelet is served (after a re-open) without undoing a prepare in flight. The
//! instance lock ([`crate::node_lock`]) makes edra the only writer of its kind's specs in
//! the CDI directory, so a spec without a record is its own and stale.
//!
//! MIG instances ([`super::mig_instances`]): those recorded for a claim that is not completed are
//! destroyed with its roll-back; an unprepare interrupted while destroying them is
//! finished; those of completed claims are checked to exist and created again at their
//! placement when a reboot lost them (or the claim is marked so its next prepare fails and
//! says why). Instances edra did not record are never touched.

use super::{PrepareError, Preparer, cdi, read_boot_id};
use crate::state::{ClaimRecord, Phase};

/// What recovery did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The boot ID changed since the last start (or none was stored but records exist).
    pub rebooted: bool,
    /// Claims whose PrepareStarted record was rolled back.
    pub rolled_back: Vec<String>,
    /// Claims whose missing spec was re-written.
    pub rewritten: Vec<String>,
    /// Claims whose spec could not be re-written (kept; prepare retries).
    pub rewrite_failed: Vec<String>,
    /// Files removed from the CDI directory.
    pub orphans_removed: Vec<std::path::PathBuf>,
    /// Prepared claims whose GPU settings (compute mode, time-slice) were set again.
    pub gpus_reapplied: Vec<String>,
    /// Prepared claims (and shared GPUs' holders) whose GPU settings could not be set again
    /// (kept; logged).
    pub gpus_reapply_failed: Vec<String>,
    /// Prepared claims (and shared GPUs' holders, `shared:gpu-0`) whose running MPS daemon
    /// was adopted.
    pub mps_adopted: Vec<String>,
    /// Prepared claims (and shared GPUs' holders) whose MPS daemon was gone and was started
    /// again.
    pub mps_restarted: Vec<String>,
    /// Prepared claims (and shared GPUs' holders) whose MPS daemon could not be started
    /// again (kept; supervision retries).
    pub mps_failed: Vec<String>,
    /// MPS daemon directories (and daemons) that no claim owned, stopped and removed.
    pub mps_orphans: Vec<String>,
    /// Prepared claims whose unprepare was interrupted while destroying their MIG
    /// instances: the unprepare was finished.
    pub mig_released: Vec<String>,
    /// Prepared claims with a MIG instance that was gone (a reboot) and was created
    /// again at its placement.
    pub mig_recreated: Vec<String>,
    /// Prepared claims with a MIG instance that was gone and could not be created again:
    /// their next prepare fails and says so.
    pub mig_lost: Vec<String>,
}

impl Preparer {
    /// After the state store was poisoned (see [`crate::state`]): re-opens it from disk and
    /// recovers from what the disk says (blocking I/O). A PrepareStarted record on disk
    /// means the kubelet was never told the claim is prepared (that answer follows a
    /// durable PrepareCompleted), so rolling it back cannot take a GPU from a running pod.
    pub fn heal(&self) -> Result<RecoveryReport, PrepareError> {
        self.store().reopen()?;
        self.recover()
    }

    /// Runs recovery (blocking I/O; call once at start, before serving the kubelet). First
    /// checks that the CDI directory is one edra can write, so a file or a read-only
    /// directory there stops the start instead of failing the first prepare.
    pub fn recover(&self) -> Result<RecoveryReport, PrepareError> {
        let store = self.store();
        let settings = self.settings();
        check_cdi_dir(&settings.cdi_dir)?;
        let mut report = RecoveryReport::default();
        let boot_id = read_boot_id(&settings.proc_root);
        let stored = store.boot_id()?;
        report.rebooted = match &stored {
            Some(s) => !boot_id.is_empty() && *s != boot_id,
            None => false,
        };
        self.repair_holdings()?;
        for rec in store.claims()? {
            let _held = self.inner.locks.lock_blocking(&rec.uid);
            // Re-read under the lock: a prepare or unprepare may have changed it meanwhile.
            let Some(rec) = store.claim(&rec.uid)? else { continue };
            self.recover_claim(rec, &mut report)?;
        }
        if let Err(e) = self.recover_memory_limits() {
            tracing::error!(error = %crate::util::error_chain(&e), "cannot finish or undo the GPU memory limits recorded before the restart; they are kept and tried again at the next start");
        }
        self.remove_orphaned_specs(&mut report)?;
        report.mps_orphans = self.sweep_mps_orphans()?;
        if !boot_id.is_empty() && stored.as_deref() != Some(boot_id.as_str()) {
            store.set_boot_id(&boot_id)?;
        }
        self.recover_shared_gpus(&mut report);
        log_report(&report);
        self.refresh_owned_mig();
        self.refresh_shared_gpus();
        Ok(report)
    }

    /// Rebuilds unreadable share lists from the claims' records and drops the holdings a
    /// release cut short left behind.
    fn repair_holdings(&self) -> Result<(), PrepareError> {
        let store = self.store();
        let rebuilt = store.rebuild_share_lists()?;
        if !rebuilt.is_empty() {
            tracing::warn!(
                gpus = ?rebuilt,
                "rebuilt the unreadable share lists of {} from the claims' records",
                rebuilt.join(", ")
            );
        }
        let orphaned = store.drop_orphaned_holdings()?;
        if !orphaned.is_empty() {
            tracing::info!(
                devices = ?orphaned,
                "dropped the holdings of {} left by a release that a crash cut short (their claims' records were \
                 already removed)",
                orphaned.join(", ")
            );
        }
        Ok(())
    }

    /// Recovers one claim's record, read under its lock: an interrupted prepare is rolled
    /// back, an interrupted unprepare finished, a prepared claim restored.
    fn recover_claim(&self, rec: ClaimRecord, report: &mut RecoveryReport) -> Result<(), PrepareError> {
        let store = self.store();
        match rec.phase {
            Phase::PrepareStarted => {
                self.release(&rec.uid)?;
                tracing::info!(claim.uid = %rec.uid, "rolled back an interrupted prepare");
                report.rolled_back.push(rec.uid);
            }
            // Recorded, but a crash came before its devices were all taken (and so
            // before the kubelet was answered): rolled back like a PrepareStarted one.
            Phase::PrepareCompleted if !store.holds_devices(&rec)? => {
                self.release(&rec.uid)?;
                tracing::info!(
                    claim.uid = %rec.uid,
                    "rolled back a prepare that a crash cut short while its devices were taken"
                );
                report.rolled_back.push(rec.uid);
            }
            Phase::PrepareCompleted => {
                if rec.migs().any(|(_, m)| m.state == crate::state::MigState::Releasing) {
                    self.release(&rec.uid)?;
                    tracing::info!(claim.uid = %rec.uid, "finished an interrupted unprepare of MIG devices");
                    report.mig_released.push(rec.uid);
                    return Ok(());
                }
                let rec = match self.recover_migs(&rec)? {
                    super::mig_instances::MigCheck::Present => rec,
                    super::mig_instances::MigCheck::Lost => {
                        report.mig_lost.push(rec.uid);
                        return Ok(());
                    }
                    super::mig_instances::MigCheck::Recreated => {
                        // The spec names the old UUID and capability nodes.
                        cdi::remove_spec(&rec.cdi_spec_path).map_err(|source| PrepareError::Cdi {
                            op: "remove",
                            path: rec.cdi_spec_path.clone(),
                            source,
                        })?;
                        report.mig_recreated.push(rec.uid.clone());
                        store.claim(&rec.uid)?.unwrap_or(rec)
                    }
                };
                self.restore_prepared(rec, report);
            }
        }
        Ok(())
    }

    /// Sets again what a prepared claim needs and a reboot or a crash may have taken: its
    /// GPU settings, its MPS daemon, its CDI spec. Failures are reported, not returned:
    /// the claim stays prepared and its next prepare or edra's retries try again.
    fn restore_prepared(&self, rec: ClaimRecord, report: &mut RecoveryReport) {
        match self.reapply_gpus(&rec.uid) {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(claim.uid = %rec.uid, gpus = n, "set a prepared claim's GPU settings again");
                report.gpus_reapplied.push(rec.uid.clone());
            }
            Err(e) => {
                tracing::warn!(claim.uid = %rec.uid, error = %crate::util::error_chain(&e), "cannot set a prepared claim's GPU settings again; its pods share the GPU without them");
                report.gpus_reapply_failed.push(rec.uid.clone());
            }
        }
        match self.ensure_mps(&rec.uid) {
            Ok(super::mps::MpsCheck::NoDaemon) => {}
            Ok(super::mps::MpsCheck::Running(d) | super::mps::MpsCheck::Adopted(d)) => {
                tracing::info!(claim.uid = %rec.uid, pid = d.pid, "adopted the claim's running MPS control daemon");
                report.mps_adopted.push(rec.uid.clone());
            }
            Ok(super::mps::MpsCheck::Restarted(_)) => report.mps_restarted.push(rec.uid.clone()),
            Err(e) => {
                tracing::error!(claim.uid = %rec.uid, error = %crate::util::error_chain(&e), "cannot start the claim's MPS control daemon again; edra keeps trying");
                report.mps_failed.push(rec.uid.clone());
            }
        }
        if rec.cdi_spec_path.exists() {
            return;
        }
        match self.write_spec_of(&rec) {
            Ok(()) => {
                tracing::info!(claim.uid = %rec.uid, "re-wrote a missing CDI spec");
                report.rewritten.push(rec.uid);
            }
            Err(e) => {
                tracing::warn!(claim.uid = %rec.uid, error = %crate::util::error_chain(&e), "cannot re-write a missing CDI spec; prepare will retry");
                report.rewrite_failed.push(rec.uid);
            }
        }
    }

    /// Removes the CDI spec files of claims without a record and the temp files of
    /// interrupted writes, each under its claim's lock.
    fn remove_orphaned_specs(&self, report: &mut RecoveryReport) -> Result<(), PrepareError> {
        let (store, settings) = (self.store(), self.settings());
        let vendor = settings.cdi_vendor();
        let Ok(entries) = std::fs::read_dir(&settings.cdi_dir) else { return Ok(()) };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let temp = cdi::temp_file_owner(&vendor, &name);
            let Some(uid) = cdi::uid_from_file_name(&vendor, &name).or(temp.map(|(uid, _)| uid)) else {
                continue;
            };
            let _held = self.inner.locks.lock_blocking(uid);
            let orphan = match temp {
                // A temp file of an interrupted atomic write: stale when its writer is
                // gone, or was this process (which writes under the claim's lock).
                Some((_, pid)) => pid == std::process::id() || !settings.proc_root.join(pid.to_string()).exists(),
                None => store.claim(uid)?.is_none() && entry.path().exists(),
            };
            if orphan {
                let path = entry.path();
                cdi::remove_spec(&path).map_err(|source| PrepareError::Cdi {
                    op: "remove",
                    path: path.clone(),
                    source,
                })?;
                tracing::info!(path = %path.display(), "removed an orphaned CDI spec file");
                report.orphans_removed.push(path);
            }
        }
        Ok(())
    }
}

/// The one line that sums up a recovery.
fn log_report(report: &RecoveryReport) {
    tracing::info!(
        rebooted = report.rebooted,
        rolled_back = report.rolled_back.len(),
        rewritten = report.rewritten.len(),
        orphans_removed = report.orphans_removed.len(),
        gpus_reapplied = report.gpus_reapplied.len(),
        gpus_reapply_failed = report.gpus_reapply_failed.len(),
        mps_adopted = report.mps_adopted.len(),
        mps_restarted = report.mps_restarted.len(),
        mps_failed = report.mps_failed.len(),
        mps_orphans = report.mps_orphans.len(),
        mig_released = report.mig_released.len(),
        mig_recreated = report.mig_recreated.len(),
        mig_lost = report.mig_lost.len(),
        "state recovered"
    );
}

/// Creates `dir` when missing, then creates and removes a file in it. The file is made
/// exclusively without following a link: whatever another user planted under its name is
/// removed, never written through.
fn check_cdi_dir(dir: &std::path::Path) -> Result<(), PrepareError> {
    let failed = |problem: String| PrepareError::CdiDir { dir: dir.to_path_buf(), problem };
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => return Err(failed("exists and is not a directory".into())),
        Ok(_) => {}
        Err(_) => {
            std::fs::create_dir_all(dir).map_err(|e| failed(format!("is missing and cannot be created ({e})")))?
        }
    }
    let probe = dir.join(format!(".edra-write-check-{}", std::process::id()));
    let create = || {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&probe)
    };
    match create() {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => std::fs::remove_file(&probe).and_then(|()| create()),
        other => other,
    }
    .map_err(|e| failed(format!("is not writable ({e})")))?;
    std::fs::remove_file(&probe).map_err(|e| failed(format!("does not let edra remove files ({e})")))
}

impl Preparer {
    /// GPUs changed for their shares (time-sliced, or EXCLUSIVE_PROCESS with an MPS
    /// daemon): put back those without shares (a crash between the last share's release
    /// and the put-back), set again those with shares (settings do not survive a reboot or
    /// a driver reload) and adopt or start again their daemons. Failures are logged; the
    /// next release, start or supervision pass tries again.
    fn recover_shared_gpus(&self, report: &mut RecoveryReport) {
        match self.put_back_idle_shared_gpus(None) {
            Ok(0) => {}
            Ok(n) => tracing::info!(gpus = n, "put back GPUs whose shares were all released before a restart"),
            Err(e) => tracing::warn!(error = %crate::util::error_chain(&e), "cannot put back a GPU without shares"),
        }
        let holders: Vec<String> = match self.store().gpu_changes() {
            Ok(changes) => {
                changes.into_iter().map(|c| c.claim).filter(|h| h.starts_with(super::SHARED_HOLDER)).collect()
            }
            Err(_) => return,
        };
        for h in holders {
            let _held = self.inner.locks.lock_blocking(&h);
            if let Err(e) = self.reapply_gpus(&h) {
                tracing::warn!(holder = %h, error = %crate::util::error_chain(&e), "cannot set a shared GPU's settings again");
                report.gpus_reapply_failed.push(h.clone());
            }
            match self.ensure_mps(&h) {
                Ok(super::mps::MpsCheck::NoDaemon) => {}
                Ok(super::mps::MpsCheck::Running(d) | super::mps::MpsCheck::Adopted(d)) => {
                    tracing::info!(holder = %h, pid = d.pid, "adopted the shared GPU's running MPS control daemon");
                    report.mps_adopted.push(h);
                }
                Ok(super::mps::MpsCheck::Restarted(_)) => report.mps_restarted.push(h),
                Err(e) => {
                    tracing::error!(holder = %h, error = %crate::util::error_chain(&e), "cannot start the shared GPU's MPS control daemon again; edra keeps trying");
                    report.mps_failed.push(h);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
