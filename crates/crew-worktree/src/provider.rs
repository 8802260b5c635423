//! [`CrewWorkspaces`]: the `WorkspaceProvider` for the four modes (ARCHITECTURE.md,
//! "Workspaces"), with the fallback policy.

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::config::{IsolationFallback, ProjectConfig, WorkspaceMode, WorktreeSettings};
use crew_core::paths::{canonical_utf8, remove_contained};
use crew_core::provider::{
    AllocateErrorKind, AllocateWorkspaceError, RunPlan, RunRequest, TaskWorkspace, TeardownError,
    TeardownReport, TeardownRequest, WorkspaceKind, WorkspaceProvider, WorkspaceRequest,
};
use crew_core::{StateStore, safe_segment};
use git2::Oid;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crew_core::provider::SecurityFinding;
use crew_core::{RunId, TaskId};

use crate::create::{CreateWorktree, identity_of, prepare_worktree};
use crate::error::{PrepareWorktreeError, TeardownWorktreeError};
use crate::leader;
use crate::private_git::PrivateGit;
use crate::teardown::{TeardownWorktree, release_preserved, teardown_worktree};
use crate::tripwire::Baseline;

/// crew's workspaces: `single`, `worktree`, `temp` and `dedicated`.
#[derive(Debug, Clone)]
pub struct CrewWorkspaces {
    settings: WorktreeSettings,
    fallback: IsolationFallback,
    require_clean_leader: bool,
    temp_root: Utf8PathBuf,
    /// The tripwire of each repository with tasks in this process, keyed by its root.
    tripwires: Arc<Mutex<HashMap<Utf8PathBuf, Tripwire>>>,
}

/// The files a repository's tasks must not change, as they were before the first of the tasks
/// now active started.
#[derive(Debug)]
struct Tripwire {
    /// The repository's common git directory.
    common: Utf8PathBuf,
    baseline: Baseline,
    active: HashSet<(RunId, TaskId)>,
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

    fn tripwires(&self) -> std::sync::MutexGuard<'_, HashMap<Utf8PathBuf, Tripwire>> {
        self.tripwires
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts watching the repository's git files for this task: a fresh copy of them when no
    /// other task of the repository is active in this process, the copy already taken
    /// otherwise (it must predate every agent that could have changed them) — or, for a run
    /// taken up again after its host died, the copy saved beside it then. The copy is saved
    /// beside the run while its tasks are active.
    fn arm_tripwire(&self, request: &WorkspaceRequest) {
        let Some(repo_root) = request.repo_root.as_deref() else {
            return;
        };
        let saved = tripwire_file(&request.workspace, repo_root, &request.run_id);
        let mut tripwires = self.tripwires();
        let tripwire = match tripwires.entry(repo_root.to_owned()) {
            Entry::Occupied(entry) => {
                let tripwire = entry.into_mut();
                if tripwire.active.is_empty() {
                    tripwire.baseline = Baseline::load(&saved, &tripwire.common)
                        .unwrap_or_else(|| Baseline::of_repository(&tripwire.common));
                }
                tripwire
            }
            Entry::Vacant(entry) => {
                let Some(common) = repository_common_dir(repo_root) else {
                    return;
                };
                entry.insert(Tripwire {
                    baseline: Baseline::load(&saved, &common)
                        .unwrap_or_else(|| Baseline::of_repository(&common)),
                    common,
                    active: HashSet::new(),
                })
            }
        };
        let run_active = tripwire
            .active
            .iter()
            .any(|(run_id, _)| *run_id == request.run_id);
        // An agent that will run unconfined can write the refs itself: they are recorded
        // before it starts, to say what it destroyed.
        let recorded = request.unconfined
            && git2::Repository::open(repo_root)
                .is_ok_and(|repo| tripwire.baseline.record_refs(&repo));
        if recorded || (!run_active && !saved.is_file()) {
            // Not fatal: without it, a teardown after the host died has no copy to check.
            let _ = tripwire.baseline.save(&saved);
        }
        tripwire
            .active
            .insert((request.run_id.clone(), request.task_id.clone()));
    }

