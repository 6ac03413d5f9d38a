//! `sharing.memory_limit = "enforced"` under real runtimes: runc, crun and podman create a
//! container from the CDI spec of a share (all its edits and hooks, as in runtime.rs), the
//! `apply-memory-limit` hook reads the `linux.cgroupsPath` the runtime was given, and the
//! agent (`edra run` as a child, NVML's memory-limit calls from the stand-in) sets the
//! share's limit on the cgroup directory the runtime really created. runc's and crun's
//! containers are killed: the agent clears the limit on the emptied cgroup the runtime
//! still keeps; podman's is cleared at unprepare.
//!
//! The agent runs in a mount namespace of its own in which its `<sys_root>/fs/cgroup` is a
//! bind mount of the host's cgroup v2 hierarchy (`/sys/fs/cgroup`, or
//! `/sys/fs/cgroup/unified` in the hybrid layout), so the directory NVML is given is the
//! runtime's own. Each test reads the container's cgroup from `/proc/<pid>/cgroup` (its
//! `0::` line) of the container's first process, checks that process is in that directory
//! of the host's hierarchy, and that the stand-in was asked to set and then clear exactly
//! `<sys_root>/fs/cgroup` + that path. The kernel's `cgroup.events` tells the agent (through
//! the bind mount) that a killed container's cgroup emptied.
//!
//! runc and podman (with runc, cgroupfs manager) run in the hybrid layout as it is; crun
//! 1.8 refuses it, so in crun's private namespace `/sys/fs/cgroup` is a cgroup2 mount (the
//! same hierarchy as `/sys/fs/cgroup/unified`), as on a cgroup v2 node.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use edra::plugin::ClaimRef;
use serde_json::{Value, json};

use crate::agent::memory_limits::{SHARE, Stub, config, limit_hook, limit_lines, share_claim, stub};
use crate::runtime::{Image, Node, Podman, bundle_config, have, in_private_namespace, run, skip, which};
use crate::support::agent::{ChildAgent, Cluster, GPUS, NODE, prepare_ok, unprepare_ok, wait_until};

/// The host's cgroup v2 hierarchy: `/sys/fs/cgroup` on a v2 node, `/sys/fs/cgroup/unified`
/// in the hybrid layout.
fn v2_root() -> Option<PathBuf> {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.controllers").is_file())
}

/// Whether `test` can run: `tools`, root (see [`have`]) and a cgroup v2 hierarchy.
fn ready(test: &str, tools: &[&str]) -> bool {
    have(test, tools) && (v2_root().is_some() || skip(test, "this host has no cgroup v2 hierarchy (v1 only)"))
}

/// A node whose agent enforces memory limits, with a share of gpu-2 prepared.
struct Limited {
    node: Node,
    agent: ChildAgent,
    stub: Stub,
    claim: ClaimRef,
    uuid: String,
}

impl Limited {
    async fn prepare() -> Limited {
        let cluster = Cluster::start().await;
        Node::files(&cluster);
        let stub = stub(&cluster, None);
        let cgroup = cluster.fs().root.join("sys/fs/cgroup");
        std::fs::create_dir_all(&cgroup).unwrap();
        let script = "mount --bind \"$0\" \"$1\" && shift && exec \"$@\"";
        let wrapper: Vec<OsString> = vec![
            "unshare".into(),
            "--mount".into(),
            "--propagation".into(),
            "private".into(),
            "sh".into(),
            "-c".into(),
            script.into(),
            v2_root().unwrap().into(),
            cgroup.into(),
        ];
        let file = config(&cluster, &stub, "enforced");
        let agent = ChildAgent::start_wrapped(&cluster, &file, "", &[], &wrapper).await;
        cluster.wait_published(NODE, GPUS).await;
        let claim = share_claim(&cluster);
        let ids = prepare_ok(&mut agent.v1().await, &claim).await;
        let node = Node::with_claim(cluster, &claim.uid, &ids);
        assert!(limit_hook(&node.spec).is_some(), "the share's device runs apply-memory-limit: {}", node.spec);
        Limited { node, agent, stub, claim, uuid: edra::inventory::mock::gpu_uuid(NODE, 2) }
    }

