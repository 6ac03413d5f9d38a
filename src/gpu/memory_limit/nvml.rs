//! The NVML calls of memory limits, looked up with `dlsym` in the NVML library (the one the
//! device backend loaded, when it did: `dlopen` of a loaded file returns it, and NVML's
//! init is reference-counted). nvml-wrapper 0.13 has no binding for them, and a driver
//! older than r615 has no such symbols, which is what detection reports.
//!
//! Layouts, from NVIDIA's `nvml.h` (CUDA 13.4): `nvmlSetMemoryLimits_v1_t` is
//! `{ const char *nameSpace; unsigned long long softLimit, hardLimit; }` and
//! `nvmlGetMemoryLimits_v1_t` adds `unsigned long long currentUsed`; `nameSpace` is the
//! full path of the cgroup directory; both functions take `(nvmlDevice_t, struct *)`.

use std::ffi::{CStr, CString, c_char, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::{GET_SYMBOL, LimitControl, LimitError, Limits, SET_SYMBOL};

type Device = *mut c_void;
type Ret = u32;

#[repr(C)]
struct SetLimits {
    name_space: *const c_char,
    soft: u64,
    hard: u64,
}

#[repr(C)]
struct GetLimits {
    name_space: *const c_char,
    soft: u64,
    hard: u64,
    used: u64,
}

type InitFn = unsafe extern "C" fn() -> Ret;
type ByUuidFn = unsafe extern "C" fn(*const c_char, *mut Device) -> Ret;
type ErrorStringFn = unsafe extern "C" fn(Ret) -> *const c_char;
type SetFn = unsafe extern "C" fn(Device, *mut SetLimits) -> Ret;
type GetFn = unsafe extern "C" fn(Device, *mut GetLimits) -> Ret;

/// The memory-limit calls of one loaded NVML library, initialised.
pub struct NvmlLimits {
    library: PathBuf,
    handle: *mut c_void,
    shutdown: InitFn,
    by_uuid: ByUuidFn,
    error_string: Option<ErrorStringFn>,
    set: SetFn,
    get: GetFn,
}

// SAFETY: the handle and function pointers are process-wide and NVML is thread-safe
// (documented as such since its first release); nothing here is mutated after `open`.
unsafe impl Send for NvmlLimits {}
// SAFETY: as above.
unsafe impl Sync for NvmlLimits {}

impl std::fmt::Debug for NvmlLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlLimits").field("library", &self.library).finish()
    }
}

