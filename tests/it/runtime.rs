//! edra's CDI spec and hooks applied by real container runtimes: podman (the CDI library, as
//! containerd and CRI-O use it) and plain runc (and crun where it is installed) on a bundle
//! whose config.json is derived here from the spec.
//!
//! The spec is written by the real prepare path: the assembled agent with the mock backend
//! prepares a claim over the kubelet's gRPC API. The node has a fake driver root of real
//! shared objects with SONAMEs compiled with `cc`, a script as `nvidia-smi`, device nodes
//! made with mknod, and a procfs stand-in saying `ModifyDeviceFiles: 1`, so the spec carries
//! all three hooks. Images are busybox rootfs trees (plus a program that dlopens
//! `libcuda.so.1` and the host's C library for it): a plain one, one whose
//! `/etc/ld.so.conf.d` is a link inside the rootfs, and one with a non-UTF-8
//! `/etc/ld.so.conf`.
//!
//! Each runtime runs in a private mount namespace (`unshare --mount`) in which the host's
//! `/proc/driver` is a tmpfs holding `nvidia/params` with `ModifyDeviceFiles: 1`, the
//! container's `/proc` is a recursive bind of that `/proc` (so the file is there to hide),
//! and `/run/cdi` is the agent's CDI directory (podman 4.3 reads specs from there only).
//! Inside, the container must see `ModifyDeviceFiles: 0`, read-only, while the namespace it
//! was started from still sees 1: the hook mounted in the container's namespace only.
//!
//! The node ([`Node::files`], [`Node::with_claim`]), bundle and podman helpers serve
//! runtime_memory_limit.rs too.
//!
//! The tools are needed: without them (or without root) each test prints why it did not
//! run; with `CI=true` that is a failure, since `.ci/run` installs them.

use std::ffi::OsString;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

use crate::support::agent::{Agent, Cluster, NODE, prepare_ok};

const DRIVER_VERSION: &str = "550.54.15";
/// The driver's library folder, not one of glibc's default folders: only the ld.so.cache
/// the hook builds lets the loader find the libraries there.
const LIB_DIR: &str = "usr/lib64";
const HOST_PARAMS: &str = "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n";
const NON_UTF8_CONF: &[u8] = b"# r\xe9pertoire \xff\xfe\n/opt/l\xe9b\n";

/// The image variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Image {
    Plain,
    /// `/etc/ld.so.conf.d` → `../usr/etc/ld.so.conf.d`.
    ConfDLink,
    /// `/etc/ld.so.conf` with bytes that are not UTF-8.
    NonUtf8Conf,
}

const IMAGES: [Image; 3] = [Image::Plain, Image::ConfDLink, Image::NonUtf8Conf];

impl Image {
    fn name(self) -> &'static str {
        match self {
            Image::Plain => "plain",
            Image::ConfDLink => "confd-link",
            Image::NonUtf8Conf => "non-utf8-conf",
        }
    }
}

/// Returns false (after printing why) when `tools` are missing or the test is not root; under
/// `CI=true` that panics instead.
pub(crate) fn have(test: &str, tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools.iter().copied().filter(|t| which(t).is_none()).collect();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    match (missing.is_empty(), root) {
        (true, true) => true,
        (false, _) => skip(test, &format!("{} not installed", missing.join(", "))),
        (true, false) => skip(test, "not running as root (runtimes, mknod and mounts need it)"),
    }
}

/// Prints why `test` does not run and returns false; under `CI=true` panics instead.
pub(crate) fn skip(test: &str, reason: &str) -> bool {
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{test}: {reason}; .ci/run installs what it needs");
    eprintln!("{test}: skipped: {reason}");
    false
}

/// Whether the runtime can run a trivial container at all (`cmd`, no CDI edits); else
/// [`skip`] with the runtime's own words.
pub(crate) fn runtime_runs(test: &str, runtime: &str, cmd: &mut Command) -> bool {
    match cmd.stdin(Stdio::null()).output() {
        Ok(out) if out.status.success() => true,
        Ok(out) => skip(
            test,
            &format!(
                "{runtime} cannot run a container here at all ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ),
        Err(e) => skip(test, &format!("cannot start {runtime}: {e}")),
    }
}

pub(crate) fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).chain(["/usr/sbin".into(), "/sbin".into()]).map(|d| d.join(tool)).find(|p| p.is_file())
}

