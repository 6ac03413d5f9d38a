//! GPU memory limits of two claims' shares on one container: the one NVML limit of a
//! (GPU, cgroup) is computed and set under that pair's lock, so two hooks at once cannot
//! leave it at one share's size.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::shares::{SHARE1, SHARE2, fixture, shared_claim};
use super::*;
use crate::gpu::memory_limit::{LimitControl, LimitError, Limits, wire};
use crate::prepare::memory_limit::MemoryLimits;

const GI: u64 = 1 << 30;

/// NVML's memory-limit calls kept in memory: one limit per (GPU, cgroup), as NVML keeps,
/// and every set in order. A set of `pause_at` bytes tells `entered`, then waits (up to a
/// deadline) for another set to come, as a slow driver call would let it.
struct SlowLimits {
    sets: Mutex<Vec<u64>>,
    came: Condvar,
    pause_at: u64,
    entered: Mutex<Option<std::sync::mpsc::Sender<()>>>,
}

impl LimitControl for SlowLimits {
    fn set(&self, _uuid: &str, _cgroup: &std::path::Path, soft: u64, _hard: u64) -> Result<(), LimitError> {
        let mut sets = self.sets.lock().unwrap();
        if soft == self.pause_at
            && let Some(tx) = self.entered.lock().unwrap().take()
        {
            let _ = tx.send(());
            let (before, deadline) = (sets.len(), Instant::now() + Duration::from_secs(1));
            while sets.len() == before && Instant::now() < deadline {
                sets = self.came.wait_timeout(sets, deadline - Instant::now()).unwrap().0;
            }
        }
        sets.push(soft);
        self.came.notify_all();
        Ok(())
    }

    fn get(&self, _uuid: &str, _cgroup: &std::path::Path) -> Result<Limits, LimitError> {
        let last = self.sets.lock().unwrap().last().copied().unwrap_or(0);
        Ok(Limits { soft: last, hard: last, used: 0 })
    }
}

fn request(uid: &str, share: &str) -> wire::Request {
    wire::Request {
        claim: uid.into(),
        device: "gpu-0".into(),
        share_id: Some(share.into()),
        cgroup: "kubepods/pod1/abc".into(),
        container: "abc".into(),
    }
}

#[tokio::test]
async fn two_claims_hooks_on_one_container_at_once_set_the_sum_of_their_shares() {
    let f = fixture();
    std::fs::create_dir_all(f.root.join("sys/fs/cgroup/kubepods/pod1/abc")).unwrap();
    let (tx, entered) = std::sync::mpsc::channel();
    let control = Arc::new(SlowLimits {
        sets: Mutex::default(),
        came: Condvar::new(),
        pause_at: 30 * GI,
        entered: Some(tx).into(),
    });
    f.preparer.set_memory_limits(MemoryLimits {
        control: control.clone(),
        cgroup_root: f.root.join("sys/fs/cgroup"),
        enforce: true,
        socket: f.root.join("memory-limit.sock"),
        exits: None,
    });
    f.claims.put(shared_claim(UID1, "a", &[("gpu", "gpu-0", SHARE1, "30Gi")], json!([])));
    f.claims.put(shared_claim(UID2, "b", &[("gpu", "gpu-0", SHARE2, "10Gi")], json!([])));
    let r = f.preparer.prepare(vec![cref(UID1, "a"), cref(UID2, "b")]).await;
    ok(&r, UID1);
    ok(&r, UID2);
    // a's hook sets 30Gi, slowly; b's comes while it is in NVML.
    let p = f.preparer.clone();
    let a = std::thread::spawn(move || p.apply_memory_limit(&request(UID1, SHARE1)));
    entered.recv_timeout(Duration::from_secs(20)).expect("a's set began");
    let p = f.preparer.clone();
    let b = std::thread::spawn(move || p.apply_memory_limit(&request(UID2, SHARE2)));
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    assert!(a.ok && b.ok, "{a:?} {b:?}");
    assert_eq!(*control.sets.lock().unwrap(), [30 * GI, 40 * GI], "b's turn came after a's: the sum is set last");
    assert_eq!(b.bytes, 40 * GI);
    // Unprepare of a lowers the limit to b's share; of b, clears it (soft 0).
    let r = f.preparer.unprepare(vec![cref(UID1, "a")]).await;
    assert!(r[UID1].is_ok());
    let r = f.preparer.unprepare(vec![cref(UID2, "b")]).await;
    assert!(r[UID2].is_ok());
    assert_eq!(control.sets.lock().unwrap()[2..], [10 * GI, 0]);
    assert!(f.preparer.store().memory_limits().unwrap().is_empty());
}
