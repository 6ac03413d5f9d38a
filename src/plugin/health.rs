//! The `DRAResourceHealth` service on the DRA socket, in every version a kubelet may call
//! (`v1`, `v1beta1`, `v1alpha1`: the same messages in three proto packages): streams the
//! complete device health list to the kubelet, first at once and then after every change.
//!
//! The health source is a `watch` channel of complete lists, so a slow kubelet only ever
//! sees the newest list. Without a change the list is sent again every [`RESEND_EVERY`]
//! (stamped with the time of sending), well within the kubelet's 30 s health timeout.
//! Messages longer than the kubelet keeps ([`MESSAGE_LIMIT`] characters) are cut as it
//! would cut them. Streams end when the source is dropped or the plugin shuts down (an
//! open stream would otherwise hold the connection through the shutdown grace period); the
//! kubelet reopens them every few seconds.
//!
//! A kubelet may open and close streams thousands of times (each of its restarts, each
//! broken connection): the first stream is logged at INFO, every other opening and closing
//! at DEBUG, and the churn is summed up at INFO at most once every [`CHURN_SUMMARY_EVERY`]
//! ([`Churn`]), when a stream opens after that long.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::{Stream, StreamExt};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// How often an unchanged list is sent again.
pub const RESEND_EVERY: Duration = Duration::from_secs(10);

/// How often at most the health streams' churn is logged at INFO.
pub const CHURN_SUMMARY_EVERY: Duration = Duration::from_secs(600);

/// The health services advertised to the kubelet when health is served, newest first; a
/// kubelet calls the newest it knows.
pub const HEALTH_SERVICES: [&str; 3] =
    ["v1.DRAResourceHealth", "v1beta1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"];

/// The longest message the kubelet keeps, in characters; longer ones are cut to
/// `MESSAGE_LIMIT - 3` characters and `...`, as the kubelet itself cuts them.
pub const MESSAGE_LIMIT: usize = 1024;

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

/// One device's entry as every version sends it (the versions differ only in package).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Wire {
    pool_name: String,
    device_name: String,
    /// `HealthStatus`: 0 unknown, 1 healthy, 2 unhealthy.
    health: i32,
    last_updated_time: i64,
    health_check_timeout_seconds: i64,
    message: String,
}

/// The DRAResourceHealth service, one value per version served.
#[derive(Clone)]
pub(crate) struct HealthService {
    source: watch::Receiver<HealthList>,
    stopping: watch::Receiver<bool>,
    churn: Arc<Churn>,
}

/// The streams opened and closed, for the log: one INFO line for the first, then a sum at
/// most every [`CHURN_SUMMARY_EVERY`].
#[derive(Debug, Default)]
struct Churn(Mutex<ChurnCount>);

#[derive(Debug, Default)]
struct ChurnCount {
    /// When the counts below started (the first stream, or the last summary).
    since: Option<tokio::time::Instant>,
    opened: u64,
    closed: u64,
    /// Streams open now.
    open: u64,
}

impl Churn {
    fn opened(&self, version: &'static str) {
        let now = tokio::time::Instant::now();
        let mut c = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        c.open = c.open.saturating_add(1);
        let Some(since) = c.since else {
            c.since = Some(now);
            drop(c);
            tracing::info!(version, "the kubelet opened the device health stream");
            return;
        };
        c.opened = c.opened.saturating_add(1);
        let (opened, closed, open, over) = (c.opened, c.closed, c.open, now.saturating_duration_since(since));
        let summary = over >= CHURN_SUMMARY_EVERY;
        if summary {
            (c.since, c.opened, c.closed) = (Some(now), 0, 0);
        }
        drop(c);
        tracing::debug!(version, "the kubelet opened a device health stream");
        if summary {
            tracing::info!(
                opened,
                closed,
                open,
                "the kubelet opened {opened} device health streams and closed {closed} in the last {}; {open} open now",
                crate::config::bounds::show(Duration::from_secs(over.as_secs()))
            );
        }
    }

