//! Reading what tasks did, and making small repositories: for summaries and `crew demo`.

use camino::Utf8Path;
use git2::{BranchType, DiffFormat, Oid, Repository, RepositoryInitOptions};

use crate::leader::crew_signature;

/// The patch between `base` and the tip of `branch`, as `git diff base..branch` prints it.
pub fn branch_patch(repo_root: &Utf8Path, base: &str, branch: &str) -> Result<String, git2::Error> {
    let repo = Repository::open(repo_root)?;
    let base_tree = repo.find_commit(Oid::from_str(base)?)?.tree()?;
    let tip_tree = repo
        .find_branch(branch, BranchType::Local)?
        .get()
        .peel_to_commit()?
        .tree()?;
    let diff = repo.diff_tree_to_tree(Some(&base_tree), Some(&tip_tree), None)?;
    patch_text(&diff)
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
