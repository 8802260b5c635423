//! Keeping crew's own directories out of `git status` without touching a tracked file: crew adds
//! root-anchored patterns to the repository's `info/exclude`.
//!
//! This is plain file work on the git directory layout (`.git` directory, or a `.git` file with
//! `gitdir:` and a `commondir`), so crew-core needs no git library for it.

use std::io;

use camino::{Utf8Path, Utf8PathBuf};

use crate::fsutil::{FileError, ensure_real_dir, read_nofollow, write_atomic};

/// The exclude file could not be updated.
#[derive(Debug, thiserror::Error)]
pub enum ExcludeError {
    /// The repository's git directory could not be found.
    #[error("failed to locate the git directory of {repo_root}")]
    GitDir {
        /// The repository whose git directory was looked for.
        repo_root: Utf8PathBuf,
        /// Why it could not be found.
        #[source]
        source: io::Error,
    },
    /// The exclude file could not be written.
    #[error("failed to update {path}")]
    Update {
        /// The exclude file.
        path: Utf8PathBuf,
        /// Why it could not be written.
        #[source]
        source: FileError,
    },
}

/// The directory holding `info/`, `objects/` and `worktrees/` for the repository whose work
/// tree top level is `repo_root`: `.git` itself, or the common dir a linked worktree points to.
pub fn common_git_dir(repo_root: &Utf8Path) -> Result<Utf8PathBuf, io::Error> {
    let dot_git = repo_root.join(".git");
    let metadata = std::fs::symlink_metadata(&dot_git)?;
    if metadata.is_dir() {
        return Ok(dot_git);
    }
    let contents = std::fs::read_to_string(&dot_git)?;
    let gitdir = contents
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("gitdir:"))
        .map(str::trim)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "`.git` file without gitdir"))?;
    let gitdir = repo_root.join(gitdir);
    match std::fs::read_to_string(gitdir.join("commondir")) {
        Ok(common) => Ok(gitdir.join(common.trim())),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(gitdir),
        Err(error) => Err(error),
    }
}

/// Adds each root-anchored `pattern` (such as `/.crew/state/`) to `info/exclude` of the
/// repository at `repo_root`, unless a line with exactly that pattern is already there.
pub fn ensure_excluded(repo_root: &Utf8Path, patterns: &[String]) -> Result<(), ExcludeError> {
    let git_dir = common_git_dir(repo_root).map_err(|source| ExcludeError::GitDir {
        repo_root: repo_root.to_owned(),
        source,
    })?;
    let info = git_dir.join("info");
    let path = info.join("exclude");
    let update_error = |source| ExcludeError::Update {
        path: path.clone(),
        source,
    };
    ensure_real_dir(&info).map_err(update_error)?;
    let current = match read_nofollow(&path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(FileError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            String::new()
        }
        Err(error) => return Err(update_error(error)),
    };
    let missing: Vec<&String> = patterns
        .iter()
        .filter(|pattern| !current.lines().any(|line| line.trim() == pattern.as_str()))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let mut updated = current;
    if !updated.is_empty() && !updated.ends_with('\n') {
        updated.push('\n');
    }
    if !updated.contains("# crew") {
        updated.push_str("# crew: runtime state and task worktrees\n");
    }
    for pattern in missing {
        updated.push_str(pattern);
        updated.push('\n');
    }
    write_atomic(&path, updated.as_bytes()).map_err(update_error)
}

/// The root-anchored pattern for `path` (absolute, inside `repo_root`), as a directory pattern.
pub fn anchored_dir_pattern(repo_root: &Utf8Path, path: &Utf8Path) -> Option<String> {
    let relative = path.strip_prefix(repo_root).ok()?;
    if relative.as_str().is_empty() {
        return None;
    }
    Some(format!("/{relative}/"))
}
