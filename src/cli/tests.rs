use super::*;
use std::path::Path;

#[test]
fn set_flags_become_overrides() {
    let cli = Cli::try_parse_from(["edra", "run", "--backend", "mock", "--set", "kubernetes.qps=5", "--set", "oops"])
        .unwrap();
    let mut o = Overrides::default();
    let err = cli.global.overrides(&mut o).unwrap_err();
    assert!(err[0].contains("oops") && err[0].contains("KEY=VALUE"));
    assert!(o.values.iter().any(|(k, v, _)| k == "kubernetes.qps" && v == "5"));
    if let Command::Run(args) = &cli.command {
        args.overrides(&mut o);
    }
    assert!(o.values.iter().any(|(k, v, f)| k == "backend" && v == "mock" && f == "--backend"));
}

#[test]
fn global_options_go_anywhere() {
    let cli = Cli::try_parse_from(["edra", "run", "--config", "/x.toml", "--log-format", "json"]).unwrap();
    assert_eq!(cli.global.config.as_deref(), Some(std::path::Path::new("/x.toml")));
    assert!(matches!(cli.global.log_format, Some(LogFormatArg::Json)));
}

#[test]
fn doctor_takes_the_run_options_and_an_output_format() {
    let cli = Cli::try_parse_from([
        "edra",
        "doctor",
        "--backend",
        "mock",
        "--kubeconfig",
        "/k",
        "--state-dir",
        "/s",
        "-o",
        "json",
    ])
    .unwrap();
    let Command::Doctor(args) = &cli.command else { panic!("expected the doctor command") };
    assert_eq!(args.output, Some(DoctorOutputArg::Json));
    let mut o = Overrides::default();
    args.run.overrides(&mut o);
    for (key, value) in [("backend", "mock"), ("kubernetes.kubeconfig", "/k"), ("paths.state_dir", "/s")] {
        assert!(o.values.iter().any(|(k, v, _)| k == key && v == value), "{key}: {:?}", o.values);
    }
}

#[test]
fn hook_update_ldcache_parses_folders() {
    let cli = Cli::try_parse_from([
        "edra",
        "hook",
        "update-ldcache",
        "--folder",
        "/usr/lib64",
        "--folder",
        "/usr/lib",
        "--ldconfig",
        "/x",
    ])
    .unwrap();
    let Command::Hook(HookArgs { command: HookCommand::UpdateLdcache(a) }) = cli.command else {
        panic!("expected the hook command")
    };
    assert_eq!(a.folders, [PathBuf::from("/usr/lib64"), PathBuf::from("/usr/lib")]);
    assert_eq!(a.ldconfig, Some(PathBuf::from("/x")));
}

#[test]
fn hook_create_symlinks_and_device_params_parse() {
    let cli = Cli::try_parse_from(["edra", "hook", "create-symlinks", "--link", "a.so.1::/l/a.so", "--link", "b::/c"])
        .unwrap();
    let Command::Hook(HookArgs { command: HookCommand::CreateSymlinks(a) }) = &cli.command else {
        panic!("expected create-symlinks")
    };
    assert_eq!(a.links, ["a.so.1::/l/a.so", "b::/c"]);
    let cli = Cli::try_parse_from(["edra", "hook", "disable-device-node-modification"]).unwrap();
    let Command::Hook(HookArgs { command: c @ HookCommand::DisableDeviceNodeModification(a) }) = &cli.command else {
        panic!("expected disable-device-node-modification")
    };
    assert_eq!((c.name(), a.proc_root.as_path()), ("disable-device-node-modification", Path::new("/proc")));
}
