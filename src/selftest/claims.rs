//! The self-test's claims: made up here, prepared and unprepared through the agent's real
//! [`Preparer`] with a state store and CDI folder of the self-test's own.
//!
//! Per GPU: a whole-GPU claim (prepare, its CDI spec checked and its hooks run, an
//! optional container, unprepare) and two memory shares of the published size (or two
//! replicas, as the GPU is published), prepared together and released.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures_util::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::json;
use tokio::sync::watch;

use super::{Check, Context};
use crate::inventory::{DeviceBackend, Inventory};
use crate::plugin::handler::{ClaimRef, DraHandler};
use crate::prepare::{ClaimFetchError, ClaimSource, PrepareSettings, Preparer};
use crate::sharing::Offer;

/// The namespace of the made-up claims.
pub const NAMESPACE: &str = "edra-selftest";

/// Made-up claims by name.
#[derive(Default)]
pub struct MadeUpClaims {
    claims: Mutex<HashMap<String, ResourceClaim>>,
}

impl MadeUpClaims {
    fn put(&self, claim: ResourceClaim) {
        let name = claim.metadata.name.clone().unwrap_or_default();
        self.claims.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(name, claim);
    }
}

impl ClaimSource for MadeUpClaims {
    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
        _deadline: tokio::time::Instant,
    ) -> BoxFuture<'_, Result<ResourceClaim, ClaimFetchError>> {
        let got = self.claims.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(name).cloned();
        let (namespace, name) = (namespace.to_string(), name.to_string());
        Box::pin(async move { got.ok_or(ClaimFetchError::NotFound { namespace, name }) })
    }
}

/// The preparer and the claims it reads.
pub struct Prep {
    pub preparer: Preparer,
    pub claims: Arc<MadeUpClaims>,
}

/// A preparer over a fresh store in the self-test's folder; failing that, the `state` check.
pub fn preparer(ctx: &Context, backend: Arc<dyn DeviceBackend>, inv: &Inventory) -> Result<Prep, Check> {
    let started = Instant::now();
    let store = crate::state::Store::open(&ctx.config.paths.state_dir).map_err(|e| {
        Check::fail(
            "state",
            None,
            started,
            crate::util::error_chain(&e),
            "the self-test's temporary folder must be on a writable local filesystem: pass --work-dir",
        )
    })?;
    let hook = ctx
        .config
        .paths
        .cdi_hook_binary
        .clone()
        .or_else(|| std::env::current_exe().ok())
        .unwrap_or_else(|| "/usr/bin/edra".into());
    let settings = PrepareSettings::from_config(&ctx.config, hook);
    let claims = Arc::new(MadeUpClaims::default());
    let (_tx, rx) = watch::channel(Arc::new(inv.clone()));
    let preparer = Preparer::with_backend(store, rx, claims.clone(), settings, backend);
    Ok(Prep { preparer, claims })
}

/// A claim UID of the self-test: a valid RFC 4122 UUID, different per `n`.
pub fn uid(n: u32) -> String {
    format!("5e1f7e57-0000-4000-8000-{n:012x}")
}

/// A claim allocated `results`: (request, device, share ID, consumed memory).
pub fn claim(ctx: &Context, n: u32, results: &[(&str, &str, Option<String>, Option<String>)]) -> ResourceClaim {
    let (driver, pool) = (&ctx.config.driver_name, &ctx.config.node_name);
    let results: Vec<_> = results
        .iter()
        .map(|(request, device, share, memory)| {
            let mut r = json!({"request": request, "driver": driver, "pool": pool, "device": device});
            if let Some(s) = share {
                r["shareID"] = json!(s);
            }
            if let Some(m) = memory {
                r["consumedCapacity"] = json!({"memory": m});
            }
            r
        })
        .collect();
    let requests: Vec<_> = {
        let mut names: Vec<&str> = results.iter().filter_map(|r| r["request"].as_str()).collect();
        names.dedup();
        names.iter().map(|n| json!({"name": n, "exactly": {"deviceClassName": driver}})).collect()
    };
    let name = format!("selftest-{n}");
    let value = json!({
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid(n)},
        "spec": {"devices": {"requests": requests}},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": format!("{name}-pod"), "uid": uid(n + 1000)}]
        }
    });
    serde_json::from_value(value).unwrap_or_default()
}

fn cref(claim: &ResourceClaim) -> ClaimRef {
    ClaimRef {
        namespace: NAMESPACE.into(),
        name: claim.metadata.name.clone().unwrap_or_default(),
        uid: claim.metadata.uid.clone().unwrap_or_default(),
    }
}

/// Prepares `claim`; its CDI device IDs, or the error the kubelet would get.
pub async fn prepare(prep: &Prep, claim: ResourceClaim) -> Result<Vec<String>, String> {
    let r = cref(&claim);
    prep.claims.put(claim);
    match prep.preparer.prepare(vec![r.clone()]).await.remove(&r.uid) {
        Some(Ok(devices)) => Ok(devices.into_iter().flat_map(|d| d.cdi_device_ids).collect()),
        Some(Err(e)) => Err(e),
        None => Err("the preparer gave no answer for the claim".into()),
    }
}

/// Unprepares the claim with number `n`.
pub async fn unprepare(prep: &Prep, n: u32) -> Result<(), String> {
    let r = ClaimRef { namespace: NAMESPACE.into(), name: format!("selftest-{n}"), uid: uid(n) };
    prep.preparer.unprepare(vec![r.clone()]).await.remove(&r.uid).unwrap_or(Err("no answer".into()))
}

