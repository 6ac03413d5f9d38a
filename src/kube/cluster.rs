//! The API server as the rest of the agent uses it: a [`Client`] plus the resource.k8s.io
//! version, discovered on first use and then kept. Publishing and claim fetching share one.

use tokio::sync::OnceCell;

use super::{Client, Error, ResourceApi};

/// A client and the resource.k8s.io version it discovers once.
pub struct Cluster {
    client: Client,
    api: OnceCell<ResourceApi>,
}

impl Cluster {
    /// Wraps a client; nothing is contacted yet.
    pub fn new(client: Client) -> Self {
        Self { client, api: OnceCell::new() }
    }

    /// The client underneath.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The resource.k8s.io version to use, discovered once.
    pub async fn api(&self) -> Result<ResourceApi, Error> {
        self.api.get_or_try_init(|| self.client.discover_resource_api()).await.copied()
    }
}
