//! Errors of crew-worktree: one enum per operation, one variant per failing step.

use std::time::Duration;

use camino::Utf8PathBuf;
use crew_core::fsutil::{FileError, LockError};
use crew_core::paths::RemoveError;
use crew_core::provider::{AllocateErrorKind, AllocateWorkspaceError};

/// Preparing a task's workspace failed. Nothing of it is left behind.
#[derive(Debug, thiserror::Error)]
pub enum PrepareWorktreeError {
    /// The project is not in a git work tree.
    #[error("{path} is not inside a git work tree")]
    NotARepository {
        /// The directory looked in.
        path: Utf8PathBuf,
    },
    /// The repository could not be opened.
    #[error("failed to open the git repository at {path}")]
    OpenRepository {
        /// The repository.
        path: Utf8PathBuf,
        /// The error beneath it.
        #[source]
        source: git2::Error,
    },
    /// The repository has no commit to start from.
    #[error("the repository at {path} has no commit yet")]
    NoCommit {
        /// The repository.
        path: Utf8PathBuf,
    },
    /// The leader checkout has uncommitted changes to tracked files (`require_clean_leader`).
    #[error(
        "the leader checkout {path} has uncommitted changes to tracked files:\n{}",
        list_paths(paths)
    )]
    DirtyLeader {
        /// The leader checkout.
        path: Utf8PathBuf,
        /// The changed paths.
        paths: Vec<String>,
    },
    /// The leader checkout's status could not be read.
    #[error("failed to read the status of {path}")]
    Status {
        /// The leader checkout.
        path: Utf8PathBuf,
        /// The error beneath it.
        #[source]
        source: git2::Error,
    },
    /// The base the run asked for names no commit.
    #[error("failed to resolve the base `{spec}`")]
    ResolveBase {
        /// The base as given.
        spec: String,
        /// The error beneath it.
        #[source]
        source: git2::Error,
    },
    /// An upstream task's branch could not be read.
    #[error("failed to read the branch {branch} of upstream task {task}")]
    UpstreamBranch {
        /// The upstream task.
        task: String,
        /// Its branch.
        branch: String,
        /// The error beneath it.
        #[source]
        source: git2::Error,
    },
    /// The work of the upstream tasks conflicts.
    #[error("the work of upstream tasks {} conflicts in:\n{}", tasks.join(", "), list_paths(paths))]
    UpstreamConflict {
        /// The upstream tasks.
        tasks: Vec<String>,
        /// The files both change.
        paths: Vec<String>,
    },
    /// Merging the work of the upstream tasks failed.
    #[error("failed to merge the work of upstream tasks {}", tasks.join(", "))]
    MergeUpstream {
        /// The upstream tasks.
        tasks: Vec<String>,
        /// The error beneath it.
        #[source]
        source: git2::Error,
    },
    /// The repository's worktree lock could not be taken.
    #[error("failed to lock the worktrees of the repository")]
    Lock(#[source] LockError),
    /// The task's branch is checked out elsewhere.
    #[error("branch {branch} is already checked out at {checked_out_at}")]
    BranchInUse {
        /// The task's branch.
        branch: String,
        /// The worktree that has it checked out.
        checked_out_at: Utf8PathBuf,
    },
    /// Something that is not the task's worktree is where it would go.
    #[error("{path} already exists and is not this task's worktree; crew does not touch it")]
    TargetExists {
        /// What is there.
        path: Utf8PathBuf,
    },
    /// The task's branch could not be made.
    #[error("failed to create branch {branch}")]
    CreateBranch {
        /// The branch.
        branch: String,
        /// The error beneath it.
        #[source]
        source: git2::Error,
    },
    /// The worktree directory could not be made.
    #[error("failed to create the worktree directory {path}")]
    CreateDir {
        /// The directory.
        path: Utf8PathBuf,
        /// The error beneath it.
        #[source]
        source: FileError,
    },
    /// git's admin entry for the worktree could not be written.
    #[error("failed to register the worktree {path} with git")]
    Register {
        /// The worktree.
        path: Utf8PathBuf,
        /// The error beneath it.
        #[source]
        source: FileError,
    },
    /// The task's commit could not be checked out.
    #[error("failed to check out {branch} into {path}")]
    Checkout {
        /// The worktree.
        path: Utf8PathBuf,
        /// The branch.
        branch: String,
        /// The error beneath it.
        #[source]
        source: git2::Error,
    },
    /// A `[worktree] link` could not be made.
    #[error("failed to link {target} to {source_path}")]
    Link {
        /// The file or directory in the leader checkout.
        source_path: Utf8PathBuf,
        /// The link in the worktree.
        target: Utf8PathBuf,
        /// The error beneath it.
        #[source]
        source: std::io::Error,
    },
    /// A `[worktree] copy` could not be made.
    #[error("failed to copy {source_path} into the worktree")]
    Copy {
        /// The file or directory in the leader checkout.
        source_path: Utf8PathBuf,
        /// The error beneath it.
        #[source]
        source: std::io::Error,
    },
    /// The `[worktree] setup` command could not start.
    #[error("failed to start the setup command `{command}` in {dir}")]
    SetupSpawn {
        /// The setup command.
        command: String,
        /// Where it was to run.
        dir: Utf8PathBuf,
        /// The error beneath it.
        #[source]
        source: std::io::Error,
    },
    /// The `[worktree] setup` command failed.
    #[error("the setup command `{command}` failed ({status}); its last output:\n{output}")]
    SetupFailed {
        /// The setup command.
        command: String,
        /// How it exited.
        status: String,
        /// The end of what it printed.
        output: String,
    },
    /// The `[worktree] setup` command ran out of time.
    #[error(
        "the setup command `{command}` did not finish within {timeout:?}; its last output:\n{output}"
    )]
    SetupTimeout {
        /// The setup command.
        command: String,
        /// How long it was given.
        timeout: Duration,
        /// The end of what it printed.
        output: String,
    },
    /// The state directory for a `dedicated` workspace could not be made.
    #[error("failed to prepare the state directory for a dedicated workspace")]
    Dedicated(#[source] crew_core::store::StateError),
    /// A `temp` workspace could not be made.
    #[error("failed to create a temp directory in {dir}")]
    TempDir {
        /// The directory.
        dir: Utf8PathBuf,
        /// The error beneath it.
        #[source]
        source: std::io::Error,
    },
    /// A `temp` workspace's path is not UTF-8.
    #[error("the temp directory {path} is not valid UTF-8")]
    NotUtf8 {
        /// The path, with what is not UTF-8 replaced.
        path: String,
    },
    /// The new workspace's device and inode could not be read.
    #[error("failed to record which directory the workspace {path} is")]
    Identity {
        /// The workspace.
        path: Utf8PathBuf,
        /// The error beneath it.
        #[source]
        source: std::io::Error,
    },
    /// The agent's own git directory could not be made or repaired.
    #[error("failed to give the worktree {path} its agent git directory: {problem}")]
    AgentGit {
        /// The worktree.
        path: Utf8PathBuf,
        /// What went wrong.
        problem: String,
    },
    /// A preparation of this task that died (its host was killed) left the worktree
    /// unfinished, and it could not be taken away to be made again.
    #[error(
        "the worktree {path} was left unfinished by a preparation that died, and could not be taken away: {problem}"
    )]
    Unfinished {
        /// The worktree.
        path: Utf8PathBuf,
        /// What went wrong.
        problem: String,
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
            PrepareWorktreeError::Unfinished { .. } => Some(
                "nothing of an agent's is in it: `crew worktrees prune` removes it, then retry".to_owned(),
            ),
            _ => None,
        }
    }

    /// This error as the provider's error, with its kind, hint and causes kept.
    pub fn into_allocate_error(self) -> AllocateWorkspaceError {
        AllocateWorkspaceError {
            kind: self.kind(),
            message: crate::provider::with_cause(&self),
            hint: self.hint(),
            error: Some(Box::new(self)),
        }
    }
}

