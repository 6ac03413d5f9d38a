//! The systemd unit and the package metadata agree with edra's configuration defaults:
//! the unit lets edra write every directory the default configuration writes to, waits
//! longer than the shutdown grace period, and both packages install the configuration
//! file where edra reads it, as a kept configuration file; the maintainer scripts delete
//! edra's lock files at the default configuration's paths on purge (deb) and erase (rpm).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use edra::config::{Config, DEFAULT_CONFIG_PATH, LoadContext, Overrides};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `[Service]` settings of the unit: key → every value given (some keys repeat).
fn unit_service_settings() -> BTreeMap<String, Vec<String>> {
    let text = std::fs::read_to_string(repo("packaging/edra.service")).expect("read unit");
    let mut section = String::new();
    let mut out = BTreeMap::<String, Vec<String>>::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        let (k, v) = line.split_once('=').unwrap_or_else(|| panic!("unit line without '=': {line}"));
        out.entry(format!("{section}{k}")).or_default().push(v.to_string());
    }
    out
}

fn default_config() -> Config {
    let dir = tempfile::tempdir().expect("temp dir");
    let ctx = LoadContext {
        explicit_file: None,
        default_file: dir.path().join("absent.toml"),
        env: Vec::new(),
        overrides: Overrides::default(),
        hostname: Some("node-1".into()),
    };
    Config::load(&ctx).expect("defaults are valid")
}

/// Seconds of a systemd time span such as `30s`, `5min` or `90`.
fn seconds(span: &str) -> u64 {
    let digits: String = span.chars().take_while(char::is_ascii_digit).collect();
    let n: u64 = digits.parse().unwrap_or_else(|_| panic!("time span {span:?}"));
    match &span[digits.len()..] {
        "" | "s" => n,
        "min" => n * 60,
        other => panic!("unit {other:?} in {span:?}"),
    }
}

/// `/var/run` is a link to `/run`; the unit names the real path.
fn real(path: &Path) -> PathBuf {
    match path.strip_prefix("/var/run") {
        Ok(rest) => Path::new("/run").join(rest),
        Err(_) => path.to_path_buf(),
    }
}

#[test]
fn unit_opens_every_directory_edra_writes_by_default() {
    let unit = unit_service_settings();
    let cfg = default_config();
    let one = |k: &str| unit.get(&format!("[Service]{k}")).and_then(|v| v.last()).cloned().unwrap_or_default();
    assert_eq!(one("Type"), "notify");
    assert_eq!(one("NotifyAccess"), "main");
    assert_eq!(one("ExecStart"), "/usr/bin/edra run");
    assert_eq!(one("ProtectSystem"), "strict", "the sandbox this test reasons about");
    let state = Path::new("/var/lib").join(one("StateDirectory"));
    assert_eq!(state, cfg.paths.state_dir, "StateDirectory= must be paths.state_dir");
    let writable: Vec<PathBuf> = unit
        .get("[Service]ReadWritePaths")
        .into_iter()
        .flatten()
        .flat_map(|v| v.split_whitespace())
        .map(|p| PathBuf::from(p.trim_start_matches('-')))
        .collect();
    for dir in [&cfg.paths.plugins_dir, &cfg.paths.registry_dir, &cfg.paths.cdi_dynamic_dir] {
        let dir = real(dir);
        assert!(writable.iter().any(|w| dir.starts_with(w)), "{} is not in ReadWritePaths={writable:?}", dir.display());
    }
    let tmpfile = std::fs::read_to_string(repo("packaging/edra.tmpfile")).expect("read tmpfile");
    let cdi = real(&cfg.paths.cdi_dynamic_dir);
    assert!(
        tmpfile.lines().any(|l| l.split_whitespace().take(2).eq(["d", cdi.to_str().unwrap_or("")])),
        "the tmpfiles entry must create {}",
        cdi.display()
    );
    let stop = seconds(&one("TimeoutStopSec"));
    assert!(
        stop > cfg.shutdown_grace.as_secs() + 5,
        "TimeoutStopSec={stop}s leaves no room after plugin.shutdown_grace={:?}",
        cfg.shutdown_grace
    );
    let watchdog = seconds(&one("WatchdogSec"));
    assert!(watchdog >= 10, "a watchdog under 10 s would fire during ordinary pauses");
    assert_eq!(one("RestartPreventExitStatus"), "64", "an invalid configuration must not restart forever");
    let devices = unit.get("[Service]DeviceAllow").cloned().unwrap_or_default();
    assert!(devices.iter().any(|d| d.starts_with("char-nvidia")), "the NVIDIA devices must stay reachable");
    assert!(!unit.contains_key("[Service]PrivateDevices"), "PrivateDevices= would hide /dev/nvidia*");
}

