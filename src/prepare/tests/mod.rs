//! The Preparer end to end over real sled, real files in temp dirs and an in-memory claim
//! source; plus CDI naming, versions, validation and the CDI JSON schema.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;

use super::*;
use crate::inventory::{Device, DeviceKind, Inventory};
use crate::plugin::handler::PreparedDevice;
use crate::state::{ClaimRecord, Phase, SCHEMA_VERSION, StateError};
use crate::test_support::gpu::{FakeMpsControl, FakeNvidiaSmi, FileModes};

const DRIVER: &str = "gpu.edra.dev";
const NODE: &str = "node-a";
const VERSION: &str = "550.54.15";
const UID1: &str = "0b0c9a28-4a35-4d0e-9f3e-0f2b1d7c1a11";
const UID2: &str = "7d1f1c1e-5b2a-4c3d-8e4f-1a2b3c4d5e6f";
const UID3: &str = "9e8d7c6b-5a49-4837-a625-140312f0e1d2";

/// Claims by `namespace/name`, counting fetches.
#[derive(Default)]
pub(super) struct MemClaims {
    claims: Mutex<HashMap<String, ResourceClaim>>,
    pub fetches: AtomicUsize,
    /// A missing claim is refused (403) as the node authorizer does, not "not found".
    pub refuse_missing: std::sync::atomic::AtomicBool,
}

impl MemClaims {
    fn put(&self, claim: ResourceClaim) {
        let key = format!("{}/{}", claim.metadata.namespace.clone().unwrap(), claim.metadata.name.clone().unwrap());
        self.claims.lock().unwrap().insert(key, claim);
    }

    /// Deletes claim `namespace/name`.
    pub fn delete(&self, namespace: &str, name: &str) {
        self.claims.lock().unwrap().remove(&format!("{namespace}/{name}")).expect("the claim existed");
    }
}

impl ClaimSource for MemClaims {
    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
        _deadline: Instant,
    ) -> BoxFuture<'_, Result<ResourceClaim, ClaimFetchError>> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        let got = self.claims.lock().unwrap().get(&format!("{namespace}/{name}")).cloned();
        let (namespace, name) = (namespace.to_string(), name.to_string());
        let refused = self.refuse_missing.load(Ordering::SeqCst);
        Box::pin(async move {
            match got {
                Some(claim) => Ok(claim),
                None if refused => {
                    let source = crate::kube::Error::from_status("GET resourceclaims".into(), 403, b"{}", None);
                    Err(ClaimFetchError::Api { namespace, name, source: Box::new(source) })
                }
                None => Err(ClaimFetchError::NotFound { namespace, name }),
            }
        })
    }
}

pub(super) struct Fixture {
    pub _tmp: Option<tempfile::TempDir>,
    pub root: PathBuf,
    pub claims: Arc<MemClaims>,
    pub preparer: Preparer,
    pub inventory_tx: watch::Sender<Arc<Inventory>>,
    /// The GPUs' compute modes (survive a restart of the preparer, as hardware does).
    pub modes: Arc<FileModes>,
    /// The stand-in `nvidia-smi` the settings point at.
    pub smi: FakeNvidiaSmi,
    /// The stand-in `nvidia-cuda-mps-control` the settings point at.
    pub mps: FakeMpsControl,
}

fn gpu(minor: u32, dev_root: &Path) -> Device {
    Device {
        name: format!("gpu-{minor}"),
        kind: DeviceKind::Gpu,
        uuid: format!("GPU-{minor:08}-aaaa-bbbb-cccc-000000000000"),
        index: minor,
        minor,
        attributes: Default::default(),
        capacity: Default::default(),
        device_nodes: vec![dev_root.join(format!("nvidia{minor}"))],
        shared: None,
        consumes: None,
    }
}

fn touch(p: &Path) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, b"x").unwrap();
}

