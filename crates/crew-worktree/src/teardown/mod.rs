//! Taking a task's worktree away without losing the agent's work.
//!
//! 1. Refuse while the agent may be alive; keep the worktree when the task waits for an answer.
//! 2. Collect uncommitted work with crew's own status options (untracked files included
//!    whatever `status.showUntrackedFiles` says): tracked changes, untracked files and
//!    directories, deletions, renames, mode changes and symlinks (as links). crew's own linked
//!    paths are never part of it, nor what the worktree's setup made while it is still as setup
//!    left it (the task's baseline, see `baseline`).
//! 3. Commit it onto the branch HEAD is on (author "crew") and read it back: the commit's tree
//!    must be what was staged and a fresh status must show nothing left.
//! 4. Only then remove the directory (never following symlinks) and the admin entry, delete
//!    the task branch when it holds no change from the base, and report everything.
//!
//! Anything uncertain (a nested repository, a detached HEAD, a commit that failed, files that
//! cannot be read) keeps the worktree in place and says where and why.
//!
//! Steps 2 and 3 are `save.rs`'s; this file holds the order of the steps, the checks before
//! them, and what happens to the directory and the branches after.

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::config::{LinkMode, WorktreeSettings};
use crew_core::paths::remove_contained;
use crew_core::provider::{DiffStat, TaskWorkspace, TeardownReport};
use crew_core::{RunId, TaskId};
use git2::{BranchType, Oid, Repository};

use crate::admin;
use crate::agent_git::AgentGit;
use crate::baseline::SetupBaseline;
use crate::create::repo_lock;
use crate::error::TeardownWorktreeError;
use crate::leader::{self};
use crate::names::{TRASH_DIR, TaskNames, worktrees_dir};
use crate::pool;

mod save;

pub(crate) use save::uncommitted;
use save::{WorkStatus, save_work};

/// What the teardown of one worktree task needs.
#[derive(Debug, Clone)]
pub struct TeardownWorktree<'a> {
    /// The task's workspace, as recorded.
    pub workspace: &'a TaskWorkspace,
    /// The project's `[worktree]` settings.
    pub settings: &'a WorktreeSettings,
    /// The repository's top level.
    pub repo_root: &'a Utf8Path,
    /// The run.
    pub run_id: &'a RunId,
    /// The run its commits name, when not `run_id` (a placement's run, for its host's).
    pub placed_for: Option<&'a RunId>,
    /// The task.
    pub task_id: &'a TaskId,
    /// Where the agent's ignored files go (`None`: they go with the worktree).
    pub keep_ignored_in: Option<Utf8PathBuf>,
    /// Where the task's setup baseline was recorded, if anywhere.
    pub baseline_file: Option<Utf8PathBuf>,
}

