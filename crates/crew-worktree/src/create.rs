//! `prepare_task_workspace` for the `worktree` mode.
//!
//! Under the repository lock (milliseconds): sweep leftover admin entries, take away what a
//! preparation of the same task that died left unfinished ([`unfinished`]), take up an existing
//! worktree of the same task, or make the branch, the directory and the admin entry (locked
//! "initializing"). Outside the lock (the slow part, so tasks overlap): check the files out,
//! link, copy, run the setup command, and only then lock the worktree for its task. Any failure
//! after the first change rolls everything back: no branch, no admin entry, no directory is
//! left, and a directory that existed before is never removed.

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::config::WorktreeSettings;
use crew_core::fsutil::ensure_real_dir;
use crew_core::git_exclude::ensure_excluded;
use crew_core::paths::DirIdentity;
use crew_core::provider::{ProgressSink, TaskWorkspace, UpstreamWork, WorkspaceKind};
use crew_core::{RunId, TaskId};
use git2::{BranchType, Oid, Repository};

use crate::admin;
use crate::agent_git::AgentGit;
use crate::baseline::SetupBaseline;
use crate::checkout;
use crate::envsetup;
use crate::error::PrepareWorktreeError;
use crate::leader;
use crate::names::{TaskNames, admin_prefix, worktrees_dir};
use crate::pool;
use crate::unfinished;

pub use crate::trash::{REPO_LOCK_TIMEOUT, repo_lock};

/// What the leader's `info/exclude` gets so that `git status` there ignores crew's worktrees
/// and the paths it links into them.
pub fn excluded_patterns(settings: &WorktreeSettings) -> Vec<String> {
    let mut patterns = vec![format!("/{}/", settings.dir)];
    patterns.extend(settings.link.iter().map(|link| format!("/{link}")));
    patterns
}

/// The lock reason of a worktree whose task is running.
pub fn in_use_reason(run_id: &RunId, task_id: &TaskId) -> String {
    format!(
        "crew: in use by run {run_id} task {task_id} (pid {})",
        std::process::id()
    )
}

/// What a worktree task needs.
#[derive(Debug, Clone)]
pub struct CreateWorktree<'a> {
    /// The repository's top level.
    pub repo_root: &'a Utf8Path,
    /// The project's `[worktree]` settings.
    pub settings: &'a WorktreeSettings,
    /// The run.
    pub run_id: &'a RunId,
    /// The task.
    pub task_id: &'a TaskId,
    /// The run's base commit.
    pub base: Oid,
    /// The tasks it depends on: their branches are merged into its start.
    pub upstream: &'a [UpstreamWork],
    /// Where the run was started, relative to the repository root.
    pub invocation_dir: &'a Utf8Path,
    /// Where to record what `setup` (and crew's copies) left: the task's baseline.
    pub baseline_file: Option<Utf8PathBuf>,
    /// Where to tell how the checkout moves on.
    pub progress: Option<&'a ProgressSink>,
    /// What the setup command gets besides the host's environment (the task's lease).
    pub env: &'a [(String, String)],
}

