//! The module layering of the library, checked on its source: imports point down. `app`
//! wires the rest and nothing below it names it; `state` and `prepare` do not import each
//! other both ways (prepare uses state); the API client knows nothing of claims, slices'
//! publishing or the kubelet; the leaves (`util`, `device_config`, `failpoint`) import
//! nothing of edra.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read a source directory").flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Lines of `module` (`src/<module>.rs` and everything under `src/<module>/`) that name any
/// of `forbidden` (`crate::<name>`; an empty name stands for every module), with their place.
fn offenders(module: &str, forbidden: &[&str]) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let single = src.join(format!("{module}.rs"));
    if single.exists() {
        files.push(single);
    }
    if src.join(module).is_dir() {
        sources(&src.join(module), &mut files);
    }
    assert!(!files.is_empty(), "no sources for module {module}");
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read a source file");
        for (n, line) in text.lines().enumerate() {
            for name in forbidden {
                let import = format!("crate::{name}");
                let hit = name.is_empty() && line.contains(&import)
                    || line.match_indices(&import).any(|(at, _)| {
                        let next = line[at + import.len()..].chars().next();
                        !next.is_some_and(|c| c.is_alphanumeric() || c == '_')
                    });
                if hit {
                    found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
    }
    found
}

#[test]
fn nothing_below_app_imports_it() {
    let below = [
        "cli",
        "config",
        "device_config",
        "doctor",
        "hook",
        "instance",
        "inventory",
        "kube",
        "malloc",
        "plugin",
        "prepare",
        "publish",
        "state",
        "telemetry",
        "util",
    ];
    let found: Vec<String> = below.iter().flat_map(|m| offenders(m, &["app"])).collect();
    assert!(found.is_empty(), "modules below app import it:\n{}", found.join("\n"));
}

#[test]
fn state_does_not_import_prepare() {
    let found = offenders("state", &["prepare", "plugin", "publish", "kube"]);
    assert!(found.is_empty(), "state imports layers above it:\n{}", found.join("\n"));
}

#[test]
fn the_api_client_knows_no_claims_preparation_or_kubelet() {
    let found = offenders("kube", &["prepare", "state", "plugin", "publish", "inventory"]);
    assert!(found.is_empty(), "kube imports layers above it:\n{}", found.join("\n"));
}

#[test]
fn leaves_import_nothing_of_edra() {
    let mut found = offenders("util", &[""]);
    found.extend(offenders("device_config", &[""]));
    found.extend(offenders("failpoint", &[""]));
    assert!(found.is_empty(), "leaf modules import edra:\n{}", found.join("\n"));
}

#[test]
fn config_is_plain_data_at_the_bottom() {
    // The settings types live in config; the logic that reads them in the rooms that use
    // them. config may name only the leaves.
    let domain = [
        "app",
        "cli",
        "dirmode",
        "doctor",
        "failpoint",
        "fuzzing",
        "gpu",
        "health",
        "hook",
        "instance",
        "inventory",
        "kube",
        "malloc",
        "mig",
        "plugin",
        "prepare",
        "publish",
        "selftest",
        "sharing",
        "state",
        "status",
        "telemetry",
    ];
    let found = offenders("config", &domain);
    assert!(found.is_empty(), "config imports a domain module:\n{}", found.join("\n"));
}
