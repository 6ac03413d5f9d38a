//! The mock backend's settings (`[mock]`): GPUs that exist only in configuration.

use super::bounds;
use super::source::{Raw, Reader, boolean, bytes, string, toml_value};

/// One mock GPU's MIG layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MockMig {
    /// Index of the parent GPU.
    pub gpu: u32,
    /// MIG profiles of the devices to create, e.g. `["1g.10gb", "3g.40gb"]`.
    pub profiles: Vec<String>,
}

/// The mock backend's GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct MockSettings {
    /// Number of GPUs.
    pub gpus: u32,
    /// Product name, e.g. "NVIDIA A100-SXM4-80GB".
    pub product_name: String,
    /// Memory per GPU in bytes.
    pub memory: u64,
    /// Architecture name, e.g. "Ampere".
    pub architecture: String,
    /// CUDA compute capability, e.g. "8.0".
    pub cuda_compute_capability: String,
    /// Streaming multiprocessors per GPU.
    pub multiprocessors: u32,
    /// Driver version reported, e.g. "550.54.15".
    pub driver_version: String,
    /// CUDA driver version reported, e.g. "12.4".
    pub cuda_driver_version: String,
    /// MIG layouts; GPUs not listed are whole GPUs.
    pub mig: Vec<MockMig>,
    /// Every GPU is in MIG mode with MIG instances created and destroyed on demand
    /// (dynamic MIG), kept in `<paths.runtime_dir>/mock-mig.json`. Only GPUs whose model
    /// has a known profile table (A100 40GB/80GB, H100 80GB) can be carved.
    pub mig_mode: bool,
    /// A file whose appended lines inject health events (see `health::source`).
    pub events_file: Option<std::path::PathBuf>,
}

impl Default for MockSettings {
    fn default() -> Self {
        Self {
            gpus: 2,
            product_name: "NVIDIA A100-SXM4-80GB".into(),
            memory: 80 << 30,
            architecture: "Ampere".into(),
            cuda_compute_capability: "8.0".into(),
            multiprocessors: 108,
            driver_version: "550.54.15".into(),
            cuda_driver_version: "12.4".into(),
            mig: Vec::new(),
            mig_mode: false,
            events_file: None,
        }
    }
}

pub(super) fn read_mock(r: &mut Reader) -> MockSettings {
    let d = MockSettings::default();
    let gpus = r.get("mock.gpus", d.gpus, bounds::u32_in(bounds::MOCK_GPUS));
    let mut m = MockSettings {
        gpus,
        product_name: r.get("mock.product_name", d.product_name, nonempty_string),
        memory: r.get("mock.memory", d.memory, |raw| {
            let (min, max) = bounds::MOCK_MEMORY;
            match bytes(raw)? {
                n if n < min || n > max => Err(format!("must be from 1Mi to 1024Ti bytes, found {n}")),
                n => Ok(n),
            }
        }),
        architecture: r.get("mock.architecture", d.architecture, nonempty_string),
        cuda_compute_capability: r.get("mock.cuda_compute_capability", d.cuda_compute_capability, nonempty_string),
        multiprocessors: r.get("mock.multiprocessors", d.multiprocessors, bounds::u32_in(bounds::MOCK_MULTIPROCESSORS)),
        driver_version: r.get("mock.driver_version", d.driver_version, nonempty_string),
        cuda_driver_version: r.get("mock.cuda_driver_version", d.cuda_driver_version, nonempty_string),
        mig: Vec::new(),
        mig_mode: r.get("mock.mig_mode", d.mig_mode, boolean),
        events_file: r.opt("mock.events_file", super::source::abs_path),
    };
    m.mig = r.get("mock.mig", Vec::new(), |raw| parse_mock_mig(&toml_value(raw)?, gpus));
    if m.mig_mode && !m.mig.is_empty() {
        let origin = r.origin_of("mock.mig");
        r.problem(
            "mock.mig",
            origin,
            "cannot be combined with mock.mig_mode = true (MIG instances are then created on demand); remove one",
        );
    }
    m
}

fn nonempty_string(raw: &Raw) -> Result<String, String> {
    let s = string(raw)?;
    if s.trim().is_empty() { Err("must not be empty".into()) } else { Ok(s) }
}

fn parse_mock_mig(v: &toml::Value, gpus: u32) -> Result<Vec<MockMig>, String> {
    let items = v.as_array().ok_or("expected a list of { gpu = N, profiles = [...] } tables")?;
    let mut out: Vec<MockMig> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let t = item.as_table().ok_or_else(|| format!("entry {i}: expected a table"))?;
        for k in t.keys() {
            if k != "gpu" && k != "profiles" {
                return Err(format!("entry {i}: unknown field {k:?} (expected gpu and profiles)"));
            }
        }
        let gpu = t
            .get("gpu")
            .and_then(|g| g.as_integer())
            .and_then(|g| u32::try_from(g).ok())
            .ok_or_else(|| format!("entry {i}: gpu must be a GPU index from 0 to {}", gpus.saturating_sub(1)))?;
        if gpu >= gpus {
            return Err(format!("entry {i}: gpu {gpu} does not exist (mock.gpus is {gpus})"));
        }
        if out.iter().any(|m| m.gpu == gpu) {
            return Err(format!("entry {i}: gpu {gpu} is listed twice"));
        }
        let profiles = t
            .get("profiles")
            .and_then(|p| p.as_array())
            .ok_or_else(|| format!("entry {i}: profiles must be a list such as [\"1g.10gb\"]"))?
            .iter()
            .map(|p| {
                let s = p.as_str().ok_or_else(|| format!("entry {i}: profiles must be strings"))?;
                validate_mig_profile(s).map_err(|e| format!("entry {i}: {e}"))?;
                Ok(s.to_string())
            })
            .collect::<Result<Vec<_>, String>>()?;
        if profiles.is_empty() {
            return Err(format!("entry {i}: profiles must not be empty"));
        }
        out.push(MockMig { gpu, profiles });
    }
    Ok(out)
}

/// Checks a MIG profile name such as `1g.10gb` or `1c.3g.40gb`.
pub fn validate_mig_profile(s: &str) -> Result<(), String> {
    let parts: Vec<&str> = s.split('.').collect();
    let ok = match parts.as_slice() {
        [g, mem] => is_num_suffix(g, "g") && is_num_suffix(mem, "gb"),
        [c, g, mem] => is_num_suffix(c, "c") && is_num_suffix(g, "g") && is_num_suffix(mem, "gb"),
        _ => false,
    };
    if ok { Ok(()) } else { Err(format!("{s:?} is not a MIG profile such as \"1g.10gb\"")) }
}

fn is_num_suffix(s: &str, suffix: &str) -> bool {
    s.strip_suffix(suffix).is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}
