//! The C compiler for test libraries (the NVML stand-in, the hook test's library), shared
//! by the library's unit tests and the integration tests.

/// The C compiler as make and cc-rs choose it: `CC` when set (it may carry arguments,
/// e.g. `ccache gcc`), otherwise `cc`.
pub fn compiler() -> Vec<String> {
    let cc = std::env::var("CC").unwrap_or_default();
    let words: Vec<String> = cc.split_whitespace().map(str::to_owned).collect();
    if words.is_empty() { vec!["cc".to_owned()] } else { words }
}

/// Compiles `src` into the shared library `out` with SONAME `soname`, linking `libs` after
/// it. Warnings are shown only when compiling fails and never fail it (no `-Werror`), so
/// a newer compiler's new warnings do not break the tests.
pub fn shared_library(src: &std::path::Path, out: &std::path::Path, soname: &str, libs: &[&str]) -> Result<(), String> {
    let cc = compiler();
    let output = std::process::Command::new(&cc[0])
        .args(&cc[1..])
        .args(["-shared", "-fPIC", "-O1", "-Wall"])
        .arg(format!("-Wl,-soname,{soname}"))
        .arg("-o")
        .arg(out)
        .arg(src)
        .args(libs)
        .output()
        .map_err(|e| {
            format!("a C compiler is needed: running {:?} failed ({e}); install gcc or set CC", cc.join(" "))
        })?;
    if !output.status.success() {
        return Err(format!(
            "compiling {} with {} failed:\n{}",
            src.display(),
            cc.join(" "),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(())
}
