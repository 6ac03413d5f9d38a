//! What the preparer needs to know about the node and its paths ([`PrepareSettings`]),
//! taken from the configuration.

use std::path::{Path, PathBuf};

use crate::gpu::mps::MpsSettings;
use crate::gpu::timeslice::NvidiaSmi;

use super::cdi;

/// What the preparer needs to know about the node and its paths.
#[derive(Debug, Clone)]
pub struct PrepareSettings {
    /// The DRA driver name.
    pub driver: String,
    /// This node's name, which is the pool name.
    pub node: String,
    /// The dynamic CDI spec directory.
    pub cdi_dir: PathBuf,
    /// Root of the NVIDIA driver's files.
    pub driver_root: PathBuf,
    /// Where the driver root is on the host when edra sees it elsewhere.
    pub host_driver_root: Option<PathBuf>,
    /// The device filesystem.
    pub dev_root: PathBuf,
    /// procfs (for the boot ID and the kernel release).
    pub proc_root: PathBuf,
    /// sysfs (for the kernel's firmware path).
    pub sys_root: PathBuf,
    /// The edra binary, which the CDI specs run as their hook.
    pub hook_binary: PathBuf,
    /// The `nvidia-smi` that sets time-slice intervals.
    pub nvidia_smi: NvidiaSmi,
    /// Where and how MPS control daemons run.
    pub mps: MpsSettings,
    /// How full GPUs are offered (which replica names exist).
    pub sharing: crate::sharing::SharingSettings,
    /// Which GPUs are carved into MIG devices on demand (which MIG device names exist).
    pub mig: crate::dynamic_mig::MigSettings,
}

/// The folder of the driver root's NVML library, for tools the driver root ships, when the
/// driver root is not `/` (on `/` the loader finds it by itself).
fn nvml_library_dir(library: &Path, driver_root: &Path) -> Option<PathBuf> {
    crate::inventory::host::library_candidates(library, driver_root)
        .into_iter()
        .find(|p| p.is_absolute() && p.exists() && driver_root != Path::new("/"))
        .and_then(|p| p.parent().map(Path::to_path_buf))
}

impl PrepareSettings {
    /// Settings from the configuration; `hook_binary` is usually `std::env::current_exe()`.
    pub fn from_config(config: &crate::config::Config, hook_binary: PathBuf) -> Self {
        let library_dir = nvml_library_dir(&config.nvml.library, &config.paths.driver_root);
        Self {
            driver: config.driver_name.clone(),
            node: config.node_name.clone(),
            cdi_dir: config.paths.cdi_dynamic_dir.clone(),
            driver_root: config.paths.driver_root.clone(),
            host_driver_root: config.paths.host_driver_root.clone(),
            dev_root: config.paths.dev_root.clone(),
            proc_root: config.paths.proc_root.clone(),
            sys_root: config.paths.sys_root.clone(),
            hook_binary,
            nvidia_smi: NvidiaSmi::new(
                config.paths.nvidia_smi.as_deref(),
                &config.paths.driver_root,
                library_dir.clone(),
            ),
            mps: MpsSettings {
                control: config.paths.mps_control.clone().unwrap_or_else(|| {
                    crate::gpu::driver_tool(&config.paths.driver_root, crate::gpu::mps::DEFAULT_RELATIVE_PATH)
                }),
                control_key: crate::gpu::mps::CONFIG_KEY,
                runtime_dir: config.paths.runtime_dir.clone(),
                // Daemons are processes of this pid namespace, whatever paths.proc_root says.
                proc_root: PathBuf::from("/proc"),
                ready_timeout: config.mps.ready_timeout,
                quit_grace: config.mps.quit_grace,
                library_dir,
            },
            sharing: config.sharing.clone(),
            mig: config.mig.clone(),
        }
    }

    /// The CDI vendor: `k8s.<driver>`.
    pub fn cdi_vendor(&self) -> String {
        cdi::vendor(&self.driver)
    }

    /// The spec file of claim `uid`.
    pub fn spec_path(&self, uid: &str) -> PathBuf {
        self.cdi_dir.join(cdi::spec_file_name(&self.cdi_vendor(), uid))
    }
}
