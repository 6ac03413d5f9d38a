//! The command line as a user meets it: exit codes of usage errors, flags a command does
//! not use, list values in `--set`, the no-credentials message, and the one wording of
//! the credential search order.

use std::path::Path;
use std::process::{Command, Output};

use edra::kube::credentials::SEARCH_ORDER;

/// `edra <args>` with an empty environment plus `env`, in `dir`.
fn edra(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edra"))
        .env_clear()
        .env("HOME", dir)
        .envs(env.iter().copied())
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run edra")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn every_usage_error_exits_64_and_help_and_version_exit_0() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases: [(&[&str], &str); 5] = [
        (&["run", "--bogus"], "unexpected argument '--bogus'"),
        (&["--bogus", "inventory"], "unexpected argument '--bogus'"),
        (&["inventory", "--output", "xml"], "invalid value 'xml'"),
        (&["frobnicate"], "unrecognized subcommand 'frobnicate'"),
        (&[], "Usage: edra"),
    ];
    for (args, said) in cases {
        let out = edra(dir.path(), &[], args);
        assert_eq!(out.status.code(), Some(64), "edra {args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(said), "edra {args:?} should say {said:?}: {}", stderr(&out));
    }
    for args in [&["--help"][..], &["run", "--help"], &["--version"], &["help", "doctor"]] {
        let out = edra(dir.path(), &[], args);
        assert_eq!(out.status.code(), Some(0), "edra {args:?}: {}", stderr(&out));
        assert!(!out.stdout.is_empty(), "edra {args:?} prints to stdout");
    }
}

