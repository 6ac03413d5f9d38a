use super::*;

#[test]
fn durations() {
    let ok = [("30", 30_000), ("30s", 30_000), ("250ms", 250), ("5m", 300_000), ("1h", 3_600_000), ("1m30s", 90_000)];
    for (s, ms) in ok {
        assert_eq!(parse_duration(s).unwrap(), Duration::from_millis(ms), "{s}");
    }
    for bad in ["", "s", "10x", "1.5s", "-1s", "m5"] {
        assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
    }
}

#[test]
fn sizes() {
    assert_eq!(parse_bytes("80Gi").unwrap(), 80 << 30);
    assert_eq!(parse_bytes("512Mi").unwrap(), 512 << 20);
    assert_eq!(parse_bytes("40G").unwrap(), 40_000_000_000);
    assert_eq!(parse_bytes("123").unwrap(), 123);
    assert!(parse_bytes("12Gb").unwrap_err().contains("Gb"));
    assert!(parse_bytes("99999999999Ti").unwrap_err().contains("too large"));
    assert!(parse_bytes("lots").is_err());
}

#[test]
fn precedence_is_flag_env_file() {
    let table: toml::Table = toml::from_str("[api]\nqps = 5\n").unwrap();
    let mut r = Reader::new()
        .with_toml(Path::new("/etc/edra/config.toml"), table.clone())
        .with_env([("EDRA_API_QPS".to_string(), "7".to_string())]);
    assert_eq!(r.get("api.qps", 1.0, positive_f64), 7.0);
    let mut r = r.with_flag("api.qps", "9".into(), "--set api.qps=9");
    assert_eq!(r.get("api.qps", 1.0, positive_f64), 9.0);
    let mut r = Reader::new().with_toml(Path::new("/x.toml"), table);
    assert_eq!(r.get("api.qps", 1.0, positive_f64), 5.0);
    assert!(r.finish().is_empty());
}

#[test]
fn every_problem_is_reported_with_its_origin() {
    let table: toml::Table = toml::from_str("qps = \"fast\"\nstate_dri = \"/x\"\n").unwrap();
    let mut r = Reader::new()
        .with_toml(Path::new("/etc/edra/config.toml"), table)
        .with_env([("EDRA_BURST".to_string(), "-3".to_string()), ("EDRA_BOGUS".to_string(), "1".to_string())]);
    r.get("qps", 1.0, positive_f64);
    r.get("burst", 1, uint);
    r.get("state_dir", PathBuf::from("/var/lib/edra"), abs_path);
    let problems: Vec<String> = r.finish().iter().map(|p| p.to_string()).collect();
    assert_eq!(problems.len(), 4, "{problems:#?}");
    assert!(problems.iter().any(|p| p.starts_with("/etc/edra/config.toml: qps: expected a number")));
    assert!(problems.iter().any(|p| p.contains("EDRA_BURST") && p.contains("non-negative")));
    assert!(problems.iter().any(|p| p.contains("state_dri: unknown key (did you mean state_dir?)")));
    assert!(problems.iter().any(|p| p.contains("EDRA_BOGUS") && p.contains("not a configuration key")));
}

#[test]
fn problems_with_file_values_name_their_line() {
    let text = "# comment\n\n[kubernetes]\nqps = \"fast\"\nburst = 3\n[cdi]\nspec_dirs = [1]\nbogus = { a = 1 }\n";
    let lines = key_lines(text);
    assert_eq!(lines.get("kubernetes.qps"), Some(&4));
    assert_eq!(lines.get("cdi.spec_dirs"), Some(&7));
    assert_eq!(lines.get("cdi.bogus.a"), Some(&8));
    let path = Path::new("/etc/edra/config.toml");
    let mut r = Reader::new().with_toml(path, toml::from_str(text).unwrap()).with_key_lines(&lines);
    r.get("kubernetes.qps", 1.0, positive_f64);
    r.get("kubernetes.burst", 1, uint);
    r.get("cdi.spec_dirs", Vec::new(), abs_path_list);
    let problems: Vec<String> = r.finish().iter().map(ToString::to_string).collect();
    assert_eq!(
        problems,
        [
            "/etc/edra/config.toml:4: kubernetes.qps: expected a number, found string",
            "/etc/edra/config.toml:7: cdi.spec_dirs: expected a list of strings, found an element of type integer",
            "/etc/edra/config.toml:8: cdi.bogus.a: unknown key",
        ]
    );
    assert!(key_lines("[unclosed").is_empty());
}

#[test]
fn text_lists_are_toml_arrays_or_comma_separated() {
    let list = |s: &str| abs_path_list(&Raw::Text(s.into()));
    let want = vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")];
    assert_eq!(list("[\"/etc/cdi\", \"/var/run/cdi\"]").unwrap(), want);
    assert_eq!(list(" ['/etc/cdi','/var/run/cdi'] ").unwrap(), want);
    assert_eq!(list("/etc/cdi, /var/run/cdi").unwrap(), want);
    assert_eq!(list("[]").unwrap(), Vec::<PathBuf>::new());
    let unclosed = list("[\"/etc/cdi\"").unwrap_err();
    assert!(unclosed.contains("TOML array of strings") && unclosed.contains("comma-separated"), "{unclosed}");
    let numbers = list("[1, 2]").unwrap_err();
    assert!(numbers.contains("element of type integer"), "{numbers}");
    assert!(list("[\"relative\"]").unwrap_err().contains("not an absolute path"));
}

#[test]
fn text_values_parse_as_toml_for_structured_keys() {
    let v = toml_value(&Raw::Text("[{ gpu = 0, profiles = [\"1g.10gb\"] }]".into())).unwrap();
    assert!(v.is_array());
    assert!(toml_value(&Raw::Text("[unclosed".into())).is_err());
}
