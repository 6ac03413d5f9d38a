//! Reading every key of the configuration, section by section, into a [`Config`]: each
//! key's default and its check, in the order the keys are read (which is the order their
//! problems are reported in).

use std::path::PathBuf;
use std::time::Duration;

use super::source::{self, Raw, Reader, abs_path, abs_path_list, boolean, string};
use super::{
    BackendKind, Config, DEFAULT_DRIVER_NAME, DEFAULT_METRICS_ADDRESS, HealthConfig, KubeSettings, LogFormat,
    MetricsSettings, MpsTimings, NvmlSettings, Paths, RuntimeConfigPaths, bounds, mock, settings, sharing,
    validate_dns_subdomain, validate_driver_name,
};

impl Config {
    /// Reads every key from `r` (problems go to `r`); `file` is the file read, if any;
    /// `node_env` (`NODE_NAME`) and `host` (the host name) are the fallbacks of `node_name`.
    pub(super) fn read(
        r: &mut Reader,
        file: Option<PathBuf>,
        node_env: Option<String>,
        host: Option<String>,
    ) -> Config {
        let node_name = read_node_name(r, node_env, host);
        let driver_name = r.get("driver_name", DEFAULT_DRIVER_NAME.to_string(), |raw| {
            let s = string(raw)?;
            validate_driver_name(&s).map(|_| s)
        });
        let backend = r.get("backend", BackendKind::Auto, BackendKind::parse);
        let backend_origin = r.origin_of("backend").map_or_else(|| "the default".to_string(), |o| o.to_string());
        let (log_format, log_level) = read_log(r);

        let kube = read_kube(r);

        let paths = read_paths(r);
        let nvml = read_nvml(r);
        let runtime = read_runtime(r);
        let rediscovery_interval = r.get(
            "publish.rediscovery_interval",
            Duration::from_secs(60),
            bounds::duration_in(bounds::REDISCOVERY_INTERVAL),
        );
        let shutdown_grace =
            r.get("plugin.shutdown_grace", Duration::from_secs(10), bounds::duration_in(bounds::SHUTDOWN_GRACE));
        let handover_timeout =
            r.get("plugin.handover_timeout", Duration::from_secs(10), bounds::duration_in(bounds::HANDOVER_TIMEOUT));
        let metrics = MetricsSettings {
            address: r.get("metrics.address", DEFAULT_METRICS_ADDRESS.parse().ok(), metrics_address),
        };
        let mock = mock::read_mock(r);
        let mps = read_mps(r);
        let sharing = sharing::read_sharing(r);
        let mig = settings::MigSettings {
            dynamic: r.get("mig.dynamic", settings::MigSettings::default().dynamic, sharing::selection),
        };
        let health = read_health(r);
        let claims = read_claims(r);
        let prefetch_claims = r.get("claims.prefetch", true, boolean);
        let prepare_early = r.get("claims.prepare_early", true, boolean);
        Config {
            file,
            node_name,
            driver_name,
            backend,
            backend_origin,
            log_format,
            log_level,
            kube,
            paths,
            nvml,
            runtime,
            rediscovery_interval,
            shutdown_grace,
            handover_timeout,
            take_over: r.get("plugin.take_over", false, boolean),
            metrics,
            mock,
            mps,
            sharing,
            mig,
            health,
            claims,
            prefetch_claims,
            prepare_early,
        }
    }
}

/// `node_name`: the key, else `NODE_NAME` (`node_env`), else the host name; a DNS subdomain.
fn read_node_name(r: &mut Reader, node_env: Option<String>, host: Option<String>) -> String {
    let node_name = match r.opt("node_name", string) {
        Some(n) => n,
        None => node_env.filter(|n| !n.is_empty()).or(host).unwrap_or_default(),
    };
    if node_name.is_empty() {
        r.problem("node_name", None, "no node name: set node_name, NODE_NAME or a host name");
    } else if let Err(e) = validate_dns_subdomain(&node_name) {
        let origin = r.origin_of("node_name");
        r.problem("node_name", origin, format!("{node_name:?} is not a valid node name: {e}"));
    }
    node_name
}

/// `[log]`: the format and the level filter.
fn read_log(r: &mut Reader) -> (LogFormat, String) {
    let log_format = r.get("log.format", LogFormat::Text, |raw| match string(raw)?.as_str() {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        other => Err(format!("expected text or json, found {other:?}")),
    });
    let log_level = r.get("log.level", "info".to_string(), |raw| {
        let s = string(raw)?;
        if s.trim().is_empty() {
            return Err("expected a level (error, warn, info, debug, trace) or a list of target=level".into());
        }
        s.parse::<tracing_subscriber::filter::Targets>()
            .map(|_| s.clone())
            .map_err(|e| format!("not a valid log filter {s:?}: {e} (expected e.g. info or edra::publish=debug,info)"))
    });
    (log_format, log_level)
}

