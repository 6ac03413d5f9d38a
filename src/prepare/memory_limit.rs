//! Kernel-enforced GPU memory limits for shares (`sharing.memory_limit`): the hook each
//! share's CDI device carries, the agent's side of its request (record, then set), and the
//! removal at release and at recovery (clear, then forget).
//!
//! The hook (`edra hook apply-memory-limit`, a `createContainer` hook) finds the
//! container's cgroup and asks the agent over its memory-limit socket ([`server`]); the
//! agent checks the claim holds that share, records the limit in the state, then sets soft
//! = hard on the share's GPU for that cgroup through NVML. The state is the agent's alone
//! (sled is held by one process), which is why the hook asks rather than sets.
//!
//! NVML keeps one limit per (GPU, cgroup), while records are per share: a container given
//! two shares of one GPU (of one claim or of two) has one limit, the sum of its shares
//! there. Each (GPU, cgroup) has its own lock (`target_lock`), under which its limit is
//! computed from its records and set, whichever claim's share is added or removed. A share
//! added is recorded, then the sum set; a share removed lowers the limit to the sum of the
//! shares left (clears it when none is), then its record is forgotten. So a crash at any
//! step leaves records that release or recovery finishes:
//!
//! - recorded, maybe not set: recovery sets the sum of the shares still held there while
//!   the cgroup is the one recorded; the others' records are forgotten, and the limit is
//!   cleared when none is held.
//! - lowered or cleared, not yet forgotten: recovery sets the sum of the shares still held
//!   (the one going is still held while its unprepare is not done, and goes at the
//!   kubelet's retry); setting or clearing again is harmless; then it is forgotten.
//!
//! A cgroup that is gone (or was made again: another inode) has no limit left to clear
//! ("removing the cgroup also clears any limits", nvml.h). A limit is also cleared when
//! its container's processes are all gone ([`exits`]: the cgroup's `cgroup.events` says
//! `populated 0`), while the runtime has not yet removed the cgroup: the driver's `dmem`
//! backend lowers the reservation it made on the cgroup's ancestors only when the soft
//! limit is zeroed, which must happen before the cgroup goes.

pub mod exits;
pub mod server;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{PrepareError, Preparer, cdi, failpoint, shared::enforced_shares};
use crate::gpu::memory_limit::exits::{CgroupExits, populated};
use crate::gpu::memory_limit::{LimitControl, LimitError, wire};
use crate::state::ClaimRecord;
use crate::state::memory_limits::MemoryLimitRecord;

/// What the preparer needs to set and clear memory limits.
#[derive(Clone)]
pub struct MemoryLimits {
    /// NVML's memory-limit calls.
    pub control: Arc<dyn LimitControl>,
    /// The cgroup v2 root (`<sys_root>/fs/cgroup`).
    pub cgroup_root: PathBuf,
    /// Whether new shares get the hook (`sharing.memory_limit` enforced, or auto where
    /// available); without it, the control only clears what earlier runs set.
    pub enforce: bool,
    /// The agent's memory-limit socket, which the hook connects to.
    pub socket: PathBuf,
    /// Watches the cgroups of set limits for their containers' exit ([`exits`]); without it
    /// limits are cleared at unprepare only.
    pub exits: Option<Arc<CgroupExits>>,
}

impl std::fmt::Debug for MemoryLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLimits").field("enforce", &self.enforce).field("socket", &self.socket).finish()
    }
}

impl Preparer {
    /// Gives the preparer its memory-limit control (once, before recovery).
    pub fn set_memory_limits(&self, limits: MemoryLimits) {
        let _ = self.inner.memory_limits.set(limits);
    }

    fn memory_limits(&self) -> Option<&MemoryLimits> {
        self.inner.memory_limits.get()
    }

    /// Adds `edra hook apply-memory-limit` to the CDI device of each of `record`'s enforced
    /// shares, when limits are enforced.
    pub(super) fn add_memory_limit_hooks(&self, spec: &mut cdi::Spec, record: &ClaimRecord) {
        let Some(limits) = self.memory_limits().filter(|l| l.enforce) else { return };
        let binary = self.inner.settings.hook_binary.display().to_string();
        for d in record.devices.iter().filter(|d| !d.admin_access && d.share.is_some()) {
            if !enforced_shares(std::slice::from_ref(d)).any(|_| true) {
                continue;
            }
            let name = cdi::device_name(&record.uid, &d.cdi_device());
            let Some(dev) = spec.devices.iter_mut().find(|x| x.name == name) else { continue };
            let mut args = vec![binary.clone(), "hook".into(), "apply-memory-limit".into()];
            args.extend(["--socket".into(), limits.socket.display().to_string()]);
            args.extend(["--claim".into(), record.uid.clone(), "--device".into(), d.device.clone()]);
            if let Some(id) = &d.share_id {
                args.extend(["--share-id".into(), id.clone()]);
            }
            dev.container_edits.hooks.push(cdi::Hook {
                hook_name: "createContainer".into(),
                path: binary.clone(),
                args,
                env: Vec::new(),
                timeout: None,
            });
        }
    }