impl Fixture {
    pub fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let mut f = Fixture::at(tmp.path());
        f._tmp = Some(tmp);
        f
    }

    /// A fixture over directories under `root` (created when missing).
    pub fn at(root: &Path) -> Fixture {
        let dev = root.join("dev");
        for n in ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"] {
            touch(&dev.join(n));
        }
        let drv = root.join("driver");
        for f in [
            format!("usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}"),
            format!("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{VERSION}"),
            format!("usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.{VERSION}"),
            "usr/lib/x86_64-linux-gnu/libc.so.6".to_string(),
            "usr/bin/nvidia-smi".to_string(),
            format!("lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"),
        ] {
            touch(&drv.join(f));
        }
        touch(&root.join("proc/sys/kernel/random/boot_id"));
        std::fs::write(root.join("proc/sys/kernel/random/boot_id"), "boot-1\n").unwrap();
        let inventory = Inventory {
            devices: vec![gpu(0, &dev), gpu(1, &dev)],
            driver_version: Some(VERSION.into()),
            cuda_driver_version: Some("12.4".into()),
            mig_gpus: Vec::new(),
            counter_sets: Vec::new(),
        };
        let (inventory_tx, rx) = watch::channel(Arc::new(inventory));
        let smi = FakeNvidiaSmi::install(&root.join("smi"));
        let mps = FakeMpsControl::install(&root.join("mps-bin"));
        let settings = PrepareSettings {
            driver: DRIVER.into(),
            node: NODE.into(),
            cdi_dir: root.join("run/cdi"),
            driver_root: drv,
            host_driver_root: None,
            dev_root: dev,
            proc_root: root.join("proc"),
            sys_root: root.join("sys"),
            hook_binary: "/usr/bin/edra".into(),
            nvidia_smi: crate::gpu::timeslice::NvidiaSmi::new(Some(&smi.path), &root.join("driver"), None),
            mps: crate::gpu::mps::MpsSettings {
                control: mps.path.clone(),
                control_key: crate::gpu::mps::CONFIG_KEY,
                runtime_dir: root.join("run/edra"),
                proc_root: "/proc".into(),
                // Generous: the machine running the tests may be loaded.
                ready_timeout: std::time::Duration::from_secs(20),
                quit_grace: std::time::Duration::from_secs(10),
                library_dir: None,
            },
            // gpu-0, gpu-1 and gpu-3 are published as shares where they have memory, and
            // as replicas where the API server has no consumable capacity.
            sharing: crate::sharing::SharingSettings {
                mode: crate::sharing::SharingMode::Shares,
                fallback: crate::sharing::Fallback::Replicas,
                gpus: crate::sharing::GpuSelection::Listed(vec!["gpu-0".into(), "gpu-1".into(), "gpu-3".into()]),
                replicas: 4,
                ..crate::sharing::SharingSettings::default()
            },
            mig: crate::dynamic_mig::MigSettings::default(),
        };
        let store = open_when_unlocked(&root.join("state"));
        let claims = Arc::new(MemClaims::default());
        let modes = Arc::new(FileModes::at(root.join("gpu-modes")));
        let preparer = Preparer::new(store, rx, claims.clone(), settings, modes.clone());
        Fixture { _tmp: None, root: root.to_path_buf(), claims, preparer, inventory_tx, modes, smi, mps }
    }

    /// The same directories with a fresh Preparer (as after a restart).
    pub fn restart(self) -> Fixture {
        self.restart_with(|_| {})
    }

    /// [`Fixture::restart`] with settings changed by `change`.
    pub fn restart_with(self, change: impl FnOnce(&mut PrepareSettings)) -> Fixture {
        self.restart_opening(change, Store::open)
    }

    /// [`Fixture::restart`] with a store without sled's background flusher: what is not
    /// made durable stays in memory only.
    pub fn restart_without_flusher(self) -> Fixture {
        self.restart_opening(|_| {}, Store::open_without_flusher)
    }

    fn restart_opening(
        self,
        change: impl FnOnce(&mut PrepareSettings),
        open: fn(&Path) -> Result<Store, StateError>,
    ) -> Fixture {
        let Fixture { _tmp, root, claims, preparer, inventory_tx, modes, smi, mps } = self;
        let mut settings = preparer.settings().clone();
        change(&mut settings);
        drop(preparer);
        let store = open_when_unlocked_with(&root.join("state"), open);
        let preparer = Preparer::new(store, inventory_tx.subscribe(), claims.clone(), settings, modes.clone());
        Fixture { _tmp, root, claims, preparer, inventory_tx, modes, smi, mps }
    }

    pub fn cdi_dir(&self) -> PathBuf {
        self.preparer.settings().cdi_dir.clone()
    }
}

