//! The systemd unit and the package metadata agree with edra's configuration defaults:
//! the unit lets edra write every directory the default configuration writes to, waits
//! longer than the shutdown grace period, and both packages install the configuration
//! file where edra reads it, as a kept configuration file.

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
