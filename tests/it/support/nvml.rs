//! The NVML stand-in library (`nvml_stub.c`), compiled once per test process with the
//! system C compiler and copied per test into its own directory next to the
//! `nvml_stub.conf` that describes the fake machine, so tests run concurrently.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The stub's source.
const SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/support/nvml_stub.c");

/// A copy of the stand-in library with its own configuration.
pub struct StubNvml {
    /// Holds the library and its configuration; removed on drop.
    pub dir: tempfile::TempDir,
    /// `<dir>/libnvidia-ml.so.1`.
    pub library: PathBuf,
}

impl StubNvml {
    /// A stand-in whose `nvml_stub.conf` holds `config` (see the format in nvml_stub.c).
    pub fn new(config: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir for the NVML stand-in");
        let library = dir.path().join("libnvidia-ml.so.1");
        std::fs::copy(compiled(), &library).expect("copy the NVML stand-in");
        std::fs::write(dir.path().join("nvml_stub.conf"), config).expect("write nvml_stub.conf");
        Self { dir, library }
    }

    /// The default configuration with the NVML backend loading this stand-in (node `n1`).
    pub fn config(&self) -> edra::config::Config {
        let ctx = edra::config::LoadContext {
            explicit_file: None,
            default_file: self.dir.path().join("absent.toml"),
            env: vec![],
            overrides: edra::config::Overrides::default(),
            hostname: Some("n1".into()),
        };
        let mut cfg = edra::config::Config::load(&ctx).expect("default configuration");
        cfg.backend = edra::config::BackendKind::Nvml;
        cfg.nvml.library = self.library.clone();
        cfg
    }

    /// A stand-in without `nvml_stub.conf`: nvmlInit_v2 fails with "driver not loaded".
    pub fn without_config() -> Self {
        let s = Self::new("");
        std::fs::remove_file(s.dir.path().join("nvml_stub.conf")).expect("remove nvml_stub.conf");
        s
    }
}

/// The UUID [`a100`] and [`gpu`] give GPU `i`.
pub fn uuid(i: u32) -> String {
    format!("GPU-00000000-0000-0000-0000-00000000000{i}")
}

/// A shared library with no NVML symbols at all, in `dir`.
pub fn empty_library(dir: &Path) -> PathBuf {
    let src = dir.join("empty.c");
    std::fs::write(&src, "int edra_not_nvml(void) { return 0; }\n").expect("write empty.c");
    let out = dir.join("libempty.so");
    compile(&src, &out).unwrap_or_else(|e| panic!("{e}"));
    out
}

/// The stand-in compiled for this process (once), under the cargo target tmp dir.
pub fn compiled() -> &'static Path {
    static LIB: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let lib = LIB.get_or_init(|| {
        // Compiled under a per-process name, then renamed into place: concurrent test
        // processes never see a half-written file, and nothing accumulates.
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nvml-stub");
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let tmp = dir.join(format!("libnvidia-ml.so.1.{}", std::process::id()));
        let out = dir.join("libnvidia-ml.so.1");
        compile(Path::new(SOURCE), &tmp)?;
        std::fs::rename(&tmp, &out).map_err(|e| format!("rename {}: {e}", tmp.display()))?;
        Ok(out)
    });
    match lib {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

fn compile(src: &Path, out: &Path) -> Result<(), String> {
    super::cc::shared_library(src, out, "libnvidia-ml.so.1", &["-ldl"])
}

/// One GPU line of `nvml_stub.conf` for an A100 80GB at enumeration `index`.
pub fn a100(index: u32, minor: u32, bus: &str, mig: bool) -> String {
    format!(
        "gpu;uuid=GPU-00000000-0000-0000-0000-00000000000{index};name=NVIDIA A100-SXM4-80GB;brand=2;arch=7;\
         minor={minor};index={index};bus={bus};mem={};sms=108;cc=8.0;mig={}\n",
        81920u64 << 20,
        u8::from(mig)
    )
}

/// One GPU line of `nvml_stub.conf`: GPU `index` (minor `index`) called `name` with
/// `mem_mib` MiB, in MIG mode when `mig`; `extra` is appended as more `key=value` fields.
pub fn gpu(index: u32, name: &str, mem_mib: u64, mig: bool, extra: &str) -> String {
    format!(
        "gpu;uuid=GPU-00000000-0000-0000-0000-00000000000{index};name={name};brand=2;arch=7;minor={index};\
         index={index};bus=00000000:{:02X}:00.0;mem={};sms=108;cc=8.0;mig={}{extra}\n",
        0x10 + index,
        mem_mib << 20,
        u8::from(mig)
    )
}

impl StubNvml {
    /// A stand-in built with `define` set (a `#define` the stub's source tests, e.g.
    /// `STUB_NO_CREATE_GI` for a driver without GPU instance creation).
    pub fn variant(config: &str, define: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir for the NVML stand-in");
        let src = dir.path().join("variant.c");
        std::fs::write(&src, format!("#define {define} 1\n#include \"{SOURCE}\"\n")).expect("write variant.c");
        let library = dir.path().join("libnvidia-ml.so.1");
        compile(&src, &library).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join("nvml_stub.conf"), config).expect("write nvml_stub.conf");
        Self { dir, library }
    }
}
