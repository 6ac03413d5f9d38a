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
//! ```

use std::collections::BTreeSet;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::view::Event;

/// How long one blocking wait of the event thread lasts at most, so it notices shutdown.
pub const WAIT: Duration = Duration::from_millis(1000);
/// How often the mock events file is read for new lines.
const MOCK_POLL: Duration = Duration::from_millis(20);

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
        }
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
            ["recovery", gpu, action] => {
                let action = action.parse().map_err(|_| format!("{action:?} is not a recovery action number"))?;
                self.recovery.lock().unwrap_or_else(PoisonError::into_inner).insert(self.uuid(gpu)?, action);
                return Ok(None);
            }
            _ => {
                return Err("expected xid <gpu> <xid>, dbe <gpu>, lost [<gpu>], back <gpu>, unmonitored <gpu>, \
                            monitored <gpu> or recovery <gpu> <action>"
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
        let mut partial = String::new();
        while !stop.load(Ordering::Relaxed) {
            match read_from(path, &mut offset) {
                Ok(text) if !text.is_empty() => {
                    self.read.store(offset, Ordering::Relaxed);
                    partial.push_str(&text);
                    while let Some(end) = partial.find('\n') {
                        let line: String = partial.drain(..=end).collect();
                        match self.parse(line.trim()) {
                            Ok(Some(event)) => sink(event),
                            Ok(None) => {}
                            Err(why) => {
                                tracing::warn!(file = %path.display(), line = line.trim(), "ignoring a line of the mock events file: {why}")
                            }
                        }
                    }
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
        !self.lost.lock().unwrap_or_else(PoisonError::into_inner).contains(uuid)
    }

    fn recovery_action(&self, uuid: &str) -> Option<u64> {
        self.recovery.lock().unwrap_or_else(PoisonError::into_inner).get(uuid).copied()
    }
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
fn read_from(path: &std::path::Path, offset: &mut u64) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    if len < *offset {
        *offset = 0;
    }
    if len == *offset {
        return Ok(String::new());
    }
    f.seek(SeekFrom::Start(*offset))?;
    let mut buf = Vec::new();
    // At most 1 MiB per read: a huge file is taken in steps.
    f.take(1 << 20).read_to_end(&mut buf)?;
    *offset = offset.saturating_add(buf.len() as u64);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_events_by_gpu_index() {
        let m = MockHealth::new("n1", 2, None);
        let gpu0 = crate::inventory::mock::gpu_uuid("n1", 0);
        assert_eq!(m.parse("xid 0 79").expect("xid"), Some(Event::Xid { gpu: gpu0.clone(), xid: 79 }));
        assert_eq!(m.parse("  # a comment").expect("comment"), None);
        assert_eq!(m.parse("lost 0").expect("lost"), Some(Event::Lost { gpu: Some(gpu0.clone()) }));
        assert!(!m.probe(&gpu0), "a lost GPU fails the probe");
        assert_eq!(m.parse("back 0").expect("back"), Some(Event::Probe { gpu: gpu0.clone(), ok: true }));
        assert!(m.probe(&gpu0));
        assert!(m.parse("xid 2 79").expect_err("no GPU 2").contains("does not exist"));
        assert!(m.parse("xid 0 lots").is_err());
        assert!(m.parse("reboot").is_err());
        assert_eq!(m.recovery_action(&gpu0), None);
        assert_eq!(m.parse("recovery 0 0").expect("recovery"), None);
        assert_eq!(m.recovery_action(&gpu0), Some(0));
    }

    #[test]
    fn the_file_is_read_as_it_grows() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("events");
        std::fs::write(&path, "xid 0 1\n").expect("write");
        let mut offset = std::fs::metadata(&path).expect("stat").len();
        assert_eq!(read_from(&path, &mut offset).expect("read"), "");
        std::fs::write(&path, "xid 0 1\nxid 0 79\n").expect("append");
        assert_eq!(read_from(&path, &mut offset).expect("read"), "xid 0 79\n");
        std::fs::write(&path, "x\n").expect("truncate");
        assert_eq!(read_from(&path, &mut offset).expect("read"), "x\n", "a shrunk file is read from its start");
    }
}
