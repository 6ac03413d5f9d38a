//! Where health events come from: a [`HealthBackend`] runs the blocking event watch on
//! edra's dedicated health thread and answers the light probe. Two implementations: NVML
//! ([`super::nvml`]) and the mock backend's events file ([`MockHealth`]), which lets a
//! whole agent be driven sick and well without a GPU.
//!
//! The events file is read as it grows (from where it ended when edra started, like
//! `tail -f`); one event per line, GPUs by index:
//!
//! ```text
//! xid 0 79        # critical XID 79 on GPU 0
//! dbe 0           # double-bit ECC error on GPU 0
//! lost 1          # GPU 1 is lost: events say so and the probe fails until `back 1`
//! lost            # NVML lost a GPU without saying which (every GPU)
//! back 1          # GPU 1 answers the probe again
//! unmonitored 2   # GPU 2 cannot be watched for events
//! monitored 2     # GPU 2 can be watched again
//! recovery 0 0    # NVML's recovery action for GPU 0 is now 0, none (1: GPU reset, ...)
//! hang 3          # GPU 3's probe blocks, as a hung NVML call would, until `unhang 3`
//! unhang 3
//! ```
//!
//! A line longer than [`MAX_LINE`] bytes is skipped without being held in memory (its
//! first [`LOGGED_PREFIX`] bytes are logged with its length), and a bad line is logged by
//! its prefix too: whatever the file holds, edra's memory and log lines stay small.

use std::collections::BTreeSet;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use super::view::Event;

/// How long one blocking wait of the event thread lasts at most, so it notices shutdown.
pub const WAIT: Duration = Duration::from_millis(1000);
/// How often the mock events file is read for new lines.
const MOCK_POLL: Duration = Duration::from_millis(20);

/// The longest line of the mock events file that is read; longer ones are skipped.
pub const MAX_LINE: usize = 4096;
/// How much of a skipped or bad line is logged.
pub const LOGGED_PREFIX: usize = 120;

/// Receives the events the watch observes.
pub type Sink<'a> = &'a (dyn Fn(Event) + Sync);

/// The hardware side of health: the event watch and the probe.
pub trait HealthBackend: Send + Sync {
    /// Watches GPUs `gpus` (UUIDs) for critical events until `stop` is set, sending each
    /// to `sink` (also [`Event::Monitored`] / [`Event::Unmonitored`] per GPU once
    /// registered). Runs on a thread of its own; every wait inside is bounded by [`WAIT`].
    fn watch(&self, gpus: &[String], sink: Sink<'_>, stop: &AtomicBool);
    /// Whether GPU `uuid` answers a light query now.
    fn probe(&self, uuid: &str) -> bool;
    /// NVML's recovery action for GPU `uuid` (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`: 0
    /// none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset), when known.
    fn recovery_action(&self, _uuid: &str) -> Option<u64> {
        None
    }
}

/// The mock backend's health: events from `mock.events_file`, GPU indexes mapped to the
/// mock UUIDs of `node`.
#[derive(Debug, Clone)]
pub struct MockHealth {
    node: String,
    gpus: u32,
    file: Option<PathBuf>,
    /// How far the file has been read (where it ended when the backend was made, at
    /// first): only lines after it count, also for a watch started again.
    read: Arc<std::sync::atomic::AtomicU64>,
    lost: Arc<Mutex<BTreeSet<String>>>,
    recovery: Arc<Mutex<std::collections::BTreeMap<String, u64>>>,
    hung: Arc<Hung>,
}

/// The GPUs whose probe blocks (`hang <gpu>`), and the probes blocked now.
#[derive(Debug, Default)]
struct Hung {
    gpus: Mutex<BTreeSet<String>>,
    changed: Condvar,
    waiting: AtomicUsize,
}

impl MockHealth {
    /// Events from `file` (none when `None`) for the `gpus` mock GPUs of `node`.
    pub fn new(node: &str, gpus: u32, file: Option<PathBuf>) -> Self {
        let start = file.as_deref().and_then(|f| std::fs::metadata(f).ok()).map(|m| m.len()).unwrap_or(0);
        MockHealth {
            node: node.to_string(),
            gpus,
            file,
            read: Arc::new(start.into()),
            lost: Arc::default(),
            recovery: Arc::default(),
            hung: Arc::default(),
        }
    }

    /// How many probes are blocked on a hung GPU now.
    pub fn probes_blocked(&self) -> usize {
        self.hung.waiting.load(Ordering::SeqCst)
    }

    fn hang(&self, gpu: String, hung: bool) {
        let mut gpus = self.hung.gpus.lock().unwrap_or_else(PoisonError::into_inner);
        if hung {
            gpus.insert(gpu);
        } else {
            gpus.remove(&gpu);
        }
        self.hung.changed.notify_all();
    }

