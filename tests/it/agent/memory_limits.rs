//! `sharing.memory_limit`: a share's CDI device runs `edra hook apply-memory-limit`, which
//! asks the running agent (a child process) to record and set the share's limit on the
//! container's cgroup through NVML (the stand-in, loaded for the memory-limit calls while
//! the devices come from the mock backend); unprepare clears it; a kill at each step in
//! between converges after a restart; a node without the calls refuses `enforced` (exit
//! 64) and warns under `auto`. The cgroup tree is a directory tree under the node's
//! sys_root: runtimes with real cgroups are in runtime_memory_limit.rs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::support::agent::{ChildAgent, Cluster, DRIVER, GPUS, NODE, prepare_ok, unprepare_ok, wait_until};
use crate::support::apiserver::{AllocatedDevice, ClaimBuilder};
use crate::support::nvml::StubNvml;

pub(crate) const SHARE: u64 = 30 << 30;
pub(crate) const CGROUPS_PATH: &str = "kubepods-besteffort-pod1.slice:cri-containerd:abc";
pub(crate) const SCOPE: &str =
    "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-abc.scope";

/// The stand-in (see [`stub`]) and the node's cgroup v2 tree with the container's scope.
pub(crate) fn node(cluster: &Cluster, variant: Option<&str>) -> (Stub, PathBuf) {
    let stub = stub(cluster, variant);
    let root = cluster.fs().root.join("sys/fs/cgroup");
    std::fs::create_dir_all(root.join(SCOPE)).unwrap();
    std::fs::write(root.join("cgroup.controllers"), "cpuset cpu io memory hugetlb pids\n").unwrap();
    (stub, root.join(SCOPE))
}

/// The stand-in knowing the mock's GPU 2, copied to `/nvml` in the node's driver root, where
/// the library is looked for.
pub(crate) fn stub(cluster: &Cluster, variant: Option<&str>) -> Stub {
    let uuid = edra::inventory::mock::gpu_uuid(NODE, 2);
    let conf = format!(
        "gpu;uuid={uuid};name=NVIDIA H200;brand=2;arch=9;minor=2;index=0;bus=00000000:12:00.0;mem={};sms=132;cc=9.0;mig=0\n",
        141u64 << 30
    );
    let stub = match variant {
        Some(v) => StubNvml::variant(&conf, v),
        None => StubNvml::new(&conf),
    };
    let dir = cluster.fs().root.join("driver/nvml");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&stub.library, dir.join("libnvidia-ml.so.1")).unwrap();
    std::fs::write(dir.join("nvml_stub.conf"), conf).unwrap();
    Stub { library: dir.join("libnvidia-ml.so.1"), dir }
}

/// The stand-in's copy in the driver root.
pub(crate) struct Stub {
    dir: PathBuf,
    library: PathBuf,
}

/// The agent's configuration file with `sharing.memory_limit = mode` and the stand-in.
pub(crate) fn config(cluster: &Cluster, _stub: &Stub, mode: &str) -> PathBuf {
    let body =
        format!("gpus = {GPUS}\n[sharing]\nmemory_limit = \"{mode}\"\n[nvml]\nlibrary = \"/nvml/libnvidia-ml.so.1\"\n");
    cluster.config_file_with(NODE, &body)
}

/// A claim for a 30 GiB share of gpu-2.
pub(crate) fn share_claim(cluster: &Cluster) -> edra::plugin::handler::ClaimRef {
    cluster.put_claim(
        ClaimBuilder::new("default", "limited")
            .allocated(
                AllocatedDevice::new("gpu", DRIVER, NODE, "gpu-2")
                    .share("6de5d941-c79d-4a8a-ba10-668351620525", "30Gi"),
            )
            .reserved_for_pod("pod-limited", "uid-of-pod-limited"),
    )
}

