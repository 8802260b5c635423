//! [`CrewWorkspaces`]: the `WorkspaceProvider` for the four modes (ARCHITECTURE.md,
//! "Workspaces"), with the fallback policy.

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::StateStore;
use crew_core::config::{IsolationFallback, ProjectConfig, WorkspaceMode, WorktreeSettings};
use crew_core::paths::{canonical_utf8, remove_contained};
use crew_core::provider::{
    AllocateErrorKind, AllocateWorkspaceError, ProviderError, RunPlan, RunRequest, TaskWorkspace,
    TeardownError, TeardownReport, TeardownRequest, WorkspaceKind, WorkspaceProvider,
    WorkspaceRequest,
};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crew_core::{RunId, TaskId};

use crate::error::{PrepareWorktreeError, TeardownWorktreeError};
use crate::leader;
use crate::private_git::PrivateGit;
use crate::teardown::{TeardownWorktree, release_preserved, teardown_worktree};

mod allocate;
mod tripwires;

use tripwires::Tripwire;

/// crew's workspaces: `single`, `worktree`, `temp` and `dedicated`.
#[derive(Debug, Clone)]
pub struct CrewWorkspaces {
    settings: WorktreeSettings,
    fallback: IsolationFallback,
    require_clean_leader: bool,
    temp_root: Utf8PathBuf,
    /// The tripwire of each repository with tasks in this process, keyed by its root.
    tripwires: Arc<Mutex<HashMap<Utf8PathBuf, Tripwire>>>,
    /// Tasks whose agents cannot write the shared git directory (confined by the kernel, in a
    /// workspace of their own): the tripwire neither watches for them nor blames them.
    beyond_reach: Arc<Mutex<HashSet<(RunId, TaskId)>>>,
}

impl CrewWorkspaces {
    /// Workspaces configured by the project's `[worktree]` and `[isolation]` settings; temp
    /// workspaces go to the system temp directory.
    pub fn new(config: &ProjectConfig) -> Self {
        let temp_root =
            canonical_utf8(&std::env::temp_dir()).unwrap_or_else(|_| Utf8PathBuf::from("/tmp"));
        CrewWorkspaces {
            require_clean_leader: config.worktree.require_clean_leader,
            settings: config.worktree.clone(),
            fallback: config.isolation.fallback,
            temp_root,
            tripwires: Arc::default(),
            beyond_reach: Arc::default(),
        }
    }

    /// Makes temp workspaces under `dir` instead of the system temp directory.
    pub fn with_temp_root(mut self, dir: Utf8PathBuf) -> Self {
        self.temp_root = dir;
        self
    }

    /// The project's `[worktree]` settings.
    pub fn settings(&self) -> &WorktreeSettings {
        &self.settings
    }

    /// Where temp workspaces are made (and the only place their removal may touch).
    pub fn temp_root(&self) -> &Utf8Path {
        &self.temp_root
    }

    fn beyond_reach(&self) -> std::sync::MutexGuard<'_, HashSet<(RunId, TaskId)>> {
        self.beyond_reach
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn tripwires(&self) -> std::sync::MutexGuard<'_, HashMap<Utf8PathBuf, Tripwire>> {
        self.tripwires
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The warning recorded on a task that got a temp dir instead of a worktree: `workspace:temp —
/// worktree requested but <reason>; used a temp dir instead`.
pub fn fallback_warning(error: &PrepareWorktreeError) -> String {
    let reason = match error {
        PrepareWorktreeError::NotARepository { .. } => "base cwd is not a git work tree".to_owned(),
        PrepareWorktreeError::NoCommit { .. } => "the repository has no commit yet".to_owned(),
        PrepareWorktreeError::DirtyLeader { paths, .. } => format!(
            "the leader has uncommitted changes to {} tracked file(s)",
            paths.len()
        ),
        other => other.to_string(),
    };
    format!("workspace:temp — worktree requested but {reason}; used a temp dir instead")
}

impl WorkspaceProvider for CrewWorkspaces {
    fn lock_files(&self, repo_root: &Utf8Path) -> Vec<Utf8PathBuf> {
        let Ok(repo) = crate::leader::open(Some(repo_root), repo_root) else {
            return Vec::new();
        };
        let lock = crate::trash::repo_lock_path(&crate::leader::common_dir(&repo));
        // Made now, so that there is a file to cover when the agent starts.
        match crew_core::fsutil::open_rw_nofollow(&lock) {
            Ok(_) => vec![lock],
            Err(_) => Vec::new(),
        }
    }

    fn run_interrupted(&self, repo_root: &Utf8Path, run_id: &RunId) {
        // Only labels: a worktree not relabelled still shows as the run's, and teardown or
        // `crew runs clean` handles it the same.
        let _ = crate::listing::mark_interrupted(repo_root, &self.settings, run_id);
    }

