//! Path safety: containment checks and the one removal function crew uses.
//!
//! Containment is decided component by component on paths whose symlinks were resolved by the
//! file system, never by string prefixes (`/a/b` does not contain `/a/b-evil`) and never by
//! `path-clean`, which only tidies paths for display and lexical comparison.

use std::io;
use std::path::{Component, Path, PathBuf};

use camino::{Utf8Component, Utf8Path, Utf8PathBuf};

/// A path crew cannot use as a workspace or state location.
#[derive(Debug, thiserror::Error)]
pub enum WorkspacePathError {
    /// The path could not be resolved (it is missing, or a link on the way is broken).
    #[error("failed to resolve {path}")]
    Resolve {
        /// The path as given.
        path: String,
        /// Why it could not be resolved.
        #[source]
        source: io::Error,
    },
    /// The resolved path is not UTF-8.
    #[error(
        "path {path} is not valid UTF-8; crew needs UTF-8 paths to record and compare workspaces"
    )]
    NotUtf8 {
        /// The path as given, with what is not UTF-8 replaced.
        path: String,
    },
}

/// Resolves every symlink, `.` and `..` of an existing path and checks that it is UTF-8.
pub fn canonical_utf8(path: &Path) -> Result<Utf8PathBuf, WorkspacePathError> {
    let canonical = path
        .canonicalize()
        .map_err(|source| WorkspacePathError::Resolve {
            path: path.to_string_lossy().into_owned(),
            source,
        })?;
    Utf8PathBuf::from_path_buf(canonical).map_err(|path| WorkspacePathError::NotUtf8 {
        path: path.to_string_lossy().into_owned(),
    })
}

/// A path that would leave the root it must stay in.
#[derive(Debug, thiserror::Error)]
pub enum ContainmentError {
    /// The path leads outside the root.
    #[error("path {path} leaves {root}")]
    Escapes {
        /// The path as given.
        path: String,
        /// The root it must stay in.
        root: Utf8PathBuf,
    },
    /// The root is relative.
    #[error("root {root} must be an absolute path")]
    RelativeRoot {
        /// The root.
        root: Utf8PathBuf,
    },
    /// The path could not be resolved.
    #[error("failed to resolve {path}")]
    Resolve {
        /// The path.
        path: Utf8PathBuf,
        /// Why it could not be resolved.
        #[source]
        source: io::Error,
    },
    /// The path is not UTF-8.
    #[error("path {path} is not valid UTF-8")]
    NotUtf8 {
        /// The path as given, with what is not UTF-8 replaced.
        path: String,
    },
}

/// `true` when `path` is `base` or lies below it, compared component by component.
/// Both paths must already be normalized (absolute, no `.` or `..`).
pub fn is_within(base: &Utf8Path, path: &Utf8Path) -> bool {
    path.starts_with(base)
}

/// Joins `relative` onto `root` and checks, without touching the file system, that the result
/// stays inside `root`. `..` components are applied lexically and may not climb above `root`;
/// an absolute `relative` must already lie inside `root`.
///
/// Lexical containment says nothing about symlinks: use [`resolve_real_contained_path`] before
/// acting on a path that may cross one.
pub fn resolve_contained_path(
    root: &Utf8Path,
    relative: &Utf8Path,
) -> Result<Utf8PathBuf, ContainmentError> {
    if !root.is_absolute() {
        return Err(ContainmentError::RelativeRoot {
            root: root.to_owned(),
        });
    }
    let root = normalize_lexically(root);
    let joined = normalize_lexically(&root.join(relative));
    if is_within(&root, &joined) {
        Ok(joined)
    } else {
        Err(ContainmentError::Escapes {
            path: relative.to_string(),
            root,
        })
    }
}