pub(crate) fn run(cmd: &mut Command) -> Output {
    let out = cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} exited with {}:\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn cc(dir: &Path, name: &str, source: &str, args: &[&str]) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let out = dir.join(name);
    run(Command::new("cc").arg("-o").arg(&out).arg(&src).args(args));
    out
}

const LIBCUDA_C: &str =
    "int edra_fake_cuda_version(void) { return 12040; }\nint cuInit(unsigned flags) { return (int)flags; }\n";
const NVML_C: &str = "int nvmlInit_v2(void) { return 0; }\n";
const DLOPEN_C: &str = r#"#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) { printf("libcuda.so.1: %s\n", dlerror()); return 1; }
    int (*version)(void) = (int (*)(void))dlsym(cuda, "edra_fake_cuda_version");
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    printf("libcuda.so.1 %d, libnvidia-ml.so.1 %s\n", version ? version() : -1, nvml ? "loaded" : dlerror());
    return 0;
}
"#;

/// The node: the fake driver root, device nodes, the procfs stand-in; then the claim's
/// spec as the real prepare path writes it.
pub(crate) struct Node {
    pub(crate) cluster: Cluster,
    pub(crate) spec: Value,
    pub(crate) cdi_id: String,
    /// The dlopen program and the host libraries it needs (absolute paths).
    dlopen: PathBuf,
    host_libs: Vec<PathBuf>,
    pub(crate) work: PathBuf,
}

fn mknod(path: &Path, major: u32, minor: u32) {
    let _ = std::fs::remove_file(path);
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path alive across the call; makedev and mknod take plain values.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(major, minor)) };
    assert_eq!(rc, 0, "mknod {}: {}", path.display(), std::io::Error::last_os_error());
}

impl Node {
    async fn prepare() -> Node {
        let cluster = Cluster::start().await;
        Node::files(&cluster);
        let mut config = cluster.config(NODE);
        config.paths.cdi_hook_binary = Some(PathBuf::from(env!("CARGO_BIN_EXE_edra")));
        let agent = Agent::start(cluster.fs(), config).await;
        let claim = cluster.allocated_claim("gpu", "gpu-1");
        let ids = prepare_ok(&mut agent.v1().await, &claim).await;
        agent.stop().await;
        Node::with_claim(cluster, &claim.uid, &ids)
    }

