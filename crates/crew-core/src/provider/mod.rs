//! The seam between running agents and where they work.
//!
//! `crew-live` asks a [`WorkspaceProvider`] for each task's directory and hands it back when the
//! task ends; it never knows whether that directory is a git worktree, a temp dir or something
//! on another machine. `crew-worktree` provides the four modes (ARCHITECTURE.md, "Workspaces");
//! an embedding host may pass its own provider.

use std::fmt;

use camino::{Utf8Path, Utf8PathBuf};
use serde::{Deserialize, Serialize};

use crate::config::WorkspaceMode;
use crate::ids::{RunId, TaskId, WorkspaceId};
use crate::paths::DirIdentity;

pub mod land;

use land::{LandError, LandMode, Landed, Landing};

/// What kind of directory a task actually got (after any fallback).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkspaceKind {
    /// The project root itself.
    Single,
    /// A git worktree on the task's own branch.
    Worktree,
    /// A fresh directory in the system temp dir.
    Temp,
    /// `.crew/state/ws/<runId>/<taskId>`.
    Dedicated,
}

impl WorkspaceKind {
    /// The name written in manifests and listings.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkspaceKind::Single => "single",
            WorkspaceKind::Worktree => "worktree",
            WorkspaceKind::Temp => "temp",
            WorkspaceKind::Dedicated => "dedicated",
        }
    }
}

impl From<WorkspaceMode> for WorkspaceKind {
    fn from(mode: WorkspaceMode) -> Self {
        match mode {
            WorkspaceMode::Single => WorkspaceKind::Single,
            WorkspaceMode::Worktree => WorkspaceKind::Worktree,
            WorkspaceMode::Temp => WorkspaceKind::Temp,
            WorkspaceMode::Dedicated => WorkspaceKind::Dedicated,
        }
    }
}

impl fmt::Display for WorkspaceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A task's upstream result, for a task that depends on earlier tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamWork {
    /// The upstream task.
    pub task_id: TaskId,
    /// The branch holding the upstream task's work, when it worked in a worktree.
    pub branch: Option<String>,
}

/// Everything a provider needs to place one task.
#[derive(Debug, Clone)]
pub struct WorkspaceRequest {
    /// The project folder of the run.
    pub workspace: WorkspaceId,
    /// The top level of the git repository holding the workspace, if any.
    pub repo_root: Option<Utf8PathBuf>,
    /// Where the run was started, relative to the repository root (or the workspace root).
    pub invocation_dir: Utf8PathBuf,
    /// The run the task belongs to.
    pub run_id: RunId,
    /// The task.
    pub task_id: TaskId,
    /// The workspace mode the task asks for.
    pub mode: WorkspaceMode,
    /// The run's base commit as fixed by `prepare_run`; when absent the provider checks the
    /// leader and takes its HEAD itself.
    pub base: Option<String>,
    /// The tasks this one depends on, with where their work is.
    pub upstream: Vec<UpstreamWork>,
    /// Where to tell how far a long step has come (a checkout of many files), if anywhere.
    pub progress: Option<ProgressSink>,
    /// Variables the worktree's setup command gets besides the host's: the task's lease
    /// (`CREW_PORT`, `COMPOSE_PROJECT_NAME`, …), so that what setup starts is the task's own.
    pub env: Vec<(String, String)>,
    /// The task's agent will run without the kernel's sandbox (turned off, or no Landlock):
    /// it can write the repository's refs itself, so the provider records them to report
    /// what it deletes or moves back.
    pub unconfined: bool,
}

/// How far a long step of preparing a workspace has come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Files of the task's commit written into its workspace, of all of them.
    Checkout {
        /// Files written so far.
        done: u64,
        /// Files to write.
        total: u64,
    },
    /// Its agent finished, and its check command runs.
    Check {
        /// The check command.
        command: String,
    },
}

/// Where a provider tells [`Progress`]: called from whichever thread does the work, a few
/// times a second at most.
#[derive(Clone)]
pub struct ProgressSink(std::sync::Arc<dyn Fn(Progress) + Send + Sync>);

impl ProgressSink {
    /// A sink that calls `tell` with each report.
    pub fn new(tell: impl Fn(Progress) + Send + Sync + 'static) -> Self {
        ProgressSink(std::sync::Arc::new(tell))
    }

    /// Reports how far the step has come.
    pub fn tell(&self, progress: Progress) {
        (self.0)(progress);
    }
}

impl fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProgressSink")
    }
}

