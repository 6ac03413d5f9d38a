//! A Jetson's CDI spec applied by a real container runtime: podman (the CDI library, as
//! containerd and CRI-O use it) with runc. The node is a fake AGX Orin (support::tegra)
//! whose CSV lists name a `libcuda.so.1.1` with a SONAME compiled with `cc`, its links, a
//! folder and device nodes made with mknod; the spec is written by the assembled agent
//! (tegra backend) preparing a claim over the kubelet's gRPC API. Inside, the container
//! must see the device nodes, the folder, the links `create-symlinks` made, and load
//! `libcuda.so.1` through the cache `update-ldcache` built. Skipped (a failure under
//! `CI=true`) without the tools or root, as the runtime test is.

use std::path::PathBuf;
use std::process::Command;

use crate::runtime::{Image, Node, Podman, have, run, runtime_runs};
use crate::support::agent::{Agent, Cluster, NODE, prepare_ok};
use crate::support::tegra;

/// A shared object with `soname`, built in `dir`; its bytes.
fn shared_object(dir: &std::path::Path, soname: &str, source: &str) -> Vec<u8> {
    let src = dir.join(format!("{soname}.c"));
    let out = dir.join(soname);
    std::fs::write(&src, source).unwrap();
    run(Command::new("cc")
        .arg("-shared")
        .arg("-fPIC")
        .arg(format!("-Wl,-soname,{soname}"))
        .arg("-o")
        .arg(&out)
        .arg(&src));
    std::fs::read(out).unwrap()
}

const CHECK: &str = r#"
echo "nvmap=$(stat -c '%F %t:%T' /dev/nvmap)"
echo "igpu=$(stat -c '%F' /dev/nvgpu/igpu0/ctrl)"
echo "absent=$(test -e /dev/nvhost-absent && echo present || echo absent)"
echo "soname=$(readlink /usr/lib/aarch64-linux-gnu/nvidia/libcuda.so.1)"
echo "devlink=$(readlink /usr/lib/aarch64-linux-gnu/nvidia/libcuda.so)"
echo "folder=$(cat /usr/share/nvidia/firmware.txt)"
echo "dlopen=$(/usr/local/bin/dlopen-cuda | cut -d, -f1)"
"#;

#[tokio::test]
async fn a_jetson_spec_gives_a_podman_container_the_csv_nodes_libraries_and_links() {
    const TEST: &str = "a_jetson_spec_gives_a_podman_container_the_csv_nodes_libraries_and_links";
    if !have(TEST, &["podman", "runc", "busybox", "cc", "ldd", "unshare", "mount", "tar"]) {
        return;
    }
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    for node in ["nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1", "nvidia2", "nvidia3"] {
        std::fs::remove_file(fs.root.join("dev").join(node)).unwrap();
    }
    let work = cluster.dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let cuda = shared_object(&work, "libcuda.so.1", "int edra_fake_cuda_version(void) { return 12060; }\n");
    let nvrm = shared_object(&work, "libnvrm_gpu.so", "int nvrm(void) { return 0; }\n");
    let fake = tegra::make(&fs.root, &[("libcuda.so.1.1", &cuda), ("libnvrm_gpu.so", &nvrm)]);
    assert!(fake.nodes, "root makes the device nodes");
    let mut config = cluster.config(NODE);
    config.backend = edra::config::BackendKind::Auto;
    config.nvml.library = "libnvidia-ml-absent-for-tests.so.1".into();
    config.paths.cdi_hook_binary = Some(PathBuf::from(env!("CARGO_BIN_EXE_edra")));
    let agent = Agent::start(fs.clone(), config).await;
    let claim = cluster.allocated_claim("jetson", "gpu-0");
    let ids = prepare_ok(&mut agent.v1().await, &claim).await;
    agent.stop().await;
    let node = Node::with_claim(cluster, &claim.uid, &ids);

    let podman = Podman::new(&node);
    let tag = podman.import(&node, Image::Plain);
    let mut probe = podman.in_namespace(&node, &["run", "--rm", "--network", "none", &tag, "sh", "-c", "true"]);
    if !runtime_runs(TEST, "podman", &mut probe) {
        return;
    }
    let out = run(&mut podman
        .in_namespace(&node, &["run", "--rm", "--network", "none", "--device", &node.cdi_id, &tag, "sh", "-c", CHECK]));
    let text = String::from_utf8_lossy(&out.stdout);
    let got = |key: &str| {
        text.lines().find_map(|l| l.strip_prefix(&format!("{key}="))).unwrap_or_else(|| panic!("no {key} in: {text}"))
    };
    assert_eq!(got("nvmap"), "character special file a:7d", "{text}");
    assert_eq!(got("igpu"), "character special file", "{text}");
    assert_eq!(got("absent"), "absent", "{text}");
    assert_eq!(got("soname"), "libcuda.so.1.1", "{text}");
    assert_eq!(got("devlink"), "libcuda.so.1", "{text}");
    assert_eq!(got("folder"), "firmware", "{text}");
    assert_eq!(got("dlopen"), "libcuda.so.1 12060", "the loader found libcuda.so.1 through the cache: {text}");
}