/// Like [`resolve_contained_path`], then resolves the symlinks of the nearest existing ancestor
/// of the result and checks again against the resolved root: a symlink inside `root` pointing
/// out of it is an escape. The part of the path that does not exist yet is appended as is.
pub fn resolve_real_contained_path(
    root: &Utf8Path,
    relative: &Utf8Path,
) -> Result<Utf8PathBuf, ContainmentError> {
    let lexical = resolve_contained_path(root, relative)?;
    let real_root = canonical_for_containment(root)?;
    let mut existing = lexical.as_path();
    let mut missing: Vec<&str> = Vec::new();
    let real_existing = loop {
        match existing.as_std_path().canonicalize() {
            Ok(real) => break real,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                let Some(name) = existing.file_name() else {
                    return Err(ContainmentError::Resolve {
                        path: lexical.clone(),
                        source: error,
                    });
                };
                missing.push(name);
                existing = existing.parent().ok_or_else(|| ContainmentError::Resolve {
                    path: lexical.clone(),
                    source: io::Error::from(io::ErrorKind::NotFound),
                })?;
            }
            Err(source) => {
                return Err(ContainmentError::Resolve {
                    path: existing.to_owned(),
                    source,
                });
            }
        }
    };
    let mut real = utf8(real_existing)?;
    for name in missing.iter().rev() {
        real.push(name);
    }
    if is_within(&real_root, &real) {
        Ok(real)
    } else {
        Err(ContainmentError::Escapes {
            path: relative.to_string(),
            root: real_root,
        })
    }
}

/// Applies `.` and `..` without looking at the file system. `..` at the root stays at the root.
pub fn normalize_lexically(path: &Utf8Path) -> Utf8PathBuf {
    let mut out = Utf8PathBuf::new();
    for component in path.components() {
        match component {
            Utf8Component::CurDir => {}
            Utf8Component::ParentDir => match out.components().next_back() {
                Some(Utf8Component::Normal(_)) => {
                    out.pop();
                }
                Some(Utf8Component::RootDir | Utf8Component::Prefix(_)) => {}
                Some(Utf8Component::ParentDir | Utf8Component::CurDir) | None => out.push(".."),
            },
            other => out.push(other.as_str()),
        }
    }
    out
}

/// A tidy rendering of a path for messages: `a/./b/../c/` shows as `a/c`.
pub fn display_clean(path: &Utf8Path) -> String {
    path_clean::clean(path.as_std_path())
        .to_string_lossy()
        .into_owned()
}

fn canonical_for_containment(path: &Utf8Path) -> Result<Utf8PathBuf, ContainmentError> {
    let real = path
        .as_std_path()
        .canonicalize()
        .map_err(|source| ContainmentError::Resolve {
            path: path.to_owned(),
            source,
        })?;
    utf8(real)
}

fn utf8(path: PathBuf) -> Result<Utf8PathBuf, ContainmentError> {
    Utf8PathBuf::from_path_buf(path).map_err(|path| ContainmentError::NotUtf8 {
        path: path.to_string_lossy().into_owned(),
    })
}

/// Which directory a workspace is, recorded when crew creates it: its device and inode, read
/// without following symlinks. A workspace whose path no longer names this directory (the agent
/// renamed it, or replaced it with a link to somewhere else) is not crew's to commit into,
/// clean or delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DirIdentity {
    /// The device.
    pub dev: u64,
    /// The inode number.
    pub ino: u64,
}

impl DirIdentity {
    /// The identity of the directory at `path` reached with no link at any level of it: one
    /// on the way (a level swapped for a link) is an error, never followed. For crew's own
    /// paths, built from a canonical root, which hold no link unless one was planted.
    pub fn of(path: &Utf8Path) -> io::Result<Self> {
        let dir = open_dir_without_links(path.as_std_path())?;
        let stat = rustix::fs::fstat(&dir)?;
        Ok(DirIdentity {
            dev: stat.st_dev,
            ino: stat.st_ino,
        })
    }

    /// Whether `path` still names this very directory, reached with no link on the way (see
    /// [`DirIdentity::of`]). Why not, when it does not.
    pub fn check(&self, path: &Utf8Path) -> Result<(), String> {
        self.open_checked(path, path).map(drop)
    }