/// `[nvml]`: the NVML library to load.
fn read_nvml(r: &mut Reader) -> NvmlSettings {
    NvmlSettings {
        library: r.get("nvml.library", "libnvidia-ml.so.1".into(), |raw| {
            let s = string(raw)?;
            if s.is_empty() { Err("expected a library name or path".into()) } else { Ok(PathBuf::from(s)) }
        }),
    }
}

/// `[runtime]`: the container runtimes' configuration files `edra doctor` reads.
fn read_runtime(r: &mut Reader) -> RuntimeConfigPaths {
    RuntimeConfigPaths {
        k3s_containerd_config: r.get(
            "runtime.k3s_containerd_config",
            "/var/lib/rancher/k3s/agent/etc/containerd/config.toml".into(),
            abs_path,
        ),
        containerd_config: r.get("runtime.containerd_config", "/etc/containerd/config.toml".into(), abs_path),
        crio_config: r.get("runtime.crio_config", "/etc/crio/crio.conf".into(), abs_path),
        crio_config_dir: r.get("runtime.crio_config_dir", "/etc/crio/crio.conf.d".into(), abs_path),
    }
}

/// `[mps]`: the MPS control daemons' timings.
fn read_mps(r: &mut Reader) -> MpsTimings {
    MpsTimings {
        ready_timeout: r.get(
            "mps.ready_timeout",
            Duration::from_secs(10),
            bounds::duration_in(bounds::MPS_READY_TIMEOUT),
        ),
        quit_grace: r.get("mps.quit_grace", Duration::from_secs(5), bounds::duration_in(bounds::MPS_QUIT_GRACE)),
        check_interval: r.get(
            "mps.check_interval",
            Duration::from_secs(5),
            bounds::duration_in(bounds::MPS_CHECK_INTERVAL),
        ),
    }
}

/// `[health]`: the XIDs ignored, the probe's period and the quiet period before a taint goes.
fn read_health(r: &mut Reader) -> HealthConfig {
    HealthConfig {
        ignored_xids: r.get("health.ignored_xids", settings::DEFAULT_IGNORED_XIDS.into_iter().collect(), xid_list),
        probe_interval: r.get(
            "health.probe_interval",
            Duration::from_secs(10),
            bounds::duration_in(bounds::HEALTH_PROBE_INTERVAL),
        ),
        quiet_period: r.get(
            "health.quiet_period",
            Duration::from_secs(300),
            bounds::duration_in(bounds::HEALTH_QUIET_PERIOD),
        ),
    }
}

/// `claims.check_interval` and `claims.release_after`: the stale-claim check.
fn read_claims(r: &mut Reader) -> settings::StaleSettings {
    let stale = settings::StaleSettings::default();
    settings::StaleSettings {
        check_interval: r.get(
            "claims.check_interval",
            stale.check_interval,
            bounds::duration_in(bounds::CLAIMS_CHECK_INTERVAL),
        ),
        release_after: r.get(
            "claims.release_after",
            stale.release_after,
            bounds::duration_in(bounds::CLAIMS_RELEASE_AFTER),
        ),
    }
}

/// `metrics.address`: an IP address and port, or `""` for no endpoint.
fn metrics_address(raw: &Raw) -> Result<Option<std::net::SocketAddr>, String> {
    let s = string(raw)?;
    if s.is_empty() {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|_| {
        format!("{s:?} is not an IP address and port such as \"127.0.0.1:9464\" or \"[::1]:9464\"; use \"\" to disable")
    })
}

/// `health.ignored_xids`: a list of XID numbers (a TOML array, or comma-separated text).
fn xid_list(raw: &Raw) -> Result<std::collections::BTreeSet<u64>, String> {
    let items: Vec<String> = match raw {
        Raw::Toml(toml::Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                toml::Value::Integer(i) => Ok(i.to_string()),
                other => Err(format!("expected a list of XID numbers, found an element of type {}", other.type_str())),
            })
            .collect::<Result<_, _>>()?,
        Raw::Text(_) => source::string_list(raw)?,
        Raw::Toml(other) => {
            return Err(format!("expected a list of XID numbers such as [13, 31], found {}", other.type_str()));
        }
    };
    let (min, max) = bounds::XID;
    items
        .iter()
        .map(|s| match s.trim().parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(format!("{s:?} is not an XID number from {min} to {max}")),
        })
        .collect()
}