    /// The agent's side of the hook's request (blocking): checks the claim holds the share,
    /// records the limit, sets the sum of the shares recorded on that GPU and cgroup. The
    /// answer says what was set (that sum), or why not.
    pub fn apply_memory_limit(&self, req: &wire::Request) -> wire::Answer {
        let Some(limits) = self.memory_limits().filter(|l| l.enforce) else {
            return wire::Answer::refused("this edra does not enforce GPU memory limits (sharing.memory_limit)");
        };
        let _held = self.inner.locks.lock_blocking(&req.claim);
        match self.record_and_set(limits, req) {
            Ok(rec) => {
                tracing::info!(claim.uid = %rec.claim, device = %rec.device, gpu = %rec.gpu, cgroup = %rec.cgroup.display(),
                    bytes = rec.bytes, container = %req.container,
                    "GPU memory limit set on the container's cgroup (the sum of its shares of the GPU)");
                wire::Answer {
                    ok: true,
                    error: String::new(),
                    gpu: rec.gpu,
                    bytes: rec.bytes,
                    cgroup: rec.cgroup.display().to_string(),
                }
            }
            Err(e) => {
                let e = crate::util::error_chain(&e);
                tracing::warn!(claim.uid = %req.claim, device = %req.device, cgroup = %req.cgroup, error = %e,
                    "cannot set a GPU memory limit; the container is not started");
                wire::Answer::refused(e)
            }
        }
    }

    fn record_and_set(&self, limits: &MemoryLimits, req: &wire::Request) -> Result<MemoryLimitRecord, PrepareError> {
        let record = self.limit_record(limits, req)?;
        let store = &self.inner.store;
        let _target = self.inner.locks.lock_blocking(&target_lock(&record));
        // The shares already limited there, this one (an earlier record of it) left out.
        let mut others = store.memory_limits_on(&record)?;
        others.retain(|r| r.key() != record.key());
        let total = sum(&others)?.checked_add(record.bytes).ok_or_else(|| too_much(&record))?;
        store.put_memory_limit(&record)?;
        failpoint::hit("memory-limit-after-record");
        if let Err(e) = limits.control.set(&record.gpu, &record.cgroup, total, total) {
            // NVML set nothing: the limit goes back to the other shares' (cleared without
            // any, in case it was set after all), then the record goes.
            let _ = match others.is_empty() {
                true => limits.control.clear(&record.gpu, &record.cgroup),
                false => sum(&others).map_or(Ok(()), |b| limits.control.set(&record.gpu, &record.cgroup, b, b)),
            };
            store.remove_memory_limit(&record)?;
            return Err(e.into());
        }
        failpoint::hit("memory-limit-after-set");
        if !self.watch_exit(limits, &record) {
            let on = store.memory_limits_on(&record)?;
            self.converge_locked(&record, &[], &on)?;
            return Err(refuse(format!("the container's processes are gone from {}", record.cgroup.display())));
        }
        Ok(MemoryLimitRecord { bytes: total, ..record })
    }

    /// The record of the limit `req` asks for, once the claim is found to hold that share.
    fn limit_record(&self, limits: &MemoryLimits, req: &wire::Request) -> Result<MemoryLimitRecord, PrepareError> {
        let rec = self.inner.store.claim(&req.claim)?.ok_or_else(|| {
            refuse(format!("claim {} is not prepared on this node; the kubelet prepares it again", req.claim))
        })?;
        let share = rec
            .devices
            .iter()
            .find(|d| d.device == req.device && d.share_id == req.share_id && d.share.is_some())
            .and_then(|d| d.share.as_ref())
            .ok_or_else(|| refuse(format!("claim {} holds no share of {}", req.claim, req.device)))?;
        let uuid = self
            .inventory_view()
            .device(&share.gpu)
            .map(|d| d.uuid.clone())
            .ok_or_else(|| refuse(format!("GPU {} is not on this node any more", share.gpu)))?;
        let rel = crate::gpu::memory_limit::cgroup::relative_path(&format!("/{}", req.cgroup)).map_err(refuse)?;
        let cgroup = limits.cgroup_root.join(rel);
        let inode = cgroup_inode(&cgroup).map_err(refuse)?;
        Ok(MemoryLimitRecord {
            claim: req.claim.clone(),
            device: req.device.clone(),
            share_id: req.share_id.clone(),
            gpu: uuid,
            cgroup,
            inode,
            boot_id: self.inner.boot_id.clone(),
            bytes: share.memory,
        })
    }

