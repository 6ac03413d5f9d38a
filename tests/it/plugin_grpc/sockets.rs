//! Socket files and shutdown: stale sockets replaced, foreign files kept, modes,
//! removal on exit, in-flight calls drained within the grace period.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use edra::plugin::proto::dra_v1 as v1;
use edra::plugin::{PluginError, PluginServer};
use tonic::Code;

use super::{DRIVER, Dirs, TestHandler, claim, exists};
use crate::support::inotify::CreatedNames;
use crate::support::kubelet::{self, RawH2};

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn prepare_one(n: usize) -> v1::NodePrepareResourcesRequest {
    let c = claim(n);
    v1::NodePrepareResourcesRequest { claims: vec![v1::Claim { namespace: c.namespace, uid: c.uid, name: c.name }] }
}

#[tokio::test]
async fn stale_sockets_of_our_names_are_replaced() {
    let dirs = Dirs::new();
    std::fs::create_dir_all(dirs.paths.plugin_dir(DRIVER)).unwrap();
    std::fs::create_dir_all(&dirs.paths.registry_dir).unwrap();
    // Sockets left behind by a killed process: bound, then the listener is gone.
    drop(std::os::unix::net::UnixListener::bind(dirs.dra_socket()).unwrap());
    drop(std::os::unix::net::UnixListener::bind(dirs.registration_socket()).unwrap());
    let server = dirs.start(TestHandler::new());
    let answer = kubelet::dra_v1(&dirs.dra_socket()).await.node_prepare_resources(prepare_one(1)).await.unwrap();
    assert_eq!(answer.into_inner().claims.len(), 1);
    kubelet::registration(&dirs.registration_socket()).await.get_info(v1_info()).await.unwrap();
    server.shutdown(Duration::from_secs(5)).await;
}

fn v1_info() -> edra::plugin::proto::registration::InfoRequest {
    edra::plugin::proto::registration::InfoRequest {}
}

#[tokio::test]
async fn a_foreign_file_at_a_socket_path_is_left_alone() {
    let dirs = Dirs::new();
    std::fs::create_dir_all(&dirs.paths.registry_dir).unwrap();
    std::fs::write(dirs.registration_socket(), b"not ours").unwrap();
    let err = PluginServer::start(&dirs.paths, DRIVER, TestHandler::new()).unwrap_err();
    assert!(matches!(err, PluginError::NotASocket { ref path } if *path == dirs.registration_socket()), "{err:?}");
    assert!(err.to_string().contains("not a socket"), "{err}");
    assert_eq!(std::fs::read(dirs.registration_socket()).unwrap(), b"not ours");
    assert!(!exists(&dirs.dra_socket()), "the DRA socket of the failed start is cleaned up");

    let dirs = Dirs::new();
    std::fs::create_dir_all(dirs.dra_socket()).unwrap();
    let err = PluginServer::start(&dirs.paths, DRIVER, TestHandler::new()).unwrap_err();
    assert!(matches!(err, PluginError::NotASocket { .. }), "{err:?}");
    assert!(dirs.dra_socket().is_dir());
    assert!(!exists(&dirs.registration_socket()));
}

