use std::time::Duration;

use tokio::sync::watch;

use super::*;
use crate::test_support::captured_logs::CapturedLogs;

#[test]
fn the_status_says_what_the_agent_serves_and_waits_for() {
    let unknown = RegistrationState::Unknown;
    let registered = RegistrationState::Registered;
    let refused = RegistrationState::Refused("too old".into());
    let cases = [
        (&unknown, false, None, "serving; waiting for the kubelet to register edra; publishing"),
        (
            &unknown,
            false,
            Some("connection refused"),
            "serving; waiting for the kubelet to register edra; not published yet: connection refused",
        ),
        (&unknown, true, None, "serving; waiting for the kubelet to register edra; 3 devices published"),
        (&registered, false, None, "serving; registered with the kubelet; publishing"),
        (&registered, false, Some("timed out"), "serving; registered with the kubelet; not published yet: timed out"),
        (&registered, true, None, "ready: 3 devices published"),
        (&refused, true, None, "the kubelet refused the registration: too old"),
    ];
    for (registration, published, error, want) in cases {
        assert_eq!(readiness_status(registration, published, 3, error), want);
    }
}

/// Runs `report_readiness` for `run_for` of paused time, the kubelet registering edra
/// after `registers_after` (if ever); returns the warnings logged.
async fn readiness_warnings(registers_after: Option<Duration>, run_for: Duration) -> String {
    let (logs, _guard) = CapturedLogs::start();
    let (registration_tx, registration) = watch::channel(RegistrationState::Unknown);
    let (_publish_tx, publish) = watch::channel(PublishStatus::default());
    let (shutdown_tx, shutdown) = watch::channel(false);
    let registry = std::path::PathBuf::from("/var/lib/kubelet/plugins_registry");
    let task = tokio::spawn(report_readiness(registration, publish, (None, registry), shutdown));
    if let Some(after) = registers_after {
        tokio::time::sleep(after).await;
        registration_tx.send_replace(RegistrationState::Registered);
        tokio::time::sleep(run_for.saturating_sub(after)).await;
    } else {
        tokio::time::sleep(run_for).await;
    }
    shutdown_tx.send_replace(true);
    task.await.expect("the readiness task");
    logs.text()
}

#[tokio::test(start_paused = true)]
async fn an_agent_the_kubelet_does_not_register_warns_once_naming_the_registry() {
    let warned = readiness_warnings(None, Duration::from_secs(29)).await;
    assert!(!warned.contains("has not registered"), "too early: {warned}");
    let warned = readiness_warnings(None, Duration::from_secs(600)).await;
    assert_eq!(warned.matches("the kubelet has not registered edra yet").count(), 1, "{warned}");
    assert!(warned.contains("registry_dir=/var/lib/kubelet/plugins_registry"), "{warned}");
    assert!(warned.contains("is the kubelet running"), "{warned}");
}

#[tokio::test(start_paused = true)]
async fn an_agent_registered_in_time_does_not_warn() {
    let warned = readiness_warnings(Some(Duration::from_secs(5)), Duration::from_secs(120)).await;
    assert!(!warned.contains("has not registered"), "{warned}");
}
