//! What a user of the node without privileges can do to `edra run`: a link planted at a
//! lock file is refused, not written through; directories edra uses that others can write
//! are named at WARN with their fix, once each; a metrics port bound first keeps edra
//! neither from the kubelet nor from the port once it is free.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use crate::support::agent::{ChildAgent, Cluster, DRIVER, WAIT, prepare_ok};

/// The unprivileged user that plants links.
const NOBODY: u32 = 65534;

#[tokio::test]
async fn a_link_planted_at_the_cdi_lock_by_another_user_is_refused_and_its_target_kept() {
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: planting a link as another user needs root");
        return;
    }
    let cluster = Cluster::start().await;
    let cdi = cluster.fs().cdi_dir();
    // A root-only file, and a CDI directory the user may write in.
    let secret = cluster.dir.path().join("secret");
    std::fs::write(&secret, "root's secret\n").expect("write the secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod 0600");
    for dir in [cluster.dir.path(), &cluster.fs().root, cdi.parent().expect("cdi's parent")] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).expect("let nobody through");
    }
    std::os::unix::fs::chown(&cdi, Some(NOBODY), Some(NOBODY)).expect("give the CDI directory to nobody");
    let lock = cdi.join(format!(".k8s.{DRIVER}.lock"));
    let planted = std::process::Command::new("ln")
        .arg("-s")
        .arg(&secret)
        .arg(&lock)
        .uid(NOBODY)
        .gid(NOBODY)
        .status()
        .expect("run ln as nobody");
    assert!(planted.success(), "ln -s as nobody: {planted}");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_edra"))
        .arg("--config")
        .arg(cluster.config_file("n1"))
        .arg("run")
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(WAIT, out).await.expect("edra exits").expect("run edra");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let said =
        format!("edra: {} is a symbolic link, not a regular file; edra does not write through it", lock.display());
    assert!(stderr.contains(&said), "{stderr}");
    assert!(stderr.contains(&format!("chmod go-w {}", cdi.display())), "{stderr}");
    assert_eq!(std::fs::read_to_string(&secret).expect("read the secret"), "root's secret\n");
}

/// `GET path` on `address`: the status code, or `None` while nothing answers there.
fn status_of(address: std::net::SocketAddr, path: &str) -> Option<u16> {
    let mut s = std::net::TcpStream::connect(address).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.split(' ').nth(1)?.parse().ok()
}

#[tokio::test]
async fn a_metrics_port_held_by_another_process_neither_stops_edra_nor_keeps_it_off_the_port() {
    let cluster = Cluster::start().await;
    let claim = cluster.allocated_claim("c", "gpu-0");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = taken.local_addr().expect("address");
    let metrics = address.to_string();
    let agent = ChildAgent::start_with_env(&cluster, "", &[("EDRA_METRICS_ADDRESS", metrics.as_str())]).await;
    // It serves the kubelet (start_with_env waited for both sockets and registered) and prepares.
    let mut v1 = agent.v1().await;
    assert_eq!(prepare_ok(&mut v1, &claim).await.len(), 1);
    let said = format!(
        "ERROR edra::telemetry::http: /metrics, /healthz and /readyz are not served: another process holds {address}"
    );
    assert_eq!(agent.stderr().matches(&said).count(), 1, "{}", agent.stderr());
    assert!(agent.stderr().contains("set metrics.address to a free port"), "{}", agent.stderr());
    // Once the port is free, edra binds it and /healthz answers as before.
    drop(taken);
    let deadline = Instant::now() + WAIT;
    while status_of(address, "/healthz") != Some(200) {
        assert!(Instant::now() < deadline, "edra did not bind {address} once free:\n{}", agent.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    agent.terminate().await;
}

#[tokio::test]
async fn directories_others_can_write_are_warned_about_once_each_with_the_chmod() {
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let paths = fs.paths();
    for dir in [&paths.cdi_dynamic_dir, &paths.registry_dir, &paths.state_dir] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).expect("chmod 0777");
    }
    let agent = ChildAgent::start(&cluster, "").await;
    let log = agent.log.clone();
    agent.terminate().await;
    let text = std::fs::read_to_string(log).expect("read the agent's log");
    let warned = |dir: &std::path::Path| {
        text.lines()
            .filter(|l| l.contains(" WARN ") && l.contains("is writable by users other than its owner"))
            .filter(|l| l.contains(&format!("fix: chmod go-w {} ", dir.display())))
            .count()
    };
    assert_eq!(warned(&paths.cdi_dynamic_dir), 1, "{text}");
    assert_eq!(warned(&paths.registry_dir), 1, "{text}");
    // edra gives its state directory mode 0700 before it looks.
    assert_eq!(warned(&paths.state_dir), 0, "{text}");
    let mode = std::fs::metadata(&paths.state_dir).expect("state dir").permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700);
}
