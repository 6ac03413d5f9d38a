//! A full disk under the state directory, on a real (small) tmpfs: the kubelet is only
//! told what the disk says. Prepares fail while the disk is full, the retry of a claim
//! whose record reached memory but not the disk is not answered from memory, `/healthz`,
//! `/readyz` and the metrics say why, and once space is freed edra re-opens its state by
//! itself and serves again; a claim prepared before the disk filled survives it all and a
//! restart.
//! Mounting needs root: without it the test says so and skips (CI runs as root).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::agent::{ChildAgent, Cluster, prepare, prepare_ok, unprepare_ok};

/// A tmpfs mounted for the test's lifetime.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).expect("create the mount point");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(at)
            .status()
            .ok()?;
        status.success().then(|| Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Writes `path` until the filesystem is full.
fn fill(path: &Path) {
    let mut f = std::fs::File::create(path).expect("create the filler");
    let chunk = vec![0xa5u8; 64 * 1024];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// `GET path` on the metrics port: (status code, body).
fn get(port: u16, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to the metrics port");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").expect("write");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read the answer");
    let code = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (code, body)
}

#[tokio::test]
async fn a_full_state_disk_never_lies_to_the_kubelet() {
    if !nix_is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let cluster = Cluster::start().await;
    let fs = cluster.fs();
    let Some(_tmpfs) = Tmpfs::mount(&fs.state_dir(), "2m") else {
        eprintln!("skipped: mount -t tmpfs is not permitted here");
        return;
    };
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    let env = [("EDRA_METRICS_ADDRESS", metrics.as_str())];
    let mut agent = ChildAgent::start_with_env(&cluster, "", &env).await;
    let mut v1 = agent.v1().await;
    let kept = cluster.allocated_claim("kept", "gpu-0");
    let kept_ids = prepare_ok(&mut v1, &kept).await;
    assert_eq!(get(port, "/healthz").0, 200);

    // Fill the disk. sled writes into the log segment it has already allocated, so claims
    // still prepare for a while (durably: those writes need no new space); go on with
    // prepare/unprepare cycles until a durability step fails.
    let filler = fs.state_dir().join("filler");
    fill(&filler);
    let mut failed = None;
    for i in 0..5000 {
        let victim = cluster.allocated_claim(&format!("victim-{i}"), "gpu-1");
        let answer = prepare(&mut v1, std::slice::from_ref(&victim)).await.expect("answer");
        if !answer[&victim.uid].error.is_empty() {
            let error = answer[&victim.uid].error.clone();
            failed = Some((victim, "prepare", error));
            break;
        }
        let answer = crate::support::agent::unprepare(&mut v1, std::slice::from_ref(&victim)).await.expect("answer");
        if !answer[&victim.uid].is_empty() {
            let error = answer[&victim.uid].clone();
            failed = Some((victim, "unprepare", error));
            break;
        }
    }
    let (victim, call, error) = failed.expect("a full disk makes a durability step fail");
    assert!(error.contains("cannot make edra's state durable"), "{call}: {error}");
    assert!(error.contains("No space left on device") && !error.contains("Os {"), "plain words: {error}");
    // The retry of that call, and every other claim, get an error that says why: nothing
    // is answered from memory.
    let again = prepare(&mut v1, &[victim.clone(), kept.clone()]).await.expect("answer");
    for c in [&victim, &kept] {
        let e = &again[&c.uid].error;
        assert!(e.contains("could not be made durable") && e.contains("free space"), "{}: {e}", c.name);
    }
    let refused = crate::support::agent::unprepare(&mut v1, std::slice::from_ref(&kept)).await.expect("answer");
    assert_ne!(refused[&kept.uid], "", "no unprepare either");
    assert!(fs.spec_file(&kept.uid).exists(), "a refused unprepare removes nothing");
    let (code, body) = get(port, "/healthz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("state store unusable") && body.contains("No space left on device"), "{body}");
    assert_eq!(get(port, "/readyz").0, 503);
    let (code, body) = get(port, "/metrics");
    assert!(code == 200 && body.contains("\nedra_state_store_usable 0\n"), "{code}: {body}");

    // Space is freed: edra re-opens its state by itself (backoff from 1 s).
    std::fs::remove_file(&filler).expect("free the space");
    let start = Instant::now();
    while get(port, "/healthz").0 != 200 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "edra did not re-open its state: {:?}",
            get(port, "/healthz")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(get(port, "/metrics").1.contains("\nedra_state_store_usable 1\n"));
    assert_eq!(prepare_ok(&mut v1, &kept).await, kept_ids, "the claim prepared before the disk filled is kept");
    prepare_ok(&mut v1, &victim).await;
    unprepare_ok(&mut v1, &victim).await;
    assert_eq!(fs.spec_files(), [fs.spec_file(&kept.uid)], "nothing else is left");

    // After kill -9 and a restart the kept claim is still prepared, answered from disk.
    agent.kill().await;
    let restarted = ChildAgent::start_with_env(&cluster, "", &env).await;
    let mut v1 = restarted.v1().await;
    let mark = cluster.server.request_mark();
    assert_eq!(prepare_ok(&mut v1, &kept).await, kept_ids);
    let claim_reads = cluster.server.requests()[mark..]
        .iter()
        .filter(|r| r.verb == "get" && r.path.contains("/resourceclaims/"))
        .count();
    assert_eq!(claim_reads, 0, "answered from the state on disk");
    assert!(fs.spec_file(&kept.uid).exists());
    unprepare_ok(&mut v1, &kept).await;
    restarted.terminate().await;
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
