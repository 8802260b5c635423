//! Landing tasks' work on a branch, all or nothing: what a host asks of its provider
//! ([`super::WorkspaceProvider::land`]) and what it is answered. crew-worktree's `land` says
//! how git does it.

use super::ProviderError;

/// How each task's work goes onto the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LandMode {
    /// A merge commit per task: its branch's history is kept.
    #[default]
    Merge,
    /// One commit per task with the task's whole change.
    Squash,
    /// The task's commits replayed one by one on the target.
    Rebase,
}

/// One task to land: its name (for messages) and its branch.
#[derive(Debug, Clone)]
pub struct Landing {
    /// The task's name, for messages.
    pub name: String,
    /// Its branch.
    pub branch: String,
    /// Where to put both sides of a conflict of this task, if anywhere (a branch that must not
    /// exist yet, or one a landing made before).
    pub conflict_branch: Option<String>,
}

/// What moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Landed {
    /// The branch that moved.
    pub target: String,
    /// Its tip before.
    pub from: String,
    /// Its tip after (equal to `from` when everything was there already).
    pub to: String,
    /// Whether the target's files in the user's working tree were brought up to date.
    pub checkout_updated: bool,
}

/// A landing that did not happen: the target is as it was.
#[derive(Debug, thiserror::Error)]
pub enum LandError {
    /// A task's work conflicts with what lands before it.
    #[error("{task} conflicts with what lands before it on {target}, in: {}", files.join(", "))]
    Conflict {
        /// The task.
        task: String,
        /// The branch it was landing on.
        target: String,
        /// The files both change.
        files: Vec<String>,
        /// The branch holding both sides with conflict markers, when one was made.
        both_sides: Option<String>,
    },
    /// The target is checked out with uncommitted changes in the way.
    #[error("{target} is checked out in {path} with uncommitted changes: {}", paths.join(", "))]
    DirtyCheckout {
        /// The target branch.
        target: String,
        /// Where it is checked out.
        path: String,
        /// The uncommitted paths.
        paths: Vec<String>,
    },
    /// The target moved while the landing was prepared.
    #[error("{target} moved while the landing was prepared (from {expected}); nothing was changed")]
    TargetMoved {
        /// The target branch.
        target: String,
        /// Its tip when the landing began.
        expected: String,
    },
    /// The provider failed (git, for crew-worktree), or cannot land at all: its own error,
    /// kept whole.
    #[error("{0}")]
    Failed(ProviderError),
}