/// Gives the task its worktree: an existing one of the same task, or a new one on its branch.
pub fn prepare_worktree(
    request: &CreateWorktree<'_>,
) -> Result<TaskWorkspace, PrepareWorktreeError> {
    let repo = leader::open(Some(request.repo_root), request.repo_root)?;
    let common = leader::common_dir(&repo);
    let names = TaskNames::new(
        request.repo_root,
        request.settings,
        request.run_id,
        request.task_id,
    );
    let lock = repo_lock(&common).map_err(PrepareWorktreeError::Lock)?;
    admin::sweep_invalid(&common, &admin_prefix(request.settings));
    // A preparation of this task that died left its worktree unfinished: never handed to an
    // agent as it is (any part of a checkout), but made again from the task's branch.
    let unfinished = unfinished::take_away(&common, request.repo_root, request.settings, &names)?;

    if let Some(entry) = admin::read_entry(&common, &names.admin)
        && entry.is_valid()
    {
        let mut warnings = Vec::new();
        if entry.branch.as_deref() != Some(names.branch.as_str()) {
            warnings.push(format!(
                "workspace:worktree — the task's worktree is on {} instead of {}; reused as it is",
                entry.branch.as_deref().unwrap_or("a detached HEAD"),
                names.branch
            ));
        }
        lock_in_use(&common, &names, request)?;
        drop(lock);
        let dir = task_dir(&names.root, request.invocation_dir)?;
        let identity = identity_of(&names.root)?;
        // Taken up again: its agent directory may hold commits not yet taken, and is kept.
        let repaired = AgentGit::of(&common, &names)
            .arm(&repo)
            .map_err(|problem| PrepareWorktreeError::AgentGit {
                path: names.root.clone(),
                problem,
            })?;
        warnings.extend(repaired.into_iter().map(|finding| {
            format!(
                "workspace:worktree — {} was not as crew left it; crew's was put back",
                finding.path
            )
        }));
        return Ok(TaskWorkspace {
            kind: WorkspaceKind::Worktree,
            dir,
            branch: Some(names.branch),
            base_commit: Some(request.base.to_string()),
            reused: true,
            warnings,
            identity: Some(identity),
            writable: agent_writable(&common, &names.admin),
            read_only: Vec::new(),
            private: Vec::new(),
            git_config: Vec::new(),
            root: names.root,
        });
    }

    let mut made = Made::default();
    let created = create_locked(&repo, &common, &names, request, &mut made);
    drop(lock);
    let result = created.and_then(|(base_commit, tip)| {
        let held = made.held.as_ref().ok_or_else(|| PrepareWorktreeError::CreateDir {
            path: names.root.clone(),
            source: crew_core::fsutil::FileError::CreateDir {
                path: names.root.clone(),
                source: std::io::Error::other("the worktree's directory was not held"),
            },
        })?;
        let (dir, mut warnings) =
            finish_outside_lock(&common, &names, request, tip, made.recycled, held)?;
        if unfinished {
            warnings.push(format!(
                "workspace:worktree — a preparation killed before it finished had left this worktree half made; it was made again from {}",
                names.branch
            ));
        }
        Ok(TaskWorkspace {
            kind: WorkspaceKind::Worktree,
            root: names.root.clone(),
            dir,
            branch: Some(names.branch.clone()),
            base_commit: Some(base_commit.to_string()),
            reused: !made.branch,
            warnings,
            identity: Some(identity_of(&names.root)?),
            writable: agent_writable(&common, &names.admin),
            read_only: Vec::new(),
            private: Vec::new(),
            git_config: Vec::new(),
        })
    });
    if result.is_err() {
        rollback(&repo, &common, &names, request, &made);
    }
    result
}

/// The identity teardown and the agent's start check a workspace against: a real directory,
/// reached with no link at any level (one swapped for a link while it was made fails it).
pub(crate) fn identity_of(root: &Utf8Path) -> Result<DirIdentity, PrepareWorktreeError> {
    DirIdentity::of(root).map_err(|source| PrepareWorktreeError::Identity {
        path: root.to_owned(),
        source,
    })
}

/// What an agent in this worktree may write in the repository's git directory: its own agent
/// directory (see [`crate::agent_git`]), where its `git add` and `git commit` go — never the
/// repository's objects, refs, `packed-refs`, `config`, `hooks/` or `info/`, nor any admin
/// entry, its own included.
pub fn agent_writable(common: &Utf8Path, admin: &str) -> Vec<Utf8PathBuf> {
    vec![
        admin::admin_root(common)
            .join(admin)
            .join(crate::agent_git::AGENT_DIR),
    ]
}

/// What this attempt created, so that a failure removes exactly that.
#[derive(Debug, Default)]
struct Made {
    branch: bool,
    /// The worktree came from the pool: switched to the task's commit, not checked out.
    recycled: bool,
    run_dir: Option<Utf8PathBuf>,
    worktree_dir: bool,
    admin_entry: bool,
    /// The worktree's directory, held open: what fills it goes through this, never through its
    /// path, which a racing process could point elsewhere meanwhile.
    held: Option<crew_core::paths::HeldDir>,
}

