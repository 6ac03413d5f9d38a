//! NVML health events through the real nvml-wrapper against the stand-in library: per-GPU
//! registration of only the supported event types (a GPU supporting none, or refusing
//! registration, is unmonitored and does not cost the others their events), XIDs, ECC
//! errors and lost GPUs from the event set, and the probe.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use edra::health::HealthBackend;
use edra::health::nvml::NvmlHealth;
use edra::health::view::Event;
use edra::inventory::nvml::NvmlBackend;

use crate::support::nvml::{StubNvml, a100, uuid};

const WAIT: Duration = Duration::from_secs(10);

fn append(stub: &StubNvml, line: &str) {
    use std::io::Write;
    let path = stub.dir.path().join("nvml_stub.events");
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).expect("open the events file");
    writeln!(f, "{line}").expect("append an event");
}

#[test]
fn registered_gpus_report_xids_ecc_errors_and_losses() {
    let stub = StubNvml::new(&format!(
        "{}{}{}fail;call=nvmlDeviceRegisterEvents;device=2;code=3\nfail;call=nvmlDeviceGetPciInfo_v3;device=2;code=15\n",
        a100(0, 0, "00000000:3B:00.0", false),
        a100(1, 1, "00000000:86:00.0", false).replace('\n', ";events=4\n"),
        a100(2, 2, "00000000:AF:00.0", false),
    ));
    append(&stub, "0 xid 31");
    let health = Arc::new(NvmlHealth::new(NvmlBackend::load(&stub.config()).expect("load the stand-in")));
    let (tx, rx) = mpsc::channel::<Event>();
    let tx = std::sync::Mutex::new(tx);
    let stop = Arc::new(AtomicBool::new(false));
    let watching = {
        let (health, stop) = (health.clone(), stop.clone());
        std::thread::spawn(move || {
            let gpus = [uuid(0), uuid(1), uuid(2)];
            let sink = move |e: Event| {
                let _ = tx.lock().map(|tx| tx.send(e));
            };
            health.watch(&gpus, &sink, &stop);
        })
    };
    let next = || rx.recv_timeout(WAIT).expect("an event");

    assert_eq!(next(), Event::Monitored { gpu: uuid(0) });
    let Event::Unmonitored { gpu, reason } = next() else { panic!("GPU 1 supports no watched event") };
    assert_eq!(gpu, uuid(1));
    assert!(reason.contains("supports neither"), "{reason}");
    let Event::Unmonitored { gpu, reason } = next() else { panic!("GPU 2 refuses registration") };
    assert_eq!(gpu, uuid(2));
    assert!(reason.contains("nvmlDeviceRegisterEvents"), "{reason}");

    // Only what is appended after registration counts; GPU 0 still has its events.
    append(&stub, "1 xid 79");
    append(&stub, "0 xid 79");
    assert_eq!(next(), Event::Xid { gpu: uuid(0), xid: 79 });
    append(&stub, "0 dbe");
    assert_eq!(next(), Event::DoubleBitEcc { gpu: uuid(0) });
    append(&stub, "0 xid 999");
    assert_eq!(next(), Event::Xid { gpu: uuid(0), xid: 999 });
    // NVML says a GPU is lost without naming it: the one that does not answer is.
    append(&stub, "lost");
    assert_eq!(next(), Event::Lost { gpu: Some(uuid(2)) });

    assert!(health.probe(&uuid(0)));
    assert!(!health.probe(&uuid(2)), "its PCI info fails: GPU is lost");
    assert!(!health.probe("GPU-ffffffff-0000-0000-0000-000000000000"));

    // NVML's recovery action (field 230): unknown until the driver answers it.
    assert_eq!(health.recovery_action(&uuid(0)), None);
    std::fs::write(stub.dir.path().join("nvml_stub.recovery"), "0 1\n1 0\n").expect("write recovery actions");
    assert_eq!(health.recovery_action(&uuid(0)), Some(1), "GPU reset needed");
    assert_eq!(health.recovery_action(&uuid(1)), Some(0));

    stop.store(true, Ordering::Relaxed);
    watching.join().expect("the watch ends within its bounded wait");
    assert!(rx.try_recv().is_err(), "nothing else was reported");
}
