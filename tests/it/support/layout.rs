//! Node layouts written into configuration files: a [`Paths`] (usually built with
//! `Paths::under` a temp dir) as the `[kubelet]`, `[cdi]` and `[paths]` tables edra reads.

use std::path::Path;

use edra::config::Paths;

/// `path` as a TOML string (quoted and escaped).
pub fn toml_path(path: &Path) -> String {
    toml::Value::String(path.display().to_string()).to_string()
}

/// The `[kubelet]`, `[cdi]` and `[paths]` tables that give `paths`.
pub fn paths_toml(paths: &Paths) -> String {
    let spec_dirs: Vec<String> = paths.cdi_spec_dirs.iter().map(|d| toml_path(d)).collect();
    format!(
        "[kubelet]\nroot_dir = {kubelet}\nplugins_dir = {plugins}\nregistry_dir = {registry}\n\
         [cdi]\nspec_dirs = [{spec_dirs}]\ndynamic_dir = {dynamic}\n\
         [paths]\nstate_dir = {state}\ndriver_root = {driver}\ndev_root = {dev}\nproc_root = {proc}\nsys_root = {sys}\n\
         runtime_dir = {runtime}\n",
        kubelet = toml_path(&paths.kubelet_root),
        plugins = toml_path(&paths.plugins_dir),
        registry = toml_path(&paths.registry_dir),
        spec_dirs = spec_dirs.join(", "),
        dynamic = toml_path(&paths.cdi_dynamic_dir),
        state = toml_path(&paths.state_dir),
        driver = toml_path(&paths.driver_root),
        dev = toml_path(&paths.dev_root),
        proc = toml_path(&paths.proc_root),
        sys = toml_path(&paths.sys_root),
        runtime = toml_path(&paths.runtime_dir),
    )
}
