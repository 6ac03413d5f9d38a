//! `edra hook create-symlinks`: symlinks inside a container's root filesystem.
//!
//! The hook runs as root in the host's namespaces while the rootfs is an image someone else
//! built, so paths in it are resolved the way the container will see them: symlinks met on
//! the way to a link's folder are followed with `/` and `..` meaning the rootfs's own, and the
//! result never leaves the rootfs ([`resolve_dir`]). Missing folders are created (0755). A
//! link is created under a temporary name and renamed over the final one, so a reader sees
//! the old entry or the new link, never neither; a link already right is left untouched.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use super::HookError;

/// How many symlinks one resolution may follow (the kernel's limit).
pub const MAX_SYMLINKS: usize = 40;

/// One link to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSpec {
    /// What the link points to, written into it as is.
    pub target: String,
    /// Where the link is, absolute inside the container.
    pub link: PathBuf,
}

/// What [`create_link`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkOutcome {
    /// The link was already right.
    Unchanged,
    /// The link was created or replaced.
    Written,
}

/// Parses `TARGET::LINK` (split at the last `::`): a non-empty target and an absolute link
/// path without `.`/`..` components, neither with NUL or newlines.
pub fn parse_link(arg: &str) -> Result<LinkSpec, HookError> {
    let bad = || HookError::Link { link: arg.to_string() };
    let (target, link) = arg.rsplit_once("::").ok_or_else(bad)?;
    let link = Path::new(link);
    let clean = |s: &str| !s.is_empty() && !s.contains(['\0', '\n']);
    let link_ok = clean(&link.to_string_lossy())
        && link.is_absolute()
        && link.file_name().is_some()
        && link.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && !link.to_string_lossy().split('/').any(|p| p == "." || p == "..");
    if !clean(target) || !link_ok {
        return Err(bad());
    }
    Ok(LinkSpec { target: target.to_string(), link: link.to_path_buf() })
}

/// The folder `dir` (absolute, inside the container) as a host path under `rootfs`,
/// resolved as inside the container: symlinks are followed within the rootfs (`..` stops at
/// its top, absolute targets start again from it). Missing folders are created (0755).
pub fn resolve_dir(rootfs: &Path, dir: &Path) -> Result<PathBuf, HookError> {
    resolve_dir_with(rootfs, dir, Escape::Clamp, &mut Vec::new())
}

/// What a `..` above the rootfs's top means while resolving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escape {
    /// The rootfs's top, as `/..` is `/` inside the container.
    Clamp,
    /// An error: a link that only makes sense on the host, leading out of the rootfs.
    Refuse,
}

/// [`resolve_dir`] with a choice of what `..` above the top means; the folders created are
/// appended to `created` (parents first), so a caller can remove them again.
pub fn resolve_dir_with(
    rootfs: &Path,
    dir: &Path,
    escape: Escape,
    created: &mut Vec<PathBuf>,
) -> Result<PathBuf, HookError> {
    let mut pending: VecDeque<OsString> = normal_parts(dir);
    let mut resolved: Vec<OsString> = Vec::new();
    let mut followed = 0usize;
    let here = |resolved: &[OsString]| resolved.iter().fold(rootfs.to_path_buf(), |p, c| p.join(c));
    while let Some(part) = pending.pop_front() {
        if part == ".." {
            if resolved.pop().is_none() && escape == Escape::Refuse {
                return Err(HookError::Escapes { path: rootfs.join(dir.strip_prefix("/").unwrap_or(dir)) });
            }
            continue;
        }
        let cur = here(&resolved).join(&part);
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                followed += 1;
                if followed > MAX_SYMLINKS {
                    return Err(HookError::Unsafe { path: cur });
                }
                let target =
                    std::fs::read_link(&cur).map_err(|source| HookError::Read { path: cur.clone(), source })?;
                if target.is_absolute() {
                    resolved.clear();
                }
                for p in normal_parts(&target).into_iter().rev() {
                    pending.push_front(p);
                }
            }
            Ok(m) if m.is_dir() => resolved.push(part),
            Ok(_) => return Err(HookError::Unsafe { path: cur }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match std::fs::DirBuilder::new().mode(0o755).create(&cur) {
                    Ok(()) => {
                        created.push(cur.clone());
                        set_mode_0755(&cur).map_err(|source| HookError::Write { path: cur.clone(), source })?
                    }
                    // Created meanwhile: look at it again.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        pending.push_front(part);
                        continue;
                    }
                    Err(source) => return Err(HookError::Write { path: cur, source }),
                }
                resolved.push(part);
            }
            Err(source) => return Err(HookError::Read { path: cur, source }),
        }
    }
    Ok(here(&resolved))
}

/// Sets a folder just created to 0755 whatever the umask, through a descriptor opened
/// without following symlinks (so a swapped-in link is never chmod-ed through).
fn set_mode_0755(dir: &Path) -> io::Result<()> {
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW).open(dir)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o755))
}

/// The `Normal` and `..` components of `p` (root and `.` dropped).
fn normal_parts(p: &Path) -> VecDeque<OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect()
}

/// Creates `spec` in `rootfs`: a no-op when the link is already right; a file or link of
/// the same name is replaced atomically; a folder there is an error.
pub fn create_link(rootfs: &Path, spec: &LinkSpec) -> Result<LinkOutcome, HookError> {
    let parent = spec.link.parent().unwrap_or(Path::new("/"));
    let name = spec.link.file_name().ok_or_else(|| HookError::Link { link: spec.link.display().to_string() })?;
    let path = resolve_dir(rootfs, parent)?.join(name);
    match std::fs::symlink_metadata(&path) {
        Ok(m)
            if m.file_type().is_symlink()
                && std::fs::read_link(&path).is_ok_and(|t| t.as_os_str() == spec.target.as_str()) =>
        {
            return Ok(LinkOutcome::Unchanged);
        }
        Ok(m) if m.is_dir() => return Err(HookError::Unsafe { path }),
        _ => {}
    }
    let mut tmp_name = OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".edra-tmp-{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    crate::util::replace_atomically(&path, &tmp, |tmp| std::os::unix::fs::symlink(&spec.target, tmp))
        .map_err(|source| HookError::Write { path, source })?;
    Ok(LinkOutcome::Written)
}

/// The whole `create-symlinks` hook: arguments checked first, then the state from `stdin`,
/// then each link in order.
pub fn create_symlinks(stdin: impl Read, links: &[String]) -> Result<(), HookError> {
    let specs = links.iter().map(|l| parse_link(l)).collect::<Result<Vec<_>, _>>()?;
    let rootfs = super::read_state(stdin)?.rootfs;
    for spec in &specs {
        create_link(&rootfs, spec)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