fn create_locked(
    repo: &Repository,
    common: &Utf8Path,
    names: &TaskNames,
    request: &CreateWorktree<'_>,
    made: &mut Made,
) -> Result<(Oid, Oid), PrepareWorktreeError> {
    let worktrees = ensure_worktrees_dir(request.repo_root, request.settings)?;
    // Not fatal: without it `git status` in the leader is merely noisier. (A run's
    // `prepare_run` wrote them before any task started; this is for callers without one.)
    let _ = ensure_excluded(request.repo_root, &excluded_patterns(request.settings));

    if std::fs::symlink_metadata(&names.root).is_ok() {
        return Err(PrepareWorktreeError::TargetExists {
            path: names.root.clone(),
        });
    }
    let (base, tip) = match repo.find_branch(&names.branch, BranchType::Local) {
        Ok(branch) => {
            // A branch left by a crashed run: taken up as it is, never reset.
            if let Some(checked_out_at) = checked_out_elsewhere(repo, common, &names.branch) {
                return Err(PrepareWorktreeError::BranchInUse {
                    branch: names.branch.clone(),
                    checked_out_at,
                });
            }
            let tip = branch
                .get()
                .peel_to_commit()
                .map_err(|source| PrepareWorktreeError::CreateBranch {
                    branch: names.branch.clone(),
                    source,
                })?
                .id();
            (request.base, tip)
        }
        Err(_) => {
            let base = leader::upstream_base(
                repo,
                request.base,
                request.upstream,
                request.task_id.as_str(),
            )?;
            let commit =
                repo.find_commit(base)
                    .map_err(|source| PrepareWorktreeError::CreateBranch {
                        branch: names.branch.clone(),
                        source,
                    })?;
            repo.branch(&names.branch, &commit, false)
                .map_err(|source| PrepareWorktreeError::CreateBranch {
                    branch: names.branch.clone(),
                    source,
                })?;
            made.branch = true;
            (base, base)
        }
    };
    let run_dir = worktrees.join(request.run_id.as_str());
    if !run_dir.exists() {
        made.run_dir = Some(run_dir.clone());
    }
    ensure_real_dir(&run_dir).map_err(|source| PrepareWorktreeError::CreateDir {
        path: run_dir.clone(),
        source,
    })?;
    if pool::take(common, request.repo_root, request.settings, names).is_some() {
        made.recycled = true;
        made.worktree_dir = true;
        made.admin_entry = true;
        // Held from here: what fills it never goes through its path again.
        made.held = Some(
            crew_core::paths::HeldDir::open(names.root.as_std_path()).map_err(|source| {
                PrepareWorktreeError::CreateDir {
                    path: names.root.clone(),
                    source: crew_core::fsutil::FileError::CreateDir {
                        path: names.root.clone(),
                        source,
                    },
                }
            })?,
        );
        return Ok((base, tip));
    }
    // Through handles from the repository root down: `.worktrees/<run>` swapped for a link as
    // the worktree is made is refused, never followed out of crew's roots.
    let mut parents: Vec<&str> = request
        .settings
        .dir
        .components()
        .map(|component| component.as_str())
        .collect();
    parents.push(request.run_id.as_str());
    let (_, held) = crew_core::fsutil::create_dir_beneath(
        request.repo_root,
        &parents,
        request.task_id.as_str(),
    )
    .map_err(|source| PrepareWorktreeError::CreateDir {
        path: names.root.clone(),
        source,
    })?;
    made.worktree_dir = true;
    made.admin_entry = true;
    admin::write_entry(
        common,
        &names.admin,
        (&names.root, &held.path()),
        &names.branch_ref(),
    )
    .map_err(|source| PrepareWorktreeError::Register {
        path: names.root.clone(),
        source,
    })?;
    made.held = Some(held);
    Ok((base, tip))
}

fn finish_outside_lock(
    common: &Utf8Path,
    names: &TaskNames,
    request: &CreateWorktree<'_>,
    tip: Oid,
    recycled: bool,
    held: &crew_core::paths::HeldDir,
) -> Result<(Utf8PathBuf, Vec<String>), PrepareWorktreeError> {
    // Every write below goes through the directory held since it was made (or taken from the
    // pool), never through `names.root` again.
    let through = held.path();
    let filled = if recycled {
        let _turn = crate::passes::turn();
        pool::switch(&through, tip, request.settings)
    } else {
        checkout::populate(&through, common, tip, request.progress)
    };
    filled.map_err(|source| PrepareWorktreeError::Checkout {
        path: names.root.clone(),
        branch: names.branch.clone(),
        source,
    })?;
    envsetup::link_paths(request.settings, request.repo_root, &through)?;
    let warnings = envsetup::copy_paths(request.settings, request.repo_root, &through)?;
    task_dir(&through, request.invocation_dir)?;
    let dir = task_dir_path(&names.root, request.invocation_dir);
    envsetup::run_setup(request.settings, &through, request.env)?;
    let mut warnings = warnings;
    if let Some(file) = &request.baseline_file {
        let links = crate::teardown::crew_links(request.settings, request.repo_root, &through);
        let recorded = SetupBaseline::take(&through, &links)
            .map_err(|error| error.message().to_owned())
            .and_then(|baseline| baseline.save(file).map_err(|error| error.to_string()));
        if let Err(problem) = recorded {
            warnings.push(format!(
                "workspace:worktree — what setup made could not be recorded ({problem}); it may be counted as the agent's work"
            ));
        }
    }
    // Last: setup and crew's own reads went through the admin entry; from here on the
    // worktree's git is the agent's own.
    let leader = leader::open(Some(request.repo_root), request.repo_root)?;
    AgentGit::of(common, names)
        .writing_through(&through)
        .arm(&leader)
        .map_err(|problem| PrepareWorktreeError::AgentGit {
            path: names.root.clone(),
            problem,
        })?;
    // Complete: until now it was locked "initializing", which a host that dies leaves behind
    // (see [`unfinished`]).
    lock_in_use(common, names, request)?;
    Ok((dir, warnings))
}

