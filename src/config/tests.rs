use super::*;
use std::io::Write;
use std::path::Path;

fn ctx(file: Option<PathBuf>, env: &[(&str, &str)]) -> LoadContext {
    LoadContext {
        explicit_file: file,
        default_file: PathBuf::from("/nonexistent/default/config.toml"),
        env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        overrides: Overrides::default(),
        hostname: Some("host-a".into()),
    }
}

fn write(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

#[test]
fn defaults_without_file() {
    let cfg = Config::load(&ctx(None, &[])).unwrap();
    assert_eq!(cfg.node_name, "host-a");
    assert_eq!(cfg.driver_name, "gpu.edra.dev");
    assert_eq!(cfg.backend, BackendKind::Auto);
    assert_eq!(cfg.paths.dra_socket("gpu.edra.dev"), Path::new("/var/lib/kubelet/plugins/gpu.edra.dev/dra.sock"));
    assert_eq!(
        cfg.paths.registration_socket("gpu.edra.dev"),
        Path::new("/var/lib/kubelet/plugins_registry/gpu.edra.dev-reg.sock")
    );
    assert_eq!(cfg.paths.cdi_dynamic_dir, Path::new("/var/run/cdi"));
    assert_eq!(cfg.mock.gpus, 2);
    assert_eq!(cfg.mock.memory, 80 << 30);
}

#[test]
fn node_name_order_is_config_then_node_name_then_host() {
    let cfg = Config::load(&ctx(None, &[("NODE_NAME", "from-env")])).unwrap();
    assert_eq!(cfg.node_name, "from-env");
    let cfg = Config::load(&ctx(None, &[("NODE_NAME", "from-env"), ("EDRA_NODE_NAME", "from-key")])).unwrap();
    assert_eq!(cfg.node_name, "from-key");
    let f = write("node_name = \"from-file\"\n");
    let cfg = Config::load(&ctx(Some(f.path().into()), &[("NODE_NAME", "from-env")])).unwrap();
    assert_eq!(cfg.node_name, "from-file");
}

#[test]
fn kubelet_root_moves_derived_dirs_unless_they_are_set() {
    let f = write("[kubelet]\nroot_dir = \"/k\"\nregistry_dir = \"/r\"\n");
    let cfg = Config::load(&ctx(Some(f.path().into()), &[])).unwrap();
    assert_eq!(cfg.paths.plugins_dir, Path::new("/k/plugins"));
    assert_eq!(cfg.paths.registry_dir, Path::new("/r"));
}

#[test]
fn missing_explicit_file_names_the_file() {
    let problems = Config::load(&ctx(Some("/nonexistent/edra.toml".into()), &[])).unwrap_err();
    assert_eq!(problems.len(), 1);
    let msg = problems[0].to_string();
    assert!(msg.contains("/nonexistent/edra.toml") && msg.contains("not found"), "{msg}");
}

#[test]
fn invalid_toml_is_reported_with_position() {
    let f = write("backend = \n");
    let problems = Config::load(&ctx(Some(f.path().into()), &[])).unwrap_err();
    let msg = problems[0].to_string();
    assert!(msg.contains("not valid TOML") && msg.contains("line 1"), "{msg}");
}

#[test]
fn all_problems_at_once() {
    let f = write(
        r#"
driver_name = "NoDomain"
backend = "cuda"
[kubernetes]
qps = 0
burst = 0
request_timeout = "soon"
[paths]
state_dir = "relative/dir"
[cdi]
dynamic_dir = "/run/elsewhere"
[mock]
gpus = 2
mig = [{ gpu = 5, profiles = ["1g.10gb"] }]
"#,
    );
    let problems = Config::load(&ctx(Some(f.path().into()), &[("EDRA_LOG_FORMAT", "xml")])).unwrap_err();
    let text: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
    for needle in [
        "driver_name",
        "backend: expected auto, nvml, mock or tegra",
        "kubernetes.qps",
        "kubernetes.burst",
        "kubernetes.request_timeout",
        "paths.state_dir: \"relative/dir\" is not an absolute path",
        "cdi.dynamic_dir",
        "mock.mig: entry 0: gpu 5 does not exist",
        "EDRA_LOG_FORMAT: log.format: expected text or json",
    ] {
        assert!(text.iter().any(|t| t.contains(needle)), "missing {needle:?} in {text:#?}");
    }
    assert_eq!(text.len(), 9, "{text:#?}");
}

#[test]
fn flags_override_env_and_file() {
    let f = write("backend = \"nvml\"\n");
    let mut c = ctx(Some(f.path().into()), &[("EDRA_BACKEND", "auto")]);
    c.overrides.push("backend", "mock", "--backend");
    let cfg = Config::load(&c).unwrap();
    assert_eq!(cfg.backend, BackendKind::Mock);
}

#[test]
fn mock_mig_from_file_and_env() {
    let f =
        write("[mock]\ngpus = 3\nmemory = \"40Gi\"\n[[mock.mig]]\ngpu = 1\nprofiles = [\"3g.20gb\", \"3g.20gb\"]\n");
    let cfg = Config::load(&ctx(Some(f.path().into()), &[])).unwrap();
    assert_eq!(cfg.mock.memory, 40 << 30);
    assert_eq!(cfg.mock.mig, vec![MockMig { gpu: 1, profiles: vec!["3g.20gb".into(), "3g.20gb".into()] }]);
    let cfg = Config::load(&ctx(None, &[("EDRA_MOCK_MIG", "[{gpu = 0, profiles = [\"1g.10gb\"]}]")])).unwrap();
    assert_eq!(cfg.mock.mig[0].profiles, vec!["1g.10gb".to_string()]);
    let err = Config::load(&ctx(None, &[("EDRA_MOCK_MIG", "[{gpu = 0, profiles = [\"big\"]}]")])).unwrap_err();
    assert!(err[0].to_string().contains("not a MIG profile"), "{}", err[0]);
}

#[test]
fn mock_mig_mode_is_read_and_not_combined_with_mock_mig() {
    let f = write("[mock]\nmig_mode = true\n");
    assert!(Config::load(&ctx(Some(f.path().into()), &[])).unwrap().mock.mig_mode);
    let f = write("[mock]\nmig_mode = true\nmig = [{ gpu = 0, profiles = [\"1g.10gb\"] }]\n");
    let err = Config::load(&ctx(Some(f.path().into()), &[])).unwrap_err();
    assert!(err[0].to_string().contains("cannot be combined with mock.mig_mode"), "{}", err[0]);
}

#[test]
fn runtime_config_paths_default_to_the_usual_files_and_are_overridable() {
    let cfg = Config::load(&ctx(None, &[])).unwrap();
    assert_eq!(cfg.runtime.k3s_containerd_config, Path::new("/var/lib/rancher/k3s/agent/etc/containerd/config.toml"));
    assert_eq!(cfg.runtime.containerd_config, Path::new("/etc/containerd/config.toml"));
    assert_eq!(cfg.runtime.crio_config, Path::new("/etc/crio/crio.conf"));
    assert_eq!(cfg.runtime.crio_config_dir, Path::new("/etc/crio/crio.conf.d"));
    let f = write("[runtime]\ncontainerd_config = \"/x/containerd.toml\"\n");
    let cfg = Config::load(&ctx(Some(f.path().into()), &[("EDRA_RUNTIME_CRIO_CONFIG_DIR", "/y")])).unwrap();
    assert_eq!(cfg.runtime.containerd_config, Path::new("/x/containerd.toml"));
    assert_eq!(cfg.runtime.crio_config_dir, Path::new("/y"));
    let err = Config::load(&ctx(None, &[("EDRA_RUNTIME_CRIO_CONFIG", "relative")])).unwrap_err();
    assert!(err[0].to_string().contains("runtime.crio_config"), "{}", err[0]);
}

#[test]
fn names() {
    assert!(validate_driver_name("gpu.edra.dev").is_ok());
    assert!(validate_driver_name("gpu").is_err());
    assert!(validate_driver_name("GPU.edra.dev").is_err());
    assert!(validate_dns_subdomain("node-1.example").is_ok());
    assert!(validate_dns_subdomain("-node").is_err());
    assert!(validate_dns_label(&"a".repeat(64)).is_err());
    assert!(validate_mig_profile("1c.3g.40gb").is_ok());
    assert!(validate_mig_profile("1g10gb").is_err());
}

#[test]
fn documented_example_is_valid_and_shows_the_defaults() {
    let example = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/edra.toml");
    let from_example = Config::load(&ctx(Some(example.clone()), &[])).unwrap();
    let defaults = Config::load(&ctx(None, &[])).unwrap();
    assert_eq!(from_example.file.as_deref(), Some(example.as_path()));
    // Where `backend` came from is the one difference a file setting the default makes.
    assert!(
        from_example.backend_origin.starts_with(&format!("{}:", example.display())),
        "{}",
        from_example.backend_origin
    );
    assert_eq!(defaults.backend_origin, "the default");
    let origin = defaults.backend_origin.clone();
    assert_eq!(Config { file: None, backend_origin: origin, ..from_example }, defaults);
}

#[test]
fn metrics_address_defaults_to_loopback_and_can_be_disabled() {
    let cfg = Config::load(&ctx(None, &[])).unwrap();
    assert_eq!(cfg.metrics.address, Some("127.0.0.1:9464".parse().unwrap()));
    let cfg = Config::load(&ctx(None, &[("EDRA_METRICS_ADDRESS", "[::1]:9100")])).unwrap();
    assert_eq!(cfg.metrics.address, Some("[::1]:9100".parse().unwrap()));
    let f = write("[metrics]\naddress = \"\"\n");
    let cfg = Config::load(&ctx(Some(f.path().into()), &[])).unwrap();
    assert_eq!(cfg.metrics.address, None);
    let problems = Config::load(&ctx(None, &[("EDRA_METRICS_ADDRESS", "localhost:9464")])).unwrap_err();
    let msg = problems[0].to_string();
    assert!(msg.contains("metrics.address") && msg.contains("not an IP address and port"), "{msg}");
}

#[test]
fn paths_under_a_directory_stay_inside_it_and_keep_the_kubelet_layout() {
    let dir = std::path::Path::new("/srv/sandbox");
    let p = Paths::under(dir);
    let all = [
        &p.kubelet_root,
        &p.plugins_dir,
        &p.registry_dir,
        &p.cdi_dynamic_dir,
        &p.state_dir,
        &p.driver_root,
        &p.dev_root,
        &p.proc_root,
        &p.sys_root,
    ];
    for path in all.into_iter().chain(&p.cdi_spec_dirs) {
        assert!(path.starts_with(dir), "{} is outside {}", path.display(), dir.display());
    }
    assert!(p.plugins_dir.starts_with(&p.kubelet_root) && p.registry_dir.starts_with(&p.kubelet_root));
    assert!(p.cdi_spec_dirs.contains(&p.cdi_dynamic_dir), "the dynamic CDI dir must be one the runtime reads");
    assert_eq!(p.dra_socket("gpu.edra.dev"), dir.join("kubelet/plugins/gpu.edra.dev/dra.sock"));
    assert_eq!(p.host_driver_root, None);
    assert_eq!(p.cdi_hook_binary, None);
}

#[test]
fn a_state_dir_that_is_a_file_is_reported_as_such() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("state");
    std::fs::write(&file, "").unwrap();
    let value = file.display().to_string();
    let problems = Config::load(&ctx(None, &[("EDRA_PATHS_STATE_DIR", value.as_str())])).unwrap_err();
    let msg = problems[0].to_string();
    assert!(msg.contains("exists and is not a directory; set paths.state_dir to a directory"), "{msg}");
    // A directory, or one still to be created, is fine.
    let missing = tmp.path().join("new").display().to_string();
    for ok in [tmp.path().display().to_string(), missing] {
        Config::load(&ctx(None, &[("EDRA_PATHS_STATE_DIR", ok.as_str())])).unwrap();
    }
}