    /// Asserts the stand-in set the share's limit on the cgroup of the container whose
    /// first process is `pid`, and only there. Returns the cgroup (below the v2 root), the
    /// host's directory and the directory NVML was given.
    fn assert_set(&self, runtime: &str, pid: u32) -> (String, PathBuf, PathBuf) {
        let rel = cgroup_of(pid);
        let real = v2_root().unwrap().join(rel.trim_start_matches('/'));
        let procs = std::fs::read_to_string(real.join("cgroup.procs")).unwrap_or_default();
        assert!(procs.lines().any(|p| p == pid.to_string()), "{runtime}: {pid} not in {}: {procs}", real.display());
        let seen = self.node.cluster.fs().root.join("sys/fs/cgroup").join(rel.trim_start_matches('/'));
        eprintln!(
            "{runtime}: the container's cgroup is {} (0::{rel}); NVML was given {}",
            real.display(),
            seen.display()
        );
        let set = (self.uuid.clone(), SHARE, SHARE, seen.clone());
        assert_eq!(limit_lines(&self.stub), vec![set], "{runtime}: soft = hard = the share, on its cgroup");
        (rel, real, seen)
    }

    /// [`Limited::assert_set`], then unprepares the claim and asserts the limit was cleared
    /// there. Returns the cgroup.
    async fn assert_set_then_cleared(&self, runtime: &str, pid: u32) -> String {
        let (rel, _, seen) = self.assert_set(runtime, pid);
        unprepare_ok(&mut self.agent.v1().await, &self.claim).await;
        let (set, cleared) = ((self.uuid.clone(), SHARE, SHARE, seen.clone()), (self.uuid.clone(), 0, u64::MAX, seen));
        assert_eq!(limit_lines(&self.stub), vec![set, cleared], "{runtime}: unprepare cleared it there");
        rel
    }

    /// [`Limited::assert_set`], then kills the container's first process (its only one)
    /// and asserts the limit is cleared while the runtime still keeps the cgroup (the
    /// container is not deleted), with nothing left for unprepare. Returns the cgroup.
    async fn assert_set_then_cleared_at_exit(&self, runtime: &str, pid: u32) -> String {
        let (rel, real, seen) = self.assert_set(runtime, pid);
        // SAFETY: kill has no memory preconditions; `pid` is the container's process.
        assert_eq!(unsafe { libc::kill(i32::try_from(pid).unwrap(), libc::SIGKILL) }, 0, "{runtime}: kill {pid}");
        wait_until("the exited container's limit is cleared", || limit_lines(&self.stub).len() == 2).await;
        let events = std::fs::read_to_string(real.join("cgroup.events")).unwrap_or_default();
        assert!(events.contains("populated 0"), "{runtime}: the cgroup is still there and empty: {events:?}");
        let (set, cleared) = ((self.uuid.clone(), SHARE, SHARE, seen.clone()), (self.uuid.clone(), 0, u64::MAX, seen));
        assert_eq!(limit_lines(&self.stub), vec![set, cleared], "{runtime}: cleared at exit, on its cgroup");
        unprepare_ok(&mut self.agent.v1().await, &self.claim).await;
        assert_eq!(limit_lines(&self.stub).len(), 2, "{runtime}: nothing was left for unprepare");
        rel
    }
}

/// The v2 cgroup of process `pid` (its `0::` line in `/proc/<pid>/cgroup`).
fn cgroup_of(pid: u32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    text.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or_else(|| panic!("no 0:: line: {text}")).to_string()
}

/// A container created by runc or crun (`create`: the createContainer hooks ran, its first
/// process waits in its cgroup); deleted on drop with the cgroups above it the test made.
struct Created {
    runtime: &'static str,
    state: PathBuf,
    id: String,
    prelude: &'static str,
    top: String,
}

