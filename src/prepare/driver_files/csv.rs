//! A Jetson's container files, from the platform's CSV lists.
//!
//! JetPack lists what a GPU container needs in
//! `/etc/nvidia-container-runtime/host-files-for-container.d/*.csv` (under the driver root):
//! one entry a line, `<kind>, <absolute path>`, kinds `dev` (a device node), `lib` (a
//! library), `sym` (a symlink) and `dir` (a folder); blank lines and lines starting with
//! `#` are ignored. The entries become [`DriverFiles`]: `dev` entries that are character
//! devices under the device root become device nodes, `lib` entries and the files links
//! lead to become read-only mounts (their folders are given to `update-ldcache`), `sym`
//! entries (and `lib` entries that are links) are recreated by the `create-symlinks` hook
//! with the target the host's link has, and `dir` entries are mounted read-only whole.
//!
//! The lists are the platform's, but the files they name could be anything, so: the
//! folder holds at most [`MAX_FILES`] CSV files of at most [`MAX_FILE_BYTES`] each, read
//! without following a link, and at most [`MAX_ENTRIES`] entries in all (more is an error,
//! as is a CSV file that cannot be read: a spec is never built from half a list). A line
//! that is not `<kind>, <absolute path>` (a `..` or `.` component, control characters, an
//! unknown kind), an entry whose folder or link leads out of the driver root, or one of the
//! wrong type is skipped with a warning; entries missing on this host (the lists cover
//! every Jetson module) are skipped with one warning that counts them. A list of which
//! nothing exists here is an error.

use std::path::{Component, Path, PathBuf};

use super::{DriverFiles, LibraryLink};

/// The CSV folder, relative to the driver root.
pub const CSV_DIR: &str = "etc/nvidia-container-runtime/host-files-for-container.d";
/// The most CSV files read.
pub const MAX_FILES: usize = 64;
/// The largest CSV file read.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// The most entries in all the CSV files together.
pub const MAX_ENTRIES: usize = 8192;
/// The longest path in an entry, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;
/// Skipped lines logged one by one; the rest are counted.
const WARN_LINES: usize = 20;

/// An entry's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A device node.
    Dev,
    /// A library file.
    Lib,
    /// A symlink.
    Sym,
    /// A folder.
    Dir,
}

/// One line of a CSV file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its kind.
    pub kind: Kind,
    /// The path it names on the host (absolute, as written).
    pub path: PathBuf,
}

/// Why a Jetson's CSV files give no files.
#[derive(Debug, thiserror::Error)]
pub enum CsvError {
    /// The folder is missing or holds no CSV file.
    #[error(
        "no CSV files in {}: a Jetson lists what its containers need there (JetPack's nvidia-container \
         packages install them); install them, or check paths.driver_root",
        dir.display()
    )]
    NoFiles {
        /// The folder looked in.
        dir: PathBuf,
    },
    /// A CSV file or the folder could not be read.
    #[error("cannot read {}: fix or remove the file (edra builds no spec from part of the list)", path.display())]
    Read {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// More files or entries than edra reads.
    #[error("{} holds more than {limit} {what}; edra reads no more than that", dir.display())]
    TooMany {
        /// The folder.
        dir: PathBuf,
        /// `CSV files` or `entries`.
        what: &'static str,
        /// The bound.
        limit: usize,
    },
    /// None of the entries exists on this host.
    #[error(
        "none of the {entries} entries of the CSV files in {} exists under {} (check paths.driver_root and paths.dev_root)",
        dir.display(),
        root.display()
    )]
    NothingFound {
        /// The folder.
        dir: PathBuf,
        /// The driver root.
        root: PathBuf,
        /// How many entries were listed.
        entries: usize,
    },
}

/// The entries of one CSV file's text; lines that are not entries are described in
/// `skipped` (`<file>:<line>: <why>`).
pub fn parse(text: &str, file: &Path, skipped: &mut Vec<String>) -> Vec<Entry> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut skip = |why: &str| skipped.push(format!("{}:{}: {why}", file.display(), n.saturating_add(1)));
        let Some((kind, path)) = line.split_once(',') else {
            skip("not `<kind>, <path>`");
            continue;
        };
        let kind = match kind.trim().to_ascii_lowercase().as_str() {
            "dev" => Kind::Dev,
            "lib" => Kind::Lib,
            "sym" => Kind::Sym,
            "dir" => Kind::Dir,
            _ => {
                skip("the kind is not dev, lib, sym or dir");
                continue;
            }
        };
        match check_path(path.trim()) {
            Ok(path) => out.push(Entry { kind, path }),
            Err(why) => skip(why),
        }
    }
    out
}