    fn take_away_unfinished(
        &self,
        repo_root: &Utf8Path,
        run_id: &RunId,
        tasks: &[TaskId],
        dry_run: bool,
    ) -> Vec<TaskId> {
        // Best effort: one that stays is `crew worktrees prune`'s to remove.
        crate::unfinished::take_away_of_run(repo_root, &self.settings, run_id, tasks, dry_run)
            .unwrap_or_default()
    }

    fn base_movement(
        &self,
        repo_root: &Utf8Path,
        base: &str,
        branch: &str,
    ) -> Option<crew_core::provider::BaseMovement> {
        crate::leader::base_movement(repo_root, base, branch)
    }

    fn pool_missing(&self, repo_root: &Utf8Path) -> usize {
        crate::pool::missing_at(repo_root, &self.settings)
    }

    fn branch_diffstat(
        &self,
        repo_root: &Utf8Path,
        base: &str,
        branch: &str,
    ) -> Option<crew_core::provider::DiffStat> {
        let (_, [files_changed, insertions, deletions]) =
            crate::inspect::branch_stat(repo_root, base, branch, 80).ok()?;
        Some(crew_core::provider::DiffStat {
            files_changed,
            insertions,
            deletions,
        })
    }

    fn overlaps(
        &self,
        repo_root: &Utf8Path,
        branch: &str,
        others: &[(String, String)],
        target: Option<&str>,
    ) -> Vec<crew_core::model::TaskOverlap> {
        match crate::radar::overlaps_of(repo_root, ("", branch), others, target) {
            Ok(found) => found
                .into_iter()
                .map(|overlap| crew_core::model::TaskOverlap {
                    with: overlap.right,
                    files: overlap.files,
                })
                .collect(),
            // The radar is advice: a repository it cannot read leaves it silent.
            Err(_) => Vec::new(),
        }
    }

    fn land(
        &self,
        repo_root: &Utf8Path,
        target: &str,
        tasks: &[crate::land::Landing],
        mode: crate::land::LandMode,
    ) -> Result<crate::land::Landed, crate::land::LandError> {
        crate::land::land(repo_root, target, tasks, mode)
    }

    fn pack_history(
        &self,
        repo_root: &Utf8Path,
        commit: &str,
        out: &mut dyn std::io::Write,
    ) -> Result<(), ProviderError> {
        Ok(crate::incoming::pack_history(repo_root, commit, out)?)
    }

    fn accept_work(
        &self,
        request: &crew_core::provider::ReceivedWork,
    ) -> Result<(), ProviderError> {
        crate::incoming::accept_work(&crate::incoming::AcceptWork {
            repo_root: &request.repo_root,
            claim: &request.claim,
            pack: &request.pack,
            branch: &request.branch,
            branch_expected_at: request.branch_expected_at.as_deref(),
            quarantine: &request.quarantine,
        })
        .map(|_| ())
        .map_err(Into::into)
    }

    fn prepare_run(&self, request: &RunRequest) -> Result<RunPlan, AllocateWorkspaceError> {
        // A `single` task's agent works in the project, beneath which crew's worktrees live
        // (other tasks' work, of this run or another): the directory is made now, so that it
        // is there to be mounted read-only for it. Not fatal: a task of a run that makes
        // worktrees made it already.
        if request.modes.contains(&WorkspaceMode::Single)
            && let Some(repo_root) = request.repo_root.as_deref()
            && git2::Repository::open(repo_root).is_ok()
        {
            // Best effort: a repository that cannot take the exclude still runs; `crew init` says
            // why.
            let _ = crew_core::git_exclude::ensure_excluded(
                repo_root,
                &crate::create::excluded_patterns(&self.settings),
            );
            // Made again, with its error, by the first worktree that needs it.
            let _ = crate::create::ensure_worktrees_dir(repo_root, &self.settings);
        }
        if !request.modes.contains(&WorkspaceMode::Worktree) {
            return Ok(RunPlan::default());
        }
        if let (Some(name), Some(repo_root)) = (&request.name, request.repo_root.as_deref()) {
            self.check_name_free(repo_root, name, &request.tasks)?;
        }
        let checked = self.check_leader(
            request.workspace.as_path(),
            request.repo_root.as_deref(),
            request.base.as_deref(),
        );
        if let (Ok(_), Some(repo_root)) = (&checked, request.repo_root.as_deref()) {
            // Before any task arms the tripwire on the repository's git files: crew's own
            // lines in `info/exclude` are never taken for an agent's change (a `temp` or placed
            // task armed before a worktree task writes them). Not fatal: without them `git
            // status` in the leader is merely noisier, and each worktree's creation tries again.
            let _ = crew_core::git_exclude::ensure_excluded(
                repo_root,
                &crate::create::excluded_patterns(&self.settings),
            );
        }
        match checked {
            Ok(base) => Ok(RunPlan {
                base_commit: Some(base.to_string()),
                base_branch: leader::open(
                    request.repo_root.as_deref(),
                    request.workspace.as_path(),
                )
                .ok()
                .and_then(|repo| leader::base_branch(&repo, request.base.as_deref())),
                warnings: Vec::new(),
            }),
            Err(error)
                if error.kind() == AllocateErrorKind::Unavailable
                    && self.fallback == IsolationFallback::Temp =>
            {
                Ok(RunPlan {
                    base_commit: None,
                    base_branch: None,
                    warnings: vec![fallback_warning(&error)],
                })
            }
            Err(error) => Err(error.into_allocate_error()),
        }
    }

