//! The claim source of a running agent: ResourceClaims fetched from the API server through
//! a [`Cluster`], bounded by a deadline so a prepare answers the kubelet in time.

use std::time::Duration;

use futures_util::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceClaim;

use super::{ClaimFetchError, ClaimSource};
use crate::kube::Cluster;

/// How long a claim fetch may take in total, so a prepare answers the kubelet well within
/// its 45 s timeout even when the API server does not answer.
const CLAIM_FETCH_DEADLINE: Duration = Duration::from_secs(20);

impl ClaimSource for Cluster {
    fn get_claim(&self, namespace: &str, name: &str) -> BoxFuture<'_, Result<ResourceClaim, ClaimFetchError>> {
        let (ns, n) = (namespace.to_string(), name.to_string());
        Box::pin(async move {
            let api_error = |source: Box<dyn std::error::Error + Send + Sync>| ClaimFetchError::Api {
                namespace: ns.clone(),
                name: n.clone(),
                source,
            };
            let fetch = async {
                let api = self.api().await?;
                self.client().get_claim(api, &ns, &n).await
            };
            match tokio::time::timeout(CLAIM_FETCH_DEADLINE, fetch).await {
                Ok(Ok(claim)) => Ok(claim),
                Ok(Err(e)) if e.is_not_found() => {
                    Err(ClaimFetchError::NotFound { namespace: ns.clone(), name: n.clone() })
                }
                Ok(Err(e)) => Err(api_error(Box::new(e))),
                Err(_) => Err(api_error(
                    format!("no answer from the API server within {}s", CLAIM_FETCH_DEADLINE.as_secs()).into(),
                )),
            }
        })
    }
}
