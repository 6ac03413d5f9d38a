//! Dynamic MIG devices end to end over the mock backend in MIG mode (its instances in its
//! state file under the runtime directory, as on a GPU): prepare creates and records,
//! unprepare destroys, an occupied placement fails its claim only, recovery after a crash
//! at each failpoint (real aborts in a child process) and after a reboot, and instances
//! edra did not record are never destroyed.

use super::*;
use crate::gpu::mig_control::{MigInstance, Placement};
use crate::inventory::DeviceBackend;
use crate::inventory::mock::MockBackend;
use crate::state::MigState;

/// 3g.40gb at memory slices 0-3 and 4-7 of the A100 80GB gpu-0.
const LOW: &str = "gpu-0-mig-3g40gb-9-0";
const HIGH: &str = "gpu-0-mig-3g40gb-9-4";
const HIGH_AT: Placement = Placement { start: 4, size: 4 };

pub(super) struct Mig {
    pub f: Fixture,
    pub backend: Arc<MockBackend>,
}

fn mock_backend(root: &Path) -> Arc<MockBackend> {
    let mut cfg = crate::config::Config::defaults_for(NODE);
    cfg.paths.dev_root = root.join("dev");
    cfg.paths.sys_root = root.join("sys");
    cfg.paths.runtime_dir = root.join("run/edra");
    cfg.mock.mig_mode = true;
    Arc::new(MockBackend::new(&cfg))
}

impl Mig {
    fn new() -> Mig {
        let tmp = tempfile::tempdir().unwrap();
        let mut m = Mig::at(tmp.path());
        m.f._tmp = Some(tmp);
        m
    }

    pub fn at(root: &Path) -> Mig {
        Mig::over(Fixture::at(root), true)
    }

    /// `f` with a preparer over the mock backend in MIG mode (with its MIG control when
    /// `control`), every GPU selected for dynamic MIG.
    fn over(f: Fixture, control: bool) -> Mig {
        let backend = mock_backend(&f.root);
        let Fixture { _tmp, root, claims, preparer, inventory_tx, modes, smi, mps } = f;
        let mut settings = preparer.settings().clone();
        settings.mig = crate::dynamic_mig::MigSettings { dynamic: crate::sharing::GpuSelection::All };
        drop(preparer);
        inventory_tx.send_replace(Arc::new(backend.discover().unwrap()));
        let store = open_when_unlocked(&root.join("state"));
        let rx = inventory_tx.subscribe();
        let preparer = match control {
            true => Preparer::with_backend(store, rx, claims.clone(), settings, backend.clone()),
            false => Preparer::new(store, rx, claims.clone(), settings, modes.clone()),
        };
        Mig { f: Fixture { _tmp, root, claims, preparer, inventory_tx, modes, smi, mps }, backend }
    }

    /// The same directories and GPUs with a fresh preparer (edra restarted), recovered.
    fn restart(self) -> (Mig, RecoveryReport) {
        let m = Mig::over(self.f, true);
        let report = m.f.preparer.recover().unwrap();
        (m, report)
    }

    fn gpu0(&self) -> String {
        crate::inventory::mock::gpu_uuid(NODE, 0)
    }

    pub fn instances(&self) -> Vec<MigInstance> {
        self.backend.mig().unwrap().mig_instances(&self.gpu0()).unwrap()
    }

    /// Creates a MIG instance edra does not know of (nvidia-smi run by someone else).
    fn foreign(&self, profile_id: u32, start: u32) -> MigInstance {
        let inv = self.backend.discover().unwrap();
        let profile = inv.mig_gpus[0].capability.profile(profile_id).unwrap().clone();
        let size = profile.placements[0].size;
        self.backend.mig().unwrap().create_mig(&self.gpu0(), &profile, Placement { start, size }).unwrap()
    }

    fn state_file(&self) -> PathBuf {
        self.f.root.join("run/edra").join(crate::inventory::mock::mig_state::STATE_FILE)
    }

    fn spec(&self, uid: &str) -> cdi::Spec {
        let path = self.f.cdi_dir().join(format!("k8s.gpu.edra.dev-claim_{uid}.json"));
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }
}

/// A claim named after its UID, allocated `device`.
fn mig_claim(uid: &str, device: &str) -> ResourceClaim {
    claim(uid, uid, &[("gpu", DRIVER, NODE, device, false)], json!([]))
}

fn mref(uid: &str) -> ClaimRef {
    cref(uid, uid)
}

