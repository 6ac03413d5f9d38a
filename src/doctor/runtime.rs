//! Check 5: does the container runtime have CDI enabled, and does it read edra's CDI
//! directory? Reads k3s's generated containerd configuration, the host containerd's and
//! CRI-O's (main file plus drop-ins), all as TOML.
//!
//! containerd: config `version = 3` is containerd 2.x (plugin
//! `io.containerd.cri.v1.runtime`, CDI on by default); `version = 2` is read by containerd
//! 1.7 (CDI off by default) and 2.x alike (plugin `io.containerd.grpc.v1.cri`), so without
//! an explicit `enable_cdi` the file cannot tell; no `version` is the legacy version 1
//! (plugin `cri`). k3s writes version 3 exactly when it bundles containerd 2.x (k3s
//! v1.32.2 and later) and version 2 with containerd 1.7, so for k3s the version decides.
//! CRI-O always has CDI on; `cdi_spec_dirs` in `[crio.runtime]` may move its directories.
//! Unset `cdi_spec_dirs` means `/etc/cdi` and `/var/run/cdi` everywhere.

use std::path::{Path, PathBuf};

use super::{CheckResult, Status};
use crate::config::RuntimeConfigPaths;

const NAME: &str = "container-runtime";
const DEFAULT_CDI_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// What one runtime configuration says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// e.g. `k3s containerd (/var/lib/rancher/k3s/agent/etc/containerd/config.toml)`.
    pub source: String,
    pub status: Status,
    pub detail: String,
    pub fix: String,
}

/// Which containerd configuration a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Containerd {
    /// The file k3s generates for its bundled containerd.
    K3s,
    /// A containerd installed on the host.
    Host,
}

/// `/var/run/x` and `/run/x` are the same directory on every current distribution.
fn same_dir(a: &Path, b: &Path) -> bool {
    let norm = |p: &Path| -> PathBuf {
        let p = p.components().collect::<PathBuf>();
        match p.strip_prefix("/var/run") {
            Ok(rest) => Path::new("/run").join(rest),
            Err(_) => p,
        }
    };
    norm(a) == norm(b)
}

fn string_list(v: Option<&toml::Value>) -> Option<Vec<String>> {
    v?.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
}

/// Whether the runtime's CDI directories (explicit or default) include `dynamic_dir`.
fn dirs_problem(dirs: Option<&[String]>, dynamic_dir: &Path, key: &str) -> Option<(String, String)> {
    let effective: Vec<String> = match dirs {
        Some(d) => d.to_vec(),
        None => DEFAULT_CDI_DIRS.iter().map(|s| s.to_string()).collect(),
    };
    if effective.iter().any(|d| same_dir(Path::new(d), dynamic_dir)) {
        return None;
    }
    let what =
        if dirs.is_some() { format!("{key} = {effective:?}") } else { format!("default CDI dirs {effective:?}") };
    Some((
        format!("{what} do not include edra's {}", dynamic_dir.display()),
        format!("add {} to {key}, or set cdi.dynamic_dir to one of the runtime's directories", dynamic_dir.display()),
    ))
}

/// What a containerd configuration file says about CDI; `None` when the file is absent.
pub fn containerd(path: &Path, kind: Containerd, dynamic_dir: &Path) -> Option<Finding> {
    let text = std::fs::read_to_string(path).ok()?;
    let who = match kind {
        Containerd::K3s => "k3s containerd",
        Containerd::Host => "containerd",
    };
    let source = format!("{who} ({})", path.display());
    let finding =
        |status, detail: String, fix: &str| Finding { source: source.clone(), status, detail, fix: fix.into() };
    let table: toml::Table = match toml::from_str(&text) {
        Ok(t) => t,
        Err(e) => {
            let first = e.to_string().lines().next().unwrap_or_default().to_string();
            return Some(finding(
                Status::Fail,
                format!("not valid TOML: {first}"),
                "fix the file; containerd cannot start with it",
            ));
        }
    };
    let version = table.get("version").and_then(toml::Value::as_integer).unwrap_or(1);
    let plugin = match version {
        3 => "io.containerd.cri.v1.runtime",
        2 => "io.containerd.grpc.v1.cri",
        _ => "cri",
    };
    let cri = table.get("plugins").and_then(|p| p.get(plugin));
    let enable = cri.and_then(|c| c.get("enable_cdi")).and_then(toml::Value::as_bool);
    let dirs = string_list(cri.and_then(|c| c.get("cdi_spec_dirs")));
    let key = format!("[plugins.\"{plugin}\"] cdi_spec_dirs");
    let set_it = format!("set enable_cdi = true under [plugins.\"{plugin}\"] and restart containerd");
    let k3s_fix = "upgrade k3s to v1.32.2 or later (containerd 2.x, CDI on); or put enable_cdi = true in a \
                   config.toml.tmpl next to the generated file and restart k3s";
    let (status, mut detail, fix) = match (enable, version, kind) {
        (Some(false), _, Containerd::K3s) => {
            (Status::Fail, format!("version {version} config sets enable_cdi = false"), k3s_fix.to_string())
        }
        (Some(false), ..) => (Status::Fail, format!("version {version} config sets enable_cdi = false"), set_it),
        (Some(true), ..) => (Status::Pass, format!("version {version} config sets enable_cdi = true"), String::new()),
        (None, 3, _) => {
            (Status::Pass, "version 3 config (containerd 2.x): CDI on by default".to_string(), String::new())
        }
        (None, _, Containerd::K3s) => (
            Status::Fail,
            format!("version {version} config: k3s bundles containerd 1.7 here, which has CDI off"),
            k3s_fix.to_string(),
        ),
        (None, ..) => (
            Status::Warn,
            format!(
                "version {version} config without enable_cdi: CDI is off on containerd 1.7 and on with 2.x; \
                 the file does not tell which is installed"
            ),
            format!("{set_it} to be sure"),
        ),
    };
    if status != Status::Fail
        && let Some((d, f)) = dirs_problem(dirs.as_deref(), dynamic_dir, &key)
    {
        return Some(finding(Status::Fail, format!("{detail}; {d}"), &f));
    }
    if let Some(d) = &dirs {
        detail.push_str(&format!("; cdi_spec_dirs = {d:?}"));
    }
    Some(finding(status, detail, &fix))
}

