//! The claim source of a running agent: ResourceClaims fetched from the API server through
//! a [`Cluster`], bounded by the call's deadline so a prepare answers the kubelet in time
//! and says whether edra's own rate limit or the server held it up. Early reads
//! ([`super::prefetch`]) are sent only with a token of the rate limit free at once.

use std::time::Duration;

use futures_util::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceClaim;

use super::{ClaimFetchError, ClaimSource, FETCH_BUDGET};
use crate::kube::Cluster;

impl ClaimSource for Cluster {
    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
        deadline: tokio::time::Instant,
    ) -> BoxFuture<'_, Result<ResourceClaim, ClaimFetchError>> {
        self.read_claim(namespace, name, deadline, false)
    }

    fn get_claim_early(
        &self,
        namespace: &str,
        name: &str,
        deadline: tokio::time::Instant,
    ) -> BoxFuture<'_, Result<ResourceClaim, ClaimFetchError>> {
        self.read_claim(namespace, name, deadline, true)
    }
}

impl Cluster {
    /// GETs a claim by `deadline`; `early`: only with a token of the rate limit free at once.
    fn read_claim(
        &self,
        namespace: &str,
        name: &str,
        deadline: tokio::time::Instant,
        early: bool,
    ) -> BoxFuture<'_, Result<ResourceClaim, ClaimFetchError>> {
        let (ns, n) = (namespace.to_string(), name.to_string());
        Box::pin(async move {
            if tokio::time::Instant::now() >= deadline {
                return Err(ClaimFetchError::OutOfTime { namespace: ns, name: n, budget: FETCH_BUDGET });
            }
            let api_error = |source: Box<dyn std::error::Error + Send + Sync>| ClaimFetchError::Api {
                namespace: ns.clone(),
                name: n.clone(),
                source,
            };
            let fetch = async {
                let api = self.api().await?;
                if early {
                    self.client().get_claim_if_free(api, &ns, &n, deadline).await
                } else {
                    self.client().get_claim_by(api, &ns, &n, deadline).await
                }
            };
            // The client itself stops at the deadline and says why; this only backs it up.
            let backstop = deadline.checked_add(Duration::from_secs(1)).unwrap_or(deadline);
            match tokio::time::timeout_at(backstop, fetch).await {
                Ok(Ok(claim)) => Ok(claim),
                Ok(Err(e)) if e.is_not_found() => {
                    Err(ClaimFetchError::NotFound { namespace: ns.clone(), name: n.clone() })
                }
                Ok(Err(e)) if e.is_throttled() => {
                    Err(ClaimFetchError::Throttled { namespace: ns.clone(), name: n.clone(), source: Box::new(e) })
                }
                Ok(Err(crate::kube::Error::Decode { source, .. })) => Err(ClaimFetchError::unreadable(&ns, &n, source)),
                Ok(Err(crate::kube::Error::Convert { problem, .. })) => {
                    Err(ClaimFetchError::Refused { namespace: ns.clone(), name: n.clone(), problem })
                }
                Ok(Err(e)) => Err(api_error(Box::new(e))),
                Err(_) => {
                    Err(api_error(format!("no answer from the API server within {}s", FETCH_BUDGET.as_secs()).into()))
                }
            }
        })
    }
}
