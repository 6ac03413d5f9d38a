//! A prepare cancelled by the kubelet (its call times out or is reset) while its blocking
//! work is queued: the claim stays locked until that work has ended, so a retry or an
//! unprepare of the same claim cannot interleave with it.

use std::sync::mpsc;
use std::time::Duration;

use super::*;

/// Hands out claims from `inner`; on the first fetch it also occupies the runtime's only
/// blocking thread until `release` fires, so the prepare's blocking work queues behind it.
struct Occupying {
    inner: Arc<MemClaims>,
    release: Mutex<Option<mpsc::Receiver<()>>>,
}

impl ClaimSource for Occupying {
    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
        deadline: Instant,
    ) -> BoxFuture<'_, Result<ResourceClaim, ClaimFetchError>> {
        if let Some(rx) = self.release.lock().unwrap().take() {
            tokio::task::spawn_blocking(move || {
                let _ = rx.recv();
            });
        }
        self.inner.get_claim(namespace, name, deadline)
    }
}

#[test]
fn a_cancelled_prepare_keeps_the_claim_locked_until_its_blocking_work_ends() {
    let rt = tokio::runtime::Builder::new_current_thread().max_blocking_threads(1).enable_all().build().unwrap();
    rt.block_on(async {
        let f = Fixture::new();
        f.claims.put(claim(UID1, "c1", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([])));
        let (release, rx) = mpsc::channel();
        let source = Arc::new(Occupying { inner: f.claims.clone(), release: Mutex::new(Some(rx)) });
        let p = Preparer::new(
            f.preparer.store().clone(),
            f.inventory_tx.subscribe(),
            source,
            f.preparer.settings().clone(),
            f.preparer.compute_modes(),
        );
        let call = tokio::spawn({
            let p = p.clone();
            async move { p.prepare(vec![cref(UID1, "c1")]).await }
        });
        // Once the claim is fetched the call is parked on its queued blocking apply.
        tokio::time::timeout(Duration::from_secs(5), async {
            while f.claims.fetches.load(Ordering::SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the claim is fetched");
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());

        let locked = tokio::time::timeout(Duration::ZERO, p.inner.locks.lock(UID1)).await.is_err();
        assert!(locked, "the claim stays locked while its blocking prepare is pending");
        release.send(()).unwrap();
        let guard = tokio::time::timeout(Duration::from_secs(5), p.inner.locks.lock(UID1)).await;
        assert!(guard.is_ok(), "the lock is released when the blocking prepare ends");
        // The work ran to its end: a consistent, completed claim that unprepare can release.
        let rec = p.store().claim(UID1).unwrap().expect("record");
        assert_eq!(rec.phase, Phase::PrepareCompleted);
        assert!(rec.cdi_spec_path.exists());
    });
}