/// What CRI-O's configuration (main file, then drop-ins in name order) says; `None` when
/// neither exists.
pub fn crio(main: &Path, drop_in_dir: &Path, dynamic_dir: &Path) -> Option<Finding> {
    let mut files: Vec<PathBuf> = Vec::new();
    if main.is_file() {
        files.push(main.to_path_buf());
    }
    if let Ok(entries) = std::fs::read_dir(drop_in_dir) {
        let mut drop_ins: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "conf"))
            .collect();
        drop_ins.sort();
        files.extend(drop_ins);
    }
    if files.is_empty() {
        return None;
    }
    let source = format!("CRI-O ({})", files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", "));
    let mut dirs: Option<Vec<String>> = None;
    for f in &files {
        let parsed = std::fs::read_to_string(f).map_err(|e| e.to_string()).and_then(|t| {
            toml::from_str::<toml::Table>(&t).map_err(|e| e.to_string().lines().next().unwrap_or_default().to_string())
        });
        let table = match parsed {
            Ok(t) => t,
            Err(e) => {
                return Some(Finding {
                    source,
                    status: Status::Fail,
                    detail: format!("{}: {e}", f.display()),
                    fix: "fix the file; CRI-O cannot start with it".into(),
                });
            }
        };
        if let Some(d) =
            string_list(table.get("crio").and_then(|c| c.get("runtime")).and_then(|r| r.get("cdi_spec_dirs")))
        {
            dirs = Some(d);
        }
    }
    let key = "[crio.runtime] cdi_spec_dirs";
    if let Some((d, f)) = dirs_problem(dirs.as_deref(), dynamic_dir, key) {
        return Some(Finding {
            source,
            status: Status::Fail,
            detail: format!("CDI is always on in CRI-O; {d}"),
            fix: f,
        });
    }
    let detail = match &dirs {
        Some(d) => format!("CDI is always on in CRI-O; cdi_spec_dirs = {d:?}"),
        None => "CDI is always on in CRI-O (default directories)".to_string(),
    };
    Some(Finding { source, status: Status::Pass, detail, fix: String::new() })
}

/// Check 5: every runtime configuration found; k3s's decides when present (k3s's kubelet
/// uses its own containerd), otherwise the worst finding does.
pub fn container_runtime(rt: &RuntimeConfigPaths, dynamic_dir: &Path) -> CheckResult {
    let k3s = containerd(&rt.k3s_containerd_config, Containerd::K3s, dynamic_dir);
    let host = containerd(&rt.containerd_config, Containerd::Host, dynamic_dir);
    let crio = crio(&rt.crio_config, &rt.crio_config_dir, dynamic_dir);
    let all: Vec<&Finding> = [&k3s, &host, &crio].into_iter().flatten().collect();
    let deciding = match &k3s {
        Some(k) => Some(k),
        None => all.iter().copied().max_by_key(|f| f.status),
    };
    let Some(deciding) = deciding else {
        return CheckResult::new(
            NAME,
            Status::Warn,
            format!(
                "no container runtime configuration found (looked at {}, {}, {} and {})",
                rt.k3s_containerd_config.display(),
                rt.containerd_config.display(),
                rt.crio_config.display(),
                rt.crio_config_dir.display()
            ),
            "point runtime.* at your runtime's configuration, and make sure it has CDI enabled",
        );
    };
    let detail = all.iter().map(|f| format!("{}: {}", f.source, f.detail)).collect::<Vec<_>>().join("; ");
    CheckResult::new(NAME, deciding.status, detail, deciding.fix.clone())
}

#[cfg(test)]
mod tests;