/// docs/mig.md quotes `message` as edra gives it.
fn documented(message: &str) {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/mig.md")).unwrap();
    assert!(doc.contains(message), "docs/mig.md does not quote {message:?}");
}

fn nodes(spec: &cdi::Spec) -> Vec<String> {
    spec.devices[0].container_edits.device_nodes.iter().map(|n| n.path.clone()).collect()
}

#[tokio::test]
async fn prepare_creates_and_records_the_instance_and_unprepare_destroys_it() {
    let m = Mig::new();
    let owned = m.f.preparer.owned_mig();
    let mut changes = m.f.preparer.mig_changes();
    assert!(!changes.has_changed().unwrap(), "nothing made yet");
    // Rediscovery wakes on this tick: the instance must exist by then.
    let (backend, gpu) = (m.backend.clone(), m.gpu0());
    let seen = tokio::spawn(async move {
        changes.changed().await.unwrap();
        (backend.mig().unwrap().mig_instances(&gpu).unwrap().len(), changes)
    });
    m.f.claims.put(mig_claim(UID1, HIGH));
    let r = m.f.preparer.prepare(vec![mref(UID1)]).await;
    assert_eq!(ok(&r, UID1)[0].device_name, HIGH);
    let made = m.instances();
    assert_eq!(made.len(), 1);
    let waited = tokio::time::timeout(std::time::Duration::from_secs(10), seen).await;
    let (seen, changes) = waited.expect("making the instance ticks").unwrap();
    assert_eq!(seen, 1, "the tick came before the instance was made");
    assert_eq!((made[0].gi, made[0].ci, made[0].placement, made[0].profile_id), (1, Some(0), HIGH_AT, 9));
    let rec = m.f.preparer.store().claim(UID1).unwrap().unwrap();
    assert_eq!(rec.phase, Phase::PrepareCompleted);
    let mig = rec.devices[0].mig.clone().unwrap();
    assert_eq!(
        (mig.state, mig.gi, mig.ci, mig.uuid.clone()),
        (MigState::Created, Some(1), Some(0), made[0].uuid.clone())
    );
    assert_eq!(**owned.borrow(), [(m.gpu0(), HIGH_AT)].into_iter().collect());
    let spec = m.spec(UID1);
    assert_eq!(spec.devices[0].name, format!("{UID1}-{HIGH}"));
    let uuid = made[0].uuid.clone().unwrap();
    assert_eq!(spec.devices[0].container_edits.env, [format!("EDRA_DEVICE_GPU_0_MIG_3G40GB_9_4_UUID={uuid}")]);
    assert!(spec.container_edits.env.contains(&"NVIDIA_VISIBLE_DEVICES=void".to_string()));
    // No capabilities under proc: the driver's numbering (GPU instance 1 of GPU 0).
    assert_eq!(nodes(&spec), ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"]);

    // The capability minors the driver lists under the configured proc root win.
    let caps = m.f.root.join("proc/driver/nvidia/capabilities/gpu0/mig/gi2");
    std::fs::create_dir_all(caps.join("ci0")).unwrap();
    std::fs::write(caps.join("access"), "DeviceFileMinor: 66\nDeviceFileMode: 292\n").unwrap();
    std::fs::write(caps.join("ci0/access"), "DeviceFileMinor: 67\n").unwrap();
    m.f.claims.put(mig_claim(UID2, LOW));
    ok(&m.f.preparer.prepare(vec![mref(UID2)]).await, UID2);
    assert_eq!(
        nodes(&m.spec(UID2)),
        ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap66", "/dev/nvidia-caps/nvidia-cap67"]
    );
    assert_eq!(owned.borrow().len(), 2);

    let u = m.f.preparer.unprepare(vec![mref(UID1), mref(UID2)]).await;
    assert!(u.values().all(Result::is_ok), "{u:?}");
    assert!(m.instances().is_empty());
    assert!(changes.has_changed().unwrap(), "destroying ticks too");
    assert!(m.f.preparer.store().claims().unwrap().is_empty());
    assert!(owned.borrow().is_empty());
}

#[tokio::test]
async fn an_instance_replaced_behind_edras_back_is_left_alone_at_unprepare() {
    let m = Mig::new();
    m.f.claims.put(mig_claim(UID1, HIGH));
    ok(&m.f.preparer.prepare(vec![mref(UID1)]).await, UID1);
    let made = m.instances();
    assert_eq!(made.len(), 1);
    // Someone destroys edra's instance and makes a 1g.10gb, which gets the freed ID.
    m.backend.mig().unwrap().destroy_mig(&m.gpu0(), made[0].gi, made[0].ci).unwrap();
    let foreign = m.foreign(19, 0);
    assert_eq!(foreign.gi, made[0].gi, "GPU instance IDs are reused");
    let u = m.f.preparer.unprepare(vec![mref(UID1)]).await;
    assert!(u.values().all(Result::is_ok), "{u:?}");
    assert_eq!(m.instances(), [foreign], "the other instance with edra's old ID stays");
    assert!(m.f.preparer.store().claims().unwrap().is_empty());
}

#[tokio::test]
async fn the_whole_gpu_of_a_dynamic_gpu_is_prepared_as_any_gpu() {
    let m = Mig::new();
    m.f.claims.put(mig_claim(UID1, "gpu-1"));
    assert_eq!(ok(&m.f.preparer.prepare(vec![mref(UID1)]).await, UID1)[0].device_name, "gpu-1");
    let spec = m.spec(UID1);
    assert_eq!(nodes(&spec), ["/dev/nvidia1"]);
    let uuid = crate::inventory::mock::gpu_uuid(NODE, 1);
    assert_eq!(spec.devices[0].container_edits.env, [format!("EDRA_DEVICE_GPU_1_UUID={uuid}")]);
    assert!(m.f.preparer.store().claim(UID1).unwrap().unwrap().devices[0].mig.is_none());
    assert_eq!(m.f.preparer.unprepare(vec![mref(UID1)]).await[UID1], Ok(()));
}

#[tokio::test]
async fn an_occupied_placement_fails_only_its_claim_and_the_foreign_instance_stays() {
    let m = Mig::new();
    let foreign = m.foreign(19, 5);
    m.f.claims.put(mig_claim(UID1, HIGH));
    m.f.claims.put(mig_claim(UID2, LOW));
    let r = m.f.preparer.prepare(vec![mref(UID1), mref(UID2)]).await;
    let e = err(&r, UID1);
    assert!(
        e.contains(&format!(
            "cannot create the MIG instance of {HIGH} (profile 3g.40gb at placement 4+4 of GPU {})",
            m.gpu0()
        )),
        "{e}"
    );
    assert!(e.contains("another MIG instance occupies those memory slices"), "{e}");
    documented(&e);
    ok(&r, UID2);
    assert!(m.f.preparer.store().claim(UID1).unwrap().is_none(), "nothing recorded for the failed claim");
    assert!(m.instances().contains(&foreign));
    m.f.preparer.unprepare(vec![mref(UID2)]).await;
    assert_eq!(m.instances(), [foreign]);

    // Time-slicing is a setting of a whole GPU.
    let sliced = json!([{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters":
        {"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}}}]);
    m.f.claims.put(claim(UID3, UID3, &[("gpu", DRIVER, NODE, LOW, false)], sliced));
    let e = err(&m.f.preparer.prepare(vec![mref(UID3)]).await, UID3);
    assert!(e.contains("cannot apply to MIG device"), "{e}");
    documented(&e);
}

#[tokio::test]
async fn mig_devices_need_a_gpu_in_mig_mode_and_a_backend_that_creates_instances() {
    // The plain fixture's GPUs are whole GPUs, not in MIG mode.
    let f = Fixture::new().restart_with(|s| s.mig.dynamic = crate::sharing::GpuSelection::All);
    f.claims.put(mig_claim(UID1, HIGH));
    let e = err(&f.preparer.prepare(vec![mref(UID1)]).await, UID1);
    assert!(e.starts_with(&format!("MIG device {HIGH} cannot be prepared: GPU gpu-0 (")), "{e}");
    assert!(e.contains("is not in MIG mode; delete the pod"), "{e}");
    documented(&e);

    let m = Mig::over(Fixture::new(), false);
    m.f.claims.put(mig_claim(UID1, HIGH));
    let e = err(&m.f.preparer.prepare(vec![mref(UID1)]).await, UID1);
    assert!(e.contains("the configured backend cannot create MIG instances"), "{e}");
    assert!(m.instances().is_empty());
}

#[tokio::test]
async fn a_failed_destroy_keeps_the_record_and_the_retry_finishes() {
    let m = Mig::new();
    m.f.claims.put(mig_claim(UID1, HIGH));
    ok(&m.f.preparer.prepare(vec![mref(UID1)]).await, UID1);
    let good = std::fs::read(m.state_file()).unwrap();
    std::fs::write(m.state_file(), b"{broken").unwrap();
    let u = m.f.preparer.unprepare(vec![mref(UID1)]).await;
    let e = u[UID1].clone().unwrap_err();
    assert!(
        e.contains(&format!("cannot destroy the MIG instance of {HIGH}")) && e.contains("the kubelet retries"),
        "{e}"
    );
    let rec = m.f.preparer.store().claim(UID1).unwrap().expect("the record stays");
    assert_eq!(rec.devices[0].mig.as_ref().map(|m| m.state), Some(MigState::Releasing));
    std::fs::write(m.state_file(), good).unwrap();
    assert_eq!(m.f.preparer.unprepare(vec![mref(UID1)]).await[UID1], Ok(()));
    assert!(m.instances().is_empty());
}

#[tokio::test]
async fn a_reboot_loses_the_instance_and_recovery_creates_it_again_with_its_new_ids() {
    let m = Mig::new();
    m.f.claims.put(mig_claim(UID1, HIGH));
    let answer = ok(&m.f.preparer.prepare(vec![mref(UID1)]).await, UID1);
    let before = m.instances()[0].clone();
    // The reboot empties the runtime directory (the GPU's instances) and the CDI directory.
    std::fs::remove_file(m.state_file()).unwrap();
    std::fs::remove_dir_all(m.f.cdi_dir()).unwrap();
    // Someone creates an instance elsewhere first, so the GPU instance IDs move.
    let foreign = m.foreign(19, 0);
    let (m, report) = m.restart();
    assert_eq!(report.mig_recreated, [UID1]);
    assert!(m.f.preparer.mig_changes().has_changed().unwrap(), "a receiver taken after recovery sees its change");
    let now: Vec<MigInstance> = m.instances().into_iter().filter(|i| i.placement == HIGH_AT).collect();
    assert_eq!(now.len(), 1);
    assert_eq!(now[0].gi, 2);
    assert_ne!(now[0].uuid, before.uuid);
    let rec = m.f.preparer.store().claim(UID1).unwrap().unwrap();
    assert_eq!(rec.devices[0].mig.as_ref().unwrap().uuid, now[0].uuid);
    let spec = m.spec(UID1);
    assert!(spec.devices[0].container_edits.env[0].ends_with(now[0].uuid.as_deref().unwrap()));
    assert_eq!(nodes(&spec)[1], "/dev/nvidia-caps/nvidia-cap21");
    assert_eq!(ok(&m.f.preparer.prepare(vec![mref(UID1)]).await, UID1), answer);
    m.f.preparer.unprepare(vec![mref(UID1)]).await;
    assert_eq!(m.instances(), [foreign], "only edra's instance is destroyed");
}

#[tokio::test]
async fn an_instance_that_cannot_be_created_again_fails_the_next_prepare_clearly() {
    let m = Mig::new();
    m.f.claims.put(mig_claim(UID1, HIGH));
    ok(&m.f.preparer.prepare(vec![mref(UID1)]).await, UID1);
    std::fs::remove_file(m.state_file()).unwrap();
    let foreign = m.foreign(19, 5);
    let (m, report) = m.restart();
    assert_eq!(report.mig_lost, [UID1]);
    assert!(!m.f.cdi_dir().join(format!("k8s.gpu.edra.dev-claim_{UID1}.json")).exists(), "no spec for a lost device");
    let e = err(&m.f.preparer.prepare(vec![mref(UID1)]).await, UID1);
    assert!(
        e.contains(&format!(
            "the MIG instance of {HIGH} (profile 3g.40gb at placement 4+4 of GPU {}) was lost",
            m.gpu0()
        )) && e.contains("another MIG instance (GPU instance 1 at placement 5+1) occupies its memory slices")
            && e.ends_with("delete the pod so the claim is allocated again"),
        "{e}"
    );
    documented(&e);
    assert_eq!(m.f.preparer.unprepare(vec![mref(UID1)]).await[UID1], Ok(()));
    assert_eq!(m.instances(), [foreign]);
    assert!(m.f.preparer.store().claims().unwrap().is_empty());
}

/// Runs in a child process only: prepares and unprepares a MIG claim in CRASH_TEST_DIR
/// with a failpoint enabled, so the process aborts part-way.
#[cfg(debug_assertions)]
#[tokio::test]
#[ignore = "run by a_crash_at_every_mig_failpoint_converges in a child process"]
async fn mig_crash_child() {
    let Ok(dir) = std::env::var("CRASH_TEST_DIR") else { return };
    let m = Mig::at(Path::new(&dir));
    m.f.claims.put(mig_claim(UID1, HIGH));
    let r = m.f.preparer.prepare(vec![mref(UID1)]).await;
    assert!(r[UID1].is_ok(), "{r:?}");
    m.f.preparer.unprepare(vec![mref(UID1)]).await;
}

#[cfg(debug_assertions)]
#[tokio::test]
async fn a_crash_at_every_mig_failpoint_converges() {
    let exe = std::env::current_exe().unwrap();
    let points = failpoint::POINTS.into_iter().filter(|p| !p.contains("-mps-") && !p.contains("timeslice"));
    // A MIG claim is recorded in a transaction: `prepare-after-record` is not on its way.
    let points = points.filter(|p| *p != "prepare-after-record");
    for point in points.filter(|p| !p.contains("gpu-recorded") && !p.contains("compute-mode")) {
        let tmp = tempfile::tempdir().unwrap();
        let before = Mig::at(tmp.path());
        let foreign = before.foreign(19, 0);
        drop(before);
        let out = std::process::Command::new(&exe)
            .args(["--ignored", "--exact", "prepare::tests::mig_instances::mig_crash_child", "--nocapture"])
            .env(failpoint::ENV, point)
            .env("CRASH_TEST_DIR", tmp.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(&format!("failpoint {point} hit")), "{point}: {stderr}");

        let m = Mig::at(tmp.path());
        let report = m.f.preparer.recover().unwrap();
        let mine: Vec<MigInstance> = m.instances().into_iter().filter(|i| *i != foreign).collect();
        match m.f.preparer.store().claim(UID1).unwrap() {
            // Completed: exactly its instance exists, as recorded.
            Some(rec) => {
                assert_eq!(rec.phase, Phase::PrepareCompleted, "{point}");
                let mig = rec.devices[0].mig.clone().unwrap();
                assert_eq!(mig.state, MigState::Created, "{point}");
                assert_eq!(mine.len(), 1, "{point}: {mine:?}");
                assert_eq!((Some(mine[0].gi), &mine[0].uuid), (mig.gi, &mig.uuid), "{point}");
                assert!(m.spec(UID1).devices[0].container_edits.env[0].ends_with(mig.uuid.as_deref().unwrap()));
                assert_eq!(m.f.preparer.unprepare(vec![mref(UID1)]).await[UID1], Ok(()), "{point}");
            }
            // Rolled back or released: nothing of edra's is left.
            None => assert!(mine.is_empty(), "{point}: {mine:?} after {report:?}"),
        }
        assert!(m.instances().iter().all(|i| *i == foreign), "{point}: {:?}", m.instances());
        assert!(m.instances().contains(&foreign), "{point}: the foreign instance stays");
        // The kubelet's retry prepares again, and unprepares.
        m.f.claims.put(mig_claim(UID1, HIGH));
        ok(&m.f.preparer.prepare(vec![mref(UID1)]).await, UID1);
        assert_eq!(m.instances().len(), 2, "{point}");
        assert_eq!(m.f.preparer.unprepare(vec![mref(UID1)]).await[UID1], Ok(()), "{point}");
        assert_eq!(m.instances(), std::slice::from_ref(&foreign), "{point}");
        assert!(m.f.preparer.store().claims().unwrap().is_empty(), "{point}");
    }
}

#[test]
fn an_mps_claim_on_a_mig_device_serves_the_created_mig_uuid_as_root() {
    if !crate::gpu::mps::tests::root_or_skip("an_mps_claim_on_a_mig_device_serves_the_created_mig_uuid_as_root") {
        return;
    }
    let m = Mig::new();
    let mps = json!([{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters":
        {"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig",
         "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 25}}}}}]);
    m.f.claims.put(claim(UID1, UID1, &[("gpu", DRIVER, NODE, HIGH, false)], mps));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    ok(&rt.block_on(m.f.preparer.prepare(vec![mref(UID1)])), UID1);
    let uuid = m.instances()[0].uuid.clone().unwrap();
    assert_eq!(
        m.f.mps.calls(),
        [
            format!("-d CUDA_VISIBLE_DEVICES={uuid}"),
            "get_server_list".into(),
            "set_default_active_thread_percentage 25".into()
        ]
    );
    let parent = m.gpu0();
    assert_eq!(m.backend.compute_mode(&parent).unwrap(), crate::gpu::ComputeMode::Default, "the parent's mode stays");
    assert_eq!(rt.block_on(m.f.preparer.unprepare(vec![mref(UID1)]))[UID1], Ok(()));
    assert!(m.f.mps.calls().iter().any(|c| c == "quit"), "{:?}", m.f.mps.calls());
    assert!(m.instances().is_empty());
}