/// Saves the work, then removes the worktree. On error, the worktree is still in place and the
/// error says why; `partial` in the caller's report carries what was done before.
pub fn teardown_worktree(
    request: &TeardownWorktree<'_>,
    report: &mut TeardownReport,
) -> Result<(), TeardownWorktreeError> {
    let turn = crate::passes::turn();
    let root = &request.workspace.root;
    let names = TaskNames::new(
        request.repo_root,
        request.settings,
        request.run_id,
        request.task_id,
    );
    let leader_repo =
        Repository::open(request.repo_root).map_err(|source| TeardownWorktreeError::Open {
            path: request.repo_root.to_owned(),
            source,
        })?;
    let common = leader::common_dir(&leader_repo);

    let agent_git = AgentGit::of(&common, &names);
    let take = |agent_git: &AgentGit| {
        agent_git
            .take(&leader_repo, &names.branch_ref())
            .map_err(|source| TeardownWorktreeError::TakeWork {
                path: root.clone(),
                source,
            })
    };
    let mut work_branch = Some(names.branch.clone());
    if std::fs::symlink_metadata(root).is_ok() {
        let held = hold_checked(request.workspace)?;
        // Its `.git` is written through the directory checked, never its path again.
        let agent_git = AgentGit::of(&common, &names).writing_through(&held.path());
        // The worktree is crew's: one its agent made read-only (`chmod 555 .`) is writable
        // again for its `.git` and for moving what the agent left. (Where that fails, the
        // step that needs it names the failure.)
        if let Ok(dir) = crew_core::paths::open_dir_without_links(root.as_std_path()) {
            // Best effort, as said above: the step that needs the access names its failure.
            let _ = crew_core::paths::give_owner_access(&dir);
        }
        if agent_git.exists() {
            // crew's pointers first: what crew reads next goes where crew decided. (Whatever
            // fails from here, the worktree handed to the user has its commits taken.)
            let repaired =
                agent_git
                    .repair()
                    .map_err(|problem| TeardownWorktreeError::AgentGit {
                        path: root.clone(),
                        problem,
                    })?;
            report.security.extend(repaired);
        }
        let repo = Repository::open(root).map_err(|source| TeardownWorktreeError::Open {
            path: root.clone(),
            source,
        })?;
        check_git_dir(&repo, root, &agent_git.expected_git_dir())?;
        let links = crew_links(request.settings, request.repo_root, root);
        let baseline = request
            .baseline_file
            .as_deref()
            .map(SetupBaseline::load)
            .unwrap_or_default();
        // What setup made and the agent left as it was: the task's baseline, not its work.
        let untouched = baseline.untouched(root);
        // One pass over the worktree serves the commit, the ignored files and the pool.
        let status = WorkStatus::read(&repo, root)?;
        work_branch = save_work(&repo, root, &links, &untouched, &status, request, report)?;
        // The agent's commits and crew's own of what it left uncommitted. (Verified: its index
        // now stages nothing but the tip's tree.)
        take(&agent_git)?;
        // From here the work is on its branch, whatever keeps the worktree in place. (What it
        // changes is counted once, when the branch is settled.)
        if let Some(branch) = &work_branch {
            describe_branch(&leader_repo, request, branch, report, false);
        }
        report.setup_paths = untouched
            .iter()
            .take(TeardownReport::NAMED)
            .cloned()
            .collect();
        let head = repo.head().ok().and_then(|head| head.target());
        set_aside_ignored(root, request, &links, &baseline, &status.ignored, report)?;
        // A pooled worktree keeps nothing of this task but the ignored paths the project
        // allows (crew's links and copies go too). One still holding setup's files is not
        // pooled: the next task would find them. Nor one where the task made a link (`src ->
        // /elsewhere`): switching it to the next task's commit would write through the link.
        let made_links = head.is_some_and(|head| makes_links(&repo, request, head));
        let cleaned = match head {
            Some(_)
                if request.settings.pool_size > 0
                    && untouched.is_empty()
                    && !status.odd_ignored
                    && !made_links =>
            {
                pool::remove_ignored_paths(root, request.settings, &status.ignored).ok()
            }
            _ => None,
        };
        drop(repo);
        agent_git
            .disarm()
            .map_err(|problem| TeardownWorktreeError::AgentGit {
                path: root.clone(),
                problem,
            })?;

        let worktrees = worktrees_dir(request.repo_root, request.settings);
        let lock = repo_lock(&common).map_err(TeardownWorktreeError::Lock)?;
        let recycled = match (cleaned, head) {
            (Some(_), Some(head)) => {
                pool::give_back(&common, request.repo_root, request.settings, &names, head)
            }
            _ => false,
        };
        if recycled {
            drop(lock);
            report.recycled = true;
        } else {
            if let Err(error) = admin::set_lock(&common, &names.admin, None) {
                report
                    .warnings
                    .push(format!("could not unlock git's entry for {root}: {error}"));
            }
            // Out of the way under the lock (a rename), deleted outside it: deleting thousands
            // of files must not hold up other tasks' worktrees.
            let trash = worktrees
                .join(TRASH_DIR)
                .join(format!("{}-{}", request.run_id, request.task_id));
            let moved = crew_core::fsutil::rename_beneath(request.repo_root, root, &trash).is_ok();
            forget_admin_entry(&common, &names.admin, root, report);
            drop(lock);
            // Deleting is the file system's work, not a pass: the next pass need not wait.
            drop(turn);
            let doomed = if moved { &trash } else { root };
            remove_contained(doomed, &[&worktrees]).map_err(|source| {
                TeardownWorktreeError::Remove {
                    path: root.clone(),
                    source,
                }
            })?;
        }
        report.removed = true;
        if let Some(run_dir) = root.parent() {
            // Only when empty: other tasks of the run may still have theirs there, and then
            // this fails as it should.
            let _ = std::fs::remove_dir(run_dir);
        }
    } else if request.workspace.identity.is_some() {
        // crew made this directory and did not remove it: someone moved or deleted it (an
        // agent renaming its own workspace). Its work may be wherever it went; the admin entry
        // stays so that `git worktree repair <new place>` can reconnect it. Its commits are
        // taken all the same.
        take(&agent_git)?;
        return Err(TeardownWorktreeError::Replaced {
            path: root.clone(),
            problem: format!(
                "{root} is gone (moved or deleted); if it was moved, `git worktree repair <new place>` reconnects it to its branch"
            ),
        });
    } else {
        let _lock = repo_lock(&common).map_err(TeardownWorktreeError::Lock)?;
        forget_admin_entry(&common, &names.admin, root, report);
    }
    settle_branches(
        &leader_repo,
        request,
        &names,
        work_branch.as_deref(),
        report,
    );
    Ok(())
}

