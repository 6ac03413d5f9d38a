use super::super::proto::health_v1alpha1 as proto;
use super::super::proto::health_v1alpha1::dra_resource_health_server::DraResourceHealth;
use super::*;

#[test]
fn devices_map_onto_the_wire_format() {
    let device = DeviceHealth {
        pool_name: "node-a".into(),
        device_name: "gpu-1".into(),
        health: Health::Unhealthy,
        last_updated: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        timeout: Some(Duration::from_secs(45)),
        message: "XID 79: GPU fell off the bus".into(),
    };
    let wire = to_wire(&device);
    assert_eq!(wire.device_name, "gpu-1");
    assert_eq!(wire.health, proto::HealthStatus::Unhealthy as i32);
    assert_eq!(wire.last_updated_time, 1_700_000_000);
    assert_eq!(wire.health_check_timeout_seconds, 45);
    assert_eq!(wire.message, "XID 79: GPU fell off the bus");
    let unknown = to_wire(&DeviceHealth { health: Health::Unknown, timeout: None, ..device });
    assert_eq!(unknown.health, proto::HealthStatus::Unknown as i32);
    assert_eq!(unknown.health_check_timeout_seconds, 0);
}

#[test]
fn long_messages_are_cut_as_the_kubelet_cuts_them() {
    assert_eq!(kubelet_message("short"), "short");
    let exact = "é".repeat(MESSAGE_LIMIT);
    assert_eq!(kubelet_message(&exact), exact, "1,024 characters are kept whole");
    let cut = kubelet_message(&"é".repeat(MESSAGE_LIMIT + 1));
    assert_eq!(cut.chars().count(), MESSAGE_LIMIT);
    assert!(cut.ends_with("é..."), "{cut}");
}

#[tokio::test(start_paused = true)]
async fn the_list_is_sent_at_once_on_changes_and_again_every_ten_seconds() {
    let device = DeviceHealth {
        pool_name: "n1".into(),
        device_name: "gpu-0".into(),
        health: Health::Healthy,
        last_updated: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        timeout: None,
        message: String::new(),
    };
    let (tx, rx) = watch::channel(Arc::new(vec![device.clone()]));
    let (stop, stopping) = watch::channel(false);
    let service = HealthService::new(rx, stopping);
    let request = Request::new(proto::NodeWatchResourcesRequest {});
    let mut stream = service.node_watch_resources(request).await.expect("stream").into_inner();
    let started = tokio::time::Instant::now();
    let first = stream.next().await.expect("a list").expect("ok");
    assert_eq!(first.devices[0].last_updated_time, 1_700_000_000);
    assert_eq!(started.elapsed(), Duration::ZERO, "the first list comes at once");

    let again = stream.next().await.expect("a list").expect("ok");
    assert_eq!(started.elapsed(), RESEND_EVERY, "unchanged, it comes again after {RESEND_EVERY:?}");
    assert!(again.devices[0].last_updated_time > 1_700_000_000, "stamped with the time it was sent");

    tx.send_replace(Arc::new(vec![DeviceHealth { health: Health::Unhealthy, ..device }]));
    let changed = stream.next().await.expect("a list").expect("ok");
    assert_eq!(started.elapsed(), RESEND_EVERY, "a change comes at once");
    assert_eq!(changed.devices[0].health, proto::HealthStatus::Unhealthy as i32);

    stop.send_replace(true);
    assert!(stream.next().await.is_none(), "shutdown ends the stream");
}

#[tokio::test(start_paused = true)]
async fn many_streams_log_one_line_and_a_summary_at_most_every_ten_minutes() {
    use crate::test_support::captured_logs::CapturedLogs;
    let (logs, _guard) = CapturedLogs::start_at("info");
    let (_tx, rx) = watch::channel(Arc::new(Vec::new()));
    let (_stop, stopping) = watch::channel(false);
    let service = HealthService::new(rx, stopping);
    // 2,000 streams, one a second (33 minutes), each closed before the next opens.
    for _ in 0..2_000 {
        let request = Request::new(proto::NodeWatchResourcesRequest {});
        let mut stream = service.node_watch_resources(request).await.expect("stream").into_inner();
        stream.next().await.expect("a list").expect("ok");
        drop(stream);
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    let text = logs.text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.iter().filter(|l| l.contains("the kubelet opened the device health stream")).count(), 1);
    let summaries: Vec<&&str> = lines.iter().filter(|l| l.contains("device health streams")).collect();
    assert_eq!(summaries.len(), 3, "{text}");
    assert_eq!(lines.len(), 4, "nothing else at INFO: {text}");
    assert!(
        summaries[0]
            .contains("the kubelet opened 600 device health streams and closed 600 in the last 10m; 1 open now"),
        "{}",
        summaries[0]
    );
}
