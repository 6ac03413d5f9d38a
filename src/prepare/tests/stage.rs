//! Claims prepared before the kubelet asks: prepared exactly as the kubelet's call would,
//! answered from the state when it asks, released when the kubelet never does; claims that
//! change a GPU are left to the kubelet.

use super::*;
use crate::prepare::ClaimError;
use crate::prepare::stage::Staged;

fn spec_path(f: &Fixture, uid: &str) -> PathBuf {
    f.cdi_dir().join(format!("k8s.gpu.edra.dev-claim_{uid}.json"))
}

#[tokio::test]
async fn a_staged_claim_is_what_the_kubelet_call_would_prepare_and_its_call_reads_nothing() {
    let f = Fixture::new();
    let c1 = claim(UID1, "c1", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([]));
    assert_eq!(f.preparer.stage(&c1).await.unwrap(), Staged::Prepared);
    assert_eq!(f.preparer.staged_count(), 1);
    let rec = f.preparer.store().claim(UID1).unwrap().expect("recorded");
    assert_eq!(rec.phase, Phase::PrepareCompleted);
    assert_eq!(f.preparer.store().holder("gpu-0").unwrap().as_deref(), Some(UID1));
    let staged_spec = std::fs::read(spec_path(&f, UID1)).expect("spec written");

    // The kubelet's call: no read of the claim, the devices as recorded.
    let devices = ok(&f.preparer.prepare(vec![cref(UID1, "c1")]).await, UID1);
    assert_eq!(f.claims.fetches.load(Ordering::SeqCst), 0, "answered from the state");
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].cdi_device_ids, [format!("k8s.gpu.edra.dev/claim={UID1}-gpu-0")]);
    assert_eq!(f.preparer.staged_count(), 0, "asked for now");

    // The same claim prepared by the kubelet's call alone gives the same answer and spec.
    let g = Fixture::new();
    g.claims.put(c1.clone());
    let direct = ok(&g.preparer.prepare(vec![cref(UID1, "c1")]).await, UID1);
    assert_eq!(direct, devices);
    // The same spec, but for the fixture's own directory.
    let direct_spec = std::fs::read_to_string(spec_path(&g, UID1)).unwrap();
    let direct_spec = direct_spec.replace(g.root.to_str().unwrap(), f.root.to_str().unwrap());
    assert_eq!(String::from_utf8(staged_spec).unwrap(), direct_spec);

    // Staging it again, or once the kubelet has it, changes nothing.
    assert_eq!(f.preparer.stage(&c1).await.unwrap(), Staged::AlreadyPrepared);
    assert!(!f.preparer.unstage("ns", "c1").await.unwrap(), "the kubelet asked: its unprepare releases it");
    assert!(f.preparer.store().claim(UID1).unwrap().is_some());
}

#[tokio::test]
async fn a_staged_claim_the_kubelet_never_asks_for_is_released() {
    let f = Fixture::new();
    let c1 = claim(UID1, "c1", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([]));
    assert_eq!(f.preparer.stage(&c1).await.unwrap(), Staged::Prepared);
    assert!(!f.preparer.unstage("ns", "other").await.unwrap(), "not staged");
    assert!(f.preparer.unstage("ns", "c1").await.unwrap());
    assert!(f.preparer.store().claim(UID1).unwrap().is_none());
    assert!(f.preparer.store().holder("gpu-0").unwrap().is_none(), "its GPU is free again");
    assert!(!spec_path(&f, UID1).exists());
    assert_eq!(f.preparer.staged_count(), 0);
    assert!(!f.preparer.unstage("ns", "c1").await.unwrap(), "once");
    // Another claim gets the GPU.
    let c2 = claim(UID2, "c2", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([]));
    assert_eq!(f.preparer.stage(&c2).await.unwrap(), Staged::Prepared);
}

#[tokio::test]
async fn claims_that_change_a_gpu_are_left_to_the_kubelet() {
    let f = Fixture::new();
    let sliced = json!([{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters":
        {"apiVersion": "gpu.edra.dev/v1alpha1", "kind": "GpuConfig",
         "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}}}}]);
    let c1 = claim(UID1, "c1", &[("gpu", DRIVER, NODE, "gpu-0", false)], sliced);
    assert_eq!(f.preparer.stage(&c1).await.unwrap(), Staged::ChangesGpus);
    assert!(f.preparer.store().claim(UID1).unwrap().is_none());
    assert!(f.preparer.store().gpu_changes().unwrap().is_empty());
    assert!(f.smi.calls().is_empty(), "no GPU touched");
    assert!(!spec_path(&f, UID1).exists());
    assert_eq!(f.preparer.staged_count(), 0);
}

#[tokio::test]
async fn a_claim_that_cannot_be_staged_leaves_nothing_behind() {
    let f = Fixture::new();
    let c1 = claim(UID1, "c1", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([]));
    f.claims.put(c1);
    ok(&f.preparer.prepare(vec![cref(UID1, "c1")]).await, UID1);
    // gpu-0 is held by c1: c2 is not staged, and nothing of it is written.
    let c2 = claim(UID2, "c2", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([]));
    let e = f.preparer.stage(&c2).await.unwrap_err();
    assert!(message(&e).contains(UID1), "{}", message(&e));
    assert!(!spec_path(&f, UID2).exists());
    assert!(f.preparer.store().claim(UID2).unwrap().is_none());
    // Allocated on another node, or not a UID edra accepts.
    let elsewhere = claim(UID3, "c3", &[("gpu", DRIVER, "node-b", "gpu-1", false)], json!([]));
    assert!(f.preparer.stage(&elsewhere).await.is_err());
    let bad = claim("../../etc", "c4", &[("gpu", DRIVER, NODE, "gpu-1", false)], json!([]));
    assert!(matches!(f.preparer.stage(&bad).await, Err(PrepareError::Claim(ClaimError::InvalidUid { .. }))));
    assert!(f.preparer.store().holder("gpu-1").unwrap().is_none());
    assert_eq!(f.preparer.staged_count(), 0);
}

#[tokio::test]
async fn the_kubelets_call_and_staging_prepare_a_claim_once() {
    // Whichever comes first prepares; the other finds it prepared.
    let f = Fixture::new();
    let c1 = claim(UID1, "c1", &[("gpu", DRIVER, NODE, "gpu-0", false)], json!([]));
    f.claims.put(c1.clone());
    let (staged, called) = tokio::join!(f.preparer.stage(&c1), f.preparer.prepare(vec![cref(UID1, "c1")]));
    let staged = staged.unwrap();
    ok(&called, UID1);
    let fetches = f.claims.fetches.load(Ordering::SeqCst);
    match staged {
        Staged::Prepared => assert_eq!(fetches, 0, "the call found it staged"),
        Staged::AlreadyPrepared => assert_eq!(fetches, 1, "the call prepared it"),
        other => panic!("{other:?}"),
    }
    assert_eq!(f.preparer.staged_count(), 0, "the kubelet has it either way");
    assert!(!f.preparer.unstage("ns", "c1").await.unwrap());
}
