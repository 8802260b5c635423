//! Names and places of a task's worktree, derived only from validated ids.

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::config::WorktreeSettings;
use crew_core::{RunId, TaskId};

/// The name of the pool directory under the worktrees directory.
pub const POOL_DIR: &str = ".pool";
/// Where torn-down worktrees wait to be deleted, outside the repository lock.
pub const TRASH_DIR: &str = ".trash";

/// Where a task's worktree lives and what it is called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskNames {
    /// `<prefix>/<runId>-<taskId>`
    pub branch: String,
    /// The admin entry under `.git/worktrees/`: flat, `<prefix with - for />-<runId>-<taskId>`.
    pub admin: String,
    /// `<repo-root>/<dir>/<runId>/<taskId>`
    pub root: Utf8PathBuf,
}

impl TaskNames {
    /// The names of `task_id` of `run_id` under the project's settings.
    pub fn new(
        repo_root: &Utf8Path,
        settings: &WorktreeSettings,
        run_id: &RunId,
        task_id: &TaskId,
    ) -> Self {
        TaskNames {
            branch: format!("{}/{run_id}-{task_id}", settings.branch_prefix),
            admin: format!("{}-{run_id}-{task_id}", admin_prefix(settings)),
            root: worktrees_dir(repo_root, settings)
                .join(run_id.as_str())
                .join(task_id.as_str()),
        }
    }

    /// The branch's full ref: `refs/heads/<branch>`.
    pub fn branch_ref(&self) -> String {
        format!("refs/heads/{}", self.branch)
    }
}

/// `<repo-root>/<dir>`: every crew worktree lives below it.
pub fn worktrees_dir(repo_root: &Utf8Path, settings: &WorktreeSettings) -> Utf8PathBuf {
    repo_root.join(&settings.dir)
}

/// The start of every crew admin entry name, e.g. `crew`.
pub fn admin_prefix(settings: &WorktreeSettings) -> String {
    settings.branch_prefix.replace('/', "-")
}

/// Splits a task branch name `<prefix>/<runId>-<taskId>` into its ids. A run a person named
/// (`refund-fix`) is recognised among `known` runs; no two of those can claim the same branch
/// (the state store refuses overlapping names).
pub fn parse_task_branch(
    settings: &WorktreeSettings,
    branch: &str,
    known: &[RunId],
) -> Option<(RunId, TaskId)> {
    let rest = branch
        .strip_prefix(&settings.branch_prefix)?
        .strip_prefix('/')?;
    // Only the named runs need looking up: a generated id is split off by its shape (and a
    // history of thousands of runs makes a scan of them all, per branch, the listing's cost).
    let named = known
        .iter()
        .filter(|run_id| run_id.created_millis().is_none())
        .find_map(|run_id| {
            let task = rest.strip_prefix(run_id.as_str())?.strip_prefix('-')?;
            Some((run_id.clone(), TaskId::parse(task).ok()?))
        });
    named.or_else(|| split_run_task(rest))
}

/// Splits `<runId>-<taskId>`. Run ids are 18 characters (`<8>-<9>`, or `<9>-<8>` from earlier
/// crews), so the split is unambiguous.
pub fn split_run_task(value: &str) -> Option<(RunId, TaskId)> {
    let run_len = 9 + 1 + 8;
    if value.len() <= run_len + 1 || value.as_bytes()[run_len] != b'-' {
        return None;
    }
    let run_id = RunId::parse(&value[..run_len]).ok()?;
    let task_id = TaskId::parse(&value[run_len + 1..]).ok()?;
    Some((run_id, task_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_flat_where_they_must_be() {
        let settings = WorktreeSettings {
            branch_prefix: "team/crew".into(),
            ..WorktreeSettings::default()
        };
        let run_id = RunId::generate();
        let task_id = TaskId::parse("api.v2").unwrap();
        let names = TaskNames::new(Utf8Path::new("/repo"), &settings, &run_id, &task_id);
        assert_eq!(names.branch, format!("team/crew/{run_id}-api.v2"));
        assert_eq!(names.admin, format!("team-crew-{run_id}-api.v2"));
        assert!(!names.admin.contains('/'));
        assert_eq!(names.root, format!("/repo/.worktrees/{run_id}/api.v2"));
        assert_eq!(
            parse_task_branch(&settings, &names.branch, &[]),
            Some((run_id, task_id))
        );
        assert_eq!(parse_task_branch(&settings, "team/crew/short-x", &[]), None);
    }

    #[test]
    fn a_named_runs_branches_are_recognised_among_known_runs() {
        let settings = WorktreeSettings::default();
        let named = RunId::named("refund-fix").unwrap();
        let other = RunId::generate();
        let known = [other, named.clone()];
        assert_eq!(
            parse_task_branch(&settings, "crew/refund-fix-api-v2", &known),
            Some((named, TaskId::parse("api-v2").unwrap()))
        );
        assert_eq!(
            parse_task_branch(&settings, "crew/refund-fix-api", &[]),
            None
        );
        assert_eq!(
            parse_task_branch(&settings, "crew/refund-api", &known),
            None
        );
    }
}