/// Taking a task's worktree away could not finish; whatever was uncertain was kept.
#[derive(Debug, thiserror::Error)]
pub enum TeardownWorktreeError {
    /// The task's agent may still run: nothing may be removed.
    #[error("the agent of this task may still be running; nothing was removed")]
    AgentAlive,
    /// The worktree's repository could not be opened.
    #[error("failed to open the worktree {path}")]
    Open {
        /// The worktree.
        path: Utf8PathBuf,
        /// The error beneath it.
        #[source]
        source: git2::Error,
    },
    /// The worktree holds a nested repository, whose work no commit of it can take.
    #[error(
        "the worktree {path} holds a nested git repository at {nested}; crew cannot save its work to a branch"
    )]
    NestedRepository {
        /// The worktree.
        path: Utf8PathBuf,
        /// The nested repository, relative to the worktree.
        nested: String,
    },
    /// The worktree holds files in an uninitialized submodule's directory.
    #[error(
        "the worktree {path} holds files in {submodule}, the directory of a submodule that is not initialized there; no commit can take them, so the worktree was kept"
    )]
    SubmoduleFiles {
        /// The worktree.
        path: Utf8PathBuf,
        /// The submodule directory, relative to the worktree.
        submodule: String,
    },
    /// The worktree's HEAD is detached: its commits would be lost with it.
    #[error("HEAD of the worktree {path} is not on a branch; its commits would be lost with it")]
    DetachedHead {
        /// The worktree.
        path: Utf8PathBuf,
    },
    /// An ignored file the agent wrote could not be kept.
    #[error("failed to keep the agent's ignored file {path} in {keep}; the worktree was kept")]
    KeepIgnored {
        /// The ignored file.
        path: Utf8PathBuf,
        /// Where ignored files were to be kept.
        keep: Utf8PathBuf,
        /// Why it could not be moved there.
        #[source]
        source: std::io::Error,
    },
    /// The workspace path no longer names the directory crew made.
    #[error(
        "the workspace {path} is not the directory crew created; nothing was committed, cleaned or removed: {problem}"
    )]
    Replaced {
        /// The worktree.
        path: Utf8PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The worktree's `.git` points at another admin entry.
    #[error(
        "the worktree {path} points at the git directory {found}, not its own admin entry {expected}; crew commits nothing there"
    )]
    ForeignGitDir {
        /// The worktree.
        path: Utf8PathBuf,
        /// The git directory it points at.
        found: String,
        /// Its own admin entry.
        expected: Utf8PathBuf,
    },
    /// The worktree is on another branch than its task's.
    #[error(
        "the worktree {path} is on branch {found}, not its task's branch {expected}; crew commits nothing onto another branch"
    )]
    OtherBranch {
        /// The worktree.
        path: Utf8PathBuf,
        /// The branch it is on.
        found: String,
        /// The task's branch.
        expected: String,
    },
    /// The work could not be staged.
    #[error("failed to stage the work in {path}")]
    Stage {
        /// The worktree.
        path: Utf8PathBuf,
        /// The error beneath it.
        #[source]
        source: git2::Error,
    },
    /// The work could not be committed.
    #[error("failed to commit the work in {path} onto {branch}")]
    Commit {
        /// The worktree.
        path: Utf8PathBuf,
        /// The branch.
        branch: String,
        /// The error beneath it.
        #[source]
        source: git2::Error,
    },
    /// The commit crew made could not be read back as it was written.
    #[error("the commit of {path} could not be read back: {problem}")]
    Verify {
        /// The worktree.
        path: Utf8PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The repository's worktree lock could not be taken.
    #[error("failed to lock the worktrees of the repository")]
    Lock(#[source] LockError),
    /// The worktree directory could not be removed.
    #[error("failed to remove the worktree directory {path}")]
    Remove {
        /// The worktree directory.
        path: Utf8PathBuf,
        /// The error beneath it.
        #[source]
        source: RemoveError,
    },
    /// The agent's git directory could not be repaired or given up.
    #[error("the agent git directory of {path} could not be put in order: {problem}")]
    AgentGit {
        /// The worktree.
        path: Utf8PathBuf,
        /// What went wrong.
        problem: String,
    },
    /// The agent's commits could not be taken into the repository.
    #[error("the commits of the agent in {path} could not be taken into the repository")]
    TakeWork {
        /// The worktree.
        path: Utf8PathBuf,
        /// What went wrong.
        #[source]
        source: crate::agent_git::TakeError,
    },
    /// The `temp` workspace could not be removed.
    #[error("failed to remove the temp workspace {path}")]
    RemoveTemp {
        /// The temp directory.
        path: Utf8PathBuf,
        /// The error beneath it.
        #[source]
        source: RemoveError,
    },
}

/// Listing or pruning crew's worktrees failed.
#[derive(Debug, thiserror::Error)]
pub enum ListWorktreesError {
    /// The repository could not be opened.
    #[error(transparent)]
    Repository(#[from] PrepareWorktreeError),
    /// The repository's worktree lock could not be taken.
    #[error("failed to lock the worktrees of the repository")]
    Lock(#[source] LockError),
}
