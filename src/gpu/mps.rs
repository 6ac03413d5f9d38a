//! The MPS control daemon of one claim, run by edra itself: `nvidia-cuda-mps-control -d`
//! with the claim's GPUs only (`CUDA_VISIBLE_DEVICES` by UUID) and its own pipe, log and
//! shm directories under edra's runtime directory (`<runtime>/mps/<id>/{pipe,log,shm}`).
//! The daemon runs in a mount namespace of its own in which the claim's shm directory is
//! `/dev/shm` (the MPS server it spawns inherits it); the claim's containers get the same
//! directory as their `/dev/shm`, so no container ever sees the host's. A private mount
//! namespace needs root (CAP_SYS_ADMIN).
//!
//! A daemon is known by its pid *and* its start time (`/proc/<pid>/stat`, field 22), so a
//! pid the kernel gave to another process later is never taken for the daemon: that pair
//! is what the caller records to adopt the daemon after a restart of edra. The daemon
//! forks away from the command edra starts (`-d`), and writes its pid into
//! `nvidia-cuda-mps-control.pid` in the pipe directory; it is ready once it answers
//! `get_server_list` on its pipe (bounded wait); then the claim's limits are set through
//! the pipe (`set_default_active_thread_percentage`, `set_default_device_pinned_mem_limit`).
//! Stopping sends `quit` through the pipe, waits a grace period, then SIGKILLs the daemon,
//! and removes the directories.
//!
//! Nothing here records anything or knows claims: prepare records a daemon before it
//! starts it (see `state::MpsDaemonRecord`), and finds it again with [`MpsDaemons::find`]
//! when a crash came between the start and the record of its pid.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The config key that overrides where `nvidia-cuda-mps-control` is.
pub const CONFIG_KEY: &str = "paths.mps_control";
/// Where `nvidia-cuda-mps-control` is under the driver root unless [`CONFIG_KEY`] says otherwise.
pub const DEFAULT_RELATIVE_PATH: &str = "usr/bin/nvidia-cuda-mps-control";
/// The file the control daemon writes its pid into, in the pipe directory.
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// The control daemon's log, in the log directory.
pub const CONTROL_LOG: &str = "control.log";
/// Lines of the daemon's log an error carries.
const LOG_TAIL_LINES: usize = 10;
/// Bytes of the end of the log read for them.
const LOG_TAIL_BYTES: u64 = 4096;
/// Longest accepted daemon ID (it names a directory).
const MAX_ID_LEN: usize = 100;
/// Between readiness or exit checks.
const POLL: Duration = Duration::from_millis(5);

/// Where and how daemons run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsSettings {
    /// `nvidia-cuda-mps-control`.
    pub control: PathBuf,
    /// The configuration key that sets `control` (named in errors).
    pub control_key: &'static str,
    /// edra's runtime directory; daemons' directories are under `<runtime>/mps/`.
    pub runtime_dir: PathBuf,
    /// procfs, for start times.
    pub proc_root: PathBuf,
    /// How long a new daemon may take to answer `get_server_list`.
    pub ready_timeout: Duration,
    /// How long `quit` may take before SIGKILL.
    pub quit_grace: Duration,
    /// Library directory to put on `LD_LIBRARY_PATH` (the driver root's libraries, when
    /// the driver root is not `/`).
    pub library_dir: Option<PathBuf>,
}

/// MPS daemon counts for the metrics.
#[derive(Debug, Default)]
pub struct MpsStats {
    /// Daemons found running at the last check.
    pub running: std::sync::atomic::AtomicU64,
    /// Daemons started again after they died.
    pub restarts: std::sync::atomic::AtomicU64,
    /// Starts that answered.
    pub started: std::sync::atomic::AtomicU64,
    /// Starts that failed.
    pub failed: std::sync::atomic::AtomicU64,
    /// Milliseconds from start to ready, summed over the starts that answered.
    pub ready_millis: std::sync::atomic::AtomicU64,
}

impl MpsStats {
    /// Counts a start that took `took` (`ok`) or failed.
    pub fn start(&self, ok: bool, took: Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        if ok {
            self.started.fetch_add(1, Relaxed);
            self.ready_millis.fetch_add(u64::try_from(took.as_millis()).unwrap_or(u64::MAX), Relaxed);
        } else {
            self.failed.fetch_add(1, Relaxed);
        }
    }
}

