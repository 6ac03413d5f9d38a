//! The `pluginregistration.Registration` service on the registration socket: tells the
//! kubelet what edra is and where its DRA socket lives, and records whether the kubelet
//! accepted it (a [`RegistrationState`], and a note to the [`CallObserver`]).

use std::sync::Arc;

use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::observer::CallObserver;
use super::proto::registration::registration_server::Registration;
use super::proto::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};

/// The plugin type the kubelet's DRA handler serves.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRAPlugin services edra serves, most preferred first (the kubelet takes the first
/// one it knows).
pub const SUPPORTED_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// What the kubelet last said about edra's registration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RegistrationState {
    /// The kubelet has not reported a registration status yet.
    #[default]
    Unknown,
    /// The kubelet accepted the plugin.
    Registered,
    /// The kubelet refused the plugin, with its reason.
    Refused(String),
}

impl RegistrationState {
    /// Whether the kubelet accepted the plugin (what readiness reports).
    pub fn is_registered(&self) -> bool {
        matches!(self, RegistrationState::Registered)
    }
}

/// The Registration service.
pub(crate) struct RegistrationService {
    driver: String,
    endpoint: String,
    versions: Vec<String>,
    state: watch::Sender<RegistrationState>,
    observer: Arc<dyn CallObserver>,
}

impl RegistrationService {
    /// A service announcing `driver` with the DRA socket at `endpoint` (an absolute path)
    /// serving the DRAPlugin versions and, with `health`, the health service.
    pub(crate) fn new(
        driver: String,
        endpoint: String,
        health: bool,
        state: watch::Sender<RegistrationState>,
        observer: Arc<dyn CallObserver>,
    ) -> Self {
        let mut versions: Vec<String> = SUPPORTED_VERSIONS.iter().map(|v| (*v).to_string()).collect();
        if health {
            versions.extend(super::health::HEALTH_SERVICES.iter().map(|v| (*v).to_string()));
        }
        RegistrationService { driver, endpoint, versions, state, observer }
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _request: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        tracing::info!(driver = %self.driver, endpoint = %self.endpoint, "the kubelet asked for the plugin info");
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.to_string(),
            name: self.driver.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: self.versions.clone(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        self.observer.registration_status(status.plugin_registered);
        if status.plugin_registered {
            tracing::info!(driver = %self.driver, endpoint = %self.endpoint, "registered with the kubelet");
            self.state.send_replace(RegistrationState::Registered);
            Ok(Response::new(RegistrationStatusResponse {}))
        } else {
            let reason = if status.error.is_empty() { "no reason given".to_string() } else { status.error };
            tracing::error!(
                driver = %self.driver,
                reason = %reason,
                "the kubelet refused the plugin registration; check the kubelet version (1.32+ is needed) and its log"
            );
            self.state.send_replace(RegistrationState::Refused(reason.clone()));
            Err(Status::internal(format!("plugin registration refused by the kubelet: {reason}")))
        }
    }
}
