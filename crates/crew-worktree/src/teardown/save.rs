//! Steps 2 and 3 of a teardown: the agent's uncommitted work collected with crew's own status
//! options, committed onto its branch, and read back before anything is removed.

use camino::Utf8Path;
use crew_core::provider::TeardownReport;
use git2::{IndexAddOption, Oid, Repository, Status, StatusOptions};

use super::{TeardownWorktree, is_link_path};
use crate::error::TeardownWorktreeError;
use crate::leader::crew_signature;
use crate::names::TaskNames;

/// crew's own view of what is not committed: untracked files are always included, ignored
/// ones never, whatever the repository's settings.
pub(super) fn work_status_options() -> StatusOptions {
    let mut options = StatusOptions::new();
    options
        .include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_ignored(false)
        .include_unmodified(false)
        .exclude_submodules(false)
        .renames_head_to_index(true)
        .renames_index_to_workdir(true);
    options
}

/// What one status pass found in a worktree at teardown: what git would commit and what it
/// ignores.
pub(super) struct WorkStatus {
    /// Every path git would commit, with its status, crew's links among them.
    pending: Vec<(String, Status)>,
    /// Ignored paths (a directory once, with a trailing `/`).
    pub(super) ignored: Vec<String>,
    /// Whether an ignored path's name is not UTF-8: it cannot be named for removal, and the
    /// worktree is not pooled.
    pub(super) odd_ignored: bool,
}

impl WorkStatus {
    pub(super) fn read(repo: &Repository, root: &Utf8Path) -> Result<Self, TeardownWorktreeError> {
        let mut options = work_status_options();
        options.include_ignored(true).recurse_ignored_dirs(false);
        let statuses =
            repo.statuses(Some(&mut options))
                .map_err(|source| TeardownWorktreeError::Stage {
                    path: root.to_owned(),
                    source,
                })?;
        let mut found = WorkStatus {
            pending: Vec::new(),
            ignored: Vec::new(),
            odd_ignored: false,
        };
        for entry in statuses.iter() {
            let path = String::from_utf8_lossy(entry.path_bytes()).into_owned();
            let status = entry.status();
            if status.is_ignored() {
                found.odd_ignored |= std::str::from_utf8(entry.path_bytes()).is_err();
                found.ignored.push(path);
            } else if !status.is_empty() {
                found.pending.push((path, status));
            }
        }
        Ok(found)
    }

    /// What git would commit, without `left_out` (crew's links, what setup made).
    fn work(&self, left_out: &[String]) -> Vec<(String, Status)> {
        self.pending
            .iter()
            .filter(|(path, _)| !is_link_path(left_out, path))
            .cloned()
            .collect()
    }
}

/// The uncommitted paths of the worktree, without crew's links.
pub(crate) fn uncommitted(
    repo: &Repository,
    root: &Utf8Path,
    links: &[String],
) -> Result<Vec<(String, Status)>, TeardownWorktreeError> {
    let statuses = repo
        .statuses(Some(&mut work_status_options()))
        .map_err(|source| TeardownWorktreeError::Stage {
            path: root.to_owned(),
            source,
        })?;
    Ok(statuses
        .iter()
        .map(|entry| {
            (
                String::from_utf8_lossy(entry.path_bytes()).into_owned(),
                entry.status(),
            )
        })
        .filter(|(path, status)| {
            !status.is_empty() && !status.is_ignored() && !is_link_path(links, path)
        })
        .collect())
}

