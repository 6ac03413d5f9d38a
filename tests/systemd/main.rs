//! The cluster side of `.ci/systemd-test`: the test API server on 127.0.0.1 and the
//! kubelet's side of edra's sockets, for edra installed from the .deb in a booted Debian
//! container whose `/var/lib/kubelet` is a bind mount of `<kubelet dir>` here.
//!
//!   EDRA_SYSTEMD_TEST_DIR=<work dir> cargo test --test systemd
//!
//! Without `EDRA_SYSTEMD_TEST_DIR` it does nothing (a plain `cargo test` runs it). With it,
//! the kubelet's root is `<work dir>/kubelet`; it writes `<work dir>/kubeconfig` (this
//! node's credentials, certificates embedded) and, for the DaemonSet's container
//! (`.ci/daemonset-test`), `<work dir>/serviceaccount/` (`token`, `ca.crt`, `namespace` of
//! the service account edra-system/edra, as the kubelet mounts them) and
//! `<work dir>/apiserver-port`,
//! prints `ready`, then answers one line per command read from stdin, `ok ...` or
//! `fail <why>`:
//!
//! - `mkdirs`: creates the plugin and registration folders, as the kubelet does when it
//!   starts;
//! - `register`: waits for edra's registration socket and registers it as the kubelet
//!   does (GetInfo, NotifyRegistrationStatus; retried for up to 30 s), then waits for its
//!   slices;
//! - `prepare <name> gpu|share|mps|mig`: a claim allocated the first GPU whole, a 1Gi share
//!   of the last, the second with MPS sharing, or the 3g.40gb MIG device at
//!   placement 0 of the first (mock `mig_mode`),
//!   prepared through the DRA socket; the answer's CDI IDs are kept;
//! - `watch`: from now on registers every new registration socket as soon as it appears,
//!   as the kubelet's plugin watcher does (for restarts it does not wait on);
//! - `check <name>`: the claim prepared again, as the kubelet does after a restart: the
//!   same CDI IDs (retried for up to 30 s while the socket is not served, as the kubelet
//!   retries);
//! - `race <name> <seconds>`: `check` again and again for that long, racing a restart;
//! - `loop <name>`: from now on the claim is prepared again every 20 ms, on a new
//!   connection each time, until `loop-stop`, which reports how many calls were answered,
//!   refused (no socket listening), cut off (a connection closed under the call: a kill
//!   of the process serving it), failed (edra answered an error, or other CDI devices),
//!   and the longest;
//! - `unprepare <name>`;
//! - `gone`: waits until both sockets are removed;
//! - `quit`.

#[allow(unused_imports)]
#[path = "../it/support/mod.rs"]
mod support;

#[path = "../../benches/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::{DRIVER, NODE, Site, SiteSettings};
use edra::plugin::proto::dra_v1 as v1;
use edra::plugin::proto::registration::{PluginInfo, RegistrationStatus};
use support::apiserver::{Identity, Options};
use support::kubelet::{RawH2, percent_encoded};

/// The kubelet's root inside the container.
const CONTAINER_KUBELET: &str = "/var/lib/kubelet";
/// edra's registration socket under the kubelet's root.
const REGISTRY_SOCKET: &str = "plugins_registry/gpu.edra.dev-reg.sock";
/// How long the kubelet keeps retrying a call that found no socket, in this test.
const RETRY: Duration = Duration::from_secs(30);

struct Kubelet {
    site: Site,
    registry: PathBuf,
    dra: PathBuf,
    prepared: HashMap<String, (v1::Claim, Vec<String>)>,
    /// Calls that found no socket or a closed one and were retried.
    retried: AtomicU32,
    /// The running `loop`, if any.
    looping: Option<(std::sync::Arc<LoopStats>, tokio::sync::watch::Sender<bool>, tokio::task::JoinHandle<()>)>,
}

/// What a `loop` saw.
#[derive(Default)]
struct LoopStats {
    answered: AtomicU32,
    /// Connections refused: no socket listening.
    refused: AtomicU32,
    /// Calls whose connection closed under them, or that got no answer in time.
    cut: AtomicU32,
    failed: AtomicU32,
    longest_ms: std::sync::atomic::AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
}