/// Opens the store in `dir`, waiting (bounded) for the lock of a just-closed one to clear:
/// a child another test thread is spawning holds the descriptors until its exec.
pub(super) fn open_when_unlocked(dir: &Path) -> Store {
    open_when_unlocked_with(dir, Store::open)
}

fn open_when_unlocked_with(dir: &Path, open: fn(&Path) -> Result<Store, StateError>) -> Store {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match open(dir) {
            Err(e) if crate::state::lock_busy(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other.unwrap(),
        }
    }
}

/// A claim allocated with `results` = (request, driver, pool, device, admin access) and
/// reserved for a pod, as the kubelet sees a claim it prepares.
pub(super) fn claim(
    uid: &str,
    name: &str,
    results: &[(&str, &str, &str, &str, bool)],
    config: serde_json::Value,
) -> ResourceClaim {
    let results: Vec<_> = results
        .iter()
        .map(|(req, driver, pool, device, admin)| {
            json!({"request": req, "driver": driver, "pool": pool, "device": device, "adminAccess": admin})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.edra.dev"}},
            {"name": "alt", "firstAvailable": [{"name": "one", "deviceClassName": "gpu.edra.dev"}]}
        ]}},
        "status": {
            "allocation": {"devices": {"results": results, "config": config}},
            "reservedFor": [{"resource": "pods", "name": format!("{name}-pod"), "uid": format!("pod-{uid}")}]
        }
    }))
    .unwrap()
}

pub(super) fn cref(uid: &str, name: &str) -> ClaimRef {
    ClaimRef { namespace: "ns".into(), name: name.into(), uid: uid.into() }
}

pub(super) fn ok(results: &PrepareResults, uid: &str) -> Vec<PreparedDevice> {
    match results.get(uid) {
        Some(Ok(d)) => d.clone(),
        other => panic!("claim {uid}: {other:?}"),
    }
}

pub(super) fn err(results: &PrepareResults, uid: &str) -> String {
    match results.get(uid) {
        Some(Err(e)) => e.clone(),
        other => panic!("claim {uid}: expected an error, got {other:?}"),
    }
}

#[tokio::test]
async fn prepare_unprepare_round_trip() {
    let f = Fixture::new();
    f.claims.put(claim(
        UID1,
        "c1",
        &[("gpu", DRIVER, NODE, "gpu-0", false), ("alt/one", DRIVER, NODE, "gpu-1", false)],
        json!([]),
    ));
    let r = f.preparer.prepare(vec![cref(UID1, "c1")]).await;
    let devices = ok(&r, UID1);
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[0].request_names, ["gpu"]);
    assert_eq!(devices[1].request_names, ["alt"], "subrequest suffix stripped");
    assert_eq!(devices[0].pool_name, NODE);
    assert_eq!(devices[0].cdi_device_ids, [format!("k8s.gpu.edra.dev/claim={UID1}-gpu-0")]);
    let spec_path = f.cdi_dir().join(format!("k8s.gpu.edra.dev-claim_{UID1}.json"));
    let spec: cdi::Spec = serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
    assert_eq!(spec.devices.len(), 2);
    assert_eq!(std::fs::metadata(&spec_path).unwrap().permissions().mode() & 0o777, 0o644);
    let rec = f.preparer.store().claim(UID1).unwrap().unwrap();
    assert_eq!(rec.phase, Phase::PrepareCompleted);
    assert_eq!(rec.boot_id, "boot-1");
    assert_eq!(f.preparer.store().holder("gpu-1").unwrap().as_deref(), Some(UID1));

    let u = f.preparer.unprepare(vec![cref(UID1, "c1")]).await;
    assert_eq!(u.get(UID1), Some(&Ok(())));
    assert!(!spec_path.exists());
    assert!(f.preparer.store().claim(UID1).unwrap().is_none());
    assert!(f.preparer.store().holder("gpu-0").unwrap().is_none());
    // Unknown claims unprepare fine (idempotent), without any API access.
    let u = f.preparer.unprepare(vec![cref(UID1, "c1"), cref(UID2, "never")]).await;
    assert!(u.values().all(Result::is_ok) && u.len() == 2);
}

