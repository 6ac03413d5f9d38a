//! The `v1alpha1.DRAResourceHealth` service on the DRA socket: streams the complete device
//! health list to the kubelet, first at once and then after every change.
//!
//! The health source is a `watch` channel of complete lists, so a slow kubelet only ever
//! sees the newest list. Without a change the list is sent again every [`RESEND_EVERY`]
//! (stamped with the time of sending), well within the kubelet's 30 s health timeout. Streams end when the source is dropped or the plugin shuts down
//! (an open stream would otherwise hold the connection through the shutdown grace
//! period); the kubelet reopens them every few seconds.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::proto::health_v1alpha1 as proto;
use super::proto::health_v1alpha1::dra_resource_health_server::DraResourceHealth;

/// How often an unchanged list is sent again.
pub const RESEND_EVERY: Duration = Duration::from_secs(10);

/// The health service name advertised to the kubelet when health is served.
pub const HEALTH_SERVICE: &str = "v1alpha1.DRAResourceHealth";

/// A device's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Health {
    /// Not known (e.g. not checked yet).
    #[default]
    Unknown,
    /// Working.
    Healthy,
    /// Failing; pods using it should be told.
    Unhealthy,
}

/// One device's health, as reported to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealth {
    /// The device's pool (this node's name).
    pub pool_name: String,
    /// The device's name in the pool.
    pub device_name: String,
    /// Its health.
    pub health: Health,
    /// When the health was last checked.
    pub last_updated: SystemTime,
    /// After how long without a report the kubelet should consider the device unknown;
    /// `None` for the kubelet's default.
    pub timeout: Option<Duration>,
    /// Why the device is in this state; empty if nothing to say.
    pub message: String,
}

/// The complete health list of the driver's devices on this node.
pub type HealthList = Arc<Vec<DeviceHealth>>;

type HealthStream = Pin<Box<dyn Stream<Item = Result<proto::NodeWatchResourcesResponse, Status>> + Send>>;

/// The DRAResourceHealth service.
pub(crate) struct HealthService {
    source: watch::Receiver<HealthList>,
    stopping: watch::Receiver<bool>,
}

impl HealthService {
    pub(crate) fn new(source: watch::Receiver<HealthList>, stopping: watch::Receiver<bool>) -> Self {
        HealthService { source, stopping }
    }
}

#[tonic::async_trait]
impl DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream;

    async fn node_watch_resources(
        &self,
        _request: Request<proto::NodeWatchResourcesRequest>,
    ) -> Result<Response<HealthStream>, Status> {
        let mut source = self.source.clone();
        source.mark_changed();
        tracing::info!("the kubelet opened the device health stream");
        let stream =
            futures_util::stream::unfold((source, self.stopping.clone()), |(mut source, mut stopping)| async move {
                let resend = tokio::select! {
                    changed = source.changed() => {
                        if changed.is_err() {
                            tracing::debug!("the health source is gone; ending the health stream");
                            return None;
                        }
                        false
                    }
                    () = tokio::time::sleep(RESEND_EVERY) => true,
                    _ = stopping.wait_for(|stop| *stop) => return None,
                };
                let list = Arc::clone(&source.borrow_and_update());
                let now = SystemTime::now();
                let devices = list
                    .iter()
                    .map(|d| {
                        let mut wire = to_proto(d);
                        if resend {
                            wire.last_updated_time = wire.last_updated_time.max(unix_seconds(now));
                        }
                        wire
                    })
                    .collect();
                let answer = proto::NodeWatchResourcesResponse { devices };
                Some((Ok(answer), (source, stopping)))
            });
        Ok(Response::new(Box::pin(stream)))
    }
}

fn unix_seconds(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)).unwrap_or(0)
}

fn to_proto(device: &DeviceHealth) -> proto::DeviceHealth {
    let health = match device.health {
        Health::Unknown => proto::HealthStatus::Unknown,
        Health::Healthy => proto::HealthStatus::Healthy,
        Health::Unhealthy => proto::HealthStatus::Unhealthy,
    };
    let seconds = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    proto::DeviceHealth {
        device: Some(proto::DeviceIdentifier {
            pool_name: device.pool_name.clone(),
            device_name: device.device_name.clone(),
        }),
        health: health as i32,
        last_updated_time: device.last_updated.duration_since(UNIX_EPOCH).map(seconds).unwrap_or(0),
        health_check_timeout_seconds: device.timeout.map(seconds).unwrap_or(0),
        message: device.message.clone(),
    }
}

#[cfg(test)]
mod tests {
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
        let wire = to_proto(&device);
        assert_eq!(wire.device.as_ref().map(|d| d.device_name.as_str()), Some("gpu-1"));
        assert_eq!(wire.health, proto::HealthStatus::Unhealthy as i32);
        assert_eq!(wire.last_updated_time, 1_700_000_000);
        assert_eq!(wire.health_check_timeout_seconds, 45);
        let unknown = to_proto(&DeviceHealth { health: Health::Unknown, timeout: None, ..device });
        assert_eq!(unknown.health, 0);
        assert_eq!(unknown.health_check_timeout_seconds, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_list_is_sent_at_once_on_changes_and_again_every_ten_seconds() {
        use futures_util::StreamExt;
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
}