/// `path` when it is absolute, plain (no `.`, `..`, `::`, control characters) and not too long.
fn check_path(path: &str) -> Result<PathBuf, &'static str> {
    if path.len() > MAX_PATH_BYTES {
        return Err("the path is too long");
    }
    if path.chars().any(crate::util::is_control) || path.contains("::") {
        return Err("the path holds control characters or `::`");
    }
    let p = Path::new(path);
    let plain = p.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && !path.split('/').any(|c| c == "." || c == "..");
    if !p.is_absolute() || !plain || p.file_name().is_none() {
        return Err("not an absolute path without `.` or `..`");
    }
    Ok(p.to_path_buf())
}

/// Reads every `*.csv` of `<driver_root>/`[`CSV_DIR`], in name order.
pub fn read_entries(driver_root: &Path, skipped: &mut Vec<String>) -> Result<Vec<Entry>, CsvError> {
    let dir = driver_root.join(CSV_DIR);
    let listing = match std::fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(CsvError::NoFiles { dir }),
        Err(source) => return Err(CsvError::Read { path: dir, source }),
    };
    let mut files = Vec::new();
    for entry in listing {
        let entry = entry.map_err(|source| CsvError::Read { path: dir.clone(), source })?;
        if entry.file_name().to_str().is_some_and(|n| n.ends_with(".csv") && !n.starts_with('.')) {
            files.push(entry.path());
            if files.len() > MAX_FILES {
                return Err(CsvError::TooMany { dir, what: "CSV files", limit: MAX_FILES });
            }
        }
    }
    if files.is_empty() {
        return Err(CsvError::NoFiles { dir });
    }
    files.sort();
    let mut entries = Vec::new();
    for file in files {
        let bytes = crate::util::read_small_file(&file, MAX_FILE_BYTES)
            .map_err(|source| CsvError::Read { path: file.clone(), source })?;
        let text = String::from_utf8(bytes).map_err(|e| CsvError::Read {
            path: file.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        })?;
        entries.extend(parse(&text, &file, skipped));
        if entries.len() > MAX_ENTRIES {
            return Err(CsvError::TooMany { dir, what: "entries", limit: MAX_ENTRIES });
        }
    }
    Ok(entries)
}

/// The files a Jetson's CSV lists name, found under `driver_root` (device nodes under
/// `dev_root`). Warnings for what was skipped are logged.
pub fn discover(driver_root: &Path, dev_root: &Path) -> Result<DriverFiles, CsvError> {
    let mut skipped = Vec::new();
    let entries = read_entries(driver_root, &mut skipped)?;
    let mut found = Found::new(driver_root, dev_root);
    for e in &entries {
        found.take(e, &mut skipped);
    }
    for line in skipped.iter().take(WARN_LINES) {
        tracing::warn!(entry = %crate::util::escape_controls(line), "CSV entry skipped");
    }
    if skipped.len() > WARN_LINES {
        tracing::warn!(more = skipped.len() - WARN_LINES, "more CSV entries skipped");
    }
    if !found.missing.is_empty() {
        let first: Vec<String> = found.missing.iter().take(5).map(|p| p.display().to_string()).collect();
        tracing::warn!(missing = found.missing.len(), ?first, "CSV entries missing on this host; skipped");
    }
    let files = found.files;
    if files.device_nodes.is_empty() && files.libraries.is_empty() && files.directories.is_empty() {
        return Err(CsvError::NothingFound {
            dir: driver_root.join(CSV_DIR),
            root: driver_root.to_path_buf(),
            entries: entries.len(),
        });
    }
    tracing::debug!(
        device_nodes = files.device_nodes.len(),
        libraries = files.libraries.len(),
        links = files.library_links.len(),
        directories = files.directories.len(),
        "found a Jetson's container files"
    );
    Ok(files)
}

/// What the entries found so far.
struct Found<'a> {
    root: &'a Path,
    dev_root: &'a Path,
    /// The driver root and device root with their links resolved (what entries must stay in).
    root_real: Option<PathBuf>,
    dev_real: Option<PathBuf>,
    files: DriverFiles,
    missing: Vec<PathBuf>,
}