/// What a run asks of its provider before any task starts.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// The project folder of the run.
    pub workspace: WorkspaceId,
    /// The top level of the git repository holding it, if any.
    pub repo_root: Option<Utf8PathBuf>,
    /// The commit or ref tasks start from; the leader's HEAD when absent.
    pub base: Option<String>,
    /// Every workspace mode the run's tasks ask for.
    pub modes: Vec<WorkspaceMode>,
    /// The run's id when a person chose it: no branch of its tasks may exist yet.
    pub name: Option<RunId>,
    /// The run's task ids.
    pub tasks: Vec<TaskId>,
}

/// What the provider fixed for the whole run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunPlan {
    /// The commit every task without upstream work starts from.
    pub base_commit: Option<String>,
    /// The branch that commit was the tip of (`main`, `origin/main`), when it was one: what
    /// the run's end compares with, to say how far it moved on.
    pub base_branch: Option<String>,
    /// Degradations that apply to the run (such as a fallback to `temp`).
    pub warnings: Vec<String>,
}

/// A task's allocated workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskWorkspace {
    /// Which of the four modes made it.
    pub kind: WorkspaceKind,
    /// The top of the allocated directory (the worktree root, the temp dir).
    pub root: Utf8PathBuf,
    /// Where the agent starts: `root` plus the run's invocation subdirectory.
    pub dir: Utf8PathBuf,
    /// The task's branch (`worktree` mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The commit the workspace started from, when it is a git checkout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_commit: Option<String>,
    /// An existing workspace for the same task was taken up again.
    #[serde(default)]
    pub reused: bool,
    /// Degradations and notes, such as a fallback to `temp`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Which directory `root` was when the provider made it; teardown acts on nothing else.
    /// `None` for directories crew did not make (`single`: the project itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<DirIdentity>,
    /// Besides `root`, what an agent working here must be able to write: for a worktree, the
    /// parts of the shared git directory a commit needs (objects, refs, logs, its own admin
    /// entry). The sandbox grants these and nothing else of the repository.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writable: Vec<Utf8PathBuf>,
    /// Beneath `root`, what the agent may not write all the same (in `single` mode, where the
    /// workspace is the project: `.crew/`, crew's worktrees, and git's `config`, `hooks/`,
    /// `info/`, `packed-refs`, `worktrees/`). The sandbox mounts these read-only for the agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only: Vec<Utf8PathBuf>,
    /// Directories the agent gets a private view of (in `single` mode, the repository's git
    /// directory): where the kernel lets it, the sandbox lays an overlay over each, so that the
    /// agent reads them as they are and its changes go to a directory of crew's, never into
    /// them; the provider takes what it may of those changes when the task ends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub private: Vec<PrivateView>,
    /// git settings the agent's git needs from the project whatever its home: its identity
    /// (`user.name`, `user.email`) as the repository resolves it (its own config, then the
    /// user's), so that an agent with a home of its own commits as the user would.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub git_config: Vec<(String, String)>,
}

/// A directory an agent sees as its own copy (see [`TaskWorkspace::private`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrivateView {
    /// The directory the agent sees.
    pub target: Utf8PathBuf,
    /// Where its changes go (the overlay's upper layer), a directory of crew's.
    pub upper: Utf8PathBuf,
    /// The overlay's scratch directory, on the same file system as `upper`.
    pub work: Utf8PathBuf,
    /// Beneath `target`, what is mounted read-only in its place where the view cannot be
    /// laid (the agent then writes `target` itself): what the view makes harmless to write.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only_without: Vec<Utf8PathBuf>,
}

/// Why a provider could not give a task its workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AllocateErrorKind {
    /// The mode cannot be had here (not a git repository, no commit yet, a dirty leader).
    Unavailable,
    /// The task's upstream results conflict with each other.
    Conflict,
    /// Anything else: a setup command that failed, a full disk, a branch in use elsewhere.
    Failed,
}

/// A workspace that could not be allocated. Nothing of it is left behind.
#[derive(Debug)]
pub struct AllocateWorkspaceError {
    /// What kind of failure it was.
    pub kind: AllocateErrorKind,
    /// What went wrong, for the user.
    pub message: String,
    /// What the user can do about it.
    pub hint: Option<String>,
    /// The provider's own error, whose message `message` is: its type stays available (a
    /// caller may downcast it), and its causes are this error's causes.
    pub error: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl fmt::Display for AllocateWorkspaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for AllocateWorkspaceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.as_deref()?.source()
    }
}

/// What the task's end means for its workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeardownRequest {
    /// The project folder of the run.
    pub workspace: WorkspaceId,
    /// The top level of the git repository holding it, if any.
    pub repo_root: Option<Utf8PathBuf>,
    /// The run the task belongs to.
    pub run_id: RunId,
    /// The task.
    pub task_id: TaskId,
    /// The agent (or one of its processes) may still be running: nothing may be removed.
    pub agent_alive: bool,
    /// Keep the workspace in place (the agent waits for an answer and will be resumed in it).
    pub keep: bool,
    /// The run a placement's run works for (its manifest's `placed_for`): the commits crew
    /// makes of the work name it.
    pub placed_for: Option<RunId>,
}