/// The workspace must still be the very directory crew created (never a link, never another
/// directory put in its place): otherwise nothing is committed into, cleaned or removed.
pub(crate) fn check_identity(workspace: &TaskWorkspace) -> Result<(), TeardownWorktreeError> {
    hold_checked(workspace).map(drop)
}

/// The workspace's directory held open, when it is still the one crew made (see
/// [`check_identity`]): what crew writes into it goes through the handle from here.
fn hold_checked(
    workspace: &TaskWorkspace,
) -> Result<crew_core::paths::HeldDir, TeardownWorktreeError> {
    let held = match &workspace.identity {
        Some(identity) => identity
            .open_checked(&workspace.root, &workspace.root)
            .map(crew_core::paths::HeldDir::from_fd),
        // Recorded before identities were: at least a real directory, not a link.
        None => crew_core::paths::HeldDir::open(workspace.root.as_std_path())
            .map_err(|error| format!("{}: {error}", workspace.root)),
    };
    held.map_err(|problem| TeardownWorktreeError::Replaced {
        path: workspace.root.clone(),
        problem,
    })
}

/// The worktree's `.git` file must lead to its own git directory (`expected`), and that to the
/// worktree itself: one rewritten to point at the leader's (or another) repository would make
/// crew commit there.
fn check_git_dir(
    repo: &Repository,
    root: &Utf8Path,
    expected: &Utf8Path,
) -> Result<(), TeardownWorktreeError> {
    let same_dir = |found: &std::path::Path, expected: &std::path::Path| match (
        found.canonicalize(),
        expected.canonicalize(),
    ) {
        (Ok(found), Ok(expected)) => found == expected,
        _ => false,
    };
    let found = repo.path();
    let same = same_dir(found, expected.as_std_path())
        && repo
            .workdir()
            .is_some_and(|workdir| same_dir(workdir, root.as_std_path()));
    let expected = expected.to_owned();
    if same {
        Ok(())
    } else {
        Err(TeardownWorktreeError::ForeignGitDir {
            path: root.to_owned(),
            found: found.display().to_string(),
            expected,
        })
    }
}

/// The paths crew linked into this worktree: symlinks pointing at the leader's directories, or
/// with `link_mode = "copy"`, the real directories crew copied there.
pub(crate) fn crew_links(
    settings: &WorktreeSettings,
    leader_root: &Utf8Path,
    root: &Utf8Path,
) -> Vec<String> {
    settings
        .link
        .iter()
        .filter(|relative| {
            let path = root.join(relative);
            match settings.link_mode {
                LinkMode::Symlink => std::fs::read_link(&path)
                    .is_ok_and(|target| target == leader_root.join(relative).as_std_path()),
                LinkMode::Copy => {
                    std::fs::symlink_metadata(&path).is_ok_and(|metadata| metadata.is_dir())
                }
            }
        })
        .map(|relative| relative.to_string())
        .collect()
}

