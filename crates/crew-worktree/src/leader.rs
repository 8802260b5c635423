//! The leader repository: the checkout a run starts from.

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::provider::UpstreamWork;
use git2::{BranchType, Oid, Repository, Signature, StatusOptions};

use crate::error::PrepareWorktreeError;

/// The identity of commits crew makes itself (saved work, merges of upstream tasks).
pub fn crew_signature() -> Result<Signature<'static>, git2::Error> {
    Signature::now("crew", "crew@localhost")
}

/// Opens the repository whose work tree top level is `repo_root`.
pub fn open(
    repo_root: Option<&Utf8Path>,
    workspace: &Utf8Path,
) -> Result<Repository, PrepareWorktreeError> {
    let Some(repo_root) = repo_root else {
        return Err(PrepareWorktreeError::NotARepository {
            path: workspace.to_owned(),
        });
    };
    Repository::open(repo_root).map_err(|source| {
        if source.code() == git2::ErrorCode::NotFound {
            PrepareWorktreeError::NotARepository {
                path: repo_root.to_owned(),
            }
        } else {
            PrepareWorktreeError::OpenRepository {
                path: repo_root.to_owned(),
                source,
            }
        }
    })
}

/// `<common>`: the git directory shared by the leader and all its worktrees.
pub fn common_dir(repo: &Repository) -> Utf8PathBuf {
    let common = repo.commondir();
    let common = common
        .canonicalize()
        .unwrap_or_else(|_| common.to_path_buf());
    Utf8PathBuf::from_path_buf(common)
        .unwrap_or_else(|path| Utf8PathBuf::from(path.to_string_lossy().into_owned()))
}

/// The tracked paths with changes in the leader: staged, unstaged, deleted, renamed, type
/// changes and modified submodules. Untracked and ignored files are not listed. Evaluated
/// from scratch every time.
pub fn dirty_paths(
    repo: &Repository,
    repo_root: &Utf8Path,
) -> Result<Vec<String>, PrepareWorktreeError> {
    let mut options = StatusOptions::new();
    options
        .include_untracked(false)
        .include_ignored(false)
        .include_unmodified(false)
        .exclude_submodules(false)
        .renames_head_to_index(true);
    let statuses =
        repo.statuses(Some(&mut options))
            .map_err(|source| PrepareWorktreeError::Status {
                path: repo_root.to_owned(),
                source,
            })?;
    let mut paths: Vec<String> = statuses
        .iter()
        .filter(|entry| !entry.status().is_empty() && !entry.status().is_ignored())
        .map(|entry| String::from_utf8_lossy(entry.path_bytes()).into_owned())
        .collect();
    paths.sort();
    paths.dedup();
    Ok(paths)
}

/// Refuses a leader with tracked changes.
pub fn check_clean(repo: &Repository, repo_root: &Utf8Path) -> Result<(), PrepareWorktreeError> {
    let paths = dirty_paths(repo, repo_root)?;
    if paths.is_empty() {
        Ok(())
    } else {
        Err(PrepareWorktreeError::DirtyLeader {
            path: repo_root.to_owned(),
            paths,
        })
    }
}

/// The commit a run starts from: `spec` (any revision) or HEAD.
pub fn resolve_base(
    repo: &Repository,
    repo_root: &Utf8Path,
    spec: Option<&str>,
) -> Result<Oid, PrepareWorktreeError> {
    match spec {
        Some(spec) => repo
            .revparse_single(spec)
            .and_then(|object| object.peel_to_commit())
            .map(|commit| commit.id())
            .map_err(|source| PrepareWorktreeError::ResolveBase {
                spec: spec.to_owned(),
                source,
            }),
        None => match repo.head() {
            Ok(head) => head
                .peel_to_commit()
                .map(|commit| commit.id())
                .map_err(|source| PrepareWorktreeError::ResolveBase {
                    spec: "HEAD".to_owned(),
                    source,
                }),
            Err(error)
                if matches!(
                    error.code(),
                    git2::ErrorCode::UnbornBranch | git2::ErrorCode::NotFound
                ) =>
            {
                Err(PrepareWorktreeError::NoCommit {
                    path: repo_root.to_owned(),
                })
            }
            Err(source) => Err(PrepareWorktreeError::ResolveBase {
                spec: "HEAD".to_owned(),
                source,
            }),
        },
    }
}