/// A daemon's directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonDirs {
    /// `<runtime>/mps/<id>`.
    pub root: PathBuf,
    /// The pipe directory (`CUDA_MPS_PIPE_DIRECTORY`).
    pub pipe: PathBuf,
    /// The log directory (`CUDA_MPS_LOG_DIRECTORY`).
    pub log: PathBuf,
    /// The directory that is `/dev/shm` for the daemon and the claim's containers.
    pub shm: PathBuf,
}

/// What to start: the daemon's ID (a directory name), its GPUs and the claim's limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonSpec {
    /// The daemon's ID: lowercase letters, digits and '-' (the claim's UID).
    pub id: String,
    /// The UUIDs of the GPUs (or MIG devices) it serves.
    pub gpus: Vec<String>,
    /// `set_default_active_thread_percentage` (1–100).
    pub active_thread_percentage: Option<u32>,
    /// `set_default_device_pinned_mem_limit <uuid> <MiB>M`, per GPU.
    pub pinned_memory_mib: Vec<(String, u64)>,
}

impl DaemonSpec {
    /// The control commands that set the limits, in order.
    pub fn limit_commands(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(p) = self.active_thread_percentage {
            out.push(format!("set_default_active_thread_percentage {p}"));
        }
        for (uuid, mib) in &self.pinned_memory_mib {
            out.push(format!("set_default_device_pinned_mem_limit {uuid} {mib}M"));
        }
        out
    }
}

/// Which process a daemon is: what the caller records to adopt it later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonIdentity {
    /// The control daemon's pid.
    pub pid: u32,
    /// Its start time, in clock ticks after boot (`/proc/<pid>/stat` field 22).
    pub start_time: u64,
}

/// Why a daemon could not be started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    /// The ID cannot name a directory.
    #[error("MPS daemon ID {id:?} is not 1 to {MAX_ID_LEN} lowercase letters, digits and '-'")]
    InvalidId {
        /// The ID given.
        id: String,
    },
    /// No GPUs were given.
    #[error("an MPS daemon needs at least one GPU")]
    NoGpus,
    /// The binary is missing.
    #[error(transparent)]
    Binary(super::GpuError),
    /// A directory could not be made or removed.
    #[error("cannot {op} {}", path.display())]
    Dir {
        /// `create` or `remove`.
        op: &'static str,
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The control command could not be run.
    #[error("cannot run {}", path.display())]
    Spawn {
        /// The binary.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// `-d` failed.
    #[error("`{} -d` failed with {status}; the daemon's log ends with: {log}", path.display())]
    Start {
        /// The binary.
        path: PathBuf,
        /// Its exit status.
        status: String,
        /// The end of the daemon's log.
        log: String,
    },
    /// The daemon did not answer in time.
    #[error(
        "the MPS control daemon did not answer get_server_list within {} ms ({what}); the daemon's log ends with: {log}",
        waited.as_millis()
    )]
    NotReady {
        /// What was last seen.
        what: String,
        /// The bound.
        waited: Duration,
        /// The end of the daemon's log.
        log: String,
    },
    /// The daemon's private mount namespace could not be made.
    #[error(
        "cannot give the MPS control daemon its own /dev/shm ({source}); edra must run as root \
         (CAP_SYS_ADMIN) to run MPS daemons"
    )]
    Namespace {
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A limit could not be set.
    #[error("the MPS control daemon refused `{command}`; the daemon's log ends with: {log}")]
    Limit {
        /// The control command.
        command: String,
        /// The end of the daemon's log.
        log: String,
    },
    /// The daemon survived SIGKILL.
    #[error("the MPS control daemon (pid {pid}) is still running after SIGKILL")]
    Unkillable {
        /// Its pid.
        pid: u32,
    },
}