    /// The directory `within` (`root` itself or a directory beneath it) held open (`O_PATH`),
    /// when `root` still names this very directory, reached with no link on the way: `root` is
    /// opened and checked, and `within` opened beneath that handle with no link followed
    /// (`RESOLVE_BENEATH`), so a swap of any level after the check leads nowhere else. Why
    /// not, when it does not.
    pub fn open_checked(
        &self,
        root: &Utf8Path,
        within: &Utf8Path,
    ) -> Result<rustix::fd::OwnedFd, String> {
        let opened = open_dir_without_links(root.as_std_path()).and_then(|dir| {
            let stat = rustix::fs::fstat(&dir)?;
            Ok((
                dir,
                DirIdentity {
                    dev: stat.st_dev,
                    ino: stat.st_ino,
                },
            ))
        });
        let dir = match opened {
            Ok((dir, found)) if found == *self => dir,
            Ok(_) => {
                return Err(format!(
                    "{root} is no longer the directory crew created there (it was replaced)"
                ));
            }
            Err(error) => return Err(Self::unreachable(root, &error)),
        };
        let Ok(relative) = within.strip_prefix(root) else {
            return Err(format!("{within} is not inside {root}"));
        };
        if relative.as_str().is_empty() {
            return Ok(dir);
        }
        use rustix::fs::{Mode, OFlags, ResolveFlags};
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let failed = |errno: rustix::io::Errno| Self::unreachable(within, &errno.into());
        match rustix::fs::openat2(
            &dir,
            relative.as_std_path(),
            flags,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) {
            Err(rustix::io::Errno::NOSYS) => {}
            opened => return opened.map_err(failed),
        }
        // No `openat2`: level by level, none a link, none leading up.
        let mut dir = dir;
        for part in relative.components() {
            let camino::Utf8Component::Normal(name) = part else {
                return Err(format!("{within} is not inside {root}"));
            };
            dir = rustix::fs::openat(&dir, name, flags | OFlags::NOFOLLOW, Mode::empty())
                .map_err(failed)?;
        }
        Ok(dir)
    }

    /// Why the directory at `path` could not be reached as crew made it.
    fn unreachable(path: &Utf8Path, error: &io::Error) -> String {
        match error {
            error if error.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
                format!("{path} is reached through a link, not the directory crew created there")
            }
            error if error.raw_os_error() == Some(rustix::io::Errno::XDEV.raw_os_error()) => {
                format!("{path} leads out of the directory crew created")
            }
            error if error.kind() == io::ErrorKind::NotFound => format!("{path} is gone"),
            error => format!("{path} is no longer the directory crew created there: {error}"),
        }
    }
}

/// What [`remove_contained`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removed {
    /// Nothing was there.
    Absent,
    /// A symlink was removed as a link; its target was not touched.
    Symlink,
    /// A file was removed.
    File,
    /// A directory was removed with everything in it.
    Directory,
}

/// A removal crew refused or could not finish.
#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    /// The path lies outside every root given.
    #[error("refusing to remove {path}: it is not inside any of {roots:?}")]
    OutsideRoots {
        /// The path.
        path: Utf8PathBuf,
        /// The roots it must lie in.
        roots: Vec<Utf8PathBuf>,
    },
    /// The path is relative or holds `.` or `..`.
    #[error("refusing to remove {path}: the path must be absolute and free of `.` and `..`")]
    NotNormalized {
        /// The path.
        path: Utf8PathBuf,
    },
    /// The path's directory could not be resolved.
    #[error("failed to resolve {path} before removing it")]
    Resolve {
        /// The path.
        path: Utf8PathBuf,
        /// Why it could not be resolved.
        #[source]
        source: io::Error,
    },
    /// The removal failed partway or at once.
    #[error("failed to remove {path}")]
    Remove {
        /// The path.
        path: Utf8PathBuf,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
}