    fn uuid(&self, index: &str) -> Result<String, String> {
        let i: u32 = index.parse().map_err(|_| format!("{index:?} is not a GPU index"))?;
        if i >= self.gpus {
            return Err(format!("GPU {i} does not exist (mock.gpus is {})", self.gpus));
        }
        Ok(crate::inventory::mock::gpu_uuid(&self.node, i))
    }

    /// The event a line of the events file names; `Ok(None)` for blank and comment lines.
    fn parse(&self, line: &str) -> Result<Option<Event>, String> {
        let line = line.split('#').next().unwrap_or_default();
        let words: Vec<&str> = line.split_whitespace().collect();
        let lost = |gpu: &str, is_lost: bool| {
            let mut set = self.lost.lock().unwrap_or_else(PoisonError::into_inner);
            if is_lost { set.insert(gpu.to_string()) } else { set.remove(gpu) }
        };
        let event = match words.as_slice() {
            [] => return Ok(None),
            ["xid", gpu, xid] => {
                let xid = xid.parse().map_err(|_| format!("{xid:?} is not an XID number"))?;
                Event::Xid { gpu: self.uuid(gpu)?, xid }
            }
            ["dbe", gpu] => Event::DoubleBitEcc { gpu: self.uuid(gpu)? },
            ["lost"] => {
                for i in 0..self.gpus {
                    lost(&crate::inventory::mock::gpu_uuid(&self.node, i), true);
                }
                Event::Lost { gpu: None }
            }
            ["lost", gpu] => {
                let gpu = self.uuid(gpu)?;
                lost(&gpu, true);
                Event::Lost { gpu: Some(gpu) }
            }
            ["back", gpu] => {
                let gpu = self.uuid(gpu)?;
                lost(&gpu, false);
                Event::Probe { gpu, ok: true }
            }
            ["unmonitored", gpu] => {
                Event::Unmonitored { gpu: self.uuid(gpu)?, reason: "the mock events file says so".into() }
            }
            ["monitored", gpu] => Event::Monitored { gpu: self.uuid(gpu)? },
            [verb @ ("hang" | "unhang"), gpu] => {
                self.hang(self.uuid(gpu)?, *verb == "hang");
                return Ok(None);
            }
            ["recovery", gpu, action] => {
                let action = action.parse().map_err(|_| format!("{action:?} is not a recovery action number"))?;
                self.recovery.lock().unwrap_or_else(PoisonError::into_inner).insert(self.uuid(gpu)?, action);
                return Ok(None);
            }
            _ => {
                return Err("expected xid <gpu> <xid>, dbe <gpu>, lost [<gpu>], back <gpu>, unmonitored <gpu>, \
                            monitored <gpu>, recovery <gpu> <action>, hang <gpu> or unhang <gpu>"
                    .into());
            }
        };
        Ok(Some(event))
    }
}

impl HealthBackend for MockHealth {
    fn watch(&self, gpus: &[String], sink: Sink<'_>, stop: &AtomicBool) {
        for gpu in gpus {
            sink(Event::Monitored { gpu: gpu.clone() });
        }
        let Some(path) = &self.file else {
            return;
        };
        let mut offset = self.read.load(Ordering::Relaxed);
        let mut lines = Lines::default();
        while !stop.load(Ordering::Relaxed) {
            match read_from(path, &mut offset) {
                Ok(bytes) if !bytes.is_empty() => {
                    self.read.store(offset, Ordering::Relaxed);
                    lines.push(&bytes, &mut |line| self.take_line(path, line, sink));
                    // More may be waiting: read again at once.
                    continue;
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    offset = 0;
                    self.read.store(0, Ordering::Relaxed);
                }
                Err(e) => tracing::warn!(file = %path.display(), error = %e, "cannot read the mock events file"),
            }
            std::thread::sleep(MOCK_POLL);
        }
    }

    fn probe(&self, uuid: &str) -> bool {
        let mut hung = self.hung.gpus.lock().unwrap_or_else(PoisonError::into_inner);
        if hung.contains(uuid) {
            self.hung.waiting.fetch_add(1, Ordering::SeqCst);
            while hung.contains(uuid) {
                hung = self.hung.changed.wait(hung).unwrap_or_else(PoisonError::into_inner);
            }
            self.hung.waiting.fetch_sub(1, Ordering::SeqCst);
        }
        drop(hung);
        !self.lost.lock().unwrap_or_else(PoisonError::into_inner).contains(uuid)
    }

