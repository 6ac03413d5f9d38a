//! The DRAResourceHealth v1alpha1 stream: advertised only when served, the complete list
//! first and after every change, and ended by shutdown.

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
        ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"]
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
