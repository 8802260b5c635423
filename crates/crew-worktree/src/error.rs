//! Errors of crew-worktree: one enum per operation, one variant per failing step.

use std::time::Duration;

use camino::Utf8PathBuf;
use crew_core::fsutil::{FileError, LockError};
use crew_core::paths::RemoveError;
use crew_core::provider::{AllocateErrorKind, AllocateWorkspaceError};

/// Preparing a task's workspace failed. Nothing of it is left behind.
#[derive(Debug, thiserror::Error)]
pub enum PrepareWorktreeError {
    #[error("{path} is not inside a git work tree")]
    NotARepository { path: Utf8PathBuf },
    #[error("failed to open the git repository at {path}")]
    OpenRepository {
        path: Utf8PathBuf,
        #[source]
        source: git2::Error,
    },
    #[error("the repository at {path} has no commit yet")]
    NoCommit { path: Utf8PathBuf },
    #[error(
        "the leader checkout {path} has uncommitted changes to tracked files:\n{}",
        list_paths(paths)
    )]
    DirtyLeader {
        path: Utf8PathBuf,
        paths: Vec<String>,
    },
    #[error("failed to read the status of {path}")]
    Status {
        path: Utf8PathBuf,
        #[source]
        source: git2::Error,
    },
    #[error("failed to resolve the base `{spec}`")]
    ResolveBase {
        spec: String,
        #[source]
        source: git2::Error,
    },
    #[error("failed to read the branch {branch} of upstream task {task}")]
    UpstreamBranch {
        task: String,
        branch: String,
        #[source]
        source: git2::Error,
    },
    #[error("the work of upstream tasks {} conflicts in:\n{}", tasks.join(", "), list_paths(paths))]
    UpstreamConflict {
        tasks: Vec<String>,
        paths: Vec<String>,
    },
    #[error("failed to merge the work of upstream tasks {}", tasks.join(", "))]
    MergeUpstream {
        tasks: Vec<String>,
        #[source]
        source: git2::Error,
    },
    #[error("failed to lock the worktrees of the repository")]
    Lock(#[source] LockError),
    #[error("branch {branch} is already checked out at {checked_out_at}")]
    BranchInUse {
        branch: String,
        checked_out_at: Utf8PathBuf,
    },
    #[error("{path} already exists and is not this task's worktree; crew does not touch it")]
    TargetExists { path: Utf8PathBuf },
    #[error("failed to create branch {branch}")]
    CreateBranch {
        branch: String,
        #[source]
        source: git2::Error,
    },
    #[error("failed to create the worktree directory {path}")]
    CreateDir {
        path: Utf8PathBuf,
        #[source]
        source: FileError,
    },
    #[error("failed to register the worktree {path} with git")]
    Register {
        path: Utf8PathBuf,
        #[source]
        source: FileError,
    },
    #[error("failed to check out {branch} into {path}")]
    Checkout {
        path: Utf8PathBuf,
        branch: String,
        #[source]
        source: git2::Error,
    },
    #[error("failed to link {target} to {source_path}")]
    Link {
        source_path: Utf8PathBuf,
        target: Utf8PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to copy {source_path} into the worktree")]
    Copy {
        source_path: Utf8PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to start the setup command `{command}` in {dir}")]
    SetupSpawn {
        command: String,
        dir: Utf8PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the setup command `{command}` failed ({status}); its last output:\n{output}")]
    SetupFailed {
        command: String,
        status: String,
        output: String,
    },
    #[error(
        "the setup command `{command}` did not finish within {timeout:?}; its last output:\n{output}"
    )]
    SetupTimeout {
        command: String,
        timeout: Duration,
        output: String,
    },
    #[error("failed to prepare the state directory for a dedicated workspace")]
    Dedicated(#[source] crew_core::store::StateError),
    #[error("failed to create a temp directory in {dir}")]
    TempDir {
        dir: Utf8PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the temp directory {path} is not valid UTF-8")]
    NotUtf8 { path: String },
    #[error("failed to record which directory the workspace {path} is")]
    Identity {
        path: Utf8PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn list_paths(paths: &[String]) -> String {
    const SHOWN: usize = 20;
    let mut text = paths
        .iter()
        .take(SHOWN)
        .map(|path| format!("  {path}"))
        .collect::<Vec<_>>()
        .join("\n");
    if paths.len() > SHOWN {
        text.push_str(&format!("\n  … and {} more", paths.len() - SHOWN));
    }
    text
}

impl PrepareWorktreeError {
    /// Whether the mode cannot be had here at all (so a fallback may apply), rather than a
    /// failure of this attempt.
    pub fn kind(&self) -> AllocateErrorKind {
        match self {
            PrepareWorktreeError::NotARepository { .. }
            | PrepareWorktreeError::NoCommit { .. }
            | PrepareWorktreeError::DirtyLeader { .. } => AllocateErrorKind::Unavailable,
            PrepareWorktreeError::UpstreamConflict { .. } => AllocateErrorKind::Conflict,
            _ => AllocateErrorKind::Failed,
        }
    }

    /// What the user can do about it.
    pub fn hint(&self) -> Option<String> {
        match self {
            PrepareWorktreeError::NotARepository { .. } => Some(
                "run crew inside a git repository, choose another --workspace-mode, or set [isolation] fallback = \"temp\"".to_owned(),
            ),
            PrepareWorktreeError::NoCommit { .. } => {
                Some("worktrees start from a commit: commit something first".to_owned())
            }
            PrepareWorktreeError::DirtyLeader { .. } => Some(
                "commit or stash these changes (`git stash`) so that every task starts from what you see; untracked files do not block. To start from a commit instead, pass `--base <ref>`; `[worktree] require_clean_leader = false` in .crew/config.toml turns this check off".to_owned(),
            ),
            PrepareWorktreeError::UpstreamConflict { .. } => Some(
                "merge the upstream branches yourself, or make the task depend on one of them".to_owned(),
            ),
            PrepareWorktreeError::BranchInUse { branch, .. } => Some(format!(
                "switch that checkout to another branch, or remove that worktree with `git worktree remove`, then retry; crew never takes over {branch} from elsewhere"
            )),
            PrepareWorktreeError::TargetExists { .. } => Some(
                "move that directory away (it may hold someone's work), or run `crew worktrees list`".to_owned(),
            ),
            _ => None,
        }
    }

    pub fn into_allocate_error(self) -> AllocateWorkspaceError {
        AllocateWorkspaceError {
            kind: self.kind(),
            message: self.to_string(),
            hint: self.hint(),
            error: Some(Box::new(self)),
        }
    }
}

/// Taking a task's worktree away could not finish; whatever was uncertain was kept.
#[derive(Debug, thiserror::Error)]
pub enum TeardownWorktreeError {
    #[error("the agent of this task may still be running; nothing was removed")]
    AgentAlive,
    #[error("failed to open the worktree {path}")]
    Open {
        path: Utf8PathBuf,
        #[source]
        source: git2::Error,
    },
    #[error(
        "the worktree {path} holds a nested git repository at {nested}; crew cannot save its work to a branch"
    )]
    NestedRepository { path: Utf8PathBuf, nested: String },
    #[error(
        "the worktree {path} holds files in {submodule}, the directory of a submodule that is not initialized there; no commit can take them, so the worktree was kept"
    )]
    SubmoduleFiles {
        path: Utf8PathBuf,
        submodule: String,
    },
    #[error("HEAD of the worktree {path} is not on a branch; its commits would be lost with it")]
    DetachedHead { path: Utf8PathBuf },
    #[error("failed to keep the agent's ignored file {path} in {keep}; the worktree was kept")]
    KeepIgnored {
        path: Utf8PathBuf,
        keep: Utf8PathBuf,
    },
    #[error(
        "the workspace {path} is not the directory crew created; nothing was committed, cleaned or removed: {problem}"
    )]
    Replaced { path: Utf8PathBuf, problem: String },
    #[error(
        "the worktree {path} points at the git directory {found}, not its own admin entry {expected}; crew commits nothing there"
    )]
    ForeignGitDir {
        path: Utf8PathBuf,
        found: String,
        expected: Utf8PathBuf,
    },
    #[error(
        "the worktree {path} is on branch {found}, not its task's branch {expected}; crew commits nothing onto another branch"
    )]
    OtherBranch {
        path: Utf8PathBuf,
        found: String,
        expected: String,
    },
    #[error("failed to stage the work in {path}")]
    Stage {
        path: Utf8PathBuf,
        #[source]
        source: git2::Error,
    },
    #[error("failed to commit the work in {path} onto {branch}")]
    Commit {
        path: Utf8PathBuf,
        branch: String,
        #[source]
        source: git2::Error,
    },
    #[error("the commit of {path} could not be read back: {problem}")]
    Verify { path: Utf8PathBuf, problem: String },
    #[error("failed to lock the worktrees of the repository")]
    Lock(#[source] LockError),
    #[error("failed to remove the worktree directory {path}")]
    Remove {
        path: Utf8PathBuf,
        #[source]
        source: RemoveError,
    },
    #[error("failed to remove the temp workspace {path}")]
    RemoveTemp {
        path: Utf8PathBuf,
        #[source]
        source: RemoveError,
    },
}

/// Listing or pruning crew's worktrees failed.
#[derive(Debug, thiserror::Error)]
pub enum ListWorktreesError {
    #[error(transparent)]
    Repository(#[from] PrepareWorktreeError),
    #[error("failed to lock the worktrees of the repository")]
    Lock(#[source] LockError),
    #[error("failed to remove the worktree {path}")]
    Remove {
        path: Utf8PathBuf,
        #[source]
        source: RemoveError,
    },
}
