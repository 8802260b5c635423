//! Worktrees whose preparation never finished: the host making one died between registering it
//! and handing it to its agent.
//!
//! A task's worktree stays locked [`INITIALIZING`] from its registration (or its taking from the
//! pool) until it is complete: files checked out, links and copies made, `setup` run, git
//! armed for the agent. Only then is it locked "in use" and its agent started. A worktree still
//! locked [`INITIALIZING`] when no live host is preparing it therefore holds nothing of an
//! agent's, and its files may be any part of a checkout: it is never handed to an agent as it
//! is. Its next preparation (the run resumed) makes it again from the task's branch, and
//! `crew worktrees prune` removes it. The branch itself is left as it is: a crashed
//! preparation never adds a commit to it.

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::config::WorktreeSettings;
use crew_core::fsutil::rename_beneath;
use crew_core::paths::remove_contained;

use crate::admin::{self, INITIALIZING};
use crate::error::PrepareWorktreeError;
use crate::names::{TRASH_DIR, TaskNames, worktrees_dir};

/// Whether the admin entry of a crew worktree says its preparation never finished.
pub fn is_unfinished(locked: Option<&str>) -> bool {
    locked == Some(INITIALIZING)
}

/// Takes away the task's worktree when a preparation that died left it unfinished: its
/// directory goes to the trash (a rename) and its admin entry is removed. Run under the
/// repository lock, by the one preparing this task (so no one else is). Returns what to delete
/// outside the lock with [`delete`]; `None` when there was nothing unfinished.
pub fn take_away(
    common: &Utf8Path,
    repo_root: &Utf8Path,
    settings: &WorktreeSettings,
    names: &TaskNames,
) -> Result<Option<Utf8PathBuf>, PrepareWorktreeError> {
    let failed = |problem: String| PrepareWorktreeError::Unfinished {
        path: names.root.clone(),
        problem,
    };
    let Some(entry) = admin::read_entry(common, &names.admin) else {
        return Ok(None);
    };
    if !is_unfinished(entry.locked.as_deref()) {
        return Ok(None);
    }
    let worktrees = worktrees_dir(repo_root, settings);
    let mut trash = None;
    if std::fs::symlink_metadata(&names.root).is_ok() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::SystemTime::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        let doomed = worktrees
            .join(TRASH_DIR)
            .join(format!("unfinished-{}-{nanos}", names.admin));
        rename_beneath(repo_root, &names.root, &doomed)
            .map_err(|error| failed(with_causes(&error)))?;
        trash = Some(doomed);
    }
    admin::remove_entry(common, &names.admin).map_err(|error| failed(with_causes(&error)))?;
    Ok(trash)
}

/// Deletes what [`take_away`] put in the trash. Best effort: what stays is crew's to sweep
/// (`crew worktrees prune` empties the trash).
pub fn delete(trash: &Utf8Path, repo_root: &Utf8Path, settings: &WorktreeSettings) {
    let worktrees = worktrees_dir(repo_root, settings);
    let _ = remove_contained(trash, &[&worktrees]);
}

/// `error` and each error beneath it, joined by `: `.
fn with_causes(error: &dyn std::error::Error) -> String {
    let chain = std::iter::successors(Some(error), |error| error.source());
    chain
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}