fn dl_error() -> String {
    // SAFETY: dlerror returns a thread-local string or null.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null dlerror strings are NUL-terminated.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// The address of `name` in `handle`, or `None`.
fn symbol(handle: *mut c_void, name: &str) -> Option<*mut c_void> {
    let c = CString::new(name).ok()?;
    // SAFETY: handle came from dlopen and is open; c is NUL-terminated.
    let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
    (!p.is_null()).then_some(p)
}

impl NvmlLimits {
    /// Opens the first of `libraries` that loads, checks it has the memory-limit functions,
    /// and initialises NVML. The error says which library lacks what.
    pub fn open(libraries: &[PathBuf]) -> Result<Self, LimitError> {
        let mut last = "no NVML library to try".to_string();
        for lib in libraries {
            let Ok(c) = CString::new(lib.as_os_str().as_bytes()) else { continue };
            // SAFETY: c is NUL-terminated; loading NVML runs only its own initialisers.
            let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if handle.is_null() {
                last = format!("cannot load the NVML library {}: {}", lib.display(), dl_error());
                continue;
            }
            return Self::from_handle(lib, handle);
        }
        Err(LimitError::Unavailable(last))
    }

    fn from_handle(lib: &Path, handle: *mut c_void) -> Result<Self, LimitError> {
        let missing = |name: &str| {
            // SAFETY: handle came from dlopen; it is closed once here and never used again.
            unsafe { libc::dlclose(handle) };
            LimitError::Unavailable(format!(
                "{} has no {name}: the driver predates GPU memory limits per cgroup (r615, CUDA 13.4)",
                lib.display()
            ))
        };
        let (Some(set), Some(get)) = (symbol(handle, SET_SYMBOL), symbol(handle, GET_SYMBOL)) else {
            let name = if symbol(handle, SET_SYMBOL).is_none() { SET_SYMBOL } else { GET_SYMBOL };
            return Err(missing(name));
        };
        let (Some(init), Some(shutdown), Some(by_uuid)) = (
            symbol(handle, "nvmlInit_v2"),
            symbol(handle, "nvmlShutdown"),
            symbol(handle, "nvmlDeviceGetHandleByUUID"),
        ) else {
            return Err(missing("nvmlInit_v2, nvmlShutdown or nvmlDeviceGetHandleByUUID"));
        };
        // SAFETY: each pointer is the named NVML function, whose C signature the type
        // spells (nvml.h); a data pointer and a function pointer have the same size here.
        let (init, shutdown, by_uuid, set, get, error_string) = unsafe {
            (
                std::mem::transmute::<*mut c_void, InitFn>(init),
                std::mem::transmute::<*mut c_void, InitFn>(shutdown),
                std::mem::transmute::<*mut c_void, ByUuidFn>(by_uuid),
                std::mem::transmute::<*mut c_void, SetFn>(set),
                std::mem::transmute::<*mut c_void, GetFn>(get),
                symbol(handle, "nvmlErrorString").map(|p| std::mem::transmute::<*mut c_void, ErrorStringFn>(p)),
            )
        };
        // SAFETY: nvmlInit_v2 takes no arguments; it is reference-counted.
        let rc = unsafe { init() };
        if rc != 0 {
            // SAFETY: as in `missing`.
            unsafe { libc::dlclose(handle) };
            return Err(LimitError::Unavailable(format!("nvmlInit_v2 in {} failed (NVML error {rc})", lib.display())));
        }
        Ok(Self { library: lib.to_path_buf(), handle, shutdown, by_uuid, error_string, set, get })
    }

    /// The library loaded.
    pub fn library(&self) -> &Path {
        &self.library
    }

    fn describe(&self, rc: Ret) -> String {
        let text = self.error_string.and_then(|f| {
            // SAFETY: nvmlErrorString returns a static string for any code.
            let p = unsafe { f(rc) };
            // SAFETY: non-null results are NUL-terminated static strings.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        });
        format!("{} (NVML error {rc})", text.unwrap_or_else(|| "unknown error".into()))
    }

    fn device(&self, uuid: &str) -> Result<Device, LimitError> {
        let unknown = |message: String| LimitError::UnknownGpu { uuid: uuid.to_string(), message };
        let c = CString::new(uuid).map_err(|_| unknown("the UUID holds a NUL byte".into()))?;
        let mut dev: Device = std::ptr::null_mut();
        // SAFETY: c is NUL-terminated; dev is a valid out pointer.
        let rc = unsafe { (self.by_uuid)(c.as_ptr(), &mut dev) };
        if rc != 0 { Err(unknown(self.describe(rc))) } else { Ok(dev) }
    }

    fn path(uuid: &str, call: &'static str, cgroup: &Path) -> Result<CString, LimitError> {
        CString::new(cgroup.as_os_str().as_bytes()).map_err(|_| LimitError::Nvml {
            call,
            uuid: uuid.to_string(),
            cgroup: cgroup.to_path_buf(),
            message: "the path holds a NUL byte".into(),
            code: 2,
        })
    }

    fn check(&self, rc: Ret, call: &'static str, uuid: &str, cgroup: &Path) -> Result<(), LimitError> {
        if rc == 0 {
            return Ok(());
        }
        let message = self.describe(rc);
        Err(LimitError::Nvml { call, uuid: uuid.to_string(), cgroup: cgroup.to_path_buf(), message, code: rc })
    }
}

impl LimitControl for NvmlLimits {
    fn set(&self, uuid: &str, cgroup: &Path, soft: u64, hard: u64) -> Result<(), LimitError> {
        let dev = self.device(uuid)?;
        let path = Self::path(uuid, SET_SYMBOL, cgroup)?;
        let mut limits = SetLimits { name_space: path.as_ptr(), soft, hard };
        // SAFETY: dev came from this library; limits and the path it points at outlive the call.
        let rc = unsafe { (self.set)(dev, &mut limits) };
        self.check(rc, SET_SYMBOL, uuid, cgroup)
    }

    fn get(&self, uuid: &str, cgroup: &Path) -> Result<Limits, LimitError> {
        let dev = self.device(uuid)?;
        let path = Self::path(uuid, GET_SYMBOL, cgroup)?;
        let mut limits = GetLimits { name_space: path.as_ptr(), soft: 0, hard: 0, used: 0 };
        // SAFETY: as in `set`; NVML writes only the three numbers.
        let rc = unsafe { (self.get)(dev, &mut limits) };
        self.check(rc, GET_SYMBOL, uuid, cgroup)?;
        Ok(Limits { soft: limits.soft, hard: limits.hard, used: limits.used })
    }
}

impl Drop for NvmlLimits {
    fn drop(&mut self) {
        // SAFETY: balanced with the successful nvmlInit_v2 of `open`. The library stays
        // loaded (the handle is not closed): NVML may keep threads of its own, and a device
        // backend may use the same file.
        unsafe { (self.shutdown)() };
        let _ = self.handle;
    }
}
