//! The kubelet plugin over real Unix sockets: registration (including the kubelet's
//! path-shaped `:authority`), DRAPlugin v1 and v1beta1, request checks, socket files and
//! shutdown. The claim handler here is a small in-memory one that records its calls; the
//! code under test is the gRPC layer.

mod dra;
mod health;
mod registration;
mod sockets;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use edra::config::Paths;
use edra::plugin::{ClaimRef, DraHandler, PluginServer, PrepareResults, PreparedDevice, UnprepareResults};
use tokio::sync::{Notify, watch};

pub const DRIVER: &str = "gpu.edra.dev";

/// What the handler was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Prepare(Vec<ClaimRef>),
    Unprepare(Vec<ClaimRef>),
}

/// An in-memory claim handler: prepares one device per claim, remembers prepared claims,
/// fails or skips the UIDs it is told to, and can hold calls until released.
#[derive(Default)]
pub struct TestHandler {
    pub calls: Mutex<Vec<Call>>,
    pub prepared: Mutex<BTreeMap<String, Vec<PreparedDevice>>>,
    pub fail: Mutex<HashSet<String>>,
    pub skip: Mutex<HashSet<String>>,
    /// While `Some(false)`, calls wait; `entered` is notified when one starts waiting.
    pub gate: Option<watch::Sender<bool>>,
    pub entered: Notify,
}

impl TestHandler {
    pub fn new() -> Arc<Self> {
        Arc::new(TestHandler::default())
    }

    /// A handler whose calls wait until `release` is called.
    pub fn gated() -> Arc<Self> {
        Arc::new(TestHandler { gate: Some(watch::Sender::new(false)), ..TestHandler::default() })
    }

    pub fn release(&self) {
        if let Some(gate) = &self.gate {
            gate.send_replace(true);
        }
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    async fn wait_for_gate(&self) {
        if let Some(gate) = &self.gate {
            let mut open = gate.subscribe();
            self.entered.notify_one();
            let _ = open.wait_for(|open| *open).await;
        }
    }

    pub fn device(uid: &str) -> PreparedDevice {
        PreparedDevice {
            request_names: vec!["gpu".into()],
            pool_name: "node-a".into(),
            device_name: "gpu-0".into(),
            cdi_device_ids: vec![format!("k8s.gpu.edra.dev/gpu={uid}-gpu-0")],
            share_id: Some(format!("share-{uid}")),
        }
    }
}

impl DraHandler for TestHandler {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        self.calls.lock().unwrap().push(Call::Prepare(claims.clone()));
        self.wait_for_gate().await;
        let (fail, skip) = (self.fail.lock().unwrap().clone(), self.skip.lock().unwrap().clone());
        let mut prepared = self.prepared.lock().unwrap();
        let mut out = BTreeMap::new();
        for claim in claims {
            if skip.contains(&claim.uid) {
                continue;
            }
            let outcome = if fail.contains(&claim.uid) {
                Err(format!("no GPU left for claim {}", claim.uid))
            } else {
                Ok(prepared.entry(claim.uid.clone()).or_insert_with(|| vec![Self::device(&claim.uid)]).clone())
            };
            out.insert(claim.uid, outcome);
        }
        out
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        self.calls.lock().unwrap().push(Call::Unprepare(claims.clone()));
        self.wait_for_gate().await;
        let mut prepared = self.prepared.lock().unwrap();
        claims
            .into_iter()
            .map(|c| {
                prepared.remove(&c.uid);
                (c.uid, Ok(()))
            })
            .collect()
    }
}

/// Kubelet directories in a temp dir.
pub struct Dirs {
    pub tmp: tempfile::TempDir,
    pub paths: Paths,
}

impl Dirs {
    pub fn new() -> Dirs {
        let tmp = tempfile::tempdir().unwrap();
        let paths = Paths::under(tmp.path());
        Dirs { tmp, paths }
    }

    pub fn dra_socket(&self) -> PathBuf {
        self.paths.dra_socket(DRIVER)
    }

    pub fn registration_socket(&self) -> PathBuf {
        self.paths.registration_socket(DRIVER)
    }

    pub fn start(&self, handler: Arc<TestHandler>) -> PluginServer {
        PluginServer::start(&self.paths, DRIVER, handler).unwrap()
    }
}

pub fn claim(n: usize) -> ClaimRef {
    ClaimRef { namespace: "default".into(), name: format!("claim-{n}"), uid: format!("uid-{n}") }
}

pub fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}
