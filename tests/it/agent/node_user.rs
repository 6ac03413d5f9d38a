//! What a user of the node without privileges can do to `edra run`: directories edra uses
//! that others can write are named at WARN with their fix, once each; a metrics port bound
//! first keeps edra neither from the kubelet nor from the port once it is free.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use crate::support::agent::{ChildAgent, Cluster, WAIT, prepare_ok};

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