/// The one problem a single `key = value` override causes.
fn problem_of(key: &str, value: &str) -> Option<String> {
    let mut c = ctx(None, &[]);
    c.overrides.push(key, value, format!("--set {key}={value}"));
    match Config::load(&c) {
        Ok(_) => None,
        Err(problems) => {
            assert_eq!(problems.len(), 1, "{key}={value}: {problems:?}");
            assert_eq!(problems[0].key, key);
            Some(problems[0].to_string())
        }
    }
}

#[test]
fn durations_and_rates_out_of_range_name_the_key_and_the_range() {
    let cases = [
        ("kubernetes.request_timeout", "18446744073709551615", "from 1s to 5m"),
        ("kubernetes.request_timeout", "0", "from 1s to 5m"),
        ("kubernetes.request_timeout", "500ms", "from 1s to 5m"),
        ("publish.rediscovery_interval", "18446744073709551615", "from 1s to 24h"),
        ("publish.rediscovery_interval", "25h", "from 1s to 24h"),
        ("plugin.shutdown_grace", "18446744073709551615", "from 0s to 10m"),
        ("plugin.shutdown_grace", "11m", "from 0s to 10m"),
        ("plugin.handover_timeout", "500ms", "from 1s to 2m"),
        ("plugin.handover_timeout", "3m", "from 1s to 2m"),
        ("kubernetes.qps", "1e-300", "from 0.1 to 10000"),
        ("kubernetes.qps", "0", "from 0.1 to 10000"),
        ("kubernetes.qps", "1e9", "from 0.1 to 10000"),
        ("kubernetes.burst", "0", "from 1 to 10000"),
        ("kubernetes.burst", "4294967296", "from 1 to 10000"),
        ("mock.gpus", "4294967296", "from 0 to 64"),
        ("mock.gpus", "65", "from 0 to 64"),
        ("mock.multiprocessors", "4294967296", "from 1 to 10000"),
        ("mock.memory", "0", "from 1Mi to 1024Ti"),
        ("mock.memory", "2000Ti", "from 1Mi to 1024Ti"),
        ("health.probe_interval", "18446744073709551615", "from 100ms to 1h"),
        ("health.probe_interval", "50ms", "from 100ms to 1h"),
        ("health.quiet_period", "0", "from 1s to 24h"),
        ("health.quiet_period", "25h", "from 1s to 24h"),
    ];
    for (key, value, range) in cases {
        let problem = problem_of(key, value).unwrap_or_else(|| panic!("{key} = {value} was accepted"));
        assert!(problem.contains(&format!("--set {key}={value}: {key}: must be {range}")), "{problem}");
    }
    let fine = [
        ("kubernetes.request_timeout", "1s"),
        ("kubernetes.request_timeout", "5m"),
        ("publish.rediscovery_interval", "24h"),
        ("plugin.shutdown_grace", "0"),
        ("plugin.shutdown_grace", "10m"),
        ("plugin.handover_timeout", "1s"),
        ("plugin.handover_timeout", "2m"),
        ("kubernetes.qps", "0.1"),
        ("kubernetes.burst", "1"),
        ("mock.gpus", "0"),
        ("mock.gpus", "64"),
        ("health.probe_interval", "100ms"),
        ("health.quiet_period", "24h"),
    ];
    for (key, value) in fine {
        assert_eq!(problem_of(key, value), None, "{key} = {value}");
    }
}

