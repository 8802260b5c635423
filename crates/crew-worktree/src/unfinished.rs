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

use camino::Utf8Path;
use crew_core::config::WorktreeSettings;
use crew_core::{RunId, TaskId};

use crate::admin::{self, INITIALIZING};
use crate::error::{ListWorktreesError, PrepareWorktreeError};
use crate::leader;
use crate::names::TaskNames;
use crate::trash;

/// Whether the admin entry of a crew worktree says its preparation never finished.
pub fn is_unfinished(locked: Option<&str>) -> bool {
    locked == Some(INITIALIZING)
}

/// Takes away the task's worktree when a preparation that died left it unfinished: its
/// directory goes to the trash (deleted once the lock is released) and its admin entry is
/// removed. Run under the repository lock, by the one preparing this task (so no one else is).
/// Whether there was something unfinished.
pub fn take_away(
    common: &Utf8Path,
    repo_root: &Utf8Path,
    settings: &WorktreeSettings,
    names: &TaskNames,
) -> Result<bool, PrepareWorktreeError> {
    let Some(entry) = admin::read_entry(common, &names.admin) else {
        return Ok(false);
    };
    if !is_unfinished(entry.locked.as_deref()) {
        return Ok(false);
    }
    trash::discard(repo_root, settings, &names.root);
    admin::remove_entry(common, &names.admin).map_err(|error| {
        let chain = std::iter::successors(Some(&error as &dyn std::error::Error), |error| {
            error.source()
        });
        PrepareWorktreeError::Unfinished {
            path: names.root.clone(),
            problem: chain
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(": "),
        }
    })?;
    Ok(true)
}

/// Takes away the unfinished worktrees of `tasks` of the finished run `run_id` (no host
/// prepares them any more), under the repository lock; what goes is deleted once it is
/// released. Returns the tasks whose worktree went. A dry run only says which would.
pub fn take_away_of_run(
    repo_root: &Utf8Path,
    settings: &WorktreeSettings,
    run_id: &RunId,
    tasks: &[TaskId],
    dry_run: bool,
) -> Result<Vec<TaskId>, ListWorktreesError> {
    let repo = leader::open(Some(repo_root), repo_root)?;
    let common = leader::common_dir(&repo);
    let _lock = trash::repo_lock(&common).map_err(ListWorktreesError::Lock)?;
    let mut gone = Vec::new();
    for task in tasks {
        let names = TaskNames::new(repo_root, settings, run_id, task);
        let unfinished = admin::read_entry(&common, &names.admin)
            .is_some_and(|entry| is_unfinished(entry.locked.as_deref()));
        if unfinished && (dry_run || take_away(&common, repo_root, settings, &names)?) {
            gone.push(task.clone());
        }
    }
    Ok(gone)
}