/// Every claim check of GPU `gpu` (device name).
pub async fn check_gpu(ctx: &Context, prep: &Prep, inv: &Inventory, gpu: &str) -> Vec<Check> {
    let index = inv.device(gpu).map_or(0, |d| d.index);
    let mut out = whole_gpu(ctx, prep, gpu, index * 10 + 1).await;
    out.push(shares(ctx, prep, inv, gpu, index * 10 + 2).await);
    out
}

async fn whole_gpu(ctx: &Context, prep: &Prep, gpu: &str, n: u32) -> Vec<Check> {
    let started = Instant::now();
    let claim = claim(ctx, n, &[("gpu", gpu, None, None)]);
    let ids = match prepare(prep, claim).await {
        Ok(ids) => ids,
        Err(e) => {
            let fix = "see the message; `edra doctor` checks the node";
            return vec![Check::fail("prepare-gpu", Some(gpu), started, e, fix)];
        }
    };
    let spec_path = prep.preparer.settings().spec_path(&uid(n));
    let mut out = vec![Check::pass(
        "prepare-gpu",
        Some(gpu),
        started,
        format!("prepared as {} ({})", ids.join(", "), spec_path.display()),
    )];
    match super::spec::read(&spec_path, gpu) {
        Ok(spec) => {
            out.extend(super::spec::check(ctx, gpu, &spec));
            out.push(super::hooks::check(ctx, gpu, &spec));
            out.push(super::container::check(ctx, gpu, &ids).await);
        }
        Err(check) => out.push(check),
    }
    let started = Instant::now();
    out.push(match unprepare(prep, n).await {
        Ok(()) if !spec_path.exists() => {
            Check::pass("unprepare-gpu", Some(gpu), started, "released; the CDI spec is removed")
        }
        Ok(()) => Check::fail(
            "unprepare-gpu",
            Some(gpu),
            started,
            format!("released, but {} is still there", spec_path.display()),
            "report this: an unprepare must remove the claim's CDI spec",
        ),
        Err(e) => Check::fail("unprepare-gpu", Some(gpu), started, e, "see the message"),
    });
    out
}

/// Two shares of `gpu` as it is published: memory shares of the published step, or two
/// replicas; a GPU published whole is skipped.
async fn shares(ctx: &Context, prep: &Prep, inv: &Inventory, gpu: &str, n: u32) -> Check {
    let started = Instant::now();
    let Some(device) = inv.device(gpu) else { return Check::skip("prepare-shares", Some(gpu), "not a whole GPU") };
    let (results, what): (Vec<_>, String) = match ctx.config.sharing.offer(device, true) {
        Offer::Whole => {
            return Check::skip("prepare-shares", Some(gpu), "published whole (sharing.mode and sharing.gpus)");
        }
        Offer::Shares(policy) => {
            let memory = crate::util::quantity(policy.step);
            let share = |k: u32| Some(uid(n * 100 + k));
            (
                vec![("a", gpu, share(1), Some(memory.clone())), ("b", gpu, share(2), Some(memory.clone()))],
                format!("two memory shares of {memory}"),
            )
        }
        Offer::Replicas(_) => {
            let (r0, r1) = (format!("{gpu}-replica-0"), format!("{gpu}-replica-1"));
            return replicas(ctx, prep, gpu, n, [r0, r1]).await;
        }
    };
    let results: Vec<(&str, &str, Option<String>, Option<String>)> = results;
    let claims = [claim(ctx, n, &results[..1]), claim(ctx, n + 5, &results[1..])];
    both(prep, gpu, [n, n + 5], claims, started, &what).await
}

async fn replicas(ctx: &Context, prep: &Prep, gpu: &str, n: u32, names: [String; 2]) -> Check {
    let started = Instant::now();
    let claims = [claim(ctx, n, &[("a", &names[0], None, None)]), claim(ctx, n + 5, &[("b", &names[1], None, None)])];
    both(prep, gpu, [n, n + 5], claims, started, "two replicas").await
}

/// Prepares both claims, checks they got different CDI devices, and releases them.
async fn both(prep: &Prep, gpu: &str, ns: [u32; 2], claims: [ResourceClaim; 2], started: Instant, what: &str) -> Check {
    let [first, second] = claims;
    let a = prepare(prep, first).await;
    let b = prepare(prep, second).await;
    let released = [unprepare(prep, ns[0]).await, unprepare(prep, ns[1]).await];
    let fix = "see the message; `edra doctor` checks the node";
    match (a, b) {
        (Ok(a), Ok(b)) if a != b && released.iter().all(Result::is_ok) => Check::pass(
            "prepare-shares",
            Some(gpu),
            started,
            format!("{what}: {} and {}, both released", a.join(","), b.join(",")),
        ),
        (Ok(a), Ok(b)) if a == b => Check::fail(
            "prepare-shares",
            Some(gpu),
            started,
            format!("{what} got the same CDI device {}", a.join(",")),
            "report this: two claims must never get the same CDI device",
        ),
        (Ok(_), Ok(_)) => {
            let e = released.into_iter().filter_map(Result::err).collect::<Vec<_>>().join("; ");
            Check::fail("prepare-shares", Some(gpu), started, format!("{what}: release failed: {e}"), fix)
        }
        (Err(e), _) | (_, Err(e)) => Check::fail("prepare-shares", Some(gpu), started, format!("{what}: {e}"), fix),
    }
}