#[test]
fn packages_install_the_configuration_where_edra_reads_it() {
    let manifest: toml::Table =
        std::fs::read_to_string(repo("Cargo.toml")).expect("read Cargo.toml").parse().expect("Cargo.toml is TOML");
    let metadata = &manifest["package"]["metadata"];
    let deb = &metadata["deb"];
    let rel = DEFAULT_CONFIG_PATH.trim_start_matches('/');
    let deb_assets = deb["assets"].as_array().expect("deb assets");
    let dest_of = |source: &str| {
        deb_assets.iter().filter_map(|a| a.as_array()).find(|a| a[0].as_str() == Some(source)).map(|a| a[1].clone())
    };
    assert_eq!(dest_of("config/edra.toml").and_then(|d| d.as_str().map(str::to_string)), Some(rel.to_string()));
    assert_eq!(dest_of("target/release/edra").and_then(|d| d.as_str().map(str::to_string)), Some("usr/bin/".into()));
    let conf_files: Vec<&str> =
        deb["conf-files"].as_array().expect("conf-files").iter().filter_map(|v| v.as_str()).collect();
    assert!(conf_files.contains(&DEFAULT_CONFIG_PATH), "deb conffiles {conf_files:?}");
    let units = &deb["systemd-units"];
    assert_eq!((units["enable"].as_bool(), units["start"].as_bool()), (Some(false), Some(false)));

    let rpm_assets = metadata["generate-rpm"]["assets"].as_array().expect("rpm assets");
    let config = rpm_assets
        .iter()
        .find(|a| a["source"].as_str() == Some("config/edra.toml"))
        .expect("rpm ships config/edra.toml");
    assert_eq!(config["dest"].as_str(), Some(DEFAULT_CONFIG_PATH));
    assert_eq!(config["config"].as_str(), Some("noreplace"));
    let unit = rpm_assets.iter().find(|a| a["source"].as_str() == Some("packaging/edra.service")).expect("rpm unit");
    assert_eq!(unit["dest"].as_str(), Some("/usr/lib/systemd/system/edra.service"));
}

#[test]
fn package_checks_tell_a_missing_file_from_wrong_usage() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for kind in ["deb", "rpm"] {
        let script = root.join(format!("packaging/check-{kind}.sh"));
        let run = |args: &[&str]| std::process::Command::new("bash").arg(&script).args(args).output().expect("run");
        let usage = run(&[]);
        assert_eq!(usage.status.code(), Some(64), "{kind}");
        assert!(String::from_utf8_lossy(&usage.stderr).starts_with("usage:"), "{kind}");
        let missing = run(&["/nonexistent/edra.pkg"]);
        assert_eq!(missing.status.code(), Some(66), "{kind}");
        let said = String::from_utf8_lossy(&missing.stderr);
        assert!(said.contains("/nonexistent/edra.pkg: file not found"), "{kind}: {said}");
    }
}

/// The agent's lock files at the default configuration's paths (`edra run` takes them),
/// as paths relative to `/`: the kubelet plugin one and the CDI one.
fn default_lock_files() -> Vec<PathBuf> {
    let config = default_config();
    let paths = edra::node_lock::lock_paths(
        &config.paths.plugin_dir(&config.driver_name),
        &config.paths.cdi_dynamic_dir,
        &edra::prepare::cdi::vendor(&config.driver_name),
    );
    paths.iter().map(|p| real(p).strip_prefix("/").expect("absolute").to_path_buf()).collect()
}