/// How far a branch moved on from a commit: the commits it gained, and whether the commit is
/// no longer on it (the branch was rewritten).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseMovement {
    /// Commits on the branch that the commit does not have.
    pub gained: usize,
    /// Whether the commit is no longer on the branch.
    pub diverged: bool,
}

/// Lines added and removed between the base and the task branch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffStat {
    /// Files changed.
    pub files_changed: usize,
    /// Lines added.
    pub insertions: usize,
    /// Lines removed.
    pub deletions: usize,
}

/// What a teardown did: what was committed, removed and kept, and why.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TeardownReport {
    /// The commit crew made of the agent's uncommitted work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed: Option<String>,
    /// The task branch, kept because it holds work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The commit that branch pointed to when crew kept it: a branch whose tip moved since
    /// holds more than the task's work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tip: Option<String>,
    /// What the task's branch changes from the base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diffstat: Option<DiffStat>,
    /// The workspace directory was removed from its place.
    #[serde(default)]
    pub removed: bool,
    /// Instead of being deleted, the worktree went to crew's pool for the next task.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recycled: bool,
    /// The workspace directory was kept here, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preserved: Option<Utf8PathBuf>,
    /// Why the workspace was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preserved_reason: Option<String>,
    /// The branch held no change from the base and was deleted.
    #[serde(default)]
    pub branch_deleted: bool,
    /// Ignored files the agent wrote (build output, an `.env`; not crew's links, copies or
    /// `keep_ignored` paths): how many, how large, which (up to [`TeardownReport::NAMED`], a
    /// directory as `dir/`), and where they were kept, if they were.
    #[serde(default)]
    pub ignored_files: u64,
    /// Their size in bytes.
    #[serde(default)]
    pub ignored_bytes: u64,
    /// Which they are.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignored_paths: Vec<String>,
    /// Where they were kept, when they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignored_kept_in: Option<Utf8PathBuf>,
    /// Paths the worktree's `setup` made that the agent left as they were: not its work, so
    /// never committed (at most [`TeardownReport::NAMED`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub setup_paths: Vec<String>,
    /// The command that brings the work into the leader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_hint: Option<String>,
    /// What went wrong without losing anything.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Files git runs or trusts on the user's behalf (the shared `config`, `hooks/`, `info/`)
    /// that changed while the task ran: put back, and the changed version kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security: Vec<SecurityFinding>,
}

impl TeardownReport {
    /// How many ignored paths a report names; the counts cover all of them.
    pub const NAMED: usize = 50;
}

/// A change to a file git runs or trusts on the user's behalf, found when a task ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecurityFinding {
    /// The file, in the shared git directory.
    pub path: Utf8PathBuf,
    /// `added`, `modified` or `removed`.
    pub change: String,
    /// It was put back as it was before the task started.
    pub restored: bool,
    /// Where the changed version was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved: Option<Utf8PathBuf>,
    /// The change is on the task's branch (crew's own settings, `.crew/`), for review before
    /// merging: nothing to put back, and merging it changes the settings.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub on_branch: bool,
}

/// A teardown that could not finish. Whatever it could not be sure of was kept in place.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct TeardownError {
    /// What went wrong, for the user.
    pub message: String,
    /// What was done before the failure; `preserved` says where the work is.
    pub partial: Box<TeardownReport>,
    /// The error beneath it, if any.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// An error of a provider's own, kept whole (its causes beneath it) for whoever reports it.
pub type ProviderError = Box<dyn std::error::Error + Send + Sync>;

/// Where tasks work. Implementations are synchronous (git and file work) and are called from a
/// blocking thread; they must be safe to call for many tasks at once.
pub trait WorkspaceProvider: Send + Sync + fmt::Debug {
    /// Checks, before any agent starts, that the run's workspace modes can be had, and fixes
    /// what all tasks share (the base commit). An error here fails the run with nothing
    /// started. The default accepts everything.
    fn prepare_run(&self, request: &RunRequest) -> Result<RunPlan, AllocateWorkspaceError> {
        // Unused by the default.
        let _ = request;
        Ok(RunPlan::default())
    }

    /// Gives the task its workspace, or fails leaving nothing behind.
    fn allocate(&self, request: &WorkspaceRequest)
    -> Result<TaskWorkspace, AllocateWorkspaceError>;

    /// Takes the workspace away without losing the agent's work.
    fn teardown(
        &self,
        workspace: &TaskWorkspace,
        request: &TeardownRequest,
    ) -> Result<TeardownReport, TeardownError>;