/// Removes `path` — a file, a symlink (as a link) or a whole directory tree — only when its real
/// location lies strictly inside one of `roots`. Symlinks are never followed: neither `path`
/// itself nor anything below it, so a link to `$HOME` inside a workspace removes the link only.
///
/// The parent of `path` is resolved through the file system, so a symlinked ancestor that points
/// out of the roots is refused.
pub fn remove_contained(path: &Utf8Path, roots: &[&Utf8Path]) -> Result<Removed, RemoveError> {
    let has_dots = path
        .as_std_path()
        .components()
        .any(|c| matches!(c, Component::CurDir | Component::ParentDir));
    if !path.is_absolute() || has_dots {
        return Err(RemoveError::NotNormalized {
            path: path.to_owned(),
        });
    }
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(RemoveError::OutsideRoots {
            path: path.to_owned(),
            roots: roots.iter().map(|root| root.to_path_buf()).collect(),
        });
    };
    let real_parent = match parent.as_std_path().canonicalize() {
        Ok(real) => real,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Removed::Absent),
        Err(source) => {
            return Err(RemoveError::Resolve {
                path: parent.to_owned(),
                source,
            });
        }
    };
    let real_path = real_parent.join(name);
    let inside = roots.iter().any(|root| {
        root.as_std_path()
            .canonicalize()
            .is_ok_and(|real_root| real_path.starts_with(&real_root) && real_path != real_root)
    });
    if !inside {
        return Err(RemoveError::OutsideRoots {
            path: path.to_owned(),
            roots: roots.iter().map(|root| root.to_path_buf()).collect(),
        });
    }
    let removal_error = |source| RemoveError::Remove {
        path: path.to_owned(),
        source,
    };
    // From here on by handle, never by the path again: its directory is reached once more with
    // no link anywhere on the way (a level swapped for a link since it was resolved is refused,
    // never followed out of the roots), and the entry is removed beneath that handle.
    let parent = match open_dir_without_links(&real_parent) {
        Ok(parent) => parent,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Removed::Absent),
        Err(source) => return Err(removal_error(source)),
    };
    let name = std::ffi::CString::new(name)
        .map_err(|error| removal_error(io::Error::new(io::ErrorKind::InvalidInput, error)))?;
    match remove_beneath(&parent, &name) {
        // Its directory read-only (an agent's `chmod 555`): its owner may write there again.
        Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
            if give_owner_access(&parent).map_err(removal_error)? {
                remove_beneath(&parent, &name).map_err(removal_error)
            } else {
                Err(removal_error(error))
            }
        }
        removed => removed.map_err(removal_error),
    }
}

/// Gives the owner of the directory open at `dir` (any handle, `O_PATH` too) back reading,
/// writing and entering it, where that was taken away (an agent's `chmod 555`, a Go module
/// cache's read-only directories): crew's workspaces must stay savable and removable by the
/// user who owns them. Through `/proc/self/fd`, which names the very directory open, never a
/// link. `false` when the owner had them; an error when they cannot be given back (a
/// directory of another user's).
pub fn give_owner_access(dir: &impl rustix::fd::AsFd) -> io::Result<bool> {
    use rustix::fd::AsRawFd;
    let mode = rustix::fs::fstat(dir)?.st_mode;
    if mode & 0o700 == 0o700 {
        return Ok(false);
    }
    let handle = format!("/proc/self/fd/{}", dir.as_fd().as_raw_fd());
    rustix::fs::chmod(
        handle.as_str(),
        rustix::fs::Mode::from_raw_mode((mode & 0o7777) | 0o700),
    )?;
    Ok(true)
}

/// [`give_owner_access`] for the directory open at `root` and every directory beneath it,
/// never following a link below it: how many needed it. For the rare workspace an operation
/// found read-only; a whole walk.
pub fn give_owner_access_below(root: &impl rustix::fd::AsFd) -> io::Result<usize> {
    let dir = rustix::fs::openat(
        root,
        ".",
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let mut given = usize::from(give_owner_access(&dir)?);
    let mut pending = vec![reopen_readable(&dir)?];
    while let Some(dir) = pending.pop() {
        for entry in rustix::fs::Dir::read_from(&dir)? {
            let entry = entry?;
            let name = entry.file_name();
            if entry.file_type() != rustix::fs::FileType::Directory
                || name.to_bytes() == b"."
                || name.to_bytes() == b".."
            {
                continue;
            }
            let child = rustix::fs::openat(
                &dir,
                name,
                rustix::fs::OFlags::PATH
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::NOFOLLOW
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )?;
            given += usize::from(give_owner_access(&child)?);
            pending.push(reopen_readable(&child)?);
        }
    }
    Ok(given)
}

/// [`give_owner_access`] for `root` and each directory from it down to `relative` (itself
/// included when it is one), never following a link: what moving `relative` out of `root`
/// needs (its directory writable, and itself, as renaming a directory rewrites its `..`).
pub fn give_owner_access_along(root: &Path, relative: &Path) -> io::Result<()> {
    use rustix::fs::{Mode, OFlags};
    let mut dir = open_dir_without_links(root)?;
    give_owner_access(&dir)?;
    for part in relative.components() {
        let Component::Normal(name) = part else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a plain relative path", relative.display()),
            ));
        };
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rustix::fs::openat(&dir, name, flags, Mode::empty()) {
            Ok(next) => dir = next,
            // A file (or a link) at the end: its directory was the last to need it.
            Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => return Ok(()),
            Err(errno) => return Err(errno.into()),
        }
        give_owner_access(&dir)?;
    }
    Ok(())
}