/// Locks the task's worktree "in use" by its task: complete, and its agent's from now on.
fn lock_in_use(
    common: &Utf8Path,
    names: &TaskNames,
    request: &CreateWorktree<'_>,
) -> Result<(), PrepareWorktreeError> {
    admin::set_lock(
        common,
        &names.admin,
        Some(&in_use_reason(request.run_id, request.task_id)),
    )
    .map_err(|source| PrepareWorktreeError::Register {
        path: names.root.clone(),
        source,
    })
}

/// `<worktree>/<invocation dir>`: where the agent starts.
fn task_dir_path(root: &Utf8Path, invocation_dir: &Utf8Path) -> Utf8PathBuf {
    crew_core::paths::resolve_contained_path(root, invocation_dir)
        .unwrap_or_else(|_| root.to_owned())
}

/// `<worktree>/<invocation dir>`, created when the leader's directory is not tracked.
fn task_dir(
    root: &Utf8Path,
    invocation_dir: &Utf8Path,
) -> Result<Utf8PathBuf, PrepareWorktreeError> {
    let dir = task_dir_path(root, invocation_dir);
    std::fs::create_dir_all(&dir).map_err(|source| PrepareWorktreeError::CreateDir {
        path: dir.clone(),
        source: crew_core::fsutil::FileError::CreateDir {
            path: dir.clone(),
            source,
        },
    })?;
    Ok(dir)
}

/// `<repo-root>/<dir>`, each level a real directory (never a symlink leading elsewhere).
pub(crate) fn ensure_worktrees_dir(
    repo_root: &Utf8Path,
    settings: &WorktreeSettings,
) -> Result<Utf8PathBuf, PrepareWorktreeError> {
    let mut dir = repo_root.to_owned();
    for component in settings.dir.components() {
        dir.push(component);
        ensure_real_dir(&dir).map_err(|source| PrepareWorktreeError::CreateDir {
            path: dir.clone(),
            source,
        })?;
    }
    crew_core::fsutil::spread_apart(&dir);
    Ok(worktrees_dir(repo_root, settings))
}

/// Where `branch` is checked out already: another worktree, or the leader itself.
fn checked_out_elsewhere(
    repo: &Repository,
    common: &Utf8Path,
    branch: &str,
) -> Option<Utf8PathBuf> {
    if let Ok(head) = repo.find_reference("HEAD")
        && head.symbolic_target().ok().flatten() == Some(format!("refs/heads/{branch}").as_str())
    {
        return Some(
            repo.workdir()
                .and_then(|dir| Utf8Path::from_path(dir).map(Utf8Path::to_owned))
                .unwrap_or_else(|| common.to_owned()),
        );
    }
    admin::read_entries(common)
        .into_iter()
        .find(|entry| entry.branch.as_deref() == Some(branch))
        .map(|entry| entry.worktree.unwrap_or(entry.dir))
}

/// Removes what a failed creation made, newest first. Best effort: each step is tried even
/// when an earlier one fails, and failures are ignored — the creation already failed with an
/// error of its own, nothing here holds an agent's work, and what is left is crew's to sweep
/// (`crew worktrees prune`). The checkout itself goes to the trash under the lock and is
/// deleted once it is released: other tasks' worktrees do not wait on its files.
fn rollback(
    repo: &Repository,
    common: &Utf8Path,
    names: &TaskNames,
    request: &CreateWorktree<'_>,
    made: &Made,
) {
    let Ok(_lock) = repo_lock(common) else {
        return;
    };
    if made.worktree_dir {
        crate::trash::discard(request.repo_root, request.settings, &names.root);
    }
    if made.admin_entry {
        // Rolling back a failed attempt: an entry left behind is swept by the next preparation.
        let _ = admin::remove_entry(common, &names.admin);
    }
    if made.branch
        && let Ok(mut branch) = repo.find_branch(&names.branch, BranchType::Local)
    {
        // Rolling back: a branch left behind is taken up as it is by the next preparation.
        let _ = branch.delete();
    }
    if let Some(run_dir) = &made.run_dir {
        // Only when empty: another task of the run may have its worktree there by now.
        let _ = std::fs::remove_dir(run_dir);
    }
}