    /// Watches `rec`'s cgroup for its container's exit; false when its processes are
    /// already gone (the watch would never fire).
    fn watch_exit(&self, limits: &MemoryLimits, rec: &MemoryLimitRecord) -> bool {
        if let Some(exits) = &limits.exits
            && let Err(e) = exits.watch(&rec.cgroup)
        {
            tracing::warn!(cgroup = %rec.cgroup.display(), error = %e,
                "cannot watch the container's cgroup for its exit; its GPU memory limit is cleared at unprepare");
        }
        populated(&rec.cgroup) != Some(false)
    }

    /// Clears and forgets the limits whose containers have exited (their cgroup holds no
    /// process, or is gone) (blocking).
    pub fn remove_exited_memory_limits(&self) -> Result<(), PrepareError> {
        let mut gone = self.inner.store.memory_limits()?;
        gone.retain(|rec| !self.is_container_there(rec));
        for rec in gone.iter().filter(|r| self.is_same_cgroup(r)) {
            tracing::info!(claim.uid = %rec.claim, device = %rec.device, cgroup = %rec.cgroup.display(),
                "the container's processes are gone; clearing its GPU memory limit before its cgroup goes");
        }
        self.remove_limits(&gone)
    }

    /// Clears and forgets every memory limit of claim `uid` (blocking; at release).
    pub(super) fn remove_memory_limits(&self, uid: &str) -> Result<(), PrepareError> {
        self.remove_limits(&self.inner.store.memory_limits_of(uid)?)
    }

    /// Forgets the limits `gone`, each (GPU, cgroup) under its lock: the limit there is set
    /// to the sum of the shares left on it, or cleared when none is, then their records go.
    fn remove_limits(&self, gone: &[MemoryLimitRecord]) -> Result<(), PrepareError> {
        let mut done: Vec<&MemoryLimitRecord> = Vec::new();
        for target in gone {
            if done.iter().any(|d| d.same_target(target)) {
                continue;
            }
            done.push(target);
            let _target = self.inner.locks.lock_blocking(&target_lock(target));
            // Read again under the lock: unprepare or the exit watch may have removed some.
            let (drop, keep): (Vec<_>, Vec<_>) =
                self.inner.store.memory_limits_on(target)?.into_iter().partition(|r| gone.contains(r));
            if !drop.is_empty() {
                self.converge_locked(target, &keep, &drop)?;
            }
        }
        Ok(())
    }

    /// With `target`'s (GPU, cgroup) lock held: sets the limit there to the sum of `keep`
    /// (cleared when empty), then forgets `drop`. Nothing is set on a cgroup that is gone
    /// or was made again (its limits went with it).
    fn converge_locked(
        &self,
        target: &MemoryLimitRecord,
        keep: &[MemoryLimitRecord],
        drop: &[MemoryLimitRecord],
    ) -> Result<(), PrepareError> {
        if self.is_same_cgroup(target) {
            let Some(limits) = self.memory_limits() else {
                return Err(PrepareError::from(LimitError::Unavailable(format!(
                    "the GPU memory limit on {} cannot be cleared: NVML's memory-limit calls are not available to \
                     this edra",
                    target.cgroup.display()
                ))));
            };
            let done = match keep {
                [] => limits.control.clear(&target.gpu, &target.cgroup),
                _ => {
                    let total = sum(keep)?;
                    limits.control.set(&target.gpu, &target.cgroup, total, total)
                }
            };
            match done {
                Ok(()) => {}
                Err(e) if e.cgroup_gone() => {}
                Err(e) => return Err(e.into()),
            }
        }
        if !drop.is_empty() {
            failpoint::hit("memory-limit-after-clear");
        }
        for rec in drop {
            self.inner.store.remove_memory_limit(rec)?;
            tracing::info!(claim.uid = %rec.claim, device = %rec.device, gpu = %rec.gpu, cgroup = %rec.cgroup.display(),
                left = keep.len(), "GPU memory limit removed");
        }
        Ok(())
    }