    fn allocate(
        &self,
        request: &WorkspaceRequest,
    ) -> Result<TaskWorkspace, AllocateWorkspaceError> {
        let result = match request.mode {
            WorkspaceMode::Single => Ok(self.allocate_single(request)),
            WorkspaceMode::Temp => self.allocate_temp(request),
            WorkspaceMode::Dedicated => self.allocate_dedicated(request),
            WorkspaceMode::Worktree => match self.allocate_worktree(request) {
                Err(error)
                    if error.kind() == AllocateErrorKind::Unavailable
                        && self.fallback == IsolationFallback::Temp =>
                {
                    let warning = fallback_warning(&error);
                    self.allocate_temp(request).map(|mut workspace| {
                        workspace.warnings.push(warning);
                        workspace
                    })
                }
                other => other,
            },
        };
        let mut workspace = result.map_err(PrepareWorktreeError::into_allocate_error)?;
        if workspace.kind == WorkspaceKind::Worktree
            && let Some(repo_root) = request.repo_root.as_deref()
            && let Ok(repo) = git2::Repository::open(repo_root)
        {
            workspace.git_config = git_identity(&repo);
        }
        self.arm_tripwire(request, workspace.kind);
        Ok(workspace)
    }

    fn teardown(
        &self,
        workspace: &TaskWorkspace,
        request: &TeardownRequest,
    ) -> Result<TeardownReport, TeardownError> {
        let mut report = TeardownReport::default();
        if request.agent_alive {
            report.preserved = Some(workspace.root.clone());
            report.preserved_reason = Some("the agent may still be running".to_owned());
            return Err(teardown_error(TeardownWorktreeError::AgentAlive, report));
        }
        report.security = self.check_tripwire(workspace, request);
        let checked = self.check_place(workspace, request).and_then(|()| {
            match workspace.kind {
                WorkspaceKind::Temp | WorkspaceKind::Dedicated => {
                    crate::teardown::check_identity(workspace).map_err(|error| error.to_string())
                }
                // Checked by the worktree teardown itself, which also checks its git directory.
                WorkspaceKind::Single | WorkspaceKind::Worktree => Ok(()),
            }
        });
        if let Err(problem) = checked {
            // Left exactly as it is: not crew's directory (any more) to commit into, clean or
            // remove.
            report.preserved = Some(workspace.root.clone());
            report.preserved_reason = Some(problem.clone());
            return Err(teardown_error(
                TeardownWorktreeError::Replaced {
                    path: workspace.root.clone(),
                    problem,
                },
                report,
            ));
        }
        match workspace.kind {
            WorkspaceKind::Single => {
                self.take_single(request, &mut report);
                Ok(report)
            }
            WorkspaceKind::Dedicated => {
                report.preserved = Some(workspace.root.clone());
                report.preserved_reason =
                    Some("dedicated workspaces are kept until their run is pruned".to_owned());
                Ok(report)
            }
            WorkspaceKind::Temp => {
                if request.keep {
                    report.preserved = Some(workspace.root.clone());
                    report.preserved_reason = Some("the task waits for an answer".to_owned());
                    return Ok(report);
                }
                match remove_contained(&workspace.root, &[&self.temp_root]) {
                    Ok(_) => {
                        report.removed = true;
                        Ok(report)
                    }
                    Err(source) => {
                        report.preserved = Some(workspace.root.clone());
                        report.preserved_reason = Some(source.to_string());
                        Err(teardown_error(
                            TeardownWorktreeError::RemoveTemp {
                                path: workspace.root.clone(),
                                source,
                            },
                            report,
                        ))
                    }
                }
            }
            WorkspaceKind::Worktree => {
                if request.keep {
                    report.preserved = Some(workspace.root.clone());
                    report.preserved_reason = Some("the task waits for an answer".to_owned());
                    return Ok(report);
                }
                let Some(repo_root) = request.repo_root.as_deref() else {
                    report.preserved = Some(workspace.root.clone());
                    report.preserved_reason = Some("the repository root is unknown".to_owned());
                    return Ok(report);
                };
                let task_dir = StateStore::new(&request.workspace, Some(repo_root))
                    .task_dir(&request.run_id, &request.task_id);
                let result = teardown_worktree(
                    &TeardownWorktree {
                        workspace,
                        settings: &self.settings,
                        repo_root,
                        run_id: &request.run_id,
                        placed_for: request.placed_for.as_ref(),
                        task_id: &request.task_id,
                        keep_ignored_in: self
                            .settings
                            .keep_agent_ignored
                            .then(|| task_dir.join("ignored")),
                        baseline_file: Some(crate::baseline::file_in(&task_dir)),
                    },
                    &mut report,
                );
                self.note_task_branch(request);
                match result {
                    Ok(()) => Ok(report),
                    Err(error) => {
                        if !report.removed {
                            let kept = release_preserved(
                                repo_root,
                                &self.settings,
                                &request.run_id,
                                &request.task_id,
                                &mut report,
                            );
                            report.preserved = Some(kept);
                            report.preserved_reason = Some(with_cause(&error));
                        }
                        Err(teardown_error(error, report))
                    }
                }
            }
        }
    }
}

impl CrewWorkspaces {
    /// Takes what a `single` task's agent may give from its private view of the git directory
    /// (see [`crate::private_git`]) into the repository; the rest is reported.
    fn take_single(&self, request: &TeardownRequest, report: &mut TeardownReport) {
        let Some(repo_root) = request.repo_root.as_deref() else {
            return;
        };
        let store = StateStore::new(&request.workspace, Some(repo_root));
        let task_dir = store.task_dir(&request.run_id, &request.task_id);
        if !crate::private_git::holds_changes(&task_dir) {
            let spares = crate::private_git::spares_dir(store.state_dir());
            crate::private_git::recycle_view(&task_dir, &spares);
            return;
        }
        let Ok(repo) = git2::Repository::open(repo_root) else {
            return;
        };
        let Some(git_dir) = Utf8PathBuf::from_path_buf(repo.path().to_owned()).ok() else {
            return;
        };
        let common = leader::common_dir(&repo);
        let view = PrivateGit::new(&common, &git_dir, &task_dir);
        let names = crate::names::TaskNames::new(
            repo_root,
            &self.settings,
            &request.run_id,
            &request.task_id,
        );
        let crew_prefix = format!("refs/heads/{}/", self.settings.branch_prefix);
        match view.take(&repo, &names.branch, &crew_prefix, &task_dir.join("tripwire")) {
            Ok(taken) => {
                report.security.extend(taken.findings);
                report.warnings.extend(taken.warnings);
                if let Some(branch) = taken.rescue_branch {
                    report.branch = Some(branch);
                }
            }
            Err(error) => report.warnings.push(format!(
                "git: the agent's commits could not be taken from its view of the repository ({error}); they are kept in {}",
                task_dir.join("git")
            )),
        }
    }
}

/// The identity a commit in `repo` is made with (`user.name`,
/// `user.email`, as the repository's config resolves them: its own, then the user's and the
/// system's), for an agent whose git may not find the user's files (a home of its own).
fn git_identity(repo: &git2::Repository) -> Vec<(String, String)> {
    let Ok(config) = repo.config() else {
        return Vec::new();
    };
    ["user.name", "user.email"]
        .into_iter()
        .filter_map(|key| Some((key.to_owned(), config.get_string(key).ok()?)))
        .collect()
}

/// The common git directory of the repository at `repo_root`, if there is one.
fn repository_common_dir(repo_root: &Utf8Path) -> Option<Utf8PathBuf> {
    let repo = git2::Repository::open(repo_root).ok()?;
    Some(leader::common_dir(&repo))
}

/// An error with what caused it, as one line: git's own message for a git error (`index is
/// locked` says more than "failed to stage").
pub(crate) fn with_cause(error: &dyn std::error::Error) -> String {
    let Some(source) = std::error::Error::source(error) else {
        return error.to_string();
    };
    let cause = match source.downcast_ref::<git2::Error>() {
        Some(git) => git.message().to_owned(),
        None => source.to_string(),
    };
    format!("{error}: {cause}")
}

fn teardown_error(error: TeardownWorktreeError, report: TeardownReport) -> TeardownError {
    TeardownError {
        message: with_cause(&error),
        partial: Box::new(report),
        // The error itself, its causes beneath it: a program that reads it gets the types.
        source: Some(Box::new(error)),
    }
}