    /// The node's driver files, device nodes and procfs stand-in.
    pub(crate) fn files(cluster: &Cluster) {
        let fs = cluster.fs();
        let work = cluster.dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        // The driver's user-space files, as an installed driver lays them out.
        let lib = fs.root.join("driver").join(LIB_DIR);
        std::fs::create_dir_all(&lib).unwrap();
        let so = |name: &str, soname: &str, src: &str| {
            let built = cc(&work, name, src, &["-shared", "-fPIC", &format!("-Wl,-soname,{soname}")]);
            std::fs::rename(built, lib.join(format!("{name}.so.{DRIVER_VERSION}"))).unwrap();
        };
        so("libcuda", "libcuda.so.1", LIBCUDA_C);
        so("libnvidia-ml", "libnvidia-ml.so.1", NVML_C);
        std::os::unix::fs::symlink(format!("libnvidia-ml.so.{DRIVER_VERSION}"), lib.join("libnvidia-ml.so.1")).unwrap();
        let bin = fs.root.join("driver/usr/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("nvidia-smi"), "#!/bin/sh\necho \"NVIDIA-SMI stand-in, driver $0\"\n").unwrap();
        std::fs::set_permissions(bin.join("nvidia-smi"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        // Device nodes the runtimes can create in containers (the driver's majors).
        for i in 0..4 {
            mknod(&fs.root.join(format!("dev/nvidia{i}")), 195, i);
        }
        mknod(&fs.root.join("dev/nvidiactl"), 195, 255);
        mknod(&fs.root.join("dev/nvidia-uvm"), 235, 0);
        let params = fs.root.join("proc/driver/nvidia/params");
        std::fs::create_dir_all(params.parent().unwrap()).unwrap();
        std::fs::write(&params, HOST_PARAMS).unwrap();
    }

    /// The node once claim `uid` is prepared (its CDI IDs `ids`) on [`Node::files`].
    pub(crate) fn with_claim(cluster: Cluster, uid: &str, ids: &[String]) -> Node {
        let work = cluster.dir.path().join("work");
        let [cdi_id] = ids else { panic!("one CDI ID expected: {ids:?}") };
        let text = std::fs::read_to_string(cluster.fs().spec_file(uid)).unwrap();
        let spec: Value = serde_json::from_str(&text).unwrap();

        let dlopen = cc(&work, "dlopen-cuda", DLOPEN_C, &["-ldl"]);
        let ldd = run(Command::new("ldd").arg(&dlopen));
        let host_libs = String::from_utf8_lossy(&ldd.stdout)
            .split_whitespace()
            .filter(|w| w.starts_with('/'))
            .map(PathBuf::from)
            .collect::<Vec<_>>();
        assert!(host_libs.iter().any(|p| p.to_string_lossy().contains("libc.so")), "ldd: {host_libs:?}");
        Node { cdi_id: cdi_id.clone(), cluster, spec, dlopen, host_libs, work }
    }

    /// A busybox rootfs for `image` under `dir`.
    pub(crate) fn rootfs(&self, dir: &Path, image: Image) -> PathBuf {
        let root = dir.join(format!("rootfs-{}", image.name()));
        for d in ["bin", "etc", "proc", "dev", "sys", "tmp", "usr/local/bin", LIB_DIR] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::copy(which("busybox").unwrap(), root.join("bin/busybox")).unwrap();
        for applet in ["sh", "cat", "echo", "grep", "od", "readlink", "stat", "test", "tr", "cut", "ls", "sleep"] {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
        }
        std::fs::copy(&self.dlopen, root.join("usr/local/bin/dlopen-cuda")).unwrap();
        for lib in &self.host_libs {
            let to = root.join(lib.strip_prefix("/").unwrap());
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(lib, &to).unwrap();
        }
        match image {
            Image::Plain => {}
            Image::ConfDLink => {
                std::fs::create_dir_all(root.join("usr/etc/ld.so.conf.d")).unwrap();
                std::fs::write(root.join("usr/etc/ld.so.conf.d/local.conf"), "/usr/local/lib\n").unwrap();
                std::os::unix::fs::symlink("../usr/etc/ld.so.conf.d", root.join("etc/ld.so.conf.d")).unwrap();
                std::fs::write(root.join("etc/ld.so.conf"), "include /etc/ld.so.conf.d/*.conf\n").unwrap();
            }
            Image::NonUtf8Conf => std::fs::write(root.join("etc/ld.so.conf"), NON_UTF8_CONF).unwrap(),
        }
        root
    }

    fn cdi_dir(&self) -> PathBuf {
        self.cluster.fs().cdi_dir()
    }

    /// The claim's device edits (the spec's only device).
    fn device(&self) -> &Value {
        &self.spec["devices"][0]["containerEdits"]
    }

    fn common(&self) -> &Value {
        &self.spec["containerEdits"]
    }
}

/// What the container reports: `key=value` lines.
const CHECK: &str = r#"
echo "nvidia1=$(stat -c '%F %t:%T' /dev/nvidia1)"
echo "nvidiactl=$(stat -c '%F %t:%T' /dev/nvidiactl)"
echo "nvidia0=$(test -e /dev/nvidia0 && echo present || echo absent)"
echo "env=$NVIDIA_VISIBLE_DEVICES $EDRA_DEVICE_GPU_1_UUID"
echo "libcuda.so.1=$(readlink /usr/lib64/libcuda.so.1)"
echo "libcuda.so=$(readlink /usr/lib64/libcuda.so)"
echo "libnvidia-ml.so.1=$(readlink /usr/lib64/libnvidia-ml.so.1)"
echo "libcuda-mount=$(grep ' /usr/lib64/libcuda.so.550.54.15 ' /proc/self/mountinfo | cut -d' ' -f6)"
echo "nvidia-smi=$(nvidia-smi)"
echo "cache=$(grep -c libcuda.so.1 /etc/ld.so.cache)"
echo "dlopen=$(/usr/local/bin/dlopen-cuda)"
echo "params=$(cat /proc/driver/nvidia/params | tr '\n' ';')"
echo "params-write=$( (echo x > /proc/driver/nvidia/params) 2>/dev/null && echo allowed || echo refused)"
echo "ld.so.conf=$(od -An -tx1 /etc/ld.so.conf | tr -d ' \n')"
echo "conf-d=$(readlink /etc/ld.so.conf.d)"
echo "edra-conf=$(cat /etc/ld.so.conf.d/00-edra-gpu.conf | grep -c '^/usr/lib64$')"
"#;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The report as key → value.
fn report(stdout: &[u8]) -> std::collections::BTreeMap<String, String> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

/// Asserts what the container saw.
fn assert_container(node: &Node, runtime: &str, image: Image, stdout: &[u8]) {
    let r = report(stdout);
    let get = |k: &str| r.get(k).map(String::as_str).unwrap_or_else(|| panic!("{runtime}/{image:?}: no {k} in {r:?}"));
    let ctx = format!("{runtime}, image {}", image.name());
    eprintln!("{ctx}: the container reported {r:?}");
    assert_eq!(get("nvidia1"), format!("character special file {:x}:{:x}", 195, 1), "{ctx}");
    assert_eq!(get("nvidiactl"), format!("character special file {:x}:{:x}", 195, 255), "{ctx}");
    assert_eq!(get("nvidia0"), "absent", "{ctx}: only the claim's GPU");
    let env: Vec<&str> = node.common()["env"]
        .as_array()
        .unwrap()
        .iter()
        .chain(node.device()["env"].as_array().unwrap())
        .filter_map(Value::as_str)
        .collect();
    let values: Vec<&str> = env.iter().filter_map(|e| e.split_once('=').map(|(_, v)| v)).collect();
    assert_eq!(get("env"), values.join(" "), "{ctx}: env {env:?}");
    assert_eq!(get("libcuda.so.1"), format!("libcuda.so.{DRIVER_VERSION}"), "{ctx}");
    assert_eq!(get("libcuda.so"), "libcuda.so.1", "{ctx}");
    assert_eq!(get("libnvidia-ml.so.1"), format!("libnvidia-ml.so.{DRIVER_VERSION}"), "{ctx}");
    assert!(get("libcuda-mount").split(',').any(|o| o == "ro"), "{ctx}: read-only mount: {}", get("libcuda-mount"));
    assert!(get("nvidia-smi").starts_with("NVIDIA-SMI stand-in"), "{ctx}: {}", get("nvidia-smi"));
    assert_ne!(get("cache"), "0", "{ctx}: ld.so.cache names libcuda.so.1");
    assert_eq!(get("dlopen"), "libcuda.so.1 12040, libnvidia-ml.so.1 loaded", "{ctx}");
    assert_eq!(
        get("params"),
        HOST_PARAMS.replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0").replace('\n', ";"),
        "{ctx}: the hook's copy in the container"
    );
    assert_eq!(get("params-write"), "refused", "{ctx}: the copy is read-only");
    assert_eq!(
        get("host-params"),
        HOST_PARAMS.replace('\n', ";"),
        "{ctx}: the namespace the runtime ran in still sees the host's file"
    );
    assert_eq!(get("edra-conf"), "1", "{ctx}: 00-edra-gpu.conf lists the library folder");
    let include = "include /etc/ld.so.conf.d/*.conf\n";
    match image {
        Image::Plain => assert_eq!(get("ld.so.conf"), hex(include.as_bytes()), "{ctx}"),
        Image::ConfDLink => {
            assert_eq!(get("conf-d"), "../usr/etc/ld.so.conf.d", "{ctx}: the link is kept");
            assert_eq!(get("ld.so.conf"), hex(include.as_bytes()), "{ctx}: unchanged");
        }
        Image::NonUtf8Conf => {
            assert_eq!(get("ld.so.conf"), hex(&[include.as_bytes(), NON_UTF8_CONF].concat()), "{ctx}: bytes kept");
        }
    }
}

/// `unshare --mount` around `runtime_cmd`: the host's `/proc/driver` is a tmpfs saying
/// `ModifyDeviceFiles: 1`, `/run/cdi` is the node's CDI directory; after the runtime, the
/// namespace's own view of the params is printed as `host-params=`.
pub(crate) fn in_private_namespace(node: &Node, prelude: &str, runtime_cmd: &[OsString]) -> Command {
    let script = format!(
        "set -e\n{prelude}\nmount -t tmpfs -o mode=0755 edra-test /proc/driver\nmkdir /proc/driver/nvidia\n\
         printf '{}' > /proc/driver/nvidia/params\nmkdir -p /run/cdi\nmount --bind \"$1\" /run/cdi\nshift\n\"$@\"\n\
         echo \"host-params=$(tr '\\n' ';' < /proc/driver/nvidia/params)\"\n",
        HOST_PARAMS.replace('\n', "\\n")
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script, "sh"]).arg(node.cdi_dir()).args(runtime_cmd);
    cmd
}

/// The spec's edits applied to `runc spec`'s default config, as the CDI library does.
pub(crate) fn bundle_config(node: &Node, bundle: &Path, rootfs: &Path) -> Value {
    run(Command::new(which("runc").unwrap()).arg("spec").arg("--bundle").arg(bundle));
    let mut config: Value = serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    config["root"] = json!({"path": rootfs, "readonly": false});
    let process = &mut config["process"];
    process["terminal"] = json!(false);
    process["args"] = json!(["sh", "-c", CHECK]);
    let env = process["env"].as_array_mut().unwrap();
    for edits in [node.common(), node.device()] {
        env.extend(edits["env"].as_array().cloned().unwrap_or_default());
    }
    let mounts = config["mounts"].as_array_mut().unwrap();
    // The namespace's /proc, with its /proc/driver stand-in, instead of a new procfs.
    for m in mounts.iter_mut().filter(|m| m["destination"] == "/proc") {
        *m = json!({"destination": "/proc", "type": "bind", "source": "/proc", "options": ["rbind", "nosuid", "nodev", "noexec"]});
    }
    for edits in [node.common(), node.device()] {
        for m in edits["mounts"].as_array().cloned().unwrap_or_default() {
            mounts.push(json!({"destination": m["containerPath"], "type": "bind", "source": m["hostPath"], "options": m["options"]}));
        }
    }
    let mut devices = Vec::new();
    let mut allowed = Vec::new();
    for edits in [node.common(), node.device()] {
        for d in edits["deviceNodes"].as_array().cloned().unwrap_or_default() {
            let host = d["hostPath"].as_str().or(d["path"].as_str()).unwrap();
            let meta = std::fs::metadata(host).unwrap();
            assert!(meta.file_type().is_char_device(), "{host}");
            let (major, minor) = (libc::major(meta.rdev()), libc::minor(meta.rdev()));
            devices.push(json!({"path": d["path"], "type": "c", "major": major, "minor": minor, "fileMode": 0o666, "uid": 0, "gid": 0}));
            allowed
                .push(json!({"allow": true, "type": "c", "major": major, "minor": minor, "access": d["permissions"]}));
        }
    }
    config["linux"]["devices"] = json!(devices);
    config["linux"]["resources"]["devices"].as_array_mut().unwrap().extend(allowed);
    let mut hooks = serde_json::Map::new();
    let device_hooks = node.device()["hooks"].as_array().cloned().unwrap_or_default();
    for h in node.common()["hooks"].as_array().unwrap().iter().chain(&device_hooks) {
        let entry = json!({"path": h["path"], "args": h["args"]});
        hooks.entry(h["hookName"].as_str().unwrap()).or_insert_with(|| json!([])).as_array_mut().unwrap().push(entry);
    }
    config["hooks"] = Value::Object(hooks);
    config
}

/// Runs each image on a bundle with `runtime` (runc or crun); returns nothing, asserts all.
fn run_bundles(test: &str, node: &Node, runtime: &str, prelude: &str) {
    let hooks: Vec<&str> =
        node.common()["hooks"].as_array().unwrap().iter().filter_map(|h| h["args"][2].as_str()).collect();
    assert_eq!(hooks, ["create-symlinks", "update-ldcache", "disable-device-node-modification"], "{}", node.spec);
    let runtime_path = which(runtime).unwrap();
    let state = node.work.join(format!("{runtime}-state"));
    // A plain container first: a runtime that cannot run here at all is a skip, not a failure.
    let probe = node.work.join(format!("{runtime}-probe"));
    std::fs::create_dir_all(&probe).unwrap();
    let rootfs = node.rootfs(&probe, Image::Plain);
    run(Command::new(which("runc").unwrap()).arg("spec").arg("--bundle").arg(&probe));
    let mut config: Value = serde_json::from_slice(&std::fs::read(probe.join("config.json")).unwrap()).unwrap();
    config["root"] = json!({"path": rootfs, "readonly": false});
    config["process"]["terminal"] = json!(false);
    config["process"]["args"] = json!(["sh", "-c", "true"]);
    std::fs::write(probe.join("config.json"), serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    let id = format!("edra-it-{}-{runtime}-probe", std::process::id());
    let cmd: Vec<OsString> = vec![
        runtime_path.clone().into(),
        "--root".into(),
        state.clone().into(),
        "run".into(),
        "--bundle".into(),
        probe.into(),
        id.into(),
    ];
    if !runtime_runs(test, runtime, &mut in_private_namespace(node, prelude, &cmd)) {
        return;
    }
    for image in IMAGES {
        let bundle = node.work.join(format!("{runtime}-{}", image.name()));
        std::fs::create_dir_all(&bundle).unwrap();
        let rootfs = node.rootfs(&bundle, image);
        let config = bundle_config(node, &bundle, &rootfs);
        std::fs::write(bundle.join("config.json"), serde_json::to_vec_pretty(&config).unwrap()).unwrap();
        let id = format!("edra-it-{}-{runtime}-{}", std::process::id(), image.name());
        let state = node.work.join(format!("{runtime}-state"));
        let cmd: Vec<OsString> = vec![
            runtime.into(),
            "--root".into(),
            state.into(),
            "run".into(),
            "--bundle".into(),
            bundle.into(),
            id.into(),
        ];
        let out = run(&mut in_private_namespace(node, prelude, &cmd));
        assert_container(node, runtime, image, &out.stdout);
        // The image on disk after the run: the cache lists the driver's libraries.
        let ldconfig = edra::hook::find_ldconfig(None).unwrap();
        let listed = run(Command::new(ldconfig).arg("-r").arg(&rootfs).arg("-p"));
        let listed = String::from_utf8_lossy(&listed.stdout);
        for soname in ["libcuda.so.1", "libnvidia-ml.so.1"] {
            assert!(
                listed.contains(&format!("{soname} (")) && listed.contains(&format!("/{LIB_DIR}/{soname}")),
                "{runtime}/{image:?}: {listed}"
            );
        }
    }
}

#[tokio::test]
async fn the_spec_and_hooks_work_under_runc() {
    if !have("the_spec_and_hooks_work_under_runc", &["runc", "busybox", "cc", "ldd", "unshare", "mount"]) {
        return;
    }
    let node = Node::prepare().await;
    run_bundles("the_spec_and_hooks_work_under_runc", &node, "runc", "");
}

#[tokio::test]
async fn the_spec_and_hooks_work_under_crun() {
    if !have("the_spec_and_hooks_work_under_crun", &["crun", "runc", "busybox", "cc", "ldd", "unshare", "mount"]) {
        return;
    }
    let node = Node::prepare().await;
    // crun 1.8 refuses a hybrid cgroup layout (v1 controllers plus a v2 mount at
    // /sys/fs/cgroup/unified); hidden in the private namespace, crun uses v1 alone.
    let prelude = "umount /sys/fs/cgroup/unified 2>/dev/null || true";
    run_bundles("the_spec_and_hooks_work_under_crun", &node, "crun", prelude);
}

/// podman with storage of its own under the node's work directory, runc as its runtime and
/// the cgroupfs manager.
pub(crate) struct Podman {
    dir: PathBuf,
    conf: PathBuf,
}

impl Podman {
    pub(crate) fn new(node: &Node) -> Podman {
        let dir = node.work.join("podman");
        std::fs::create_dir_all(&dir).unwrap();
        // podman here needs no default ulimits (runc fails setting RLIMIT_NPROC otherwise).
        let conf = dir.join("containers.conf");
        std::fs::write(
            &conf,
            "[containers]\ndefault_ulimits = []\n[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n",
        )
        .unwrap();
        Podman { dir, conf }
    }

    /// podman's command line with `args`.
    fn args(&self, args: &[&str]) -> Vec<OsString> {
        let mut all: Vec<OsString> = vec!["podman".into(), "--root".into(), self.dir.join("root").into()];
        all.extend(["--runroot".into(), self.dir.join("runroot").into(), "--storage-driver".into(), "vfs".into()]);
        all.extend(args.iter().map(OsString::from));
        all
    }

    /// `podman args` here.
    pub(crate) fn command(&self, args: &[&str]) -> Command {
        let all = self.args(args);
        let mut cmd = Command::new(&all[0]);
        cmd.args(&all[1..]).env("CONTAINERS_CONF", &self.conf);
        cmd
    }

    /// `podman args` in [`in_private_namespace`].
    pub(crate) fn in_namespace(&self, node: &Node, args: &[&str]) -> Command {
        let mut cmd = in_private_namespace(node, "", &self.args(args));
        cmd.env("CONTAINERS_CONF", &self.conf);
        cmd
    }

    /// `image` imported; its tag.
    pub(crate) fn import(&self, node: &Node, image: Image) -> String {
        let rootfs = node.rootfs(&self.dir, image);
        let tarball = self.dir.join(format!("{}.tar", image.name()));
        run(Command::new("tar").arg("-C").arg(&rootfs).arg("-cf").arg(&tarball).arg("."));
        let tag = format!("localhost/edra-it-{}:{}", std::process::id(), image.name());
        run(&mut self.command(&["import", tarball.to_str().unwrap(), &tag]));
        tag
    }
}

#[tokio::test]
async fn the_spec_and_hooks_work_under_podman() {
    if !have(
        "the_spec_and_hooks_work_under_podman",
        &["podman", "runc", "busybox", "cc", "ldd", "unshare", "mount", "tar"],
    ) {
        return;
    }
    let node = Node::prepare().await;
    let podman = Podman::new(&node);
    for (i, image) in IMAGES.into_iter().enumerate() {
        let tag = podman.import(&node, image);
        // A plain container first: podman that cannot run here at all is a skip.
        if i == 0 {
            let mut probe = podman.in_namespace(&node, &["run", "--rm", "--network", "none", &tag, "sh", "-c", "true"]);
            if !runtime_runs("the_spec_and_hooks_work_under_podman", "podman", &mut probe) {
                return;
            }
        }
        let args = ["run", "--rm", "--network", "none", "-v", "/proc:/proc:rbind", "--device", &node.cdi_id];
        let args = [&args[..], &[tag.as_str(), "sh", "-c", CHECK]].concat();
        let out = run(&mut podman.in_namespace(&node, &args));
        assert_container(&node, "podman", image, &out.stdout);
    }
}
