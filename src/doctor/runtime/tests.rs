//! Unit tests of the container runtime check: containerd configs version 2 and 3 with CDI
//! on, off and unset, k3s's generated config, CDI directories that miss edra's, CRI-O with
//! drop-ins, broken TOML, and which finding decides.

use super::*;

const DYN: &str = "/var/run/cdi";

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn containerd_text(text: &str, kind: Containerd) -> Finding {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("config.toml");
    write(&p, text);
    containerd(&p, kind, Path::new(DYN)).unwrap()
}

#[test]
fn containerd_v3_has_cdi_on_by_default() {
    let f = containerd_text(
        "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\ndefault_runtime_name = \"runc\"\n",
        Containerd::Host,
    );
    assert_eq!(f.status, Status::Pass, "{f:?}");
    assert!(f.detail.contains("version 3") && f.detail.contains("on by default"), "{}", f.detail);
}

#[test]
fn containerd_v3_with_cdi_disabled_fails() {
    let f = containerd_text(
        "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\nenable_cdi = false\n",
        Containerd::Host,
    );
    assert_eq!(f.status, Status::Fail);
    assert!(f.fix.contains("enable_cdi = true") && f.fix.contains("io.containerd.cri.v1.runtime"), "{}", f.fix);
}

#[test]
fn containerd_v2_explicit_on_passes_and_unset_is_unsure() {
    let on =
        containerd_text("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\nenable_cdi = true\n", Containerd::Host);
    assert_eq!(on.status, Status::Pass);
    let unsure = containerd_text(
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\nsandbox_image = \"x\"\n",
        Containerd::Host,
    );
    assert_eq!(unsure.status, Status::Warn);
    assert!(unsure.detail.contains("1.7") && unsure.fix.contains("io.containerd.grpc.v1.cri"), "{unsure:?}");
    let off =
        containerd_text("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\nenable_cdi = false\n", Containerd::Host);
    assert_eq!(off.status, Status::Fail);
}

#[test]
fn k3s_version_2_config_means_containerd_1_7() {
    let f = containerd_text(
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\nsnapshotter = \"overlayfs\"\n",
        Containerd::K3s,
    );
    assert_eq!(f.status, Status::Fail);
    assert!(f.detail.contains("containerd 1.7") && f.fix.contains("v1.32.2"), "{f:?}");
    assert!(f.source.starts_with("k3s containerd"), "{}", f.source);
    let ok = containerd_text("version = 3\n", Containerd::K3s);
    assert_eq!(ok.status, Status::Pass);
}

#[test]
fn cdi_spec_dirs_must_include_edras_directory() {
    let f = containerd_text(
        "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\nenable_cdi = true\ncdi_spec_dirs = [\"/etc/cdi\"]\n",
        Containerd::Host,
    );
    assert_eq!(f.status, Status::Fail);
    assert!(f.detail.contains("do not include edra's /var/run/cdi"), "{}", f.detail);
    assert!(f.fix.contains("cdi.dynamic_dir"), "{}", f.fix);
    // /run/cdi is the same directory as /var/run/cdi.
    let f = containerd_text(
        "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\ncdi_spec_dirs = [\"/etc/cdi\", \"/run/cdi\"]\n",
        Containerd::Host,
    );
    assert_eq!(f.status, Status::Pass, "{f:?}");
    assert!(f.detail.contains("/run/cdi"), "{}", f.detail);
}

#[test]
fn broken_toml_and_absent_files() {
    let f = containerd_text("version = = 3", Containerd::Host);
    assert_eq!(f.status, Status::Fail);
    assert!(f.detail.contains("not valid TOML"), "{}", f.detail);
    assert!(containerd(Path::new("/nonexistent/config.toml"), Containerd::Host, Path::new(DYN)).is_none());
}

#[test]
fn crio_drop_ins_override_in_name_order() {
    let d = tempfile::tempdir().unwrap();
    let main = d.path().join("crio.conf");
    let dir = d.path().join("crio.conf.d");
    assert!(crio(&main, &dir, Path::new(DYN)).is_none());
    write(&main, "[crio.runtime]\ncdi_spec_dirs = [\"/etc/cdi\"]\n");
    let f = crio(&main, &dir, Path::new(DYN)).unwrap();
    assert_eq!(f.status, Status::Fail, "{f:?}");
    write(&dir.join("10-cdi.conf"), "[crio.runtime]\ncdi_spec_dirs = [\"/etc/cdi\", \"/var/run/cdi\"]\n");
    write(&dir.join("README"), "not a drop-in");
    let f = crio(&main, &dir, Path::new(DYN)).unwrap();
    assert_eq!(f.status, Status::Pass, "{f:?}");
    assert!(f.source.contains("10-cdi.conf") && !f.source.contains("README"), "{}", f.source);
    write(&dir.join("20-other.conf"), "[crio.runtime]\ncdi_spec_dirs = [\"/opt/cdi\"]\n");
    assert_eq!(crio(&main, &dir, Path::new(DYN)).unwrap().status, Status::Fail);
    // Drop-ins alone are enough.
    std::fs::remove_file(&main).unwrap();
    std::fs::remove_file(dir.join("20-other.conf")).unwrap();
    assert_eq!(crio(&main, &dir, Path::new(DYN)).unwrap().status, Status::Pass);
}

fn paths(root: &Path) -> RuntimeConfigPaths {
    RuntimeConfigPaths {
        k3s_containerd_config: root.join("k3s/config.toml"),
        containerd_config: root.join("containerd/config.toml"),
        crio_config: root.join("crio/crio.conf"),
        crio_config_dir: root.join("crio/crio.conf.d"),
    }
}

#[test]
fn none_found_warns_and_k3s_decides_when_present() {
    let d = tempfile::tempdir().unwrap();
    let rt = paths(d.path());
    let r = container_runtime(&rt, Path::new(DYN));
    assert_eq!(r.status, Status::Warn);
    assert!(r.detail.contains("no container runtime configuration found"), "{}", r.detail);
    write(&rt.containerd_config, "version = 2\n");
    let r = container_runtime(&rt, Path::new(DYN));
    assert_eq!(r.status, Status::Warn, "host containerd alone decides: {r:?}");
    write(&rt.k3s_containerd_config, "version = 3\n");
    let r = container_runtime(&rt, Path::new(DYN));
    assert_eq!(r.status, Status::Pass, "k3s's config decides: {r:?}");
    assert!(r.detail.contains("k3s containerd") && r.detail.contains("; containerd ("), "{}", r.detail);
}