    fn recovery_action(&self, uuid: &str) -> Option<u64> {
        self.recovery.lock().unwrap_or_else(PoisonError::into_inner).get(uuid).copied()
    }
}

impl MockHealth {
    /// Sends the event of one line of the events file to `sink`, or logs why it has none.
    fn take_line(&self, path: &std::path::Path, line: Line, sink: Sink<'_>) {
        match line {
            Line::Whole(text) => match self.parse(text.trim()) {
                Ok(Some(event)) => sink(event),
                Ok(None) => {}
                Err(why) => {
                    let line = prefix(text.trim().as_bytes());
                    tracing::warn!(file = %path.display(), line, "ignoring a line of the mock events file: {why}")
                }
            },
            Line::TooLong { prefix, bytes } => tracing::warn!(
                file = %path.display(),
                line = prefix,
                bytes,
                "ignoring a line of the mock events file: longer than {MAX_LINE} bytes"
            ),
        }
    }
}

/// A line of the events file: whole, or too long to be read (its prefix and length).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Line {
    Whole(String),
    TooLong { prefix: String, bytes: u64 },
}

/// Splits bytes read into lines, holding at most [`MAX_LINE`] bytes of an unfinished one.
#[derive(Debug, Default)]
struct Lines {
    partial: Vec<u8>,
    /// The length so far of a line found too long (`partial` then holds its prefix).
    skipping: Option<u64>,
}

impl Lines {
    /// Adds `bytes` and passes every line they finish to `out`.
    fn push(&mut self, bytes: &[u8], out: &mut dyn FnMut(Line)) {
        let mut rest = bytes;
        loop {
            let (piece, ended) = match rest.iter().position(|b| *b == b'\n') {
                Some(i) => (&rest[..i], true),
                None => (rest, false),
            };
            self.take(piece);
            if !ended {
                return;
            }
            rest = &rest[piece.len() + 1..];
            let line = std::mem::take(&mut self.partial);
            out(match self.skipping.take() {
                Some(bytes) => Line::TooLong { prefix: format!("{}…", String::from_utf8_lossy(&line)), bytes },
                None => Line::Whole(String::from_utf8_lossy(&line).into_owned()),
            });
        }
    }

    /// Adds a piece of the current line, keeping only its prefix once it is too long.
    fn take(&mut self, piece: &[u8]) {
        let len = u64::try_from(piece.len()).unwrap_or(u64::MAX);
        if let Some(bytes) = &mut self.skipping {
            *bytes = bytes.saturating_add(len);
        } else if self.partial.len().saturating_add(piece.len()) > MAX_LINE {
            let had = u64::try_from(self.partial.len()).unwrap_or(u64::MAX);
            self.skipping = Some(had.saturating_add(len));
            let keep = LOGGED_PREFIX.saturating_sub(self.partial.len()).min(piece.len());
            self.partial.extend_from_slice(&piece[..keep]);
            self.partial.truncate(LOGGED_PREFIX);
            self.partial.shrink_to(LOGGED_PREFIX);
        } else {
            self.partial.extend_from_slice(piece);
        }
    }
}

/// The first [`LOGGED_PREFIX`] bytes of `line`, as text (`…` marks a cut).
fn prefix(line: &[u8]) -> String {
    let cut = line.len() > LOGGED_PREFIX;
    let mut text = String::from_utf8_lossy(&line[..line.len().min(LOGGED_PREFIX)]).into_owned();
    if cut {
        text.push('…');
    }
    text
}

/// GPUs that cannot be watched (NVML's event API could not be loaded): every GPU is
/// reported as not monitored, and every probe succeeds.
#[derive(Debug, Clone)]
pub struct Unwatched {
    /// Why, for the condition's message.
    pub reason: String,
}

impl HealthBackend for Unwatched {
    fn watch(&self, gpus: &[String], sink: Sink<'_>, _stop: &AtomicBool) {
        for gpu in gpus {
            sink(Event::Unmonitored { gpu: gpu.clone(), reason: self.reason.clone() });
        }
    }

    fn probe(&self, _uuid: &str) -> bool {
        true
    }
}

/// What was appended to `path` after `offset` (from the start again if it shrank).
fn read_from(path: &std::path::Path, offset: &mut u64) -> std::io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    if len < *offset {
        *offset = 0;
    }
    if len == *offset {
        return Ok(Vec::new());
    }
    f.seek(SeekFrom::Start(*offset))?;
    let mut buf = Vec::new();
    // At most 1 MiB per read: a huge file is taken in steps.
    f.take(1 << 20).read_to_end(&mut buf)?;
    *offset = offset.saturating_add(buf.len() as u64);
    Ok(buf)
}

#[cfg(test)]
mod tests;
