//! NVML's events on edra's health thread: one event set, each GPU registered only for
//! the critical-XID and double-bit-ECC events it supports (nvml-wrapper frees the whole
//! set when a registration fails, so an unsupported type must never be asked for), then
//! bounded waits until shutdown. A GPU that supports neither event, or whose handle
//! cannot be had, is reported as not monitored; MIG devices are covered by their parent
//! GPU's registration (NVML reports their events there). The probe asks NVML for the
//! GPU by UUID and reads its PCI info; the recovery action is NVML's field 230, which
//! drivers without it do not answer.

use std::sync::atomic::{AtomicBool, Ordering};

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;

use super::source::{HealthBackend, Sink, WAIT};
use super::view::{Event, XID_UNKNOWN};
use crate::inventory::nvml::NvmlBackend;

/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`: what the driver says a GPU needs after an error.
const FIELD_RECOVERY_ACTION: u32 = 230;

/// The event types edra watches.
const WATCHED: EventTypes = EventTypes::CRITICAL_XID_ERROR.union(EventTypes::DOUBLE_BIT_ECC_ERROR);

/// NVML's health side, on its own loaded instance of the library.
pub struct NvmlHealth {
    backend: NvmlBackend,
}

impl std::fmt::Debug for NvmlHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlHealth").field("library", &self.backend.library()).finish()
    }
}

impl NvmlHealth {
    /// Health through `backend`'s NVML.
    pub fn new(backend: NvmlBackend) -> Self {
        NvmlHealth { backend }
    }
}

/// Registers `gpus` on a fresh event set; returns the set (none if not even a set could be
/// made) and tells `sink` which GPUs are monitored.
fn register<'n>(nvml: &'n Nvml, gpus: &[String], sink: Sink<'_>) -> Option<nvml_wrapper::EventSet<'n>> {
    let mut set = match nvml.create_event_set() {
        Ok(s) => s,
        Err(e) => {
            for gpu in gpus {
                sink(Event::Unmonitored { gpu: gpu.clone(), reason: format!("nvmlEventSetCreate failed: {e}") });
            }
            return None;
        }
    };
    let mut registered: Vec<(String, EventTypes)> = Vec::new();
    for gpu in gpus {
        let unmonitored = |reason: String| sink(Event::Unmonitored { gpu: gpu.clone(), reason });
        let device = match nvml.device_by_uuid(gpu.as_str()) {
            Ok(d) => d,
            Err(e) => {
                unmonitored(format!("nvmlDeviceGetHandleByUUID failed: {e}"));
                continue;
            }
        };
        let wanted = match device.supported_event_types() {
            Ok(supported) => supported & WATCHED,
            Err(e) => {
                unmonitored(format!("nvmlDeviceGetSupportedEventTypes failed: {e}"));
                continue;
            }
        };
        if wanted.is_empty() {
            unmonitored("it supports neither critical-XID nor double-bit-ECC events".into());
            continue;
        }
        match device.register_events(wanted, set) {
            Ok(s) => {
                set = s;
                registered.push((gpu.clone(), wanted));
                sink(Event::Monitored { gpu: gpu.clone() });
            }
            Err(e) => {
                // The wrapper freed the set: make a new one and register the others again
                // (told afterwards, so whoever hears it knows the new set is in place).
                set = nvml.create_event_set().ok()?;
                for (other, types) in &registered {
                    let again = nvml.device_by_uuid(other.as_str()).map_err(Into::into);
                    match again.and_then(|d| d.register_events(*types, set)) {
                        Ok(s) => set = s,
                        Err(_) => return None,
                    }
                }
                unmonitored(format!("nvmlDeviceRegisterEvents failed: {}", e.error));
            }
        }
    }
    Some(set)
}

impl NvmlHealth {
    /// NVML lost a GPU without saying which: the GPUs that fail the probe are lost; if
    /// every GPU answers, all of them are (as NVIDIA's own driver decides).
    fn report_lost(&self, gpus: &[String], sink: Sink<'_>) {
        let lost: Vec<&String> = gpus.iter().filter(|g| !self.probe(g)).collect();
        if lost.is_empty() {
            sink(Event::Lost { gpu: None });
        }
        for gpu in lost {
            sink(Event::Lost { gpu: Some(gpu.clone()) });
        }
    }
}

impl HealthBackend for NvmlHealth {
    fn watch(&self, gpus: &[String], sink: Sink<'_>, stop: &AtomicBool) {
        let nvml = self.backend.nvml();
        let Some(set) = register(nvml, gpus, sink) else {
            tracing::warn!("cannot create or keep an NVML event set; GPUs are probed but not watched for XIDs");
            return;
        };
        let wait_ms = u32::try_from(WAIT.as_millis()).unwrap_or(1000);
        while !stop.load(Ordering::Relaxed) {
            match set.wait(wait_ms) {
                Ok(data) => {
                    let gpu = data.device.uuid().ok();
                    let Some(gpu) = gpu else {
                        // An event from a GPU NVML cannot name: lost, but which?
                        self.report_lost(gpus, sink);
                        continue;
                    };
                    if data.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                        let xid = match data.event_data {
                            Some(XidError::Value(v)) => v,
                            Some(XidError::Unknown) | None => XID_UNKNOWN,
                        };
                        sink(Event::Xid { gpu: gpu.clone(), xid });
                    }
                    if data.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                        sink(Event::DoubleBitEcc { gpu });
                    }
                }
                Err(NvmlError::Timeout) => {}
                Err(NvmlError::GpuLost) => {
                    self.report_lost(gpus, sink);
                    pause(stop);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "waiting for NVML events failed; trying again");
                    pause(stop);
                }
            }
        }
    }

    fn probe(&self, uuid: &str) -> bool {
        let nvml = self.backend.nvml();
        nvml.device_by_uuid(uuid).and_then(|d| d.pci_info()).is_ok()
    }

    fn recovery_action(&self, uuid: &str) -> Option<u64> {
        let device = self.backend.nvml().device_by_uuid(uuid).ok()?;
        let samples = device.field_values_for(&[FieldId(FIELD_RECOVERY_ACTION)]).ok()?;
        match samples.into_iter().next()?.ok()?.value.ok()? {
            SampleValue::U32(v) => Some(u64::from(v)),
            SampleValue::U64(v) => Some(v),
            SampleValue::I64(v) => u64::try_from(v).ok(),
            SampleValue::F64(_) => None,
        }
    }
}

/// Waits one [`WAIT`] (in short steps, so shutdown is noticed) after a failed wait, so a
/// wait that keeps failing at once does not spin.
fn pause(stop: &AtomicBool) {
    let step = std::time::Duration::from_millis(50);
    let mut waited = std::time::Duration::ZERO;
    while waited < WAIT && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(step);
        waited += step;
    }
}