    /// Puts back what changed since the tripwire was armed, keeps the changed versions in the
    /// task's state directory, and reports each change.
    fn check_tripwire(
        &self,
        workspace: &TaskWorkspace,
        request: &TeardownRequest,
    ) -> Vec<SecurityFinding> {
        let Some(repo_root) = request.repo_root.as_deref() else {
            return Vec::new();
        };
        let saved = tripwire_file(&request.workspace, repo_root, &request.run_id);
        let key = (request.run_id.clone(), request.task_id.clone());
        let mut tripwires = self.tripwires();
        let armed = tripwires
            .get(repo_root)
            .is_some_and(|tripwire| tripwire.active.contains(&key));
        let common = match tripwires.get(repo_root) {
            Some(tripwire) => tripwire.common.clone(),
            None => match repository_common_dir(repo_root) {
                Some(common) => common,
                None => return Vec::new(),
            },
        };
        // A worktree's own config, which crew never writes: any is the agent's.
        let own = match workspace.kind {
            WorkspaceKind::Worktree => {
                let names = crate::names::TaskNames::new(
                    repo_root,
                    &self.settings,
                    &request.run_id,
                    &request.task_id,
                );
                vec![
                    common
                        .join("worktrees")
                        .join(names.admin)
                        .join("config.worktree"),
                ]
            }
            _ => Vec::new(),
        };
        let evidence = StateStore::new(&request.workspace, request.repo_root.as_deref())
            .task_dir(&request.run_id, &request.task_id)
            .join("tripwire");
        let Some(tripwire) = tripwires.get_mut(repo_root).filter(|_| armed) else {
            // Not armed in this process: a teardown after the host died, checked against the
            // copy saved beside the run then.
            return Baseline::load(&saved, &common)
                .map(|mut baseline| {
                    let mut findings = baseline.restore(&own, &evidence);
                    findings.extend(self.check_refs(&mut baseline, repo_root, [&key]));
                    findings
                })
                .unwrap_or_default();
        };
        let mut findings = tripwire.baseline.restore(&own, &evidence);
        let active: Vec<(RunId, TaskId)> = tripwire.active.iter().cloned().collect();
        findings.extend(self.check_refs(&mut tripwire.baseline, repo_root, active.iter()));
        if !request.keep {
            tripwire.active.remove(&key);
            if !tripwire
                .active
                .iter()
                .any(|(run_id, _)| *run_id == request.run_id)
            {
                let _ = std::fs::remove_file(&saved);
            }
        }
        findings
    }

