//! The DRAResourceHealth stream in its three versions (v1, v1beta1, v1alpha1; clients
//! generated from each proto): advertised only when served, the same complete list first
//! and after every change in each, and ended by shutdown.

use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use edra::plugin::proto::health_v1alpha1::{HealthStatus, NodeWatchResourcesRequest};
use edra::plugin::proto::registration::InfoRequest;
use edra::plugin::{DeviceHealth, Health, HealthList, PluginServer};
use tokio::sync::watch;

use super::{DRIVER, Dirs, TestHandler};
use crate::support::kubelet;

fn device(name: &str, health: Health) -> DeviceHealth {
    DeviceHealth {
        pool_name: "node-a".into(),
        device_name: name.into(),
        health,
        last_updated: UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        timeout: None,
        message: String::new(),
    }
}

#[tokio::test]
async fn the_health_stream_sends_the_full_list_and_every_change_until_shutdown() {
    let dirs = Dirs::new();
    let (health, source) = watch::channel::<HealthList>(Arc::new(vec![
        device("gpu-0", Health::Healthy),
        device("gpu-1", Health::Healthy),
    ]));
    let server = PluginServer::start_with_health(&dirs.paths, DRIVER, TestHandler::new(), source).unwrap();
    let info = kubelet::registration(&dirs.registration_socket()).await.get_info(InfoRequest {}).await.unwrap();
    assert_eq!(
        info.into_inner().supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1beta1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth"
        ]
    );

    let mut client = kubelet::health_v1alpha1(&dirs.dra_socket()).await;
    let mut stream = client.node_watch_resources(NodeWatchResourcesRequest {}).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().expect("the current list");
    let names: Vec<_> = first.devices.iter().map(|d| d.device.as_ref().unwrap().device_name.clone()).collect();
    assert_eq!(names, ["gpu-0", "gpu-1"]);
    assert!(first.devices.iter().all(|d| d.health == HealthStatus::Healthy as i32));
    assert_eq!(first.devices[0].last_updated_time, 1_800_000_000);

    let mut sick = device("gpu-1", Health::Unhealthy);
    sick.message = "XID 79".into();
    health.send_replace(Arc::new(vec![device("gpu-0", Health::Healthy), sick]));
    let second = stream.message().await.unwrap().expect("the changed list");
    assert_eq!(second.devices.len(), 2, "always the complete list");
    assert_eq!(second.devices[1].health, HealthStatus::Unhealthy as i32);
    assert_eq!(second.devices[1].message, "XID 79");

    // An open stream does not hold up the shutdown: it ends.
    let started = Instant::now();
    server.shutdown(Duration::from_secs(30)).await;
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert!(matches!(stream.message().await, Ok(None) | Err(_)));
}

#[tokio::test]
async fn without_a_health_source_the_service_is_neither_advertised_nor_served() {
    let dirs = Dirs::new();
    let server = dirs.start(TestHandler::new());
    let info = kubelet::registration(&dirs.registration_socket()).await.get_info(InfoRequest {}).await.unwrap();
    assert_eq!(info.into_inner().supported_versions, ["v1.DRAPlugin", "v1beta1.DRAPlugin"]);
    let mut client = kubelet::health_v1alpha1(&dirs.dra_socket()).await;
    let status = client.node_watch_resources(NodeWatchResourcesRequest {}).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented);
    server.shutdown(Duration::from_secs(5)).await;
}

/// One version's stream as (device, health, message, timeout) tuples per list.
macro_rules! open_stream {
    ($module:ident, $socket:expr) => {{
        use edra::plugin::proto::$module::NodeWatchResourcesRequest;
        use edra::plugin::proto::$module::dra_resource_health_client::DraResourceHealthClient;
        let channel = kubelet::channel($socket).await.expect("connect to the DRA socket");
        let mut client = DraResourceHealthClient::new(channel);
        let stream = client.node_watch_resources(NodeWatchResourcesRequest {}).await.unwrap().into_inner();
        futures_util::StreamExt::map(stream, |m| {
            m.unwrap()
                .devices
                .into_iter()
                .map(|d| (d.device.unwrap().device_name, d.health, d.message, d.health_check_timeout_seconds))
                .collect::<Vec<_>>()
        })
        .boxed()
    }};
}

#[tokio::test]
async fn the_v1_v1beta1_and_v1alpha1_services_send_the_same_lists() {
    use futures_util::StreamExt;
    let dirs = Dirs::new();
    let mut sick = device("gpu-1", Health::Unhealthy);
    sick.message = "x".repeat(2000);
    sick.timeout = Some(Duration::from_secs(30));
    let (health, source) = watch::channel::<HealthList>(Arc::new(vec![device("gpu-0", Health::Healthy)]));
    let server = PluginServer::start_with_health(&dirs.paths, DRIVER, TestHandler::new(), source).unwrap();
    let socket = dirs.dra_socket();
    let mut streams = vec![
        open_stream!(health_v1, &socket),
        open_stream!(health_v1beta1, &socket),
        open_stream!(health_v1alpha1, &socket),
    ];
    for s in &mut streams {
        assert_eq!(s.next().await.expect("a list"), [("gpu-0".to_string(), 1, String::new(), 0)]);
    }
    health.send_replace(Arc::new(vec![device("gpu-0", Health::Healthy), sick]));
    let cut = format!("{}...", "x".repeat(1021));
    for s in &mut streams {
        let list = s.next().await.expect("the changed list");
        assert_eq!(list[1], ("gpu-1".to_string(), 2, cut.clone(), 30), "the message cut to 1,024 characters");
    }
    server.shutdown(Duration::from_secs(30)).await;
    for s in &mut streams {
        assert!(s.next().await.is_none(), "shutdown ends every version's stream");
    }
}