    /// Which of `others` (`(name, branch)`), and `target` (a branch) when given, would
    /// conflict with `branch` if both were merged, and in which files — found without changing
    /// any branch or file. The default knows of none.
    fn overlaps(
        &self,
        repo_root: &Utf8Path,
        branch: &str,
        others: &[(String, String)],
        target: Option<&str>,
    ) -> Vec<crate::model::TaskOverlap> {
        // Unused by the default.
        let _ = (repo_root, branch, others, target);
        Vec::new()
    }

    /// How far `branch` moved on from the commit `base` (a run's base, once the run ended);
    /// `None` when either cannot be read. The default cannot tell.
    fn base_movement(
        &self,
        repo_root: &Utf8Path,
        base: &str,
        branch: &str,
    ) -> Option<BaseMovement> {
        // Unused by the default.
        let _ = (repo_root, base, branch);
        None
    }

    /// How many recycled workspaces the provider's pool lacks (what a refill after a run would
    /// make). The default keeps none.
    fn pool_missing(&self, repo_root: &Utf8Path) -> usize {
        // Unused by the default.
        let _ = repo_root;
        0
    }

    /// What `branch` changes against the commit `base`, counted (for a branch that came back
    /// from a placement, which no teardown here counted). The default cannot tell.
    fn branch_diffstat(&self, repo_root: &Utf8Path, base: &str, branch: &str) -> Option<DiffStat> {
        // Unused by the default.
        let _ = (repo_root, base, branch);
        None
    }

    /// The files this provider locks for the repository at `repo_root` (made when missing):
    /// an agent must not be able to hold them, and a lock needs no right to write. The
    /// sandbox covers them in the agent's namespace. The default locks nothing.
    fn lock_files(&self, repo_root: &Utf8Path) -> Vec<Utf8PathBuf> {
        // Unused by the default.
        let _ = repo_root;
        Vec::new()
    }

    /// The host of `run_id` died: its workspaces may still say they are in use, and should
    /// now say what became of them. The default does nothing.
    fn run_interrupted(&self, repo_root: &Utf8Path, run_id: &RunId) {
        // Unused by the default.
        let _ = (repo_root, run_id);
    }

    /// Removes the workspaces of `tasks` of the finished run `run_id` that a preparation its
    /// host's death cut short left behind, unrecorded on their task and holding nothing of an
    /// agent's; in a dry run, only names them. Returns those tasks. The default knows of none.
    fn take_away_unfinished(
        &self,
        repo_root: &Utf8Path,
        run_id: &RunId,
        tasks: &[TaskId],
        dry_run: bool,
    ) -> Vec<TaskId> {
        // Unused by the default.
        let _ = (repo_root, run_id, tasks, dry_run);
        Vec::new()
    }

    /// Writes the whole history of `commit` as a git pack to `out`: what a placement's clone
    /// that lacks the run's base needs. The default cannot.
    fn pack_history(
        &self,
        repo_root: &Utf8Path,
        commit: &str,
        out: &mut dyn std::io::Write,
    ) -> Result<(), ProviderError> {
        // Unused by the default.
        let _ = (repo_root, commit, out);
        Err("this workspace provider cannot send history to a placement".into())
    }

    /// Lands `tasks`, in this order, on the local branch `target` of the repository at
    /// `repo_root`: all of them, or none (`crew land`). The default cannot.
    fn land(
        &self,
        repo_root: &Utf8Path,
        target: &str,
        tasks: &[Landing],
        mode: LandMode,
    ) -> Result<Landed, LandError> {
        // Unused by the default.
        let _ = (repo_root, target, tasks, mode);
        Err(LandError::Failed(
            "this workspace provider cannot land work on a branch".into(),
        ))
    }

    /// Takes in work a placement sent back (a pack and its claim), checked before the task's
    /// branch moves to it (crew-worktree `incoming`). The default cannot.
    fn accept_work(&self, request: &ReceivedWork) -> Result<(), ProviderError> {
        // Unused by the default.
        let _ = request;
        Err("this workspace provider cannot take in work from a placement".into())
    }
}

/// Work a placement sent back, for [`WorkspaceProvider::accept_work`].
#[derive(Debug, Clone)]
pub struct ReceivedWork {
    /// The receiving repository's top level.
    pub repo_root: Utf8PathBuf,
    /// What the placement says it sent.
    pub claim: crate::shim::WorkClaim,
    /// The pack, as a file.
    pub pack: Utf8PathBuf,
    /// The task's branch.
    pub branch: String,
    /// Where the branch must be for it to move: `None` when it must not exist yet.
    pub branch_expected_at: Option<String>,
    /// The ref holding the work while it is checked, and after a refusal.
    pub quarantine: String,
}
