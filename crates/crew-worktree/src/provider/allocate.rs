//! Allocating a task's workspace in each mode: a worktree (its place and branch checked
//! first, the run's leader too), a temp dir, a dedicated dir, or the project itself
//! (`single`, with its private view of the git directory).

use camino::{Utf8Path, Utf8PathBuf};
use crew_core::provider::{
    AllocateErrorKind, AllocateWorkspaceError, TaskWorkspace, TeardownRequest, WorkspaceKind,
    WorkspaceRequest,
};
use crew_core::{RunId, StateStore, TaskId, safe_segment};
use git2::Oid;

use super::{CrewWorkspaces, git_identity};
use crate::create::{CreateWorktree, identity_of, prepare_worktree};
use crate::error::PrepareWorktreeError;
use crate::leader;
use crate::private_git::PrivateGit;

impl CrewWorkspaces {
    /// Where a task's workspace of this kind must be, derived from its ids and crew's roots,
    /// never taken from the record: a record pointing elsewhere (edited by hand, or by an
    /// agent) is refused before anything is touched.
    pub(super) fn check_place(
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
    pub(super) fn check_name_free(
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

    pub(super) fn check_leader(
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

    pub(super) fn allocate_worktree(
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
    pub(super) fn baseline_file(
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

    pub(super) fn allocate_temp(
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

    pub(super) fn allocate_dedicated(
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

    /// A `single` task's workspace: the project itself. What the agent may not write there:
    /// crew's own `.crew/` (its settings, agents, teams and state), crew's worktrees (other
    /// tasks' work, the pool), and what git runs or trusts on the user's behalf in the common
    /// git directory (`config`, `hooks/`, `info/`, `packed-refs`, and other worktrees' admin
    /// entries): those that exist, mounted read-only for it. And the git directory itself is
    /// a private view of its own (see [`crate::private_git`]).
    pub(super) fn allocate_single(&self, request: &WorkspaceRequest) -> TaskWorkspace {
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
                let store = StateStore::new(&request.workspace, Some(repo_root));
                let task_dir = store.task_dir(&request.run_id, &request.task_id);
                let view = PrivateGit::new(&common, &git_dir, &task_dir);
                match view.arm(&crate::private_git::spares_dir(store.state_dir())) {
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
}