impl Created {
    /// `runtime create` of the claim's bundle with `linux.cgroupsPath` = `cgroups_path`,
    /// in [`in_private_namespace`] after `prelude`; crun's bundle has no device cgroup rules
    /// (see the test).
    fn new(node: &Node, runtime: &'static str, prelude: &'static str, cgroups_path: &str) -> Created {
        let bundle = node.work.join(format!("{runtime}-limited"));
        std::fs::create_dir_all(&bundle).unwrap();
        let rootfs = node.rootfs(&bundle, Image::Plain);
        let mut config = bundle_config(node, &bundle, &rootfs);
        config["linux"]["cgroupsPath"] = json!(cgroups_path);
        if runtime == "crun" {
            config["linux"]["resources"].as_object_mut().unwrap().remove("devices");
        }
        std::fs::write(bundle.join("config.json"), serde_json::to_vec_pretty(&config).unwrap()).unwrap();
        let top = cgroups_path.split('/').find(|c| !c.is_empty()).unwrap().to_string();
        let id = format!("edra-it-{}-{runtime}-limited", std::process::id());
        let created = Created { runtime, state: node.work.join(format!("{runtime}-state")), id, prelude, top };
        let cmd = created.command(&["create", "--bundle", bundle.to_str().unwrap()]);
        let log = bundle.join("create.log");
        let out = std::fs::File::create(&log).unwrap();
        // The container's first process keeps stdout and stderr: a file, not a pipe to wait on.
        let status = in_private_namespace(node, prelude, &cmd)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .status()
            .unwrap();
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(status.success(), "{runtime} create exited with {status}: {log}");
        created
    }

    /// The runtime's command line for `args` and the container.
    fn command(&self, args: &[&str]) -> Vec<OsString> {
        let mut cmd: Vec<OsString> =
            vec![which(self.runtime).unwrap().into(), "--root".into(), self.state.clone().into()];
        cmd.extend(args.iter().map(OsString::from));
        cmd.push(self.id.clone().into());
        cmd
    }

    /// The pid of the container's first process, from the runtime's state.
    fn pid(&self) -> u32 {
        let cmd = self.command(&["state"]);
        let out = run(Command::new(&cmd[0]).args(&cmd[1..]));
        let state: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(state["status"], "created", "{}: {state}", self.runtime);
        u32::try_from(state["pid"].as_u64().unwrap()).unwrap()
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        let delete = self.command(&["delete", "--force"]);
        let script = format!("{}\n\"$@\"", self.prelude);
        let _ = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script, "sh"])
            .args(&delete)
            .stdin(Stdio::null())
            .output();
        remove_cgroups(&self.top);
    }
}