#[tokio::test]
async fn sockets_are_private_and_the_plugin_dir_is_not_world_accessible() {
    let dirs = Dirs::new();
    let server = dirs.start(TestHandler::new());
    assert_eq!(mode(&dirs.dra_socket()), 0o600);
    assert_eq!(mode(&dirs.registration_socket()), 0o600);
    assert_eq!(mode(&dirs.paths.plugin_dir(DRIVER)), 0o750);
    assert_eq!(mode(&dirs.paths.registry_dir) & 0o007, 0);
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn the_kubelets_registry_directory_sees_no_name_but_the_final_socket() {
    let dirs = Dirs::new();
    std::fs::create_dir_all(&dirs.paths.registry_dir).unwrap();
    let created = CreatedNames::watch(&dirs.paths.registry_dir);
    let server = dirs.start(TestHandler::new());
    kubelet::registration(&dirs.registration_socket()).await.get_info(v1_info()).await.unwrap();
    assert_eq!(created.take(), [format!("{DRIVER}-reg.sock")]);
    assert_eq!(mode(&dirs.registration_socket()), 0o600);
    server.shutdown(Duration::from_secs(5)).await;
}

/// A directory bind-mounted over itself, as systemd's `ReadWritePaths=` and a pod's
/// hostPath volume make it; unmounted when dropped.
struct OwnMount(std::path::PathBuf);

impl OwnMount {
    fn bind(dir: &std::path::Path) -> Result<OwnMount, String> {
        let out = std::process::Command::new("mount").arg("--bind").arg(dir).arg(dir).output();
        match out {
            Ok(o) if o.status.success() => Ok(OwnMount(dir.to_path_buf())),
            Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl Drop for OwnMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[tokio::test]
async fn a_registry_directory_on_another_mount_gets_the_socket_bound_in_place_and_private() {
    let dirs = Dirs::new();
    std::fs::create_dir_all(&dirs.paths.registry_dir).unwrap();
    let _mount = match OwnMount::bind(&dirs.paths.registry_dir) {
        Ok(m) => m,
        Err(why) => {
            eprintln!("skipped: cannot bind-mount the registry directory over itself (needs root): {why}");
            return;
        }
    };
    let created = CreatedNames::watch(&dirs.paths.registry_dir);
    let server = dirs.start(TestHandler::new());
    kubelet::registration(&dirs.registration_socket()).await.get_info(v1_info()).await.unwrap();
    assert_eq!(created.take(), [format!("{DRIVER}-reg.sock")]);
    assert_eq!(mode(&dirs.registration_socket()) & 0o077, 0, "private from the start");
    let staged = dirs.paths.plugin_dir(DRIVER).join(format!(".{DRIVER}-reg.sock~"));
    assert!(!exists(&staged), "the staged socket that could not be moved is removed");
    server.shutdown(Duration::from_secs(5)).await;
    assert!(!exists(&dirs.registration_socket()));
}

#[tokio::test]
async fn sockets_are_removed_on_shutdown_and_on_drop() {
    let dirs = Dirs::new();
    let server = dirs.start(TestHandler::new());
    // An idle kubelet connection does not hold up the shutdown.
    let _client = kubelet::dra_v1(&dirs.dra_socket()).await;
    let started = Instant::now();
    server.shutdown(Duration::from_secs(30)).await;
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert!(!exists(&dirs.dra_socket()));
    assert!(!exists(&dirs.registration_socket()));
    assert!(dirs.paths.plugin_dir(DRIVER).is_dir());

    let server = dirs.start(TestHandler::new());
    drop(server);
    assert!(!exists(&dirs.dra_socket()));
    assert!(!exists(&dirs.registration_socket()));
}

#[tokio::test]
async fn a_socket_replaced_by_another_instance_is_not_removed() {
    let dirs = Dirs::new();
    let server = dirs.start(TestHandler::new());
    std::fs::remove_file(dirs.registration_socket()).unwrap();
    let other = std::os::unix::net::UnixListener::bind(dirs.registration_socket()).unwrap();
    server.shutdown(Duration::from_secs(5)).await;
    assert!(exists(&dirs.registration_socket()), "the other instance's socket stays");
    assert!(!exists(&dirs.dra_socket()));
    drop(other);
}

#[tokio::test]
async fn graceful_shutdown_lets_an_in_flight_call_finish() {
    let dirs = Dirs::new();
    let handler = TestHandler::gated();
    let server = dirs.start(handler.clone());
    let mut client = kubelet::dra_v1(&dirs.dra_socket()).await;
    let entered = handler.entered.notified();
    let call = tokio::spawn(async move { client.node_prepare_resources(prepare_one(1)).await });
    entered.await;
    let shutdown = tokio::spawn(server.shutdown(Duration::from_secs(30)));
    // Wait until the server stopped accepting: new connections are refused.
    while tokio::net::UnixStream::connect(dirs.registration_socket()).await.is_ok() {
        tokio::task::yield_now().await;
    }
    assert!(!call.is_finished());
    handler.release();
    let answer = call.await.unwrap().unwrap().into_inner();
    assert_eq!(answer.claims["uid-1"].error, "");
    assert_eq!(shutdown.await.unwrap(), 0, "nothing aborted");
    assert!(!exists(&dirs.dra_socket()));
}

#[tokio::test]
async fn calls_still_running_after_the_grace_period_are_aborted() {
    let dirs = Dirs::new();
    let handler = TestHandler::gated();
    let server = dirs.start(handler.clone());
    let mut client = kubelet::dra_v1(&dirs.dra_socket()).await;
    let entered = handler.entered.notified();
    let call = tokio::spawn(async move { client.node_prepare_resources(prepare_one(1)).await });
    entered.await;
    let started = Instant::now();
    let aborted = server.shutdown(Duration::from_millis(200)).await;
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert_eq!(aborted, 1, "the one running call is reported aborted");
    let status = call.await.unwrap().unwrap_err();
    assert!(matches!(status.code(), Code::Unavailable | Code::Cancelled | Code::Unknown), "{status:?}");
    assert!(!exists(&dirs.dra_socket()));
    assert!(!exists(&dirs.registration_socket()));
}

#[tokio::test]
async fn connections_left_open_are_closed_after_the_grace_period() {
    let dirs = Dirs::new();
    let server = dirs.start(TestHandler::new());
    // This client never answers the server's shutdown PING, so the connection stays open.
    let mut raw = RawH2::connect(&dirs.registration_socket()).await.unwrap();
    raw.get_info(&kubelet::percent_encoded(&dirs.registration_socket())).await.unwrap();
    let started = Instant::now();
    server.shutdown(Duration::from_millis(200)).await;
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    tokio::time::timeout(Duration::from_secs(5), raw.wait_closed()).await.expect("the server closed the connection");
    assert!(!exists(&dirs.registration_socket()));
}

#[tokio::test]
async fn unusable_driver_names_and_socket_paths_are_refused() {
    let dirs = Dirs::new();
    let err = PluginServer::start(&dirs.paths, "../escape", TestHandler::new()).unwrap_err();
    assert!(matches!(err, PluginError::InvalidDriverName { .. }), "{err:?}");
    assert!(!dirs.paths.plugins_dir.exists(), "nothing is created for a bad name");

    let mut paths = dirs.paths.clone();
    paths.plugins_dir = dirs.tmp.path().join("p".repeat(100));
    let err = PluginServer::start(&paths, DRIVER, TestHandler::new()).unwrap_err();
    assert!(matches!(err, PluginError::SocketPathTooLong { max: 107, .. }), "{err:?}");
    assert!(err.to_string().contains("longer than 107 bytes"), "{err}");
}