#[test]
fn hook_and_version_refuse_configuration_flags() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases: [(&[&str], &str); 4] = [
        (&["--config", "/nonexistent.toml", "version"], "--config"),
        (&["version", "--set", "kubernetes.qps=fast"], "--set"),
        (&["--log-level", "debug", "hook", "update-ldcache"], "--log-level"),
        (&["hook", "create-symlinks", "--log-format", "json"], "--log-format"),
    ];
    for (args, flag) in cases {
        let out = edra(dir.path(), &[], args);
        assert_eq!(out.status.code(), Some(64), "edra {args:?}: {}", stderr(&out));
        let text = stderr(&out);
        assert!(text.contains("reads no configuration") && text.contains(flag), "edra {args:?}: {text}");
    }
    let out = edra(dir.path(), &[], &["version"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn set_accepts_toml_arrays_for_lists() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = ["inventory", "--backend", "mock", "--node-name", "n1", "-o", "json"];
    let arrays = ["--set", r#"cdi.spec_dirs=["/etc/cdi", "/run/cdi"]"#, "--set", "cdi.dynamic_dir=/run/cdi"];
    let out = edra(dir.path(), &[], &[&arrays[..], &base[..]].concat());
    assert!(out.status.success(), "a TOML array in --set: {}", stderr(&out));
    let env = [("EDRA_CDI_SPEC_DIRS", r#"["/etc/cdi","/run/cdi"]"#), ("EDRA_CDI_DYNAMIC_DIR", "/run/cdi")];
    let out = edra(dir.path(), &env, &base);
    assert!(out.status.success(), "a TOML array in EDRA_*: {}", stderr(&out));
    let comma = ["--set", "cdi.spec_dirs=/etc/cdi,/run/cdi", "--set", "cdi.dynamic_dir=/run/cdi"];
    let out = edra(dir.path(), &[], &[&comma[..], &base[..]].concat());
    assert!(out.status.success(), "comma-separated: {}", stderr(&out));
    // The dynamic directory must still be one of the list, so the value was really read.
    let other = ["--set", r#"cdi.spec_dirs=["/etc/cdi"]"#, "--set", "cdi.dynamic_dir=/run/cdi"];
    let out = edra(dir.path(), &[], &[&other[..], &base[..]].concat());
    assert_eq!(out.status.code(), Some(64));
    assert!(stderr(&out).contains("/run/cdi is not one of cdi.spec_dirs (/etc/cdi)"), "{}", stderr(&out));
    let broken = ["--set", r#"cdi.spec_dirs=["/etc/cdi""#];
    let out = edra(dir.path(), &[], &[&broken[..], &base[..]].concat());
    assert_eq!(out.status.code(), Some(64));
    assert!(stderr(&out).contains("expected a TOML array of strings"), "{}", stderr(&out));
}

#[test]
fn under_the_journal_an_invalid_configuration_is_written_at_error_priority() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().expect("tempdir");
    // edra's stderr is this file; JOURNAL_STREAM names it as systemd does.
    let path = dir.path().join("stderr");
    let file = std::fs::File::create(&path).expect("create the stderr file");
    let meta = file.metadata().expect("stat the stderr file");
    let status = Command::new(env!("CARGO_BIN_EXE_edra"))
        .env_clear()
        .env("HOME", dir.path())
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .current_dir(dir.path())
        .args(["--set", "backend=nope", "run"])
        .stderr(file)
        .status()
        .expect("run edra");
    assert_eq!(status.code(), Some(64));
    let text = std::fs::read_to_string(&path).expect("read the stderr file");
    assert!(text.starts_with("<3>edra: invalid configuration (1 problem):\n<3>  - "), "{text}");
    assert!(text.lines().all(|l| l.starts_with("<3>")), "a line without the error priority:\n{text}");
}

/// `--set` values that leave edra no credentials: every k3s and in-cluster source under
/// `dir`, where nothing is (the state there too).
fn no_credentials(dir: &std::path::Path) -> Vec<String> {
    let absent = |name: &str| dir.join(name).display().to_string();
    vec![
        format!("kubernetes.k3s_kubelet_kubeconfig={}", absent("kubelet.kubeconfig")),
        format!("kubernetes.k3s_server_kubeconfig={}", absent("k3s.yaml")),
        format!("kubernetes.service_account_dir={}", absent("sa")),
        format!("paths.state_dir={}", absent("state")),
    ]
}

#[test]
fn missing_credentials_and_gpus_that_cannot_be_reached_are_both_reported_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let absent = |name: &str| dir.path().join(name).display().to_string();
    let mut sets = no_credentials(dir.path());
    sets.push(format!("nvml.library={}", absent("libnvidia-ml.so.1")));
    let mut args: Vec<&str> = sets.iter().flat_map(|s| ["--set", s.as_str()]).collect();
    args.extend(["run", "--node-name", "n1"]);
    let out = edra(dir.path(), &[], &args);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    let text = stderr(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "edra: invalid configuration (2 problems):", "{text}");
    assert_eq!(lines[1], "  - no usable Kubernetes credentials; tried, in order:", "{text}");
    let devices = lines.iter().find(|l| l.starts_with("  - devices: ")).unwrap_or_else(|| panic!("{text}"));
    assert!(devices.contains("backend = \"auto\" (the default) found no usable NVML"), "{text}");
    assert!(devices.contains(&absent("libnvidia-ml.so.1")), "{text}");
}

#[test]
fn missing_credentials_are_one_problem_with_the_sources_indented_under_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let absent = |name: &str| dir.path().join(name).display().to_string();
    let sets = no_credentials(dir.path());
    let mut args: Vec<&str> = sets.iter().flat_map(|s| ["--set", s.as_str()]).collect();
    args.extend(["run", "--backend", "mock", "--node-name", "n1"]);
    let out = edra(dir.path(), &[], &args);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    let text = stderr(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "edra: invalid configuration (1 problem):", "{text}");
    assert_eq!(lines[1], "  - no usable Kubernetes credentials; tried, in order:", "{text}");
    let tried = [
        "kubernetes.kubeconfig / --kubeconfig: not set".to_string(),
        "KUBECONFIG: not set".to_string(),
        format!("{}/.kube/config: does not exist", dir.path().display()),
        "in-cluster: KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT not set".to_string(),
        format!("k3s kubelet kubeconfig {}: does not exist", absent("kubelet.kubeconfig")),
        format!("k3s server kubeconfig {}: does not exist", absent("k3s.yaml")),
    ];
    for (i, source) in tried.iter().enumerate() {
        assert_eq!(lines[2 + i], format!("      - {source}"), "{text}");
    }
    assert!(lines[8].starts_with("    set kubernetes.kubeconfig (--kubeconfig)"), "{text}");
    assert_eq!(lines.len(), 9, "{text}");
    // `edra doctor` reports the same search, and says what to do once (in its fix).
    let n = args.len() - 5;
    let mut doctor: Vec<&str> = args[..n].to_vec();
    doctor.extend(["doctor", "--backend", "mock", "--node-name", "n1", "-o", "json"]);
    let out = edra(dir.path(), &[], &doctor);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor JSON");
    let checks = report["checks"].as_array().expect("checks");
    let api = checks.iter().find(|c| c["name"] == "api-server").expect("an api-server check");
    let detail = api["detail"].as_str().unwrap_or_default();
    assert!(detail.starts_with("no usable Kubernetes credentials; tried, in order: kubernetes.kubeconfig"), "{detail}");
    assert!(!detail.contains("run in a pod"), "the fix is not repeated in the detail: {detail}");
    assert_eq!(api["fix"].as_str(), Some(edra::kube::credentials::NO_CREDENTIALS_FIX));
    // The documentation quotes what edra prints.
    for doc in ["README.md", "docs/operations.md", "docs/configuration.md"] {
        let body = read(doc);
        assert!(body.contains(lines[1].trim_start_matches("  - ")), "{doc} does not quote {:?}", lines[1]);
    }
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)).expect("read a repository file")
}

/// Whitespace runs, comment markers and backquotes collapsed, so wrapped text compares.
fn words(text: &str) -> String {
    text.replace(['#', '`'], " ").split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn the_credential_search_order_is_stated_one_way_everywhere() {
    let dir = tempfile::tempdir().expect("tempdir");
    let help = edra(dir.path(), &[], &["run", "--help"]);
    let mut places = vec![("edra run --help".to_string(), String::from_utf8_lossy(&help.stdout).into_owned())];
    for doc in ["README.md", "docs/configuration.md", "config/edra.toml"] {
        places.push((doc.to_string(), read(doc)));
    }
    for (place, text) in places {
        assert!(words(&text).contains(&words(SEARCH_ORDER)), "{place} does not say {SEARCH_ORDER:?}");
    }
}
