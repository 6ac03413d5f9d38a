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
        "handover",
        "hook",
        "node_lock",
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
        "node_lock",
        "inventory",
        "kube",
        "malloc",
        "dynamic_mig",
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

/// The top-level modules of src/ and, for each, the others its production code names
/// (`crate::<module>` outside comments and test code).
fn module_graph() -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    use std::collections::{BTreeMap, BTreeSet};
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut modules = BTreeSet::new();
    for entry in std::fs::read_dir(&src).expect("read src").flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        match name.strip_suffix(".rs") {
            Some(m) if !m.ends_with("_tests") && m != "lib" && m != "main" => modules.insert(m.to_string()),
            Some(_) => false,
            None => entry.path().is_dir() && modules.insert(name),
        };
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = modules.iter().map(|m| (m.clone(), BTreeSet::new())).collect();
    for module in &modules {
        let mut files = Vec::new();
        let single = src.join(format!("{module}.rs"));
        if single.exists() {
            files.push(single);
        }
        if src.join(module).is_dir() {
            sources(&src.join(module), &mut files);
        }
        for file in files {
            let name = file.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
            if name.contains("test") || file.components().any(|c| c.as_os_str() == "tests") {
                continue;
            }
            let text = std::fs::read_to_string(&file).expect("read a source file");
            for line in production_lines(&text) {
                for (at, _) in line.match_indices("crate::") {
                    let rest = &line[at + "crate::".len()..];
                    let name: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
                    if modules.contains(&name) && name != *module {
                        graph.get_mut(module).expect("a module").insert(name);
                    }
                }
            }
        }
    }
    graph
}

/// The lines of `text` that are code of the production build: no comments, no inline
/// `#[cfg(test)] mod … { … }` block (a `#[cfg(test)] mod tests;` line is skipped alone).
fn production_lines(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("//") {
            continue;
        }
        if trimmed.starts_with("#[cfg(test)]") {
            let Some(next) = lines.next() else { break };
            if next.trim_end().ends_with('{') {
                let mut depth: i64 = 1;
                for inner in lines.by_ref() {
                    depth += inner.matches('{').count() as i64 - inner.matches('}').count() as i64;
                    if depth <= 0 {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(line);
    }
    out
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let graph = module_graph();
    println!("module graph (production imports):");
    for (module, imports) in &graph {
        println!("  {module} -> {}", imports.iter().cloned().collect::<Vec<_>>().join(", "));
    }
    if let Some(cycle) = find_cycle(&graph) {
        panic!("an import cycle between top-level modules: {}", cycle.join(" -> "));
    }
}

type Graph = std::collections::BTreeMap<String, std::collections::BTreeSet<String>>;

/// A cycle in `graph`, found by a depth-first search for a back edge, as the path it closes.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit<'a>(
        m: &'a str,
        graph: &'a Graph,
        path: &mut Vec<&'a str>,
        done: &mut std::collections::BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| *p == m) {
            let mut cycle: Vec<String> = path[at..].iter().map(|s| s.to_string()).collect();
            cycle.push(m.to_string());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m);
        for next in graph.get(m).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m);
        None
    }
    let mut done = std::collections::BTreeSet::new();
    graph.keys().find_map(|m| visit(m, graph, &mut Vec::new(), &mut done))
}

/// The files (child modules) of top-level module `top` and, for each, its siblings its
/// production code names: `crate::<top>::<sibling>`, `super::<sibling>` from a child's own
/// file, `super::super::<sibling>` from a file below it (a `use super::{…}` list counts
/// each name in it). The parent (`mod.rs`) is left out: parent and child name each other
/// by design.
fn submodule_graph(top: &str) -> Graph {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(top);
    let mut children = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(&dir).expect("read a module directory").flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let child = name.strip_suffix(".rs").map(str::to_string).unwrap_or(name);
        if child != "mod" && child != "tests" {
            children.insert(child);
        }
    }
    let mut graph: Graph = children.iter().map(|c| (c.clone(), Default::default())).collect();
    let mut files = Vec::new();
    sources(&dir, &mut files);
    for file in files {
        let rel: Vec<String> = file
            .strip_prefix(&dir)
            .expect("under the module")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        if rel[0] == "mod" || rel.iter().any(|c| c == "tests") {
            continue;
        }
        let child = rel[0].clone();
        // The prefix that names a sibling from this file.
        let up = match (rel.len(), rel.last().map(String::as_str)) {
            (1, _) | (2, Some("mod")) => "super::",
            _ => "super::super::",
        };
        let text = std::fs::read_to_string(&file).expect("read a source file");
        let code = production_lines(&text).join("\n");
        let mut named = Vec::new();
        for prefix in [format!("crate::{top}::"), up.to_string()] {
            for (at, _) in code.match_indices(&prefix) {
                let rest = &code[at + prefix.len()..];
                if let Some(list) = rest.strip_prefix('{') {
                    let list = &list[..list.find('}').unwrap_or(list.len())];
                    named.extend(list.split(',').map(|n| n.trim().split("::").next().unwrap_or("").to_string()));
                } else {
                    named.push(rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect());
                }
            }
        }
        for name in named {
            if children.contains(&name) && name != child {
                graph.get_mut(&child).expect("a child").insert(name);
            }
        }
    }
    graph
}

#[test]
fn no_import_cycle_between_the_files_of_a_module() {
    // The reader sees the edges there are (one of each kind of path).
    let prepare = submodule_graph("prepare");
    assert!(prepare["cdi_validate"].contains("cdi"), "{prepare:?}");
    assert!(prepare["claim"].contains("plan"), "{prepare:?}");
    assert!(submodule_graph("state")["holdings"].contains("record"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut cycles = Vec::new();
    for entry in std::fs::read_dir(&src).expect("read src").flatten() {
        let top = entry.file_name().to_string_lossy().to_string();
        if !entry.path().is_dir() || top == "test_support" {
            continue;
        }
        let graph = submodule_graph(&top);
        if let Some(cycle) = find_cycle(&graph) {
            cycles.push(format!("{top}: {}", cycle.join(" -> ")));
        }
    }
    assert!(cycles.is_empty(), "import cycles between the files of a module:\n{}", cycles.join("\n"));
}
