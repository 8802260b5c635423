//! git's worktree administration files, read and written directly.
//!
//! A linked worktree is a directory whose `.git` file says `gitdir: <common>/worktrees/<name>`,
//! and an admin directory holding `gitdir` (the path of that `.git` file), `commondir`, `HEAD`,
//! the worktree's `index`, and `locked` while it is locked. This is the layout git documents in
//! gitrepository-layout(5) and writes itself. crew writes it directly so that the admin part of
//! creating a worktree takes milliseconds under the repository lock, and the checkout runs
//! outside it.

use std::io;

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::fsutil::{FileError, ensure_real_dir, read_nofollow, write_atomic};
use crew_core::paths::{RemoveError, remove_contained};

/// The lock reason crew writes while creating a worktree, so that no prune removes it
/// half-made.
pub const INITIALIZING: &str = "crew: initializing";

/// One entry of `<common>/worktrees/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminEntry {
    /// The entry's name (its directory under `worktrees/`).
    pub name: String,
    /// Its directory: `<common>/worktrees/<name>`.
    pub dir: Utf8PathBuf,
    /// The worktree directory, from the `gitdir` file (without its trailing `/.git`).
    pub worktree: Option<Utf8PathBuf>,
    /// The branch HEAD points to, when it is a symbolic ref to `refs/heads/…`.
    pub branch: Option<String>,
    /// The lock reason, when the worktree is locked (empty string for a reasonless lock).
    pub locked: Option<String>,
}

impl AdminEntry {
    /// The worktree directory exists and its `.git` file points back at this entry (or at its
    /// agent git directory, beneath it: see [`crate::agent_git`]).
    pub fn is_valid(&self) -> bool {
        let Some(worktree) = &self.worktree else {
            return false;
        };
        let Ok(contents) = std::fs::read_to_string(worktree.join(".git")) else {
            return false;
        };
        contents
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("gitdir:"))
            .is_some_and(|gitdir| {
                let gitdir = Utf8Path::new(gitdir.trim());
                gitdir == self.dir || gitdir == self.dir.join(crate::agent_git::AGENT_DIR)
            })
    }

    /// Whether crew locked it (its lock reason starts with `crew`).
    pub fn is_crew_locked(&self) -> bool {
        self.locked
            .as_deref()
            .is_some_and(|reason| reason.starts_with("crew"))
    }
}

/// `<common>/worktrees`
pub fn admin_root(common: &Utf8Path) -> Utf8PathBuf {
    common.join("worktrees")
}

/// Reads one admin entry; `None` when it does not exist.
pub fn read_entry(common: &Utf8Path, name: &str) -> Option<AdminEntry> {
    let dir = admin_root(common).join(name);
    if !dir.is_dir() {
        return None;
    }
    let worktree = read_text(&dir.join("gitdir")).and_then(|gitdir| {
        let gitdir = Utf8PathBuf::from(gitdir.trim());
        let gitdir = if gitdir.is_absolute() {
            gitdir
        } else {
            dir.join(gitdir)
        };
        gitdir.parent().map(Utf8Path::to_owned)
    });
    let branch = read_text(&dir.join("HEAD")).and_then(|head| {
        head.trim()
            .strip_prefix("ref: refs/heads/")
            .map(str::to_owned)
    });
    let locked = read_text(&dir.join("locked")).map(|reason| reason.trim().to_owned());
    Some(AdminEntry {
        name: name.to_owned(),
        dir,
        worktree,
        branch,
        locked,
    })
}

/// Every admin entry of the repository.
pub fn read_entries(common: &Utf8Path) -> Vec<AdminEntry> {
    let Ok(entries) = admin_root(common).read_dir_utf8() else {
        return Vec::new();
    };
    let mut found: Vec<AdminEntry> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| read_entry(common, entry.file_name()))
        .collect();
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