/// The directory open at `dir` (an `O_PATH` handle), opened again for reading its entries.
fn reopen_readable(dir: &rustix::fd::OwnedFd) -> io::Result<rustix::fd::OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    Ok(rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// A directory crew holds open while it fills it: what it writes there goes through
/// [`HeldDir::path`], which names this very directory whatever is done meanwhile to the path
/// it was opened by (a level of it renamed away and a link to elsewhere put in its place).
#[derive(Debug)]
pub struct HeldDir {
    fd: rustix::fd::OwnedFd,
}

impl HeldDir {
    /// Holds the directory `path`, reached with no link at any level.
    pub fn open(path: &Path) -> io::Result<Self> {
        Ok(HeldDir {
            fd: open_dir_without_links(path)?,
        })
    }

    /// Holds the directory open at `fd` (an `O_PATH` handle will do).
    pub fn from_fd(fd: rustix::fd::OwnedFd) -> Self {
        HeldDir { fd }
    }

    /// `/proc/self/fd/<n>`: a path to the directory held, for what takes a path (git, a
    /// child's working directory, which is entered before its `exec` closes the handle).
    pub fn path(&self) -> Utf8PathBuf {
        use rustix::fd::AsRawFd;
        Utf8PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }
}

/// Opens the directory `path` for the `*at` calls (`O_PATH`), refusing a link at any level of
/// it (`RESOLVE_NO_SYMLINKS`; level by level with `O_NOFOLLOW` where the kernel lacks
/// `openat2`).
pub fn open_dir_without_links(path: &Path) -> io::Result<rustix::fd::OwnedFd> {
    use rustix::fs::{CWD, Mode, OFlags, ResolveFlags};
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    match rustix::fs::openat2(
        CWD,
        path,
        flags,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    ) {
        Err(rustix::io::Errno::NOSYS) => {}
        opened => return opened.map_err(io::Error::from),
    }
    let mut dir = rustix::fs::open("/", flags, Mode::empty())?;
    for part in path.components() {
        if let Component::Normal(name) = part {
            dir = rustix::fs::openat(&dir, name, flags | OFlags::NOFOLLOW, Mode::empty())?;
        }
    }
    Ok(dir)
}

/// Removes the entry `name` of the directory `dir`: a link or file by `unlinkat`, a directory
/// with everything in it, each level opened beneath the one above without following a link
/// (one swapped for a link meanwhile is removed as a link).
fn remove_beneath(dir: &rustix::fd::OwnedFd, name: &std::ffi::CStr) -> io::Result<Removed> {
    use rustix::fs::{AtFlags, FileType, Mode, OFlags};
    let stat = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(rustix::io::Errno::NOENT) => return Ok(Removed::Absent),
        Err(errno) => return Err(errno.into()),
    };
    let kind = FileType::from_raw_mode(stat.st_mode);
    if kind == FileType::Directory {
        if stat.st_mode & 0o700 != 0o700 {
            // Read-only or closed to its owner: given back to empty it. (A link put in its
            // place meanwhile is refused by `NOFOLLOW`, never changed.)
            let handle = rustix::fs::openat(
                dir,
                name,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            );
            if let Ok(handle) = handle {
                // One it cannot be given back fails below, where it is read or emptied.
                let _ = give_owner_access(&handle);
            }
        }
        let opened = rustix::fs::openat(
            dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        );
        match opened {
            Ok(child) => {
                remove_children(child)?;
                rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
                return Ok(Removed::Directory);
            }
            // Swapped for a link (or a file) since: that is what goes.
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {}
            Err(errno) => return Err(errno.into()),
        }
    }
    rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
    Ok(if kind == FileType::Symlink {
        Removed::Symlink
    } else {
        Removed::File
    })
}