#[test]
fn a_mock_mig_gpu_index_is_never_wrapped() {
    // 4294967296 as u32 would be 0, an existing GPU.
    let f = write("[mock]\ngpus = 2\nmig = [{ gpu = 4294967296, profiles = [\"1g.10gb\"] }]\n");
    let problems = Config::load(&ctx(Some(f.path().into()), &[])).unwrap_err();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].to_string().contains("gpu must be a GPU index from 0 to 1"), "{}", problems[0]);
}

#[test]
fn ignored_xids_default_to_the_application_errors_and_are_checked() {
    let cfg = Config::load(&ctx(None, &[])).unwrap();
    assert_eq!(cfg.health.ignored_xids.iter().copied().collect::<Vec<_>>(), [13, 31, 43, 45, 68, 109]);
    assert_eq!((cfg.health.probe_interval.as_secs(), cfg.health.quiet_period.as_secs()), (10, 300));
    let f = write("[health]\nignored_xids = [13, 94]\n");
    let cfg = Config::load(&ctx(Some(f.path().into()), &[])).unwrap();
    assert_eq!(cfg.health.ignored_xids.iter().copied().collect::<Vec<_>>(), [13, 94]);
    let cfg = Config::load(&ctx(None, &[("EDRA_HEALTH_IGNORED_XIDS", "43, 45")])).unwrap();
    assert_eq!(cfg.health.ignored_xids.iter().copied().collect::<Vec<_>>(), [43, 45]);
    let empty = Config::load(&ctx(None, &[("EDRA_HEALTH_IGNORED_XIDS", "")])).unwrap();
    assert!(empty.health.ignored_xids.is_empty(), "an empty list ignores nothing");
    for bad in ["[\"x\"]", "[0]", "[70000]"] {
        let f = write(&format!("[health]\nignored_xids = {bad}\n"));
        let problems = Config::load(&ctx(Some(f.path().into()), &[])).unwrap_err();
        assert!(problems[0].to_string().contains("health.ignored_xids"), "{}", problems[0]);
    }
    assert!(
        problem_of("health.ignored_xids", "13,lots")
            .is_some_and(|p| p.contains("\"lots\" is not an XID number from 1 to 65535"))
    );
}