    /// Whether `rec`'s cgroup is still the one it was recorded on: same boot, same inode.
    fn is_same_cgroup(&self, rec: &MemoryLimitRecord) -> bool {
        rec.boot_id == self.inner.boot_id && cgroup_inode(&rec.cgroup).is_ok_and(|i| i == rec.inode)
    }

    /// Whether `rec`'s container is still there: its recorded cgroup, not known to be
    /// empty of processes.
    fn is_container_there(&self, rec: &MemoryLimitRecord) -> bool {
        self.is_same_cgroup(rec) && populated(&rec.cgroup) != Some(false)
    }

    /// Whether claim `rec.claim` still holds the share `rec` limits.
    fn holds_share(&self, rec: &MemoryLimitRecord) -> Result<bool, PrepareError> {
        Ok(self.inner.store.claim(&rec.claim)?.is_some_and(|c| {
            c.devices.iter().any(|d| {
                d.device == rec.device
                    && (rec.share_id.is_none() || d.share_id == rec.share_id)
                    && d.share.as_ref().is_some_and(|s| s.memory == rec.bytes)
            })
        }))
    }

    /// At recovery: finishes or undoes every recorded limit, each (GPU, cgroup) under its
    /// lock. The limits of shares still prepared, on their recorded cgroup which still holds
    /// processes, are set again, their sum (a crash may have come between record and set,
    /// or between lowering and forgetting), and watched; the others are forgotten, and the
    /// limit cleared where none is left. Returns (set again, removed).
    pub(crate) fn recover_memory_limits(&self) -> Result<(usize, usize), PrepareError> {
        let (mut kept, mut removed) = (0, 0);
        let all = self.inner.store.memory_limits()?;
        for (i, target) in all.iter().enumerate() {
            if all[..i].iter().any(|r| r.same_target(target)) {
                continue;
            }
            let _target = self.inner.locks.lock_blocking(&target_lock(target));
            let limits = self.memory_limits();
            let there = limits.is_some() && self.is_container_there(target);
            let (mut keep, mut drop) = (Vec::new(), Vec::new());
            for rec in self.inner.store.memory_limits_on(target)? {
                match there && self.holds_share(&rec)? {
                    true => keep.push(rec),
                    false => drop.push(rec),
                }
            }
            self.converge_locked(target, &keep, &drop)?;
            if let (Some(l), false) = (limits, keep.is_empty()) {
                // A container gone between the look and the watch is found by the watcher's
                // first look, which comes after recovery.
                self.watch_exit(l, target);
            }
            (kept, removed) = (kept + keep.len(), removed + drop.len());
        }
        if kept + removed > 0 {
            tracing::info!(kept, removed, "GPU memory limits recovered: held shares' set again, the others removed");
        }
        Ok((kept, removed))
    }
}

/// The lock key of `rec`'s (GPU, cgroup), whose one NVML limit the shares there make
/// together: what is set there and what is recorded change under it, whichever claim's.
fn target_lock(rec: &MemoryLimitRecord) -> String {
    format!("memory-limit\0{}\0{}", rec.gpu, rec.cgroup.display())
}

/// The sum of `recs`' bytes, checked.
fn sum(recs: &[MemoryLimitRecord]) -> Result<u64, PrepareError> {
    recs.iter().try_fold(0u64, |acc, r| acc.checked_add(r.bytes).ok_or_else(|| too_much(r)))
}

fn too_much(rec: &MemoryLimitRecord) -> PrepareError {
    refuse(format!(
        "the GPU memory limits of the shares on GPU {} for cgroup {} add up to more than 2^64 bytes",
        rec.gpu,
        rec.cgroup.display()
    ))
}

fn refuse(why: String) -> PrepareError {
    PrepareError::from(LimitError::Unavailable(why))
}

/// The inode of the cgroup directory `path`, refusing anything but a real directory
/// reached without symlinks.
pub fn cgroup_inode(path: &Path) -> Result<u64, String> {
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| format!("the container's cgroup {} is not there: {e}", path.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a cgroup directory", path.display()));
    }
    match std::fs::canonicalize(path) {
        Ok(real) if real == path => Ok(meta.ino()),
        _ => Err(format!("the path of the cgroup {} goes through a symlink", path.display())),
    }
}