/// Removes everything in the open directory `dir`.
fn remove_children(dir: rustix::fd::OwnedFd) -> io::Result<()> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(&dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(entry.file_name().to_owned());
        }
    }
    for name in names {
        remove_beneath(&dir, &name)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containment_is_component_wise() {
        assert!(is_within(Utf8Path::new("/a/b"), Utf8Path::new("/a/b/c")));
        assert!(is_within(Utf8Path::new("/a/b"), Utf8Path::new("/a/b")));
        assert!(!is_within(
            Utf8Path::new("/a/b"),
            Utf8Path::new("/a/b-evil")
        ));
        assert!(!is_within(Utf8Path::new("/a/b"), Utf8Path::new("/a")));
    }

    #[test]
    fn lexical_resolution_refuses_climbing_out() {
        let root = Utf8Path::new("/work/project");
        assert_eq!(
            resolve_contained_path(root, Utf8Path::new("a/../b")).unwrap(),
            "/work/project/b"
        );
        assert!(resolve_contained_path(root, Utf8Path::new("../project-evil/x")).is_err());
        assert!(resolve_contained_path(root, Utf8Path::new("a/../../x")).is_err());
        assert!(resolve_contained_path(root, Utf8Path::new("/etc/passwd")).is_err());
        assert_eq!(
            resolve_contained_path(root, Utf8Path::new("/work/project/x")).unwrap(),
            "/work/project/x"
        );
    }

    /// A racing process flips the directory holding what crew removes between the real one
    /// and a link to a decoy laid out the same way, as fast as it can, for hundreds of
    /// removals: whatever moment a flip lands on, nothing of the decoy goes.
    #[test]
    fn a_directory_flipped_to_a_link_mid_removal_never_leads_out_of_the_roots() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let temp = tempfile::tempdir().unwrap();
        let base = Utf8PathBuf::from_path_buf(temp.path().canonicalize().unwrap()).unwrap();
        let (root, decoy) = (base.join("root"), base.join("decoy"));
        let (flipped, aside) = (root.join("ws"), root.join("ws.aside"));
        const ENTRIES: usize = 800;
        for entry in 0..ENTRIES {
            for dir in [&flipped, &decoy] {
                std::fs::create_dir_all(dir.join(format!("e{entry}/inner"))).unwrap();
                std::fs::write(dir.join(format!("e{entry}/inner/file")), "x").unwrap();
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flipper = {
            let (flipped, aside, decoy, stop) =
                (flipped.clone(), aside.clone(), decoy.clone(), stop.clone());
            std::thread::spawn(move || {
                // Each state held a moment, a little longer each round (1 to 64 µs), so that
                // some flip lands between any two steps of a removal.
                let hold = |round: u32| {
                    let until = std::time::Instant::now()
                        + std::time::Duration::from_micros(1 << (round % 7));
                    while std::time::Instant::now() < until {
                        std::hint::spin_loop();
                    }
                };
                let mut round = 0;
                while !stop.load(Ordering::Relaxed) {
                    std::fs::rename(&flipped, &aside).unwrap();
                    std::os::unix::fs::symlink(&decoy, &flipped).unwrap();
                    hold(round);
                    std::fs::remove_file(&flipped).unwrap();
                    std::fs::rename(&aside, &flipped).unwrap();
                    hold(round / 7);
                    round += 1;
                }
            })
        };
        let mut removed = 0;
        for entry in 0..ENTRIES {
            if let Ok(Removed::Directory) =
                remove_contained(&flipped.join(format!("e{entry}")), &[&root])
            {
                removed += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        flipper.join().unwrap();
        let left = (0..ENTRIES)
            .filter(|entry| decoy.join(format!("e{entry}/inner/file")).exists())
            .count();
        assert_eq!(left, ENTRIES, "the decoy lost {} entries", ENTRIES - left);
        // And crew's own did go, whenever the directory was the real one.
        let kept = (0..ENTRIES)
            .filter(|entry| flipped.join(format!("e{entry}")).exists())
            .count();
        assert!(removed > 0, "none removed");
        assert_eq!(kept, ENTRIES - removed, "each one said removed is gone");
    }

    #[test]
    fn normalize_keeps_leading_parent_of_relative_paths() {
        assert_eq!(normalize_lexically(Utf8Path::new("../a/./b/..")), "../a");
        assert_eq!(normalize_lexically(Utf8Path::new("/../a")), "/a");
        assert_eq!(normalize_lexically(Utf8Path::new("../../a")), "../../a");
    }
}