/// Whether `path` is one of crew's links, or inside one (a copied directory's files).
pub(crate) fn is_link_path(links: &[String], path: &str) -> bool {
    let path = path.trim_end_matches('/');
    links.iter().any(|link| {
        path == link
            || path
                .strip_prefix(link.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
    })
}

/// The agent's ignored files — whatever git ignores that is not crew's (its links, its copies of
/// `[worktree] copy`, the `keep_ignored` paths a recycled worktree keeps): named and counted in
/// the report and, unless the project lets them go, moved out of the worktree to
/// `keep_ignored_in`, so that they are neither lost with it nor handed to the next task. A file
/// that cannot be moved keeps the worktree in place.
fn set_aside_ignored(
    root: &Utf8Path,
    request: &TeardownWorktree<'_>,
    links: &[String],
    baseline: &SetupBaseline,
    ignored: &[String],
    report: &mut TeardownReport,
) -> Result<(), TeardownWorktreeError> {
    let settings = request.settings;
    let crews = |relative: &str| {
        let path = Utf8Path::new(relative);
        is_link_path(links, relative)
            || baseline.made_ignored(relative)
            || settings.copy.iter().any(|copy| path == copy)
            || settings
                .keep_ignored
                .iter()
                .any(|keep| path.starts_with(keep))
    };
    let ignored: Vec<&String> = ignored
        .iter()
        .filter(|path| !crews(path.trim_end_matches('/')))
        .collect();
    for path in &ignored {
        let relative = path.trim_end_matches('/');
        let (files, bytes) = tree_size(&root.join(relative));
        report.ignored_files += files;
        report.ignored_bytes += bytes;
        if report.ignored_paths.len() < TeardownReport::NAMED {
            report.ignored_paths.push((*path).clone());
        }
    }
    let Some(keep) = request
        .keep_ignored_in
        .as_ref()
        .filter(|_| !ignored.is_empty())
    else {
        return Ok(());
    };
    for path in &ignored {
        let relative = path.trim_end_matches('/');
        let target = keep.join(relative);
        // An agent's read-only directory on the way (or the one moved) is its owner's to
        // move again.
        let moved = crew_core::paths::give_owner_access_along(
            root.as_std_path(),
            Utf8Path::new(relative).as_std_path(),
        )
        .and_then(|()| match target.parent() {
            Some(parent) => std::fs::create_dir_all(parent),
            None => Ok(()),
        })
        .and_then(|()| std::fs::rename(root.join(relative), &target));
        if let Err(source) = moved {
            return Err(TeardownWorktreeError::KeepIgnored {
                path: root.join(relative),
                keep: keep.clone(),
                source,
            });
        }
    }
    report.ignored_kept_in = Some(keep.clone());
    Ok(())
}

/// Files and bytes below `path`, never following symlinks (a link counts as one small file).
pub(crate) fn tree_size(path: &Utf8Path) -> (u64, u64) {
    let Ok(metadata) = std::fs::symlink_metadata(path) else {
        return (0, 0);
    };
    if !metadata.is_dir() {
        return (1, metadata.len());
    }
    let mut totals = (0, 0);
    if let Ok(entries) = path.read_dir_utf8() {
        for entry in entries.flatten() {
            let (files, bytes) = tree_size(entry.path());
            totals.0 += files;
            totals.1 += bytes;
        }
    }
    totals
}

/// Deletes the task branch when it holds nothing beyond the base (and crew made it for this
/// task); keeps a branch with work and says how to merge it.
fn settle_branches(
    repo: &Repository,
    request: &TeardownWorktree<'_>,
    names: &TaskNames,
    work_branch: Option<&str>,
    report: &mut TeardownReport,
) {
    let base = request
        .workspace
        .base_commit
        .as_deref()
        .and_then(|base| Oid::from_str(base).ok());
    let tip_of = |name: &str| {
        repo.find_branch(name, BranchType::Local)
            .ok()
            .and_then(|branch| branch.get().target())
    };
    let task_tip = tip_of(&names.branch);
    if let (Some(task_tip), Some(base)) = (task_tip, base)
        && task_tip == base
        && !request.workspace.reused
        && let Ok(mut branch) = repo.find_branch(&names.branch, BranchType::Local)
        && branch.delete().is_ok()
    {
        report.branch_deleted = true;
    }
    let kept = match work_branch {
        Some(branch) if branch != names.branch || !report.branch_deleted => Some(branch.to_owned()),
        _ => None,
    };
    let Some(kept) = kept else {
        // Nothing beyond the base: what the teardown noted of the branch went with it.
        report.branch = None;
        report.tip = None;
        report.diffstat = None;
        report.merge_hint = None;
        return;
    };
    let Some(tip) = describe_branch(repo, request, &kept, report, true) else {
        return;
    };
    if let Some(base) = base {
        report
            .security
            .extend(settings_changed(repo, request.repo_root, base, tip));
    }
}

/// Records in `report` that the task's work is on `branch`: its tip, how to merge it and, when
/// `counted`, its changes since the base. The tip, `None` when the branch is not there.
fn describe_branch(
    repo: &Repository,
    request: &TeardownWorktree<'_>,
    branch: &str,
    report: &mut TeardownReport,
    counted: bool,
) -> Option<Oid> {
    let tip = repo
        .find_branch(branch, BranchType::Local)
        .ok()?
        .get()
        .target()?;
    let base = request
        .workspace
        .base_commit
        .as_deref()
        .and_then(|base| Oid::from_str(base).ok());
    if counted {
        report.diffstat = base.and_then(|base| diffstat(repo, base, tip));
    }
    report.merge_hint = Some(format!("git merge {branch}"));
    report.tip = Some(tip.to_string());
    report.branch = Some(branch.to_owned());
    Some(tip)
}

/// Whether the task's commits add a symbolic link, or turn a path into one, since its base (a
/// base that cannot be read counts as yes).
fn makes_links(repo: &Repository, request: &TeardownWorktree<'_>, tip: Oid) -> bool {
    const LINK: u32 = 0o120000;
    let Some(base) = request
        .workspace
        .base_commit
        .as_deref()
        .and_then(|base| Oid::from_str(base).ok())
    else {
        return true;
    };
    let trees = repo
        .find_commit(base)
        .and_then(|base| base.tree())
        .and_then(|base| Ok((base, repo.find_commit(tip)?.tree()?)));
    let Ok((base_tree, tip_tree)) = trees else {
        return true;
    };
    let Ok(diff) = repo.diff_tree_to_tree(Some(&base_tree), Some(&tip_tree), None) else {
        return true;
    };
    diff.deltas().any(|delta| {
        u32::from(delta.new_file().mode()) == LINK && u32::from(delta.old_file().mode()) != LINK
    })
}

/// crew's own settings (`.crew/`, its state aside) that the task's branch changes since its
/// base: merging the branch would change how crew runs agents, so each is a finding to review
/// before merging. (What loosens the sandbox would still need allowing; the rest applies at
/// once.)
fn settings_changed(
    repo: &Repository,
    repo_root: &Utf8Path,
    base: Oid,
    tip: Oid,
) -> Vec<crew_core::provider::SecurityFinding> {
    let trees = repo
        .find_commit(base)
        .and_then(|base| base.tree())
        .and_then(|base| Ok((base, repo.find_commit(tip)?.tree()?)));
    let Ok((base_tree, tip_tree)) = trees else {
        return Vec::new();
    };
    let mut options = git2::DiffOptions::new();
    options.pathspec(".crew/");
    let Ok(diff) = repo.diff_tree_to_tree(Some(&base_tree), Some(&tip_tree), Some(&mut options))
    else {
        return Vec::new();
    };
    diff.deltas()
        .filter_map(|delta| {
            let file = delta
                .new_file()
                .path()
                .or_else(|| delta.old_file().path())?;
            let file = Utf8Path::from_path(file)?;
            (!file.starts_with(".crew/state")).then(|| crew_core::provider::SecurityFinding {
                path: repo_root.join(file),
                change: match delta.status() {
                    git2::Delta::Added => "added",
                    git2::Delta::Deleted => "removed",
                    _ => "modified",
                }
                .to_owned(),
                restored: false,
                saved: None,
                on_branch: true,
            })
        })
        .collect()
}

fn diffstat(repo: &Repository, base: Oid, tip: Oid) -> Option<DiffStat> {
    let base_tree = repo.find_commit(base).ok()?.tree().ok()?;
    let tip_tree = repo.find_commit(tip).ok()?.tree().ok()?;
    let stats = repo
        .diff_tree_to_tree(Some(&base_tree), Some(&tip_tree), None)
        .ok()?
        .stats()
        .ok()?;
    Some(DiffStat {
        files_changed: stats.files_changed(),
        insertions: stats.insertions(),
        deletions: stats.deletions(),
    })
}

/// The path of a worktree kept by a teardown that could not finish, unlocked so that the user
/// can work with it.
pub fn release_preserved(
    repo_root: &Utf8Path,
    settings: &WorktreeSettings,
    run_id: &RunId,
    task_id: &TaskId,
    report: &mut TeardownReport,
) -> Utf8PathBuf {
    let names = TaskNames::new(repo_root, settings, run_id, task_id);
    if let Ok(repo) = Repository::open(repo_root) {
        let common = leader::common_dir(&repo);
        // The user works in it from here: with the repository's own git, the agent's commits
        // and staged files taken into it. What cannot be taken stays in the agent's directory,
        // which the worktree no longer reads.
        // Its `.git` is written through the worktree's directory reached with no link, never
        // through one put in its place (then there is nothing of crew's to point back).
        let held = crew_core::paths::HeldDir::open(names.root.as_std_path()).ok();
        let agent_git = match &held {
            Some(held) => AgentGit::of(&common, &names).writing_through(&held.path()),
            None => AgentGit::of(&common, &names),
        };
        match agent_git.take_with_index(&repo, &names.branch_ref()) {
            // Its work taken: its `.git` goes back to the admin entry, where the worktree is
            // still crew's; a failure leaves the pointer to the agent's directory, which holds
            // nothing not taken.
            Ok(_) if held.is_some() => {
                // The work is taken; a view not disarmed is disarmed by the worktree's removal or
                // named by the next teardown.
                let _ = agent_git.disarm();
            }
            Ok(_) => {}
            Err(error) if agent_git.exists() && held.is_none() => report.warnings.push(format!(
                "the agent's git directory is kept at {} with what could not be taken ({error}); {} is not the worktree crew made (a link or gone), so nothing was written there",
                agent_git.dir(),
                names.root
            )),
            Err(error) if agent_git.exists() => match agent_git.point_back() {
                Ok(()) => report.warnings.push(format!(
                    "the agent's git directory is kept at {} with what could not be taken ({error}); the worktree uses the repository's own git again",
                    agent_git.dir()
                )),
                Err(problem) => report.warnings.push(format!(
                    "the worktree still uses the agent's git directory {} ({problem}): do not run git there",
                    agent_git.dir()
                )),
            },
            Err(_) => {}
        }
        // Still locked, the worktree is as usable, and only needs `--force` to be removed by
        // hand: not worth failing the release for.
        let _ = admin::set_lock(&common, &names.admin, None);
    }
    names.root
}

/// Removes git's admin entry of a removed worktree. A failure leaves an entry git reports as
/// prunable (`git worktree prune` removes it): a warning of the teardown, not an error.
fn forget_admin_entry(
    common: &Utf8Path,
    admin: &str,
    root: &Utf8Path,
    report: &mut TeardownReport,
) {
    if let Err(error) = admin::remove_entry(common, admin) {
        report.warnings.push(format!(
            "could not remove git's entry for {root} ({error}); `git worktree prune` removes it"
        ));
    }
}
