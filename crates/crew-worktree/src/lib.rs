//! crew-worktree: where tasks work, and taking it away without losing anything.
//!
//! It implements crew-core's `WorkspaceProvider` for the four modes (ARCHITECTURE.md,
//! "Workspaces") in [`CrewWorkspaces`]:
//!
//! - `single`: the project root itself, with a private view of its git directory
//!   ([`private_git`]: the agent's changes go to a layer of crew's, from which only its own
//!   branch's commits are taken back);
//! - `worktree`: a git worktree at `<repo-root>/.worktrees/<runId>/<taskId>` on the branch
//!   `crew/<runId>-<taskId>` ([`create`] makes it, [`teardown`] saves the work onto the branch
//!   and removes it);
//! - `temp`: a fresh 0700 directory `crew-ws-<taskId>-XXXXXX` in the system temp dir, removed
//!   afterwards;
//! - `dedicated`: `.crew/state/ws/<runId>/<taskId>`, kept until the run is pruned.
//!
//! [`listing`] finds crew's worktrees and task branches (and the orphans among them) and prunes
//! the ones that hold no work. git2 is the git library; worktree admin entries are written
//! directly ([`admin`]) so that the admin part takes milliseconds under the repository lock.
//!
//! Agents are untrusted: an agent's git in a worktree writes only a git directory of its own
//! ([`agent_git`]: its own objects and refs, from which only its task branch is taken back),
//! teardown acts only on the directory crew created (its identity is recorded at creation), and
//! a [`tripwire`] puts back any change an agent made to the files git runs or trusts on the
//! user's behalf (`config`, `hooks/`, `info/`).
//!
//! It must not spawn agents or print.

// The kernel is asked for everything through crew-sandbox, the one crate with `unsafe`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod agent_git;
pub mod baseline;
pub mod checkout;
pub mod create;
pub mod envsetup;
pub mod error;
pub mod incoming;
pub mod inspect;
pub mod land;
pub mod leader;
pub mod listing;
pub mod names;
mod passes;
pub mod pool;
pub mod private_git;
pub mod provider;
pub mod radar;
pub mod teardown;
pub mod trash;
pub mod tripwire;
pub mod unfinished;

pub use error::{ListWorktreesError, PrepareWorktreeError, TeardownWorktreeError};
/// The git library's error, which the inspections here return as it is.
pub use git2::Error as GitError;
pub use provider::{CrewWorkspaces, fallback_warning};
