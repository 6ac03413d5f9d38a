use super::*;
use tokio::sync::oneshot;

#[tokio::test]
async fn tasks_are_tracked_until_they_end() {
    let inflight = InFlight::new();
    let (release, wait) = oneshot::channel::<()>();
    let task = inflight.spawn(1, async move { wait.await.is_ok() });
    assert_eq!(inflight.len(), 1);
    let quick = inflight.spawn(2, async { 7 });
    assert_eq!(quick.await.ok(), Some(7));
    assert_eq!(inflight.len(), 1);
    release.send(()).ok();
    assert_eq!(task.await.ok(), Some(true));
    inflight.idle().await;
    assert_eq!(inflight.len(), 0);
}

#[tokio::test]
async fn abort_all_cancels_running_tasks() {
    let inflight = InFlight::new();
    let task = inflight.spawn(1, std::future::pending::<()>());
    inflight.abort_all();
    inflight.idle().await;
    assert!(task.await.is_err_and(|e| e.is_cancelled()));
    let late = inflight.spawn(2, std::future::pending::<()>());
    assert!(late.await.is_err_and(|e| e.is_cancelled()), "calls after abort_all are aborted too");
    inflight.idle().await;
}