/// Starts, checks and stops MPS control daemons.
pub trait MpsDaemons: Send + Sync {
    /// Starts the daemon `spec.id` for its GPUs, waits until it answers and sets its limits.
    /// On failure a daemon that runs is killed; the directories (with the log) stay until
    /// [`MpsDaemons::stop`].
    fn start(&self, spec: &DaemonSpec) -> Result<DaemonIdentity, MpsError>;
    /// Whether `daemon` is still that process, alive.
    fn is_running(&self, daemon: &DaemonIdentity) -> bool;
    /// The running daemon `id` as its pid file names it, if that process is alive, started
    /// at or after `not_before` (clock ticks after boot) and is the MPS control binary: for
    /// a daemon whose start was recorded but whose pid was not.
    fn find(&self, id: &str, not_before: u64) -> Option<DaemonIdentity>;
    /// Stops daemon `id` (`quit`, then SIGKILL after the grace period) and removes its
    /// directories. Idempotent.
    fn stop(&self, id: &str, daemon: Option<&DaemonIdentity>) -> Result<(), MpsError>;
}

/// The real supervisor: runs `nvidia-cuda-mps-control`.
#[derive(Debug, Clone)]
pub struct Supervisor {
    /// Settings.
    pub settings: MpsSettings,
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !id.starts_with('-')
}

impl MpsSettings {
    /// The directories of daemon `id`.
    pub fn dirs(&self, id: &str) -> DaemonDirs {
        let root = self.runtime_dir.join("mps").join(id);
        DaemonDirs { pipe: root.join("pipe"), log: root.join("log"), shm: root.join("shm"), root }
    }
}

/// The start time of process `pid` and whether it is a zombie, from `<proc>/<pid>/stat`.
pub fn process_start(proc_root: &Path, pid: u32) -> Option<(u64, bool)> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    // The command name may hold spaces and parentheses: fields follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let zombie = fields.first()? == &"Z";
    let start = fields.get(19)?.parse().ok()?;
    Some((start, zombie))
}

/// Clock ticks after boot now (`/proc/uptime`), one tick early: every process started
/// from now on has a start time at least this.
pub fn clock_ticks_now(proc_root: &Path) -> u64 {
    // SAFETY: sysconf with a valid name has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100).max(1);
    let uptime = std::fs::read_to_string(proc_root.join("uptime")).unwrap_or_default();
    let (secs, frac) = uptime.split_whitespace().next().unwrap_or("0").split_once('.').unwrap_or(("0", "0"));
    let secs: u64 = secs.parse().unwrap_or(0);
    let centis: u64 = format!("{frac:0<2}")[..2].parse().unwrap_or(0);
    secs.saturating_mul(hz).saturating_add(centis.saturating_mul(hz) / 100).saturating_sub(1)
}

/// Creates `dir` (and its parents) with `mode`, whatever the umask; a link planted at
/// `dir` is refused, never given the mode.
fn make_dir(dir: &Path, mode: u32) -> Result<(), MpsError> {
    use std::os::unix::fs::DirBuilderExt;
    let failed = |source| MpsError::Dir { op: "create", path: dir.to_path_buf(), source };
    std::fs::DirBuilder::new().recursive(true).mode(mode).create(dir).map_err(failed)?;
    crate::util::set_dir_mode(dir, mode).map_err(failed)
}

/// The last lines of the daemon's control log, on one line; `(empty)` without one.
pub fn log_tail(dirs: &DaemonDirs) -> String {
    let Ok(mut f) = std::fs::File::open(dirs.log.join(CONTROL_LOG)) else { return "(no log)".into() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut buf = Vec::new();
    use std::io::Seek;
    if f.seek(std::io::SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES))).is_err()
        || f.take(LOG_TAIL_BYTES).read_to_end(&mut buf).is_err()
    {
        return "(unreadable log)".into();
    }
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
    if tail.is_empty() { "(empty log)".into() } else { tail.join(" | ") }
}