use std::os::unix::fs::PermissionsExt;

#[tokio::test]
async fn repeated_prepare_is_answered_from_state_without_a_fetch() {
    let f = Fixture::new();
    f.claims.put(claim(UID1, "c1", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([])));
    let first = ok(&f.preparer.prepare(vec![cref(UID1, "c1")]).await, UID1);
    assert_eq!(f.claims.fetches.load(Ordering::SeqCst), 1);
    let second = ok(&f.preparer.prepare(vec![cref(UID1, "c1")]).await, UID1);
    assert_eq!(first, second);
    assert_eq!(f.claims.fetches.load(Ordering::SeqCst), 1, "answered from sled");
    // After a reboot cleared /var/run/cdi, the spec is re-written, still without a fetch.
    let spec_path = f.cdi_dir().join(format!("k8s.gpu.edra.dev-claim_{UID1}.json"));
    std::fs::remove_file(&spec_path).unwrap();
    let f = f.restart();
    let third = ok(&f.preparer.prepare(vec![cref(UID1, "c1")]).await, UID1);
    assert_eq!(first, third);
    assert!(spec_path.exists());
    assert_eq!(f.claims.fetches.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn concurrent_calls_for_one_claim_fetch_once() {
    let f = Fixture::new();
    f.claims.put(claim(UID1, "c1", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([])));
    let (a, b) = tokio::join!(f.preparer.prepare(vec![cref(UID1, "c1")]), f.preparer.prepare(vec![cref(UID1, "c1")]));
    assert_eq!(ok(&a, UID1), ok(&b, UID1));
    assert_eq!(f.claims.fetches.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn exclusive_conflict_names_the_holder_and_admin_access_is_exempt() {
    let f = Fixture::new();
    f.claims.put(claim(UID1, "c1", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([])));
    f.claims.put(claim(UID2, "c2", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([])));
    f.claims.put(claim(UID3, "c3", &[("gpu", DRIVER, NODE, "gpu-0", true)], json!([])));
    ok(&f.preparer.prepare(vec![cref(UID1, "c1")]).await, UID1);
    let r = f.preparer.prepare(vec![cref(UID2, "c2"), cref(UID3, "c3")]).await;
    let e = err(&r, UID2);
    assert!(e.contains("gpu-0") && e.contains(UID1), "{e}");
    assert!(!f.cdi_dir().join(format!("k8s.gpu.edra.dev-claim_{UID2}.json")).exists());
    assert!(f.preparer.store().claim(UID2).unwrap().is_none());
    ok(&r, UID3);
    // Unpreparing the admin claim leaves the exclusive holding alone.
    f.preparer.unprepare(vec![cref(UID3, "c3")]).await;
    assert_eq!(f.preparer.store().holder("gpu-0").unwrap().as_deref(), Some(UID1));
}

#[tokio::test]
async fn per_claim_errors_say_what_is_wrong() {
    let f = Fixture::new();
    let mut replaced = claim(UID2, "c1", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([]));
    replaced.metadata.uid = Some(UID2.into());
    f.claims.put(replaced);
    let mut unallocated = claim(UID2, "c2", &[], json!([]));
    unallocated.status = None;
    f.claims.put(unallocated);
    f.claims.put(claim(UID3, "other-driver", &[("gpu", "other.example.com", NODE, "gpu-0", false)], json!([])));
    f.claims.put(claim(UID3, "other-pool", &[("gpu", DRIVER, "node-b", "gpu-0", false)], json!([])));
    f.claims.put(claim(UID3, "missing", &[("gpu", DRIVER, NODE, "gpu-7", false)], json!([])));
    let bad_config = json!([{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters":
        {"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "Exclusive", "extra": 1}}}}]);
    f.claims.put(claim(UID3, "bad-config", &[("gpu", DRIVER, NODE, "gpu-0", false)], bad_config));
    let mps = json!([{"source": "FromClass", "requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters":
        {"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS",
         "mps": {"defaultPerDevicePinnedMemoryLimit": {"gpu-1": "1Gi"}}}}}}]);
    f.claims.put(claim(UID3, "mps", &[("gpu", DRIVER, NODE, "gpu-0", false)], mps));

    let cases: [(ClaimRef, &str); 9] = [
        (cref(UID1, "c1"), "the claim was replaced"),
        (cref(UID2, "c2"), "is not allocated"),
        (cref(UID3, "other-driver"), "no devices allocated by driver gpu.edra.dev in pool node-a"),
        (cref(UID3, "other-pool"), "no devices allocated by driver gpu.edra.dev in pool node-a"),
        (cref(UID3, "missing"), "device gpu-7 is not on this node"),
        (cref(UID3, "bad-config"), "unknown field `extra`"),
        (cref(UID3, "mps"), "names \"gpu-1\", which is not one of the claim's MPS devices (gpu-0)"),
        (cref(UID3, "gone"), "ResourceClaim ns/gone was not found"),
        (cref("Not-A-UID", "x"), "is not a lowercase RFC 4122 UUID"),
    ];
    for (c, fragment) in cases {
        let uid = c.uid.clone();
        let r = f.preparer.prepare(vec![c]).await;
        let e = err(&r, &uid);
        assert!(e.contains(fragment), "{e:?} lacks {fragment:?}");
        assert!(f.preparer.store().claim(&uid).unwrap().is_none(), "nothing recorded for a failed claim");
    }
    assert!(std::fs::read_dir(f.cdi_dir()).map(|d| d.count()).unwrap_or(0) == 0, "no spec files left");
}

#[tokio::test]
async fn every_claim_in_a_call_gets_an_answer() {
    let f = Fixture::new();
    f.claims.put(claim(UID1, "c1", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([])));
    f.claims.put(claim(UID2, "c2", &[("gpu", DRIVER, NODE, "gpu-1", false)], json!([])));
    let r = f.preparer.prepare(vec![cref(UID1, "c1"), cref(UID2, "c2"), cref(UID3, "absent")]).await;
    assert_eq!(r.len(), 3);
    ok(&r, UID1);
    ok(&r, UID2);
    err(&r, UID3);
}

struct Unreachable;

impl ClaimSource for Unreachable {
    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
        _deadline: Instant,
    ) -> BoxFuture<'_, Result<ResourceClaim, ClaimFetchError>> {
        let source = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused").into();
        let e = ClaimFetchError::Api { namespace: namespace.into(), name: name.into(), source };
        Box::pin(async move { Err(e) })
    }
}

#[tokio::test]
async fn prepared_claims_keep_working_with_the_api_server_unreachable() {
    let f = Fixture::new();
    f.claims.put(claim(UID1, "c1", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([])));
    let first = ok(&f.preparer.prepare(vec![cref(UID1, "c1")]).await, UID1);
    let offline = Preparer::new(
        f.preparer.store().clone(),
        f.inventory_tx.subscribe(),
        Arc::new(Unreachable),
        f.preparer.settings().clone(),
        f.preparer.compute_modes(),
    );
    let r = offline.prepare(vec![cref(UID1, "c1"), cref(UID2, "c2")]).await;
    assert_eq!(ok(&r, UID1), first);
    let e = err(&r, UID2);
    assert!(e.contains("cannot get ResourceClaim ns/c2") && e.contains("connection refused"), "{e}");
    assert_eq!(offline.unprepare(vec![cref(UID1, "c1")]).await.get(UID1), Some(&Ok(())));
    assert!(offline.store().claims().unwrap().is_empty());
}

mod cancel;
mod lazy;
mod memory_limits;
mod mig_instances;
mod mps_claims;
mod recovery;
mod shares;
mod shares_mps;
mod sharing;
mod spec;
mod stage;