fn read_text(path: &Utf8Path) -> Option<String> {
    read_nofollow(path)
        .ok()
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

/// What an admin entry's `commondir` says: the common directory, two levels up.
pub const COMMONDIR: &str = "../..\n";

/// Writes the admin entry `name` for a worktree at `worktree_root` on `branch`, locked with
/// [`INITIALIZING`], and the worktree's `.git` file. The worktree directory must exist and be
/// empty; the admin entry must not exist.
///
/// `worktree_root` is `(where it is, the path to write its `.git` through)`: the second the
/// held directory's handle (see `crew_core::paths::HeldDir`).
pub fn write_entry(
    common: &Utf8Path,
    name: &str,
    (worktree_root, through): (&Utf8Path, &Utf8Path),
    branch_ref: &str,
) -> Result<Utf8PathBuf, FileError> {
    let root = admin_root(common);
    ensure_real_dir(&root)?;
    let dir = root.join(name);
    std::fs::create_dir(&dir).map_err(|source| FileError::CreateDir {
        path: dir.clone(),
        source,
    })?;
    // `locked` first: from here on, `git worktree prune` leaves the entry alone.
    write_atomic(&dir.join("locked"), INITIALIZING.as_bytes())?;
    write_atomic(&dir.join("commondir"), COMMONDIR.as_bytes())?;
    write_atomic(&dir.join("HEAD"), format!("ref: {branch_ref}\n").as_bytes())?;
    write_atomic(
        &dir.join("gitdir"),
        format!("{worktree_root}/.git\n").as_bytes(),
    )?;
    write_atomic(&through.join(".git"), format!("gitdir: {dir}\n").as_bytes())?;
    Ok(dir)
}

/// Locks the worktree with `reason`, or unlocks it with `None`.
pub fn set_lock(common: &Utf8Path, name: &str, reason: Option<&str>) -> Result<(), FileError> {
    let path = admin_root(common).join(name).join("locked");
    match reason {
        Some(reason) => write_atomic(&path, reason.as_bytes()),
        None => match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(FileError::Write { path, source }),
        },
    }
}

/// Removes the admin entry `name` (git's "prune" of one worktree).
pub fn remove_entry(common: &Utf8Path, name: &str) -> Result<(), RemoveError> {
    let root = admin_root(common);
    remove_contained(&root.join(name), &[&root]).map(drop)
}

/// Removes crew's admin entries that are invalid and unlocked by anyone but crew's own
/// initialization: leftovers of a failed or crashed creation. Such leftovers make later adds
/// fail with a false "already checked out". Returns the names removed.
pub fn sweep_invalid(common: &Utf8Path, crew_prefix: &str) -> Vec<String> {
    let mut swept = Vec::new();
    for entry in read_entries(common) {
        let ours = entry.name.starts_with(&format!("{crew_prefix}-"));
        let user_locked = entry.locked.is_some() && !entry.is_crew_locked();
        if !ours || user_locked || entry.is_valid() {
            continue;
        }
        // Sweeps run under the repository lock, and creation writes a complete entry before
        // letting go of it: an invalid entry seen here is a leftover, not one being made.
        let directory_gone = entry
            .worktree
            .as_ref()
            .is_none_or(|worktree| !worktree.exists());
        if directory_gone && remove_entry(common, &entry.name).is_ok() {
            swept.push(entry.name);
        }
    }
    swept
}

/// Moves a registered worktree: its directory from `from` to `to` (both beneath `beneath`, the
/// repository's root: moved through directory handles from there down, never through a level
/// swapped for a link) and its admin entry from `old_name` to `new_name`, rewriting both
/// pointer files. Run under the repository lock. Every step is a rename or a small file
/// written atomically; the worktree's files are not touched.
pub fn relocate(
    common: &Utf8Path,
    old_name: &str,
    new_name: &str,
    (from, to): (&Utf8Path, &Utf8Path),
    beneath: &Utf8Path,
) -> Result<(), FileError> {
    let root = admin_root(common);
    let old_dir = root.join(old_name);
    let new_dir = root.join(new_name);
    let rename = |from: &Utf8Path, to: &Utf8Path| {
        std::fs::rename(from, to).map_err(|source| FileError::Write {
            path: to.to_owned(),
            source,
        })
    };
    rename(&old_dir, &new_dir)?;
    write_atomic(
        &from.join(".git"),
        format!("gitdir: {new_dir}\n").as_bytes(),
    )?;
    crew_core::fsutil::rename_beneath(beneath, from, to)?;
    write_atomic(&new_dir.join("gitdir"), format!("{to}/.git\n").as_bytes())
}

/// Points the worktree's HEAD at `target`: `ref: refs/heads/<branch>`, or a commit id to
/// detach it.
pub fn set_head(common: &Utf8Path, name: &str, target: &str) -> Result<(), FileError> {
    let path = admin_root(common).join(name).join("HEAD");
    write_atomic(&path, format!("{target}\n").as_bytes())
}