impl Supervisor {
    /// Fails unless the control binary is an executable file (it names the path and the
    /// config key).
    pub fn check_binary(&self) -> Result<(), MpsError> {
        use std::os::unix::fs::PermissionsExt;
        let s = &self.settings;
        match std::fs::metadata(&s.control) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => Ok(()),
            _ => Err(MpsError::Binary(super::GpuError::MissingBinary { path: s.control.clone(), key: s.control_key })),
        }
    }

    fn command(&self, dirs: &DaemonDirs) -> Command {
        let mut cmd = Command::new(&self.settings.control);
        cmd.env("CUDA_MPS_PIPE_DIRECTORY", &dirs.pipe).env("CUDA_MPS_LOG_DIRECTORY", &dirs.log);
        if let Some(dir) = &self.settings.library_dir {
            cmd.env("LD_LIBRARY_PATH", dir);
        }
        cmd
    }

    /// Sends one command through the pipe; true when the control client exits 0. The
    /// client is bounded by `limit` and killed after it.
    fn send(&self, dirs: &DaemonDirs, line: &str, limit: Duration) -> Result<bool, MpsError> {
        let spawn_err = |source| MpsError::Spawn { path: self.settings.control.clone(), source };
        let mut child = self
            .command(dirs)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(spawn_err)?;
        if let Some(mut stdin) = child.stdin.take() {
            // A client that exits early closes the pipe: its status says what happened.
            let _ = writeln!(stdin, "{line}");
        }
        let status = crate::util::wait_bounded(&mut child, limit, POLL).map_err(spawn_err)?;
        Ok(status.is_some_and(|s| s.success()))
    }

    /// `-d` in a mount namespace of its own, where `dirs.shm` is `/dev/shm`.
    fn daemon_command(&self, dirs: &DaemonDirs) -> Result<Command, MpsError> {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::process::CommandExt;
        let shm = std::ffi::CString::new(dirs.shm.as_os_str().as_bytes()).map_err(|e| MpsError::Dir {
            op: "use",
            path: dirs.shm.clone(),
            source: std::io::Error::other(e),
        })?;
        let mut cmd = self.command(dirs);
        cmd.arg("-d");
        // SAFETY: between fork and exec the closure only makes system calls (unshare,
        // mount) on memory prepared before the fork; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                let check = |r: libc::c_int| if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) };
                let null = std::ptr::null();
                check(libc::unshare(libc::CLONE_NEWNS))?;
                // Nothing mounted here propagates back to the host.
                check(libc::mount(
                    c"none".as_ptr(),
                    c"/".as_ptr(),
                    null,
                    libc::MS_REC | libc::MS_PRIVATE,
                    null.cast(),
                ))?;
                check(libc::mount(shm.as_ptr(), c"/dev/shm".as_ptr(), null, libc::MS_BIND, null.cast()))
            });
        }
        Ok(cmd)
    }

    fn read_pid(dirs: &DaemonDirs) -> Option<u32> {
        std::fs::read_to_string(dirs.pipe.join(PID_FILE)).ok()?.trim().parse().ok()
    }

    fn identity(&self, pid: u32) -> Option<DaemonIdentity> {
        match process_start(&self.settings.proc_root, pid) {
            Some((start_time, false)) => Some(DaemonIdentity { pid, start_time }),
            _ => None,
        }
    }

    fn kill(&self, daemon: &DaemonIdentity) {
        // Re-checked just before: a pid reused by another process is never signalled.
        if self.is_running(daemon)
            && let Ok(pid) = i32::try_from(daemon.pid)
        {
            // SAFETY: kill(2) with a checked positive pid and a valid signal number.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }

    /// Sends the spec's limit commands; a refused one kills the daemon.
    fn set_limits(
        &self,
        spec: &DaemonSpec,
        dirs: &DaemonDirs,
        daemon: &DaemonIdentity,
        started: Instant,
    ) -> Result<(), MpsError> {
        for command in spec.limit_commands() {
            let left = self.settings.ready_timeout.saturating_sub(started.elapsed());
            if !self.send(dirs, &command, left.max(Duration::from_secs(1)))? {
                let log = log_tail(dirs);
                self.kill(daemon);
                return Err(MpsError::Limit { command, log });
            }
        }
        Ok(())
    }

    fn wait_gone(&self, daemon: &DaemonIdentity, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while self.is_running(daemon) {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(POLL);
        }
        true
    }
}

impl MpsDaemons for Supervisor {
    fn start(&self, spec: &DaemonSpec) -> Result<DaemonIdentity, MpsError> {
        let (id, gpus) = (spec.id.as_str(), &spec.gpus);
        if !valid_id(id) {
            return Err(MpsError::InvalidId { id: id.to_string() });
        }
        if gpus.is_empty() {
            return Err(MpsError::NoGpus);
        }
        self.check_binary()?;
        let s = &self.settings;
        let dirs = s.dirs(id);
        // The pipe is for every container of the claim (any user); the log for edra; the
        // shm directory is a /dev/shm (sticky, for every user).
        make_dir(&dirs.root, 0o755)?;
        make_dir(&dirs.pipe, 0o755)?;
        make_dir(&dirs.log, 0o700)?;
        make_dir(&dirs.shm, 0o1777)?;
        // A pid file left by a daemon that is gone would be taken for the new one.
        let _ = std::fs::remove_file(dirs.pipe.join(PID_FILE));
        let started = Instant::now();
        let mut child = self
            .daemon_command(&dirs)?
            .env("CUDA_VISIBLE_DEVICES", gpus.join(","))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| match source.raw_os_error() {
                Some(libc::EPERM) => MpsError::Namespace { source },
                _ => MpsError::Spawn { path: s.control.clone(), source },
            })?;
        // `-d` forks the daemon and returns at once.
        let left = s.ready_timeout.saturating_sub(started.elapsed());
        let waited = crate::util::wait_bounded(&mut child, left, POLL)
            .map_err(|source| MpsError::Spawn { path: s.control.clone(), source })?;
        let Some(status) = waited else {
            return Err(MpsError::NotReady {
                what: "`-d` did not return".into(),
                waited: s.ready_timeout,
                log: log_tail(&dirs),
            });
        };
        if !status.success() {
            return Err(MpsError::Start { path: s.control.clone(), status: status.to_string(), log: log_tail(&dirs) });
        }
        let mut what = "no pid file yet".to_string();
        loop {
            let left = s.ready_timeout.saturating_sub(started.elapsed());
            if let Some(pid) = Self::read_pid(&dirs) {
                match self.identity(pid) {
                    None => what = format!("pid {pid} is not running"),
                    Some(daemon) => {
                        if self.send(&dirs, "get_server_list", left.max(POLL))? {
                            self.set_limits(spec, &dirs, &daemon, started)?;
                            tracing::info!(mps.id = id, pid, gpus = %gpus.join(","), "MPS control daemon ready");
                            return Ok(daemon);
                        }
                        what = format!("pid {pid} does not answer yet");
                    }
                }
            }
            if started.elapsed() >= s.ready_timeout {
                let log = log_tail(&dirs);
                if let Some(daemon) = Self::read_pid(&dirs).and_then(|pid| self.identity(pid)) {
                    self.kill(&daemon);
                }
                return Err(MpsError::NotReady { what, waited: s.ready_timeout, log });
            }
            std::thread::sleep(POLL);
        }
    }

    fn is_running(&self, daemon: &DaemonIdentity) -> bool {
        matches!(process_start(&self.settings.proc_root, daemon.pid), Some((start, false)) if start == daemon.start_time)
    }

    fn find(&self, id: &str, not_before: u64) -> Option<DaemonIdentity> {
        if !valid_id(id) {
            return None;
        }
        let pid = Self::read_pid(&self.settings.dirs(id))?;
        let daemon = self.identity(pid).filter(|d| d.start_time >= not_before)?;
        let cmdline = std::fs::read(self.settings.proc_root.join(pid.to_string()).join("cmdline")).ok()?;
        let name = self.settings.control.file_name()?.as_encoded_bytes();
        cmdline.windows(name.len()).any(|w| w == name).then_some(daemon)
    }

    fn stop(&self, id: &str, daemon: Option<&DaemonIdentity>) -> Result<(), MpsError> {
        if !valid_id(id) {
            return Err(MpsError::InvalidId { id: id.to_string() });
        }
        let s = &self.settings;
        let dirs = s.dirs(id);
        if let Some(daemon) = daemon.filter(|d| self.is_running(d)) {
            let quit = self.check_binary().is_ok() && self.send(&dirs, "quit", s.quit_grace)?;
            if !(quit && self.wait_gone(daemon, s.quit_grace)) {
                tracing::warn!(mps.id = id, pid = daemon.pid, log = %log_tail(&dirs), "MPS control daemon did not quit; killing it");
                self.kill(daemon);
                if !self.wait_gone(daemon, Duration::from_secs(5)) {
                    return Err(MpsError::Unkillable { pid: daemon.pid });
                }
            }
        }
        match std::fs::remove_dir_all(&dirs.root) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(MpsError::Dir { op: "remove", path: dirs.root, source }),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
