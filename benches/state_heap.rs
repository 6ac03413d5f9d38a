//! The state store alone (`edra::state::Store` on sled), driven through the record writes
//! of prepare/unprepare cycles in one thread with no gRPC, HTTP or logging around it: what
//! the allocator holds for sled over many cycles. It separates the bytes the program has
//! allocated and not freed (`mallinfo2`: live heap) from the pages the heap keeps resident
//! (`/proc/self/smaps`), which is how "Memory over cycles" in docs/benchmarks.md tells a
//! leak from fragmentation.
//!
//! `cargo bench --bench state_heap`; `BENCH_CYCLES=n` (default 100,000). The store lives
//! under /dev/shm when it exists, so syncs do not dominate; the allocator is set up as
//! `edra run` sets it (one arena, `edra::malloc`).

use std::time::Instant;

#[allow(dead_code)]
#[path = "../tests/it/support/procfs.rs"]
mod procfs;

use edra::device_config::GpuConfig;
use edra::state::{ClaimRecord, DeviceRecord, Phase, SCHEMA_VERSION, Store};

const DEFAULT_CYCLES: usize = 100_000;
const GPUS: usize = 8;

fn main() {
    let arenas = edra::malloc::limit_arenas();
    let cycles = std::env::var("BENCH_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_CYCLES);
    let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm".into() } else { std::env::temp_dir() };
    let dir = tempfile::tempdir_in(&base).expect("temp dir for the store");
    let store = Store::open(dir.path()).expect("open the state store");

    println!("# State store heap over prepare/unprepare cycles ({cycles} cycles, store in {})\n", base.display());
    println!("Allocator: {arenas:?}. Per cycle: PrepareStarted, PrepareCompleted, remove; each a durable commit.\n");
    println!(
        "| cycles | allocated in the heap (KiB) | heap size (KiB) | heap resident (KiB, [heap]) | mmapped blocks (KiB) | RssAnon (KiB) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    let report = |n: usize| {
        let m = mallinfo();
        let (heap, anon) = resident();
        println!("| {n} | {} | {} | {heap} | {} | {anon} |", m.in_use / 1024, m.heap / 1024, m.mmapped / 1024);
    };
    let start = Instant::now();
    for i in 0..cycles {
        let mut record = record(i);
        store.put_claim(&record).expect("PrepareStarted");
        record.phase = Phase::PrepareCompleted;
        store.put_claim(&record).expect("PrepareCompleted");
        store.remove_claim(&record.uid).expect("remove");
        if i + 1 == 200 || (i + 1) % (cycles / 10).max(1) == 0 {
            report(i + 1);
        }
    }
    println!("\n{cycles} cycles in {:.1} s", start.elapsed().as_secs_f64());
}

/// A claim record shaped like the ones prepare writes for one GPU.
fn record(i: usize) -> ClaimRecord {
    let uid = format!("{:08x}-1b2c-4d5e-8f90-{:012x}", i, i.wrapping_mul(7919));
    let device = format!("gpu-{}", i % GPUS);
    ClaimRecord {
        schema: SCHEMA_VERSION,
        uid: uid.clone(),
        namespace: "default".into(),
        name: format!("claim-{i}"),
        phase: Phase::PrepareStarted,
        devices: vec![DeviceRecord {
            request: "gpu".into(),
            request_names: vec!["gpu".into()],
            device: device.clone(),
            pool: "node-1".into(),
            cdi_ids: vec![format!("k8s.gpu.edra.dev/claim={uid}-{device}")],
            admin_access: false,
            share_id: None,
            share: None,
            mig: None,
            config: GpuConfig::default(),
        }],
        cdi_spec_path: format!("/var/run/cdi/k8s.gpu.edra.dev-claim_{uid}.json").into(),
        created_at: 1_790_000_000 + i as u64,
        boot_id: "5f0c4e2a-8f53-4d7e-9a61-3c2b1d0e9f87".into(),
    }
}

/// glibc's counters, in bytes.
#[derive(Default)]
struct Mallinfo {
    /// Allocated and not freed, in the heap (small and medium blocks).
    in_use: usize,
    /// What the heap has obtained from the system (brk).
    heap: usize,
    /// Large blocks, each its own mapping (sled's 512 KiB log buffers and metrics
    /// histograms).
    mmapped: usize,
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn mallinfo() -> Mallinfo {
    // SAFETY: mallinfo2 only reads the allocator's counters.
    let m = unsafe { libc::mallinfo2() };
    Mallinfo { in_use: m.uordblks, heap: m.arena, mmapped: m.hblkhd }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn mallinfo() -> Mallinfo {
    Mallinfo::default()
}

/// (anonymous KiB of the [heap] mapping, RssAnon KiB) of this process.
fn resident() -> (u64, u64) {
    let pid = std::process::id();
    let heap = procfs::smaps(pid).iter().filter(|m| m.name == "[heap]").map(|m| m.anonymous).sum();
    (heap, procfs::status(pid).get("RssAnon").copied().unwrap_or(0))
}