#[test]
fn sharing_defaults_to_shares_of_every_gpu_and_bad_values_name_the_key() {
    use crate::config::settings::{Fallback, GpuSelection, SharingMode};
    let cfg = Config::load(&ctx(None, &[])).unwrap();
    assert_eq!(cfg.sharing, crate::config::settings::SharingSettings::default());
    assert_eq!((cfg.sharing.mode, cfg.sharing.memory_step), (SharingMode::Shares, 1 << 30));
    let f = write(
        "[sharing]\nmode = \"replicas\"\ngpus = [\"gpu-1\", \"GPU-abc\"]\nmemory_step = \"512Mi\"\nreplicas = 8\n\
         fallback = \"replicas\"\n",
    );
    let cfg = Config::load(&ctx(Some(f.path().into()), &[])).unwrap();
    assert_eq!(cfg.sharing.mode, SharingMode::Replicas);
    assert_eq!(cfg.sharing.gpus, GpuSelection::Listed(vec!["gpu-1".into(), "GPU-abc".into()]));
    assert_eq!(
        (cfg.sharing.memory_step, cfg.sharing.replicas, cfg.sharing.fallback),
        (512 << 20, 8, Fallback::Replicas)
    );
    let cases = [
        ("sharing.mode", "split", "expected shares, replicas or exclusive"),
        ("sharing.gpus", "*,gpu-0", "cannot be combined"),
        ("sharing.gpus", "../etc", "neither a GPU device name"),
        ("sharing.memory_step", "1500k", "whole number of MiB"),
        ("sharing.memory_step", "2Ti", "from 1Mi to 1Ti"),
        ("sharing.replicas", "1", "from 2 to 64"),
        ("sharing.replicas", "4294967298", "from 2 to 64"),
        ("sharing.fallback", "none", "expected exclusive or replicas"),
        ("sharing.timeslice", "Fast", "expected Default, Short, Medium or Long"),
    ];
    for (key, value, want) in cases {
        let p = problem_of(key, value).unwrap_or_else(|| panic!("{key}={value} accepted"));
        assert!(p.contains(want), "{key}={value}: {p}");
    }
}

