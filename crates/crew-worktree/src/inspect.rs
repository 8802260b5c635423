//! Reading what tasks did, and making small repositories: for summaries and `crew demo`.

use camino::Utf8Path;
use git2::{BranchType, DiffFormat, Oid, Repository, RepositoryInitOptions};

use crate::leader::crew_signature;

/// The patch between `base` and the tip of `branch`, as `git diff base..branch` prints it.
pub fn branch_patch(repo_root: &Utf8Path, base: &str, branch: &str) -> Result<String, git2::Error> {
    let repo = Repository::open(repo_root)?;
    patch_text(&branch_diff(&repo, base, branch)?)
}

/// The tree diff between commit `base` and the tip of local `branch`.
fn branch_diff<'repo>(
    repo: &'repo Repository,
    base: &str,
    branch: &str,
) -> Result<git2::Diff<'repo>, git2::Error> {
    let base_tree = repo.find_commit(Oid::from_str(base)?)?.tree()?;
    let tip_tree = repo
        .find_branch(branch, BranchType::Local)?
        .get()
        .peel_to_commit()?
        .tree()?;
    repo.diff_tree_to_tree(Some(&base_tree), Some(&tip_tree), None)
}

/// The patch between `base` and what the worktree at `dir` holds now, committed or not
/// (untracked files included, ignored ones not): a running task's work so far. Reads only.
pub fn worktree_patch(dir: &Utf8Path, base: &str) -> Result<String, git2::Error> {
    let repo = Repository::open(dir)?;
    let base_tree = repo.find_commit(Oid::from_str(base)?)?.tree()?;
    let mut options = git2::DiffOptions::new();
    options
        .include_untracked(true)
        .recurse_untracked_dirs(true)
        .show_untracked_content(true);
    let diff = repo.diff_tree_to_workdir_with_index(Some(&base_tree), Some(&mut options))?;
    patch_text(&diff)
}

/// A diff as `git diff` prints it.
fn patch_text(diff: &git2::Diff<'_>) -> Result<String, git2::Error> {
    let mut patch = String::new();
    diff.print(DiffFormat::Patch, |_, _, line| {
        let origin = line.origin();
        if matches!(origin, '+' | '-' | ' ') {
            patch.push(origin);
        }
        patch.push_str(&String::from_utf8_lossy(line.content()));
        true
    })?;
    Ok(patch)
}

/// `git diff --stat base..branch`: one line per file and a summary, `width` columns wide, and
/// the counts (files, insertions, deletions).
pub fn branch_stat(
    repo_root: &Utf8Path,
    base: &str,
    branch: &str,
    width: usize,
) -> Result<(String, [usize; 3]), git2::Error> {
    let repo = Repository::open(repo_root)?;
    let base_tree = repo.find_commit(Oid::from_str(base)?)?.tree()?;
    let tip_tree = repo
        .find_branch(branch, BranchType::Local)?
        .get()
        .peel_to_commit()?
        .tree()?;
    let diff = repo.diff_tree_to_tree(Some(&base_tree), Some(&tip_tree), None)?;
    let stats = diff.stats()?;
    let text = stats.to_buf(git2::DiffStatsFormat::FULL, width)?;
    let counts = [stats.files_changed(), stats.insertions(), stats.deletions()];
    Ok((String::from_utf8_lossy(&text).into_owned(), counts))
}

/// The files `base..branch` changes, each with its lines added and removed, in path order.
pub fn branch_files(
    repo_root: &Utf8Path,
    base: &str,
    branch: &str,
) -> Result<Vec<(String, usize, usize)>, git2::Error> {
    let repo = Repository::open(repo_root)?;
    let diff = branch_diff(&repo, base, branch)?;
    let mut files = Vec::new();
    for index in 0..diff.deltas().len() {
        let Some(delta) = diff.get_delta(index) else {
            continue;
        };
        let path = delta
            .new_file()
            .path()
            .or_else(|| delta.old_file().path())
            .map(|path| path.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (added, removed) = match git2::Patch::from_diff(&diff, index)? {
            Some(patch) => {
                let (_, added, removed) = patch.line_stats()?;
                (added, removed)
            }
            None => (0, 0),
        };
        files.push((path, added, removed));
    }
    files.sort();
    Ok(files)
}

/// What became of a branch crew was asked to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BranchDrop {
    /// It was deleted.
    Deleted,
    /// It was gone already.
    Missing,
    /// Its tip is no longer the commit crew recorded: it holds more than the task's work.
    Moved {
        /// Its tip now.
        tip: String,
    },
    /// git would not delete it (checked out in a worktree, a locked ref); the message says why.
    Refused {
        /// What git said.
        message: String,
    },
}

/// Deletes `branch` if it still points at `tip` (compared and deleted in one step, so that a
/// commit made meanwhile is never lost), and is checked out nowhere.
pub fn drop_branch(repo_root: &Utf8Path, branch: &str, tip: &str) -> BranchDrop {
    let repo = match Repository::open(repo_root) {
        Ok(repo) => repo,
        Err(error) => {
            return BranchDrop::Refused {
                message: error.message().to_owned(),
            };
        }
    };
    let mut found = match repo.find_branch(branch, BranchType::Local) {
        Ok(found) => found,
        Err(error) if error.code() == git2::ErrorCode::NotFound => return BranchDrop::Missing,
        Err(error) => {
            return BranchDrop::Refused {
                message: error.message().to_owned(),
            };
        }
    };
    let now = found.get().target().map(|oid| oid.to_string());
    if now.as_deref() != Some(tip) {
        return BranchDrop::Moved {
            tip: now.unwrap_or_default(),
        };
    }
    // libgit2 refuses a branch checked out in any worktree, and a reference that changed
    // since it was looked up.
    match found.delete() {
        Ok(()) => BranchDrop::Deleted,
        Err(error) => BranchDrop::Refused {
            message: error.message().to_owned(),
        },
    }
}

/// A new repository at `dir` (which must exist) on branch `main`, with `files` committed by
/// crew's own identity: needs no git configuration at all.
pub fn create_repository(dir: &Utf8Path, files: &[(&str, &str)]) -> Result<Oid, git2::Error> {
    let repo = Repository::init_opts(dir, RepositoryInitOptions::new().initial_head("main"))?;
    for (path, contents) in files {
        let full = dir.join(path);
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|error| git2::Error::from_str(&error.to_string()))?;
        }
        std::fs::write(&full, contents)
            .map_err(|error| git2::Error::from_str(&error.to_string()))?;
    }
    let mut index = repo.index()?;
    index.add_all(["*"], git2::IndexAddOption::DEFAULT, None)?;
    index.write()?;
    let tree = repo.find_tree(index.write_tree()?)?;
    let signature = crew_signature()?;
    repo.commit(
        Some("HEAD"),
        &signature,
        &signature,
        "initial commit",
        &tree,
        &[],
    )
}