impl<'a> Found<'a> {
    fn new(root: &'a Path, dev_root: &'a Path) -> Self {
        Found {
            root,
            dev_root,
            root_real: root.canonicalize().ok(),
            dev_real: dev_root.canonicalize().ok(),
            files: DriverFiles { root: root.to_path_buf(), ..DriverFiles::default() },
            missing: Vec::new(),
        }
    }

    fn take(&mut self, e: &Entry, skipped: &mut Vec<String>) {
        let (host, base) = match e.kind {
            Kind::Dev => match e.path.strip_prefix("/dev") {
                Ok(rel) if rel.as_os_str().is_empty() => {
                    return skipped.push(format!("dev {}: not a device", e.path.display()));
                }
                Ok(rel) => (self.dev_root.join(rel), self.dev_real.clone()),
                Err(_) => return skipped.push(format!("dev {}: not under /dev", e.path.display())),
            },
            _ => (super::under(self.root, &e.path), self.root_real.clone()),
        };
        let Ok(meta) = std::fs::symlink_metadata(&host) else {
            self.missing.push(e.path.clone());
            return;
        };
        // The folder holding the entry, links resolved, must be inside its root.
        let inside = host.parent().and_then(|p| p.canonicalize().ok()).zip(base).is_some_and(|(p, b)| p.starts_with(b));
        if !inside {
            return skipped.push(format!("{}: its folder leads out of {}", e.path.display(), self.root.display()));
        }
        let ft = meta.file_type();
        match e.kind {
            Kind::Dev if std::os::unix::fs::FileTypeExt::is_char_device(&ft) => {
                push_new(&mut self.files.device_nodes, host)
            }
            Kind::Dir if ft.is_dir() => push_new(&mut self.files.directories, host),
            Kind::Lib | Kind::Sym if ft.is_file() => self.library(host),
            Kind::Lib | Kind::Sym if ft.is_symlink() => self.link(&e.path, host, skipped),
            kind => skipped.push(format!("{kind:?} {}: not of that type on this host", e.path.display())),
        }
    }

    fn library(&mut self, host: PathBuf) {
        if let Some(dir) = host.parent().filter(|_| is_library_name(&host)) {
            push_new(&mut self.files.library_dirs, dir.to_path_buf());
        }
        push_new(&mut self.files.libraries, host);
    }

    /// A link to recreate, with the file it leads to mounted when that is inside the root.
    fn link(&mut self, path: &Path, host: PathBuf, skipped: &mut Vec<String>) {
        let target = std::fs::read_link(&host).ok().and_then(|t| t.to_str().map(str::to_string));
        let Some(target) = target.filter(|t| !t.is_empty() && !t.chars().any(crate::util::is_control)) else {
            return skipped.push(format!("{}: its link target is not plain text", path.display()));
        };
        // An absolute target means the same path under the root (the host's `/` when edra
        // sees it elsewhere).
        let real = match target.strip_prefix('/') {
            Some(rel) => self.root.join(rel).canonicalize().ok(),
            None => host.canonicalize().ok(),
        };
        let root = self.root_real.as_deref();
        let Some(real) = real.filter(|r| root.is_some_and(|b| r.starts_with(b)) && r.is_file()) else {
            return skipped
                .push(format!("{} -> {target}: the link leads out of the root or to no file", path.display()));
        };
        let (Some(dir), Some(name)) = (host.parent(), host.file_name().and_then(|n| n.to_str())) else { return };
        let link = LibraryLink { dir: dir.to_path_buf(), name: name.to_string(), target };
        if !self.files.library_links.contains(&link) {
            self.files.library_links.push(link);
        }
        if is_library_name(&host) {
            push_new(&mut self.files.library_dirs, dir.to_path_buf());
        }
        // The file mounted at its place in the container: its path under the root.
        let in_root = root.and_then(|b| real.strip_prefix(b).ok()).map(|rel| self.root.join(rel));
        if let Some(file) = in_root {
            self.library(file);
        }
    }
}

fn is_library_name(p: &Path) -> bool {
    p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.contains(".so"))
}

fn push_new(v: &mut Vec<PathBuf>, p: PathBuf) {
    if !v.contains(&p) {
        v.push(p);
    }
}

#[cfg(test)]
mod tests;