/// Removes the (empty) cgroup tree `top` from every hierarchy, deepest first.
fn remove_cgroups(top: &str) {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else { return };
    for h in hierarchies.flatten().map(|e| e.path()).chain([PathBuf::from("/sys/fs/cgroup")]) {
        remove_tree(&h.join(top));
    }
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
            remove_tree(&e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// runc's or crun's test: the kubelet's cgroupfs form of `cgroupsPath`, created, then the
/// limit checked, cleared when the container's process is killed (before it is deleted).
async fn under_bundle_runtime(test: &str, runtime: &'static str, prelude: &'static str) {
    if !ready(test, &[runtime, "runc", "busybox", "cc", "ldd", "unshare", "mount"]) {
        return;
    }
    let limited = Limited::prepare().await;
    let cgroups_path = format!("/edra-it-{}-{runtime}/podlimited/{runtime}-ctr", std::process::id());
    let created = Created::new(&limited.node, runtime, prelude, &cgroups_path);
    let rel = limited.assert_set_then_cleared_at_exit(runtime, created.pid()).await;
    assert_eq!(rel, cgroups_path, "{runtime} placed the container at its cgroupsPath");
    drop(created);
    limited.agent.terminate().await;
}

#[tokio::test]
async fn the_memory_limit_hook_gets_runcs_real_cgroup() {
    under_bundle_runtime("the_memory_limit_hook_gets_runcs_real_cgroup", "runc", "").await;
}

#[tokio::test]
async fn the_memory_limit_hook_gets_cruns_real_cgroup() {
    // crun 1.8 refuses the hybrid layout: here /sys/fs/cgroup is the v2 hierarchy alone. Its
    // eBPF device filter cannot load here (raising RLIMIT_MEMLOCK needs CAP_SYS_RESOURCE),
    // which crun 1.8 forgives only without device rules, so its bundle has none.
    let prelude = "if [ ! -e /sys/fs/cgroup/cgroup.controllers ]; then mount -t cgroup2 edra-test /sys/fs/cgroup; fi";
    under_bundle_runtime("the_memory_limit_hook_gets_cruns_real_cgroup", "crun", prelude).await;
}

/// A podman container, removed on drop in the mount namespace podman ran it in (its
/// conmon's), where its mounts are.
struct PodmanContainer<'a> {
    podman: &'a Podman,
    name: String,
    conmon: Option<u32>,
}

impl Drop for PodmanContainer<'_> {
    fn drop(&mut self) {
        let rm = self.podman.command(&["rm", "--force", "--time", "0", &self.name]);
        let mut cmd = match self.conmon {
            Some(pid) => {
                let mut cmd = Command::new("nsenter");
                cmd.arg(format!("--mount=/proc/{pid}/ns/mnt")).arg(rm.get_program()).args(rm.get_args());
                cmd.envs(rm.get_envs().filter_map(|(k, v)| Some((k, v?))));
                cmd
            }
            None => rm,
        };
        let _ = cmd.stdin(Stdio::null()).output();
    }
}

#[tokio::test]
async fn the_memory_limit_hook_gets_podmans_real_cgroup() {
    let test = "the_memory_limit_hook_gets_podmans_real_cgroup";
    if !ready(test, &["podman", "runc", "busybox", "cc", "ldd", "unshare", "mount", "tar", "nsenter"]) {
        return;
    }
    let limited = Limited::prepare().await;
    let node = &limited.node;
    let podman = Podman::new(node);
    let tag = podman.import(node, Image::Plain);
    let name = format!("edra-it-{}-limited", std::process::id());
    let mut container = PodmanContainer { podman: &podman, name: name.clone(), conmon: None };
    let args = ["run", "-d", "--name", &name, "--network", "none", "-v", "/proc:/proc:rbind", "--device", &node.cdi_id];
    let log = node.work.join("podman-run.log");
    let out = std::fs::File::create(&log).unwrap();
    let status = podman
        .in_namespace(node, &[&args[..], &[tag.as_str(), "sleep", "600"]].concat())
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .status()
        .unwrap();
    assert!(status.success(), "podman run exited with {status}: {}", std::fs::read_to_string(&log).unwrap());
    let format = "{{.State.Pid}} {{.State.ConmonPid}} {{.OCIConfigPath}}";
    let inspect = run(&mut podman.command(&["inspect", "--format", format, &name]));
    let inspect = String::from_utf8_lossy(&inspect.stdout).trim().to_string();
    let [pid, conmon, config] = inspect.split(' ').collect::<Vec<_>>()[..] else { panic!("inspect: {inspect}") };
    container.conmon = conmon.parse().ok();
    let rel = limited.assert_set_then_cleared("podman", pid.parse().unwrap()).await;
    let config: Value = serde_json::from_slice(&std::fs::read(config).unwrap()).unwrap();
    let cgroups_path = config["linux"]["cgroupsPath"].as_str().unwrap();
    eprintln!("podman: linux.cgroupsPath {cgroups_path}");
    assert_eq!(rel, cgroups_path, "the cgroupsPath the hook read is where runc put the container");
    drop(container);
    limited.agent.terminate().await;
}
