use super::*;

#[tokio::test]
async fn same_uid_is_serialised_and_map_does_not_grow() {
    let locks = ClaimLocks::default();
    let g = locks.lock("a").await;
    // A second lock of "a" must wait while the first is held.
    let pending = tokio::time::timeout(std::time::Duration::ZERO, locks.lock("a")).await;
    assert!(pending.is_err());
    let _b = locks.lock("b").await;
    drop(g);
    let _a2 = locks.lock("a").await;
    for i in 0..100 {
        drop(locks.lock(&format!("x{i}")).await);
    }
    assert!(locks.len() <= 3, "map grew to {}", locks.len());
}