/// Every file and folder under `root`, relative to it, sorted.
fn tree(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let path = entry.expect("entry").path();
            out.push(path.strip_prefix(root).expect("under root").display().to_string());
            if path.is_dir() {
                todo.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Lays out a removed node's leftovers under `root`: edra's lock files, its state, and
/// files that are not edra's beside them (another driver's lock, a spec, `others` in
/// edra's plugin folder).
fn leftovers(root: &Path, others: &[&str]) {
    let locks = default_lock_files();
    for lock in &locks {
        let at = root.join(lock);
        std::fs::create_dir_all(at.parent().expect("a folder")).expect("folder");
        std::fs::write(&at, b"4242\n").expect("lock file");
    }
    let cdi = root.join(locks[1].parent().expect("the CDI folder"));
    std::fs::write(cdi.join(".k8s.other.dev.lock"), b"").expect("another driver's lock");
    std::fs::write(cdi.join("other.json"), b"{}").expect("another spec");
    for other in others {
        std::fs::write(root.join(locks[0].parent().expect("plugin folder")).join(other), b"").expect("other file");
    }
    std::fs::create_dir_all(root.join("var/lib/edra/db")).expect("state");
}

#[test]
fn apt_purge_removes_edras_lock_files_and_its_empty_plugin_folder_only() {
    let postrm = repo("packaging/debian/postrm");
    let purge = |root: &Path, action: &str| {
        let out =
            std::process::Command::new("sh").arg(&postrm).arg(action).env("DPKG_ROOT", root).output().expect("sh");
        assert!(out.status.success(), "postrm {action}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let removed = tempfile::tempdir().expect("temp dir");
    leftovers(removed.path(), &[]);
    let before = tree(removed.path());
    purge(removed.path(), "remove");
    assert_eq!(tree(removed.path()), before, "remove keeps the lock files and the state");
    purge(removed.path(), "purge");
    let left = tree(removed.path());
    assert_eq!(
        left,
        [
            "run",
            "run/cdi",
            "run/cdi/.k8s.other.dev.lock",
            "run/cdi/other.json",
            "var",
            "var/lib",
            "var/lib/kubelet",
            "var/lib/kubelet/plugins"
        ],
        "only edra's lock files, its empty plugin folder and its state are gone"
    );
    let shared = tempfile::tempdir().expect("temp dir");
    leftovers(shared.path(), &["dra.sock.other"]);
    purge(shared.path(), "purge");
    let left = tree(shared.path());
    assert!(left.contains(&"var/lib/kubelet/plugins/gpu.edra.dev/dra.sock.other".to_string()), "{left:?}");
    assert!(!left.iter().any(|p| p.ends_with(".k8s.gpu.edra.dev.lock") || p.ends_with("edra.lock")), "{left:?}");
}

/// rpm's `%postun` has fixed paths and no root to point elsewhere: it runs as root in a
/// mount namespace of its own with fresh tmpfs on `/var/lib` and `/run`.
#[test]
fn rpm_erase_removes_edras_lock_files_and_keeps_the_state() {
    let unshare = Path::new("/usr/bin/unshare");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !unshare.exists() {
        eprintln!("skipped: running rpm's %postun on /var/lib and /run needs root and unshare (a mount namespace)");
        return;
    }
    let setup = tempfile::tempdir().expect("temp dir");
    leftovers(setup.path(), &[]);
    let run = |arg: &str| {
        let inner = r#"set -e
mount -t tmpfs edra-test /var/lib && mount -t tmpfs edra-test /run
cp -a "$1/var/lib/." /var/lib/ && cp -a "$1/run/." /run/
sh "$2" "$3" >&2
find /var/lib /run | sort"#;
        let out = std::process::Command::new(unshare)
            .args(["--mount", "--propagation", "private", "sh", "-c", inner, "sh"])
            .arg(setup.path())
            .arg(repo("packaging/rpm/post_uninstall.sh"))
            .arg(arg)
            .output()
            .expect("unshare");
        assert!(out.status.success(), "%postun {arg}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect::<Vec<_>>()
    };
    let upgraded = run("1");
    for lock in default_lock_files() {
        let at = format!("/{}", lock.display());
        assert!(upgraded.contains(&at), "an upgrade keeps {at}: {upgraded:?}");
    }
    let erased = run("0");
    assert_eq!(
        erased,
        [
            "/run",
            "/run/cdi",
            "/run/cdi/.k8s.other.dev.lock",
            "/run/cdi/other.json",
            "/var/lib",
            "/var/lib/edra",
            "/var/lib/edra/db",
            "/var/lib/kubelet",
            "/var/lib/kubelet/plugins"
        ],
        "erase removes only edra's lock files and its empty plugin folder; the state stays"
    );
}