#[test]
fn mig_is_static_unless_gpus_are_selected_for_dynamic_mig() {
    use crate::config::settings::GpuSelection;
    let cfg = Config::load(&ctx(None, &[])).unwrap();
    assert!(!cfg.mig.any(), "static by default");
    let f = write("[mig]\ndynamic = [\"gpu-0\", \"GPU-abc\"]\n");
    let cfg = Config::load(&ctx(Some(f.path().into()), &[])).unwrap();
    assert_eq!(cfg.mig.dynamic, GpuSelection::Listed(vec!["gpu-0".into(), "GPU-abc".into()]));
    let f = write("[mig]\ndynamic = [\"*\"]\n");
    assert_eq!(Config::load(&ctx(Some(f.path().into()), &[])).unwrap().mig.dynamic, GpuSelection::All);
    for (value, want) in [("*,gpu-0", "cannot be combined"), ("gpu-0-mig-1-0", "neither a GPU device name")] {
        let p = problem_of("mig.dynamic", value).unwrap_or_else(|| panic!("mig.dynamic={value} accepted"));
        assert!(p.contains(want), "{value}: {p}");
    }
}

#[test]
fn sharing_enforcement_keeps_timeslice_alone_as_timeslicing_and_refuses_contradictions() {
    use crate::config::settings::Enforcement;
    use crate::device_config::Interval;
    let load = |text: &str| Config::load(&ctx(Some(write(text).path().into()), &[]));
    let enforcement = |text: &str| load(text).unwrap().sharing.enforcement;
    assert_eq!(enforcement(""), Enforcement::None);
    assert_eq!(enforcement("[sharing]\nenforcement = \"none\"\n"), Enforcement::None);
    // A configuration from before `enforcement` keeps its meaning.
    assert_eq!(enforcement("[sharing]\ntimeslice = \"Medium\"\n"), Enforcement::TimeSlicing(Interval::Medium));
    assert_eq!(enforcement("[sharing]\nenforcement = \"timeslicing\"\n"), Enforcement::TimeSlicing(Interval::Default));
    assert_eq!(
        enforcement("[sharing]\nenforcement = \"timeslicing\"\ntimeslice = \"Long\"\n"),
        Enforcement::TimeSlicing(Interval::Long)
    );
    assert_eq!(enforcement("[sharing]\nenforcement = \"mps\"\nmode = \"replicas\"\n"), Enforcement::Mps);
    let cases = [
        ("[sharing]\nenforcement = \"mps\"\ntimeslice = \"Short\"\n", "is \"mps\" but sharing.timeslice is set"),
        ("[sharing]\nenforcement = \"none\"\ntimeslice = \"Short\"\n", "is \"none\" but sharing.timeslice is set"),
        ("[sharing]\nenforcement = \"mps\"\nmode = \"exclusive\"\n", "so no GPU is shared"),
        ("[sharing]\nenforcement = \"MPS\"\n", "expected none, timeslicing or mps, found \"MPS\""),
    ];
    for (text, want) in cases {
        let problems = load(text).unwrap_err();
        assert_eq!(problems.len(), 1, "{text}: {problems:?}");
        let p = problems[0].to_string();
        assert!(p.contains("sharing.enforcement") && p.contains(want), "{text}: {p}");
    }
    // From the environment too.
    let cfg = Config::load(&ctx(None, &[("EDRA_SHARING_ENFORCEMENT", "mps")])).unwrap();
    assert_eq!(cfg.sharing.enforcement, Enforcement::Mps);
}

#[test]
fn log_filters_are_levels_or_target_level_lists_and_others_are_refused() {
    for ok in ["info", "debug", "edra::publish=debug,info", "warn,edra=debug"] {
        assert_eq!(Config::load(&ctx(None, &[("EDRA_LOG_LEVEL", ok)])).unwrap().log_level, ok);
    }
    for (bad, says) in [
        ("", "expected a level"),
        ("edra=loud", "not a valid log filter \"edra=loud\""),
        ("edra=debug=info", "too many '='"),
        ("edra[prepare{claim.uid=x}]=debug", "not a valid log filter"),
    ] {
        let err = Config::load(&ctx(None, &[("EDRA_LOG_LEVEL", bad)])).unwrap_err()[0].to_string();
        assert!(err.contains("log.level") && err.contains(says), "{bad:?}: {err}");
    }
}