/// The branch a run starts from: the one `spec` names (local, or remote-tracking such as
/// `origin/main`), or the leader's current branch when no base is named. `None` for a commit, a
/// tag or a detached HEAD: nothing to follow.
pub fn base_branch(repo: &Repository, spec: Option<&str>) -> Option<String> {
    match spec {
        Some(spec) => [BranchType::Local, BranchType::Remote]
            .into_iter()
            .any(|kind| repo.find_branch(spec, kind).is_ok())
            .then(|| spec.to_owned()),
        None => {
            let head = repo.head().ok()?;
            head.is_branch()
                .then(|| head.shorthand().ok().map(str::to_owned))
                .flatten()
        }
    }
}

pub use crew_core::provider::BaseMovement;

/// [`BaseMovement`] of `branch` since `base` in the repository at `repo_root`; `None` when
/// either cannot be read (the branch was deleted, the repository is gone).
pub fn base_movement(repo_root: &Utf8Path, base: &str, branch: &str) -> Option<BaseMovement> {
    let repo = Repository::open(repo_root).ok()?;
    let base = Oid::from_str(base).ok()?;
    let tip = [BranchType::Local, BranchType::Remote]
        .into_iter()
        .find_map(|kind| repo.find_branch(branch, kind).ok())?
        .get()
        .target()?;
    let (gained, behind) = repo.graph_ahead_behind(tip, base).ok()?;
    Some(BaseMovement {
        gained,
        diverged: behind > 0,
    })
}

/// The commit a dependent task starts from: the run's base when no upstream left a branch;
/// the branch when one did; their merge when several did. A conflict fails with its paths.
pub fn upstream_base(
    repo: &Repository,
    run_base: Oid,
    upstream: &[UpstreamWork],
    task_id: &str,
) -> Result<Oid, PrepareWorktreeError> {
    let mut tips = Vec::new();
    for work in upstream {
        let Some(branch) = &work.branch else { continue };
        let tip = repo
            .find_branch(branch, BranchType::Local)
            .and_then(|branch| branch.get().peel_to_commit())
            .map_err(|source| PrepareWorktreeError::UpstreamBranch {
                task: work.task_id.to_string(),
                branch: branch.clone(),
                source,
            })?;
        tips.push((work.task_id.to_string(), tip.id()));
    }
    let Some(((first_task, first), rest)) = tips.split_first() else {
        return Ok(run_base);
    };
    let mut merged = *first;
    let mut merged_tasks = vec![first_task.clone()];
    for (task, tip) in rest {
        let merge_error = |source| PrepareWorktreeError::MergeUpstream {
            tasks: merged_tasks.iter().cloned().chain([task.clone()]).collect(),
            source,
        };
        if merged == *tip
            || repo
                .graph_descendant_of(merged, *tip)
                .map_err(merge_error)?
        {
            merged_tasks.push(task.clone());
            continue;
        }
        if repo
            .graph_descendant_of(*tip, merged)
            .map_err(merge_error)?
        {
            merged = *tip;
            merged_tasks.push(task.clone());
            continue;
        }
        let ours = repo.find_commit(merged).map_err(merge_error)?;
        let theirs = repo.find_commit(*tip).map_err(merge_error)?;
        let mut index = repo
            .merge_commits(&ours, &theirs, None)
            .map_err(merge_error)?;
        if index.has_conflicts() {
            let mut paths: Vec<String> = index
                .conflicts()
                .map_err(merge_error)?
                .filter_map(Result::ok)
                .filter_map(|conflict| conflict.our.or(conflict.their).or(conflict.ancestor))
                .map(|entry| String::from_utf8_lossy(&entry.path).into_owned())
                .collect();
            paths.sort();
            paths.dedup();
            return Err(PrepareWorktreeError::UpstreamConflict {
                tasks: merged_tasks.iter().cloned().chain([task.clone()]).collect(),
                paths,
            });
        }
        let tree_id = index.write_tree_to(repo).map_err(merge_error)?;
        let tree = repo.find_tree(tree_id).map_err(merge_error)?;
        let signature = crew_signature().map_err(merge_error)?;
        merged_tasks.push(task.clone());
        merged = repo
            .commit(
                None,
                &signature,
                &signature,
                &format!(
                    "crew: merge the work of {} for task {task_id}",
                    merged_tasks.join(", ")
                ),
                &tree,
                &[&ours, &theirs],
            )
            .map_err(|source| PrepareWorktreeError::MergeUpstream {
                tasks: merged_tasks.clone(),
                source,
            })?;
    }
    Ok(merged)
}

/// Reads objects as git does: libgit2 re-hashes every object it reads, git does not. The
/// objects come from the user's own repository and are still checked by zlib and the packs'
/// checksums. Set once per process, before the first read that counts (a checkout, the radar).
pub fn fast_reads() {
    static FAST_READS: std::sync::Once = std::sync::Once::new();
    FAST_READS.call_once(|| git2::opts::strict_hash_verification(false));
}
