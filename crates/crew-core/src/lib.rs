//! crew-core: the domain model every other crew crate stands on.
//!
//! It owns ids ([`ids`]), workspace discovery ([`discovery`]), configuration ([`config`]), the
//! run and task model with its state transitions ([`model`]), the state store under
//! `.crew/state` ([`store`]), path safety ([`paths`]) and the [`provider::WorkspaceProvider`]
//! trait that separates running agents from where they work.
//!
//! It must not depend on tokio, git2 or any terminal code, and it never prints: it returns
//! data and typed errors.

// The kernel is asked for everything through crew-sandbox, the one crate with `unsafe`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod discovery;
pub mod env_vars;
pub mod fsutil;
pub mod git_exclude;
pub mod host;
pub mod ids;
pub mod model;
pub mod paths;
pub mod provider;
pub mod shim;
pub mod store;

pub use config::{AgentDef, ConfigDir, ProjectConfig, Team, TeamDef, WorkspaceMode};
pub use discovery::Workspace;
pub use ids::{AgentId, RunId, TaskId, WorkspaceId, safe_segment};
pub use model::{
    CancelCause, CancelRecord, RunManifest, RunStatus, SandboxRecord, SandboxState, TaskRecord,
    TaskStatus,
};
pub use store::StateStore;