#[tokio::main]
async fn main() {
    let Some(work) = std::env::var_os("EDRA_SYSTEMD_TEST_DIR").map(PathBuf::from) else {
        println!("systemd: nothing to do; .ci/systemd-test runs this with EDRA_SYSTEMD_TEST_DIR set");
        return;
    };
    let kubelet = work.join("kubelet");
    let site = Site::new(Options::default(), SiteSettings { gpus: 2, ..SiteSettings::default() }).await;
    let kubeconfig = site.server.write_kubeconfig(site.dir.path(), &Identity::node(NODE)).expect("kubeconfig");
    std::fs::copy(&kubeconfig, work.join("kubeconfig")).expect("copy the kubeconfig");
    service_account(&site, &work);
    let mut k = Kubelet {
        site,
        registry: kubelet.join(REGISTRY_SOCKET),
        dra: kubelet.join(format!("plugins/{DRIVER}/dra.sock")),
        prepared: HashMap::new(),
        retried: AtomicU32::new(0),
        looping: None,
    };
    println!("ready");
    // Commands from stdin, read on a thread of their own (tokio's stdin is not built in).
    let (tx, mut commands) = tokio::sync::mpsc::channel::<String>(1);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines().map_while(Result::ok) {
            if tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    while let Some(line) = commands.recv().await {
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words.as_slice() {
            ["register"] => k.register().await,
            ["mkdirs"] => k.mkdirs(),
            ["prepare", name, kind] => k.prepare(name, kind).await,
            ["watch"] => Ok(k.watch()),
            ["check", name] => k.check(name).await,
            ["race", name, seconds] => match seconds.parse() {
                Ok(s) => k.race(name, Duration::from_secs(s)).await,
                Err(_) => Err(format!("not a number of seconds: {seconds}")),
            },
            ["loop", name] => k.start_loop(name),
            ["loop-stop"] => k.stop_loop().await,
            ["unprepare", name] => k.unprepare(name).await,
            ["gone"] => k.gone().await,
            ["quit"] => break,
            _ => Err(format!("unknown command {line:?}")),
        };
        match reply {
            Ok(s) => println!("ok {s}"),
            Err(e) => println!("fail {}", e.replace('\n', " | ")),
        }
    }
}

/// The DaemonSet's credentials: a token of the service account edra-system/edra (the
/// test API server knows no pod-bound tokens, so no node name rides with it) and the CA, in
/// `<work>/serviceaccount/`; the API server's port in `<work>/apiserver-port`.
fn service_account(site: &Site, work: &Path) {
    let dir = work.join("serviceaccount");
    std::fs::create_dir_all(&dir).expect("create serviceaccount/");
    let token = format!("edra-daemonset-test-{}", std::process::id());
    let groups = ["system:serviceaccounts", "system:serviceaccounts:edra-system", "system:authenticated"];
    site.server.add_token(&token, "system:serviceaccount:edra-system:edra", &groups);
    for (name, text) in [("token", token), ("ca.crt", site.server.ca_pem()), ("namespace", "edra-system".to_string())] {
        std::fs::write(dir.join(name), text).expect("write a service account file");
    }
    std::fs::write(work.join("apiserver-port"), site.server.addr().port().to_string()).expect("write apiserver-port");
}

/// GetInfo and NotifyRegistrationStatus on the registration socket, as the kubelet sends
/// them.
async fn register_once(registry: &Path) -> Result<PluginInfo, String> {
    // The path edra listens on, in the container, as the kubelet there would dial it.
    let authority = percent_encoded(&Path::new(CONTAINER_KUBELET).join(REGISTRY_SOCKET));
    let mut h2 = RawH2::connect(registry).await.map_err(|e| format!("connect: {e}"))?;
    let info = h2.get_info(&authority).await.map_err(|e| format!("GetInfo: {e:?}"))?;
    let status = RegistrationStatus { plugin_registered: true, error: String::new() };
    h2.notify(&authority, status).await.map_err(|e| format!("NotifyRegistrationStatus: {e:?}"))?;
    Ok(info)
}

/// Waits for `what` for up to `limit`, every 50 ms.
async fn wait(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Result<(), String> {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > limit {
            return Err(format!("{what}: not after {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

impl Kubelet {
    fn mkdirs(&self) -> Result<String, String> {
        for dir in [self.registry.parent(), self.dra.parent().and_then(Path::parent)].into_iter().flatten() {
            std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        }
        Ok("plugins and plugins_registry created".into())
    }

    async fn register(&mut self) -> Result<String, String> {
        wait("registration socket", RETRY, || self.registry.exists()).await?;
        // A socket left by a killed edra refuses connections until the next one replaces it.
        let start = Instant::now();
        let info = loop {
            match register_once(&self.registry).await {
                Ok(info) => break info,
                Err(e) if start.elapsed() > RETRY => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        let server = &self.site.server;
        server
            .wait_for("slices", RETRY, |s| !s.slices_on(NODE).is_empty())
            .await
            .map_err(|e| format!("no slices after registration: {e}"))?;
        Ok(format!("registered {} at {}", info.name, info.endpoint))
    }

    fn watch(&self) -> String {
        let registry = self.registry.clone();
        tokio::spawn(async move {
            let mut registered = None;
            loop {
                // A new socket may reuse the old one's inode number; its change time differs.
                let socket = std::fs::metadata(&registry).ok().map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()));
                if socket.is_some() && socket != registered {
                    match register_once(&registry).await {
                        Ok(_) => registered = socket,
                        Err(e) => eprintln!("watch: registration failed, retrying: {e}"),
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        "watching the registration directory".into()
    }

    async fn race(&self, name: &str, limit: Duration) -> Result<String, String> {
        let (claim, before) = self.prepared.get(name).ok_or(format!("{name} was not prepared"))?;
        let (start, retried, mut calls) = (Instant::now(), self.retried.load(Ordering::Relaxed), 0);
        while start.elapsed() < limit {
            let after = self.call(claim, true).await?;
            if &after != before {
                return Err(format!("{name}: CDI devices {after:?}, before {before:?}"));
            }
            calls += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let retried = self.retried.load(Ordering::Relaxed) - retried;
        Ok(format!("{calls} prepares answered alike, {retried} retried after a refused or closed connection"))
    }

    /// A published device: the first by name for whole GPUs, the last for shares, the
    /// second for MPS.
    fn device(&self, kind: &str) -> Result<String, String> {
        let devices = self.site.server.with_state(|s| {
            s.slices_on(NODE)
                .iter()
                .flat_map(|sl| sl["spec"]["devices"].as_array().cloned().unwrap_or_default())
                .filter_map(|d| d["name"].as_str().map(str::to_string))
                .collect::<Vec<_>>()
        });
        let mut devices = devices;
        devices.sort();
        let pick = match kind {
            "share" => devices.last(),
            "mps" => devices.get(1),
            _ => devices.first(),
        };
        pick.cloned().ok_or_else(|| "no published device".to_string())
    }

    async fn call(&self, claim: &v1::Claim, prepare: bool) -> Result<Vec<String>, String> {
        let start = Instant::now();
        loop {
            let answer = match tokio::time::timeout(RETRY, self.call_once(claim, prepare)).await {
                Ok(a) => a,
                Err(_) => Err(format!("no answer in {RETRY:?}")),
            };
            match answer {
                Ok(ids) => return Ok(ids),
                Err(e) if start.elapsed() < RETRY && e.starts_with("transport") => {
                    self.retried.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn call_once(&self, claim: &v1::Claim, prepare: bool) -> Result<Vec<String>, String> {
        call_at(&self.dra, claim, prepare).await
    }

    async fn prepare(&mut self, name: &str, kind: &str) -> Result<String, String> {
        // The mock's dynamic MIG devices are allocated by name, as the scheduler would
        // from the GPU's partitions (the tests in tests/it/agent/mig.rs do the same).
        let device = if kind == "mig" { "gpu-0-mig-3g40gb-9-0".to_string() } else { self.device(kind)? };
        let claim = match kind {
            "gpu" => self.site.claim(name, std::slice::from_ref(&device)),
            "share" => self.site.claim_share(name, &device, "1Gi"),
            "mig" => self.site.claim(name, std::slice::from_ref(&device)),
            "mps" => {
                let sharing = serde_json::json!({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 20}});
                let config = serde_json::json!({"apiVersion": format!("{DRIVER}/v1alpha1"), "kind": "GpuConfig", "sharing": sharing});
                self.site.claim_with(name, std::slice::from_ref(&device), Some(config))
            }
            other => return Err(format!("unknown claim kind {other}")),
        };
        let ids = self.call(&claim, true).await?;
        if ids.is_empty() {
            return Err("prepared with no CDI device".into());
        }
        let reply = ids.join(",");
        self.prepared.insert(name.to_string(), (claim, ids));
        Ok(reply)
    }

    async fn check(&mut self, name: &str) -> Result<String, String> {
        let (claim, before) = self.prepared.get(name).ok_or(format!("{name} was not prepared"))?;
        let after = self.call(claim, true).await?;
        if &after != before {
            return Err(format!("{name}: CDI devices {after:?}, before {before:?}"));
        }
        Ok(after.join(","))
    }

    fn start_loop(&mut self, name: &str) -> Result<String, String> {
        let (claim, before) = self.prepared.get(name).cloned().ok_or(format!("{name} was not prepared"))?;
        let stats = std::sync::Arc::new(LoopStats::default());
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let (dra, counts) = (self.dra.clone(), stats.clone());
        let task = tokio::spawn(async move {
            while !*stopped.borrow() {
                let start = Instant::now();
                let answer = tokio::time::timeout(RETRY, call_at(&dra, &claim, true)).await;
                let took = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
                counts.longest_ms.fetch_max(took, Ordering::Relaxed);
                let error = match answer {
                    Ok(Ok(ids)) if ids == before => None,
                    Ok(Ok(ids)) => Some((&counts.failed, format!("CDI devices {ids:?}, before {before:?}"))),
                    Ok(Err(e)) if e.starts_with("transport") && is_refused(&e) => Some((&counts.refused, e)),
                    Ok(Err(e)) if e.starts_with("transport") => Some((&counts.cut, e)),
                    Ok(Err(e)) => Some((&counts.failed, e)),
                    Err(_) => Some((&counts.cut, format!("no answer in {RETRY:?}"))),
                };
                match error {
                    None => counts.answered.fetch_add(1, Ordering::Relaxed),
                    Some((count, e)) => {
                        counts.first_error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                        count.fetch_add(1, Ordering::Relaxed)
                    }
                };
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(20)) => {}
                    _ = stopped.changed() => {}
                }
            }
        });
        self.looping = Some((stats, stop, task));
        Ok(format!("preparing {name} every 20 ms"))
    }

    async fn stop_loop(&mut self) -> Result<String, String> {
        let (stats, stop, task) = self.looping.take().ok_or("no loop is running")?;
        stop.send_replace(true);
        task.await.map_err(|e| format!("the loop's task: {e}"))?;
        let error = stats.first_error.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_default();
        Ok(format!(
            "answered={} refused={} cut={} failed={} longest_ms={} first_error={error:?}",
            stats.answered.load(Ordering::Relaxed),
            stats.refused.load(Ordering::Relaxed),
            stats.cut.load(Ordering::Relaxed),
            stats.failed.load(Ordering::Relaxed),
            stats.longest_ms.load(Ordering::Relaxed)
        ))
    }

    async fn unprepare(&mut self, name: &str) -> Result<String, String> {
        let (claim, _) = self.prepared.remove(name).ok_or(format!("{name} was not prepared"))?;
        self.call(&claim, false).await?;
        Ok(name.to_string())
    }

    async fn gone(&self) -> Result<String, String> {
        wait("sockets removed", RETRY, || !self.registry.exists() && !self.dra.exists()).await?;
        Ok("sockets removed".into())
    }
}

/// Whether a transport error says no socket listened (refused, or no socket file).
fn is_refused(error: &str) -> bool {
    error.contains("Connection refused") || error.contains("No such file")
}

/// One DRAPlugin v1 call on a new connection to the DRA socket `dra`; the CDI IDs.
async fn call_at(dra: &Path, claim: &v1::Claim, prepare: bool) -> Result<Vec<String>, String> {
    let channel = support::kubelet::channel(dra).await.map_err(|e| format!("transport: {e}"))?;
    let mut client = v1::dra_plugin_client::DraPluginClient::new(channel);
    let claims = vec![claim.clone()];
    let (error, ids) = if prepare {
        let answer = client
            .node_prepare_resources(v1::NodePrepareResourcesRequest { claims })
            .await
            .map_err(|e| format!("transport: {e}"))?
            .into_inner();
        let r = answer.claims.get(&claim.uid).ok_or("no answer for the claim")?;
        (r.error.clone(), r.devices.iter().flat_map(|d| d.cdi_device_ids.clone()).collect())
    } else {
        let answer = client
            .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims })
            .await
            .map_err(|e| format!("transport: {e}"))?
            .into_inner();
        let r = answer.claims.get(&claim.uid).ok_or("no answer for the claim")?;
        (r.error.clone(), Vec::new())
    };
    if error.is_empty() { Ok(ids) } else { Err(format!("edra answered: {error}")) }
}