    /// What an unconfined agent destroyed of the refs recorded before it started (see
    /// [`Baseline::check_refs`]), but for the branches the `tasks` may move and the checkout's.
    fn check_refs<'a>(
        &self,
        baseline: &mut Baseline,
        repo_root: &Utf8Path,
        tasks: impl IntoIterator<Item = &'a (RunId, TaskId)>,
    ) -> Vec<SecurityFinding> {
        if !baseline.has_refs() {
            return Vec::new();
        }
        let Ok(repo) = git2::Repository::open(repo_root) else {
            return Vec::new();
        };
        let mut own: Vec<String> = tasks
            .into_iter()
            .map(|(run_id, task_id)| {
                crate::names::TaskNames::new(repo_root, &self.settings, run_id, task_id)
                    .branch_ref()
            })
            .collect();
        if let Some(head) = repo
            .find_reference("HEAD")
            .ok()
            .and_then(|head| head.symbolic_target().ok().flatten().map(str::to_owned))
        {
            own.push(head);
        }
        baseline.check_refs(&repo, &own)
    }

    /// After crew moved (or deleted) a task's branch at its teardown: the tripwire's record of
    /// the refs follows.
    fn note_task_branch(&self, request: &TeardownRequest) {
        let Some(repo_root) = request.repo_root.as_deref() else {
            return;
        };
        let mut tripwires = self.tripwires();
        let Some(tripwire) = tripwires.get_mut(repo_root) else {
            return;
        };
        if !tripwire.baseline.has_refs() {
            return;
        }
        let Ok(repo) = git2::Repository::open(repo_root) else {
            return;
        };
        let branch = crate::names::TaskNames::new(
            repo_root,
            &self.settings,
            &request.run_id,
            &request.task_id,
        )
        .branch_ref();
        tripwire.baseline.note_ref(&repo, &branch);
    }

    /// Where a task's workspace of this kind must be, derived from its ids and crew's roots,
    /// never taken from the record: a record pointing elsewhere (edited by hand, or by an
    /// agent) is refused before anything is touched.
    fn check_place(
        &self,
        workspace: &TaskWorkspace,
        request: &TeardownRequest,
    ) -> Result<(), String> {
        let root = &workspace.root;
        let expected_place = match workspace.kind {
            WorkspaceKind::Single => return Ok(()),
            WorkspaceKind::Dedicated => {
                let store = StateStore::new(&request.workspace, request.repo_root.as_deref());
                let expected = store.dedicated_dir(&request.run_id, &request.task_id);
                (*root == expected)
                    .then_some(())
                    .ok_or(expected.to_string())
            }
            WorkspaceKind::Temp => {
                let name_ok = root.file_name().is_some_and(|name| {
                    name.starts_with(&format!(
                        "crew-ws-{}-",
                        safe_segment(request.task_id.as_str())
                    ))
                });
                (name_ok && root.parent() == Some(self.temp_root.as_path()))
                    .then_some(())
                    .ok_or(format!("a crew-ws-* directory in {}", self.temp_root))
            }
            WorkspaceKind::Worktree => {
                let Some(repo_root) = request.repo_root.as_deref() else {
                    return Err("the repository root is unknown".to_owned());
                };
                let names = crate::names::TaskNames::new(
                    repo_root,
                    &self.settings,
                    &request.run_id,
                    &request.task_id,
                );
                (*root == names.root)
                    .then_some(())
                    .ok_or(names.root.to_string())
            }
        };
        expected_place.map_err(|expected| {
            format!("the recorded workspace {root} is not where this task's workspace belongs ({expected})")
        })
    }

    /// The leader checks of a worktree run: a repository with a commit, clean unless the
    /// project allows otherwise. Returns the base commit.
    /// A named run's task branches must be new: one left by an earlier run of that name would
    /// be taken up as this task's own work.
    fn check_name_free(
        &self,
        repo_root: &Utf8Path,
        name: &RunId,
        tasks: &[TaskId],
    ) -> Result<(), AllocateWorkspaceError> {
        let Ok(repo) = git2::Repository::open(repo_root) else {
            // Not a repository: the leader check says so.
            return Ok(());
        };
        let taken: Vec<String> = tasks
            .iter()
            .map(|task| crate::names::TaskNames::new(repo_root, &self.settings, name, task).branch)
            .filter(|branch| repo.find_branch(branch, git2::BranchType::Local).is_ok())
            .collect();
        if taken.is_empty() {
            return Ok(());
        }
        Err(AllocateWorkspaceError {
            kind: AllocateErrorKind::Failed,
            message: format!(
                "the run name `{name}` is taken: branch {} exists from an earlier run",
                taken.join(", ")
            ),
            hint: Some(
                "pick another name, or merge or delete the branch first (`crew worktrees list` shows crew's branches)"
                    .to_owned(),
            ),
            error: None,
        })
    }

    fn check_leader(
        &self,
        workspace: &Utf8Path,
        repo_root: Option<&Utf8Path>,
        base: Option<&str>,
    ) -> Result<Oid, PrepareWorktreeError> {
        let repo = leader::open(repo_root, workspace)?;
        let repo_root = repo_root.expect("leader::open refuses a missing repository root");
        // No commit at all comes first: it explains a dirty status of everything too.
        let explicit_base = base.is_some();
        let base = leader::resolve_base(&repo, repo_root, base)?;
        // Tasks start from the checkout's HEAD only when no base is named: then what the user
        // sees must be what they start from. A named base does not depend on the checkout.
        if self.require_clean_leader && !explicit_base {
            leader::check_clean(&repo, repo_root)?;
        }
        Ok(base)
    }

    fn allocate_worktree(
        &self,
        request: &WorkspaceRequest,
    ) -> Result<TaskWorkspace, PrepareWorktreeError> {
        let base = match request
            .base
            .as_deref()
            .and_then(|base| Oid::from_str(base).ok())
        {
            // The run already checked the leader and fixed its base.
            Some(base) => base,
            None => self.check_leader(
                request.workspace.as_path(),
                request.repo_root.as_deref(),
                request.base.as_deref(),
            )?,
        };
        let repo_root =
            request
                .repo_root
                .as_deref()
                .ok_or_else(|| PrepareWorktreeError::NotARepository {
                    path: request.workspace.as_path().to_owned(),
                })?;
        prepare_worktree(&CreateWorktree {
            repo_root,
            settings: &self.settings,
            run_id: &request.run_id,
            task_id: &request.task_id,
            base,
            upstream: &request.upstream,
            invocation_dir: &request.invocation_dir,
            baseline_file: self.baseline_file(request, repo_root),
            progress: request.progress.as_ref(),
            env: &request.env,
        })
    }

    /// Where a task's setup baseline goes, when the project has a setup (or copies) to record.
    fn baseline_file(
        &self,
        request: &WorkspaceRequest,
        repo_root: &Utf8Path,
    ) -> Option<Utf8PathBuf> {
        if self.settings.setup.is_none() && self.settings.copy.is_empty() {
            return None;
        }
        StateStore::new(&request.workspace, Some(repo_root))
            .ensure_task_dir(&request.run_id, &request.task_id)
            .ok()
            .map(|task_dir| crate::baseline::file_in(&task_dir))
    }

    fn allocate_temp(
        &self,
        request: &WorkspaceRequest,
    ) -> Result<TaskWorkspace, PrepareWorktreeError> {
        let dir = tempfile::Builder::new()
            .prefix(&format!(
                "crew-ws-{}-",
                safe_segment(request.task_id.as_str())
            ))
            .rand_bytes(6)
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir_in(&self.temp_root)
            .map_err(|source| PrepareWorktreeError::TempDir {
                dir: self.temp_root.clone(),
                source,
            })?
            .keep();
        let dir =
            Utf8PathBuf::from_path_buf(dir).map_err(|path| PrepareWorktreeError::NotUtf8 {
                path: path.to_string_lossy().into_owned(),
            })?;
        Ok(TaskWorkspace {
            kind: WorkspaceKind::Temp,
            identity: Some(identity_of(&dir)?),
            root: dir.clone(),
            dir,
            branch: None,
            base_commit: None,
            reused: false,
            warnings: Vec::new(),
            writable: Vec::new(),
            read_only: Vec::new(),
            private: Vec::new(),
            git_config: Vec::new(),
        })
    }

    fn allocate_dedicated(
        &self,
        request: &WorkspaceRequest,
    ) -> Result<TaskWorkspace, PrepareWorktreeError> {
        let store = StateStore::new(&request.workspace, request.repo_root.as_deref());
        let existed = store
            .dedicated_dir(&request.run_id, &request.task_id)
            .is_dir();
        let dir = store
            .ensure_dedicated_dir(&request.run_id, &request.task_id)
            .map_err(PrepareWorktreeError::Dedicated)?;
        Ok(TaskWorkspace {
            kind: WorkspaceKind::Dedicated,
            identity: Some(identity_of(&dir)?),
            root: dir.clone(),
            dir,
            branch: None,
            base_commit: None,
            reused: existed,
            warnings: Vec::new(),
            writable: Vec::new(),
            read_only: Vec::new(),
            private: Vec::new(),
            git_config: Vec::new(),
        })
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
    fn run_interrupted(&self, repo_root: &Utf8Path, run_id: &RunId) {
        // Only labels: a worktree not relabelled still shows as the run's, and teardown or
        // `crew runs clean` handles it the same.
        let _ = crate::listing::mark_interrupted(repo_root, &self.settings, run_id);
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

    fn pack_history(
        &self,
        repo_root: &Utf8Path,
        commit: &str,
        out: &mut dyn std::io::Write,
    ) -> Result<(), String> {
        crate::incoming::pack_history(repo_root, commit, out).map_err(|error| error.to_string())
    }

    fn accept_work(&self, request: &crew_core::provider::ReceivedWork) -> Result<(), String> {
        crate::incoming::accept_work(&crate::incoming::AcceptWork {
            repo_root: &request.repo_root,
            claim: &request.claim,
            pack: &request.pack,
            branch: &request.branch,
            branch_expected_at: request.branch_expected_at.as_deref(),
            quarantine: &request.quarantine,
        })
        .map(|_| ())
        .map_err(|error| error.to_string())
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
            let _ = crew_core::git_exclude::ensure_excluded(
                repo_root,
                &crate::create::excluded_patterns(&self.settings),
            );
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
        self.arm_tripwire(request);
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
    /// A `single` task's workspace: the project itself. What the agent may not write there:
    /// crew's own `.crew/` (its settings, agents, teams and state), crew's worktrees (other
    /// tasks' work, the pool), and what git runs or trusts on the user's behalf in the common
    /// git directory (`config`, `hooks/`, `info/`, `packed-refs`, and other worktrees' admin
    /// entries): those that exist, mounted read-only for it. And the git directory itself is
    /// a private view of its own (see [`crate::private_git`]).
    fn allocate_single(&self, request: &WorkspaceRequest) -> TaskWorkspace {
        let project = request.workspace.as_path();
        let base = request.repo_root.as_deref().unwrap_or(project);
        let dir = crew_core::paths::resolve_contained_path(base, &request.invocation_dir)
            .unwrap_or_else(|_| project.to_owned());
        let mut read_only = vec![project.join(crew_core::discovery::CREW_DIR)];
        let mut private = Vec::new();
        let mut warnings = Vec::new();
        let mut git_config = Vec::new();
        let repository = request
            .repo_root
            .as_deref()
            .and_then(|repo_root| Some((repo_root, git2::Repository::open(repo_root).ok()?)));
        if let Some((repo_root, repo)) = repository {
            let common = leader::common_dir(&repo);
            git_config = git_identity(&repo);
            // Even in the agent's private view: what it would plant there is never the user's,
            // but a program that writes its settings there (aider its identity) learns at once
            // that it may not, rather than at the task's end as a finding.
            read_only.extend(["config", "hooks"].iter().map(|name| common.join(name)));
            read_only.push(crate::names::worktrees_dir(repo_root, &self.settings));
            let git_dir = Utf8PathBuf::from_path_buf(repo.path().to_owned()).ok();
            // The main checkout's: every admin entry is another worktree's. A linked
            // checkout's own is among them.
            if git_dir
                .as_deref()
                .map(|dir| dir.as_str().trim_end_matches('/'))
                == Some(common.as_str().trim_end_matches('/'))
            {
                read_only.push(common.join("worktrees"));
            }
            if let Some(git_dir) = git_dir {
                let task_dir = StateStore::new(&request.workspace, Some(repo_root))
                    .task_dir(&request.run_id, &request.task_id);
                let view = PrivateGit::new(&common, &git_dir, &task_dir);
                match view.arm() {
                    Ok(()) => private.push(view.view()),
                    Err(error) => {
                        read_only.extend([common.join("packed-refs"), common.join("info")]);
                        warnings.push(format!(
                        "git: the agent's private view of {common} could not be made ({error}): it writes the repository's git directory itself"
                    ));
                    }
                }
            }
        }
        read_only.retain(|path| {
            std::fs::symlink_metadata(path).is_ok_and(|metadata| !metadata.is_symlink())
        });
        TaskWorkspace {
            kind: WorkspaceKind::Single,
            root: project.to_owned(),
            dir,
            branch: None,
            base_commit: None,
            reused: false,
            warnings,
            identity: None,
            writable: Vec::new(),
            read_only,
            private,
            git_config,
        }
    }

    /// Takes what a `single` task's agent may give from its private view of the git directory
    /// (see [`crate::private_git`]) into the repository; the rest is reported.
    fn take_single(&self, request: &TeardownRequest, report: &mut TeardownReport) {
        let Some(repo_root) = request.repo_root.as_deref() else {
            return;
        };
        let store = StateStore::new(&request.workspace, Some(repo_root));
        let task_dir = store.task_dir(&request.run_id, &request.task_id);
        if !crate::private_git::holds_changes(&task_dir) {
            crate::private_git::remove_view(&task_dir);
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

/// Where the tripwire's copy is saved beside a run while its tasks are active.
fn tripwire_file(
    workspace: &crew_core::WorkspaceId,
    repo_root: &Utf8Path,
    run_id: &RunId,
) -> Utf8PathBuf {
    StateStore::new(workspace, Some(repo_root))
        .run_dir(run_id)
        .join("tripwire.json")
}

/// The common git directory of the repository at `repo_root`, if there is one.
fn repository_common_dir(repo_root: &Utf8Path) -> Option<Utf8PathBuf> {
    let repo = git2::Repository::open(repo_root).ok()?;
    Some(leader::common_dir(&repo))
}

/// An error with what caused it, as one line: git's own message for a git error (`index is
/// locked` says more than "failed to stage").
fn with_cause(error: &TeardownWorktreeError) -> String {
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
        source: std::error::Error::source(&error).map(|source| source.to_string().into()),
    }
}