/// Commits everything uncommitted onto the branch HEAD is on and verifies it. Returns the
/// branch holding the task's work.
pub(super) fn save_work(
    repo: &Repository,
    root: &Utf8Path,
    links: &[String],
    untouched: &[String],
    status: &WorkStatus,
    request: &TeardownWorktree<'_>,
    report: &mut TeardownReport,
) -> Result<Option<String>, TeardownWorktreeError> {
    // Neither crew's links nor what setup made (and the agent left alone) is the agent's work.
    let left_out: Vec<String> = links.iter().chain(untouched).cloned().collect();
    let pending = status.work(&left_out);
    // A nested repository (or an initialized submodule) holds work git cannot take into this
    // branch; removing it would lose that work.
    for (path, _) in &pending {
        let candidate = root.join(path.trim_end_matches('/'));
        // Never through a symlink: `up -> ../../..` leads to the leader's own `.git`.
        let is_real_dir =
            std::fs::symlink_metadata(&candidate).is_ok_and(|metadata| metadata.is_dir());
        if is_real_dir && std::fs::symlink_metadata(candidate.join(".git")).is_ok() {
            return Err(TeardownWorktreeError::NestedRepository {
                path: root.to_owned(),
                nested: path.trim_end_matches('/').to_owned(),
            });
        }
    }
    check_submodule_dirs(repo, root)?;
    let head = repo.head().map_err(|source| TeardownWorktreeError::Open {
        path: root.to_owned(),
        source,
    })?;
    if !head.is_branch() {
        return Err(TeardownWorktreeError::DetachedHead {
            path: root.to_owned(),
        });
    }
    let branch = head.shorthand().ok().map(str::to_owned);
    let branch_name = branch.clone().unwrap_or_default();
    let expected = request
        .workspace
        .branch
        .clone()
        .unwrap_or_else(|| names_branch(request));
    if branch_name != expected {
        return Err(TeardownWorktreeError::OtherBranch {
            path: root.to_owned(),
            found: branch_name,
            expected,
        });
    }
    if pending.is_empty() {
        return Ok(branch);
    }

    let stage_error = |source| TeardownWorktreeError::Stage {
        path: root.to_owned(),
        source,
    };
    if !untouched.is_empty() {
        // As HEAD has them, whatever the agent staged: setup's version is not its work.
        let head_commit = head.peel_to_commit().map_err(stage_error)?;
        repo.reset_default(Some(head_commit.as_object()), untouched)
            .map_err(stage_error)?;
    }
    let mut index = repo.index().map_err(stage_error)?;
    let mut skip_links = |path: &std::path::Path, _spec: &[u8]| -> i32 {
        i32::from(is_link_path(&left_out, &path.to_string_lossy()))
    };
    index
        .add_all(["*"], IndexAddOption::DEFAULT, Some(&mut skip_links))
        .map_err(stage_error)?;
    index
        .update_all(["*"], Some(&mut skip_links))
        .map_err(stage_error)?;
    for link in links {
        // Never part of the work, even if the agent staged it itself. Removing a path the
        // index does not hold fails, and there is nothing to remove then.
        let _ = index.remove_path(std::path::Path::new(link));
    }
    index.write().map_err(stage_error)?;
    let tree_id = index.write_tree().map_err(stage_error)?;

    let commit_error = |source| TeardownWorktreeError::Commit {
        path: root.to_owned(),
        branch: branch_name.clone(),
        source,
    };
    let parent = head.peel_to_commit().map_err(commit_error)?;
    if parent.tree_id() != tree_id {
        let tree = repo.find_tree(tree_id).map_err(commit_error)?;
        let signature = crew_signature().map_err(commit_error)?;
        let message = format!(
            "crew: save the work of task {} (run {})\n\nCommitted by crew when the task ended, from the changes the agent left uncommitted.\n",
            request.task_id,
            request.placed_for.unwrap_or(request.run_id)
        );
        let commit_id = repo
            .commit(
                Some("HEAD"),
                &signature,
                &signature,
                &message,
                &tree,
                &[&parent],
            )
            .map_err(commit_error)?;
        verify_commit(repo, root, commit_id, tree_id)?;
        report.committed = Some(commit_id.to_string());
    }
    let left = uncommitted(repo, root, &left_out)?;
    if !left.is_empty() {
        return Err(TeardownWorktreeError::Verify {
            path: root.to_owned(),
            problem: format!(
                "{} path(s) still uncommitted after the commit, e.g. {}",
                left.len(),
                left[0].0
            ),
        });
    }
    Ok(branch)
}

pub(super) fn names_branch(request: &TeardownWorktree<'_>) -> String {
    TaskNames::new(
        request.repo_root,
        request.settings,
        request.run_id,
        request.task_id,
    )
    .branch
}

/// Files in the directory of a submodule that is not initialized there belong to no repository:
/// git shows no change for them, so no commit can take them. A worktree holding some is kept.
pub(super) fn check_submodule_dirs(
    repo: &Repository,
    root: &Utf8Path,
) -> Result<(), TeardownWorktreeError> {
    const GITLINK: u32 = 0o160000;
    let Ok(index) = repo.index() else {
        return Ok(());
    };
    for entry in index.iter().filter(|entry| entry.mode == GITLINK) {
        let relative = String::from_utf8_lossy(&entry.path).into_owned();
        let dir = root.join(&relative);
        let is_real_dir = std::fs::symlink_metadata(&dir).is_ok_and(|metadata| metadata.is_dir());
        // An initialized submodule (its own `.git`) keeps its own work.
        if !is_real_dir || std::fs::symlink_metadata(dir.join(".git")).is_ok() {
            continue;
        }
        let holds_files = dir
            .read_dir_utf8()
            .is_ok_and(|mut entries| entries.next().is_some());
        if holds_files {
            return Err(TeardownWorktreeError::SubmoduleFiles {
                path: root.to_owned(),
                submodule: relative,
            });
        }
    }
    Ok(())
}

/// Reads the commit back from the object database: it must exist, be on HEAD and carry the
/// tree that was staged.
pub(super) fn verify_commit(
    repo: &Repository,
    root: &Utf8Path,
    commit_id: Oid,
    tree_id: Oid,
) -> Result<(), TeardownWorktreeError> {
    let problem = |problem: String| TeardownWorktreeError::Verify {
        path: root.to_owned(),
        problem,
    };
    let commit = repo
        .find_commit(commit_id)
        .map_err(|error| problem(format!("commit {commit_id} cannot be read: {error}")))?;
    if commit.tree_id() != tree_id {
        return Err(problem(format!(
            "commit {commit_id} does not carry the staged tree"
        )));
    }
    let head = repo
        .head()
        .and_then(|head| head.peel_to_commit())
        .map_err(|error| problem(format!("HEAD cannot be read: {error}")))?;
    if head.id() != commit_id {
        return Err(problem(format!(
            "HEAD is {} instead of {commit_id}",
            head.id()
        )));
    }
    Ok(())
}