    fn closed(&self) {
        let mut c = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        c.open = c.open.saturating_sub(1);
        c.closed = c.closed.saturating_add(1);
        drop(c);
        tracing::debug!("a device health stream ended");
    }
}

/// Counts its stream as closed when the stream is dropped.
struct Open(Arc<Churn>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.closed();
    }
}

impl HealthService {
    pub(crate) fn new(source: watch::Receiver<HealthList>, stopping: watch::Receiver<bool>) -> Self {
        HealthService { source, stopping, churn: Arc::default() }
    }

    /// The lists to send: the current one at once, then after every change, and again
    /// every [`RESEND_EVERY`] without one (stamped with the time of sending); ends on
    /// shutdown or when the source is gone.
    fn lists(&self, version: &'static str) -> impl Stream<Item = Vec<Wire>> + Send + 'static {
        let mut source = self.source.clone();
        source.mark_changed();
        self.churn.opened(version);
        let open = Open(Arc::clone(&self.churn));
        futures_util::stream::unfold(
            (source, self.stopping.clone(), open),
            |(mut source, mut stopping, open)| async move {
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
                let now = unix_seconds(SystemTime::now());
                let devices = list
                    .iter()
                    .map(|d| {
                        let mut wire = to_wire(d);
                        if resend {
                            wire.last_updated_time = wire.last_updated_time.max(now);
                        }
                        wire
                    })
                    .collect();
                Some((devices, (source, stopping, open)))
            },
        )
    }
}

/// Implements one version's service over [`HealthService::lists`].
macro_rules! health_version {
    ($module:ident, $name:literal) => {
        #[tonic::async_trait]
        impl super::proto::$module::dra_resource_health_server::DraResourceHealth for HealthService {
            type NodeWatchResourcesStream =
                Pin<Box<dyn Stream<Item = Result<super::proto::$module::NodeWatchResourcesResponse, Status>> + Send>>;

            async fn node_watch_resources(
                &self,
                _request: Request<super::proto::$module::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                use super::proto::$module as p;
                let stream = self.lists($name).map(|list| {
                    let devices = list
                        .into_iter()
                        .map(|w| p::DeviceHealth {
                            device: Some(p::DeviceIdentifier { pool_name: w.pool_name, device_name: w.device_name }),
                            health: w.health,
                            last_updated_time: w.last_updated_time,
                            health_check_timeout_seconds: w.health_check_timeout_seconds,
                            message: w.message,
                        })
                        .collect();
                    Ok(p::NodeWatchResourcesResponse { devices })
                });
                Ok(Response::new(Box::pin(stream)))
            }
        }
    };
}

health_version!(health_v1, "v1");
health_version!(health_v1beta1, "v1beta1");
health_version!(health_v1alpha1, "v1alpha1");

fn unix_seconds(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)).unwrap_or(0)
}

/// `message` as the kubelet keeps it: at most [`MESSAGE_LIMIT`] characters.
pub fn kubelet_message(message: &str) -> String {
    match message.char_indices().nth(MESSAGE_LIMIT) {
        None => message.to_string(),
        Some(_) => {
            let cut = message.char_indices().nth(MESSAGE_LIMIT - 3).map_or(message.len(), |(i, _)| i);
            format!("{}...", &message[..cut])
        }
    }
}

fn to_wire(device: &DeviceHealth) -> Wire {
    let health = match device.health {
        Health::Unknown => 0,
        Health::Healthy => 1,
        Health::Unhealthy => 2,
    };
    let seconds = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    Wire {
        pool_name: device.pool_name.clone(),
        device_name: device.device_name.clone(),
        health,
        last_updated_time: device.last_updated.duration_since(UNIX_EPOCH).map(seconds).unwrap_or(0),
        health_check_timeout_seconds: device.timeout.map(seconds).unwrap_or(0),
        message: kubelet_message(&device.message),
    }
}

#[cfg(test)]
mod tests;