/// The stand-in's memory-limit lines: (uuid, soft, hard, cgroup).
pub(crate) fn limit_lines(stub: &Stub) -> Vec<(String, u64, u64, PathBuf)> {
    let text = std::fs::read_to_string(stub.dir.join("nvml_stub.memlimits")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(5, ' ');
            (f.next()? == "set").then_some(())?;
            Some((f.next()?.into(), f.next()?.parse().ok()?, f.next()?.parse().ok()?, f.next()?.into()))
        })
        .collect()
}

/// The apply-memory-limit hook of `spec` (argv).
pub(crate) fn limit_hook(spec: &Value) -> Option<Vec<String>> {
    spec["devices"]
        .as_array()?
        .iter()
        .flat_map(|d| d["containerEdits"]["hooks"].as_array().into_iter().flatten())
        .find_map(|h| {
            let args: Vec<String> = serde_json::from_value(h["args"].clone()).ok()?;
            (args.get(2).map(String::as_str) == Some("apply-memory-limit") && h["hookName"] == "createContainer")
                .then_some(args)
        })
}

/// Runs the hook as a runtime would, for a container whose config.json has `cgroups_path`.
pub(crate) fn run_hook(args: &[String], bundle: &Path, cgroups_path: &str) -> std::process::Output {
    std::fs::create_dir_all(bundle).unwrap();
    let config = json!({"ociVersion": "1.2.0", "root": {"path": "rootfs"}, "linux": {"cgroupsPath": cgroups_path}});
    std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();
    let state = json!({"ociVersion": "1.2.0", "id": "abc", "status": "creating", "pid": 1, "bundle": bundle});
    let mut child = Command::new(&args[0])
        .args(&args[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the hook");
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), state.to_string().as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

pub(crate) fn spec_of(cluster: &Cluster, uid: &str) -> Value {
    serde_json::from_slice(&std::fs::read(cluster.fs().spec_file(uid)).expect("the claim's spec")).unwrap()
}

/// A fake allocation of `bytes` on the stand-in's GPU by a process in `cgroup`: its NVML code.
fn allocate(stub: &Stub, cgroup: &Path, bytes: u64) -> i32 {
    use std::ffi::CString;
    let lib = CString::new(stub.library.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: loading the stand-in runs no initialisers of its own; symbols are the stub's
    // functions with the signatures below.
    unsafe {
        let h = libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null());
        let sym = |n: &str| libc::dlsym(h, CString::new(n).unwrap().as_ptr());
        let init: extern "C" fn() -> i32 = std::mem::transmute(sym("nvmlInit_v2"));
        let by_uuid: extern "C" fn(*const libc::c_char, *mut *mut libc::c_void) -> i32 =
            std::mem::transmute(sym("nvmlDeviceGetHandleByUUID"));
        let alloc: extern "C" fn(*mut libc::c_void, *const libc::c_char, u64) -> i32 =
            std::mem::transmute(sym("nvmlStubAllocate"));
        assert_eq!(init(), 0);
        let mut dev = std::ptr::null_mut();
        let uuid = CString::new(edra::inventory::mock::gpu_uuid(NODE, 2)).unwrap();
        assert_eq!(by_uuid(uuid.as_ptr(), &mut dev), 0);
        let path = CString::new(cgroup.as_os_str().as_encoded_bytes()).unwrap();
        alloc(dev, path.as_ptr(), bytes)
    }
}

/// Starts the agent on `file` with `failpoints`, waits until it published, and prepares the
/// share claim; returns the agent, the claim and the argv of its apply-memory-limit hook.
async fn prepared_share(
    cluster: &Cluster,
    file: &Path,
    failpoints: &str,
) -> (ChildAgent, edra::plugin::handler::ClaimRef, Vec<String>) {
    let agent = ChildAgent::start_configured(cluster, file, failpoints, &[]).await;
    cluster.wait_published(NODE, GPUS).await;
    let claim = share_claim(cluster);
    prepare_ok(&mut agent.v1().await, &claim).await;
    let args = limit_hook(&spec_of(cluster, &claim.uid)).expect("the share's device runs apply-memory-limit");
    (agent, claim, args)
}

#[tokio::test]
async fn the_hook_sets_the_shares_limit_which_holds_and_unprepare_clears_it() {
    let cluster = Cluster::start().await;
    let (stub, scope) = node(&cluster, None);
    let (agent, claim, args) = prepared_share(&cluster, &config(&cluster, &stub, "enforced"), "").await;
    let out = run_hook(&args, &cluster.dir.path().join("bundle"), CGROUPS_PATH);
    assert!(out.status.success(), "hook: {}", String::from_utf8_lossy(&out.stderr));
    let uuid = edra::inventory::mock::gpu_uuid(NODE, 2);
    assert_eq!(limit_lines(&stub), vec![(uuid.clone(), SHARE, SHARE, scope.clone())], "soft = hard = the share");
    assert_eq!(allocate(&stub, &scope, SHARE), 0, "the share fits");
    assert_eq!(allocate(&stub, &scope, 1), 20, "one byte more fails with NVML_ERROR_MEMORY");
    // A container that is not the claim's share is refused, and sets nothing.
    let other = args.iter().map(|a| if a == "gpu-2" { "gpu-1".to_string() } else { a.clone() }).collect::<Vec<_>>();
    let out = run_hook(&other, &cluster.dir.path().join("bundle2"), CGROUPS_PATH);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds no share of gpu-1"), "{out:?}");
    unprepare_ok(&mut agent.v1().await, &claim).await;
    assert_eq!(limit_lines(&stub).last(), Some(&(uuid, 0, u64::MAX, scope)), "cleared: soft 0, hard max");
    assert_eq!(limit_lines(&stub).len(), 2);
    agent.terminate().await;
}

/// Failpoints exist only in debug builds (as for the other crash tests in crash*.rs): in a
/// release build the agent would not abort, so this test is compiled for debug builds only.
#[cfg(debug_assertions)]
#[tokio::test]
async fn a_kill_between_record_and_set_or_clear_and_forget_converges() {
    let cluster = Cluster::start().await;
    let (stub, scope) = node(&cluster, None);
    let file = config(&cluster, &stub, "enforced");
    let uuid = edra::inventory::mock::gpu_uuid(NODE, 2);
    let (mut agent, claim, args) = prepared_share(&cluster, &file, "memory-limit-after-record").await;
    let out = run_hook(&args, &cluster.dir.path().join("bundle"), CGROUPS_PATH);
    assert_eq!(out.status.code(), Some(1), "the agent died before setting: the container is not created");
    agent.wait_exit().await;
    assert!(limit_lines(&stub).is_empty(), "recorded, not set");
    // Recovery finishes it: the claim still holds the share and the cgroup is the same.
    let mut agent = ChildAgent::start_configured(&cluster, &file, "memory-limit-after-clear", &[]).await;
    assert_eq!(limit_lines(&stub), vec![(uuid.clone(), SHARE, SHARE, scope.clone())], "set again at recovery");
    // The kill now comes after the clear, before the record is dropped.
    let unprepared = crate::support::agent::unprepare(&mut agent.v1().await, std::slice::from_ref(&claim)).await;
    assert!(unprepared.is_err() || unprepared.is_ok_and(|r| !r[&claim.uid].is_empty()));
    agent.wait_exit().await;
    assert_eq!(limit_lines(&stub).last(), Some(&(uuid.clone(), 0, u64::MAX, scope.clone())));
    let mut agent = ChildAgent::start_configured(&cluster, &file, "", &[]).await;
    unprepare_ok(&mut agent.v1().await, &claim).await;
    assert_eq!(limit_lines(&stub).last(), Some(&(uuid, 0, u64::MAX, scope)), "cleared in the end");
    agent.kill().await;
}

/// A container whose processes are all gone (its `cgroup.events` says `populated 0`) has
/// its limit cleared on the cgroup that is still there, before unprepare; the container
/// made again in a new cgroup gets the limit there; one that exits while the agent is
/// killed (SIGKILL) is cleared at the next start, not set again.
#[tokio::test]
async fn an_exited_containers_limit_is_cleared_before_its_cgroup_goes_even_across_a_kill() {
    let cluster = Cluster::start().await;
    let (stub, scope) = node(&cluster, None);
    let file = config(&cluster, &stub, "enforced");
    let uuid = edra::inventory::mock::gpu_uuid(NODE, 2);
    let populated = |scope: &Path, n: u8| {
        std::fs::write(scope.join("cgroup.events"), format!("populated {n}\nfrozen 0\n")).unwrap()
    };
    populated(&scope, 1);
    let (mut agent, claim, args) = prepared_share(&cluster, &file, "").await;
    let out = run_hook(&args, &cluster.dir.path().join("bundle"), CGROUPS_PATH);
    assert!(out.status.success(), "hook: {}", String::from_utf8_lossy(&out.stderr));
    let (set, cleared) = ((uuid.clone(), SHARE, SHARE, scope.clone()), (uuid.clone(), 0, u64::MAX, scope.clone()));
    assert_eq!(limit_lines(&stub), vec![set.clone()]);
    populated(&scope, 0);
    wait_until("the exited container's limit is cleared", || limit_lines(&stub).len() == 2).await;
    assert_eq!(limit_lines(&stub), vec![set.clone(), cleared.clone()], "cleared on the cgroup still there");
    // The container made again (the kubelet restarts it): a new cgroup, a new limit.
    let scope2 = scope.with_file_name("cri-containerd-def.scope");
    std::fs::create_dir_all(&scope2).unwrap();
    populated(&scope2, 1);
    let out = run_hook(&args, &cluster.dir.path().join("bundle2"), "kubepods-besteffort-pod1.slice:cri-containerd:def");
    assert!(out.status.success(), "hook: {}", String::from_utf8_lossy(&out.stderr));
    let set2 = (uuid.clone(), SHARE, SHARE, scope2.clone());
    assert_eq!(limit_lines(&stub).last(), Some(&set2));
    // It exits while the agent is dead: the next start clears it rather than set it again.
    agent.kill().await;
    populated(&scope2, 0);
    let agent = ChildAgent::start_configured(&cluster, &file, "", &[]).await;
    let cleared2 = (uuid, 0, u64::MAX, scope2);
    assert_eq!(limit_lines(&stub), vec![set, cleared, set2, cleared2], "recovery cleared, not set");
    unprepare_ok(&mut agent.v1().await, &claim).await;
    assert_eq!(limit_lines(&stub).len(), 4, "nothing was left for unprepare");
    agent.terminate().await;
}

#[tokio::test]
async fn a_node_without_the_nvml_calls_refuses_enforced_and_warns_under_auto() {
    let cluster = Cluster::start().await;
    let (stub, _) = node(&cluster, Some("STUB_NO_MEMORY_LIMITS"));
    let out = Command::new(env!("CARGO_BIN_EXE_edra"))
        .arg("--config")
        .arg(config(&cluster, &stub, "enforced"))
        .arg("run")
        .env_remove("KUBECONFIG")
        .env_remove(edra::prepare::failpoint::ENV)
        .stdin(Stdio::null())
        .output()
        .expect("run edra");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("sharing.memory_limit = \"enforced\", but this node cannot enforce"), "{stderr}");
    assert!(stderr.contains("has no nvmlDeviceSetMemoryLimits_v1"), "{stderr}");
    let agent = ChildAgent::start_configured(&cluster, &config(&cluster, &stub, "auto"), "", &[]).await;
    cluster.wait_published(NODE, GPUS).await;
    let claim = share_claim(&cluster);
    prepare_ok(&mut agent.v1().await, &claim).await;
    assert_eq!(limit_hook(&spec_of(&cluster, &claim.uid)), None, "advisory: no hook");
    let stderr = agent.stderr();
    assert!(stderr.contains("shares' memory stays advisory on this node"), "{stderr}");
    agent.terminate().await;
}