/// `paths.state_dir`: an absolute path that is a directory or does not exist yet (then edra
/// creates it), so a file there is reported here rather than as "File exists" at start.
fn state_dir(raw: &Raw) -> Result<PathBuf, String> {
    let dir = abs_path(raw)?;
    match std::fs::metadata(&dir) {
        Ok(m) if !m.is_dir() => Err(format!(
            "{} exists and is not a directory; set paths.state_dir to a directory (edra creates it when missing)",
            dir.display()
        )),
        _ => Ok(dir),
    }
}

/// `[kubernetes]`: credentials and the client's limits.
fn read_kube(r: &mut Reader) -> KubeSettings {
    KubeSettings {
        kubeconfig: r.opt("kubernetes.kubeconfig", |raw| {
            let s = string(raw)?;
            if s.is_empty() { Err("expected a path, found an empty string".into()) } else { Ok(PathBuf::from(s)) }
        }),
        context: r.opt("kubernetes.context", string),
        qps: r.get("kubernetes.qps", 100.0, bounds::f64_in(bounds::QPS)),
        burst: r.get("kubernetes.burst", 200, bounds::u32_in(bounds::BURST)),
        request_timeout: r.get(
            "kubernetes.request_timeout",
            Duration::from_secs(30),
            bounds::duration_in(bounds::REQUEST_TIMEOUT),
        ),
        insecure_skip_tls_verify: r.get("kubernetes.insecure_skip_tls_verify", false, boolean),
        k3s_kubelet_kubeconfig: r.get(
            "kubernetes.k3s_kubelet_kubeconfig",
            "/var/lib/rancher/k3s/agent/kubelet.kubeconfig".into(),
            abs_path,
        ),
        k3s_server_kubeconfig: r.get("kubernetes.k3s_server_kubeconfig", "/etc/rancher/k3s/k3s.yaml".into(), abs_path),
        service_account_dir: r.get(
            "kubernetes.service_account_dir",
            "/var/run/secrets/kubernetes.io/serviceaccount".into(),
            abs_path,
        ),
    }
}

/// `[kubelet]`, `[cdi]` and `[paths]`: where edra finds and puts everything on the node;
/// the dynamic CDI directory must be one the runtime reads.
fn read_paths(r: &mut Reader) -> Paths {
    let kubelet_root: PathBuf = r.get("kubelet.root_dir", "/var/lib/kubelet".into(), abs_path);
    let plugins_dir = r.get("kubelet.plugins_dir", kubelet_root.join("plugins"), abs_path);
    let registry_dir = r.get("kubelet.registry_dir", kubelet_root.join("plugins_registry"), abs_path);
    let cdi_spec_dirs: Vec<PathBuf> =
        r.get("cdi.spec_dirs", vec!["/etc/cdi".into(), "/var/run/cdi".into()], abs_path_list);
    let cdi_dynamic_dir: PathBuf = r.get("cdi.dynamic_dir", "/var/run/cdi".into(), abs_path);
    if !cdi_spec_dirs.iter().any(|d| d == &cdi_dynamic_dir) {
        let origin = r.origin_of("cdi.dynamic_dir");
        r.problem(
            "cdi.dynamic_dir",
            origin,
            format!(
                "{} is not one of cdi.spec_dirs ({}); the container runtime would not see edra's specs",
                cdi_dynamic_dir.display(),
                cdi_spec_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
            ),
        );
    }
    Paths {
        kubelet_root,
        plugins_dir,
        registry_dir,
        cdi_spec_dirs,
        cdi_dynamic_dir,
        cdi_hook_binary: r.opt("cdi.hook_binary", abs_path),
        state_dir: r.get("paths.state_dir", "/var/lib/edra".into(), state_dir),
        driver_root: r.get("paths.driver_root", "/".into(), abs_path),
        host_driver_root: r.opt("paths.host_driver_root", abs_path),
        nvidia_smi: r.opt("paths.nvidia_smi", abs_path),
        mps_control: r.opt("paths.mps_control", abs_path),
        runtime_dir: r.get("paths.runtime_dir", "/run/edra".into(), abs_path),
        dev_root: r.get("paths.dev_root", "/dev".into(), abs_path),
        proc_root: r.get("paths.proc_root", "/proc".into(), abs_path),
        sys_root: r.get("paths.sys_root", "/sys".into(), abs_path),
    }
}
