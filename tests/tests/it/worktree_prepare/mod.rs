//! Preparing task workspaces against real repositories, with `git` itself as the reference.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use camino::Utf8Path;
use crew_core::TaskId;
use crew_core::config::{IsolationFallback, ProjectConfig, WorkspaceMode};
use crew_core::provider::{
    AllocateErrorKind, RunRequest, TaskWorkspace, UpstreamWork, WorkspaceKind, WorkspaceProvider,
};
use crew_tests::{TestEnv, places_apart, tree_fingerprint, write};
use crew_worktree::CrewWorkspaces;

use crate::common::worktrees::Fixture;

mod failures;
mod layout;

fn prepare_run_error(fixture: &Fixture) -> crew_core::provider::AllocateWorkspaceError {
    fixture
        .provider
        .prepare_run(&RunRequest {
            workspace: fixture.workspace.id().clone(),
            repo_root: fixture.workspace.repo_root().map(Utf8Path::to_owned),
            base: None,
            modes: vec![WorkspaceMode::Worktree],
            name: None,
            tasks: Vec::new(),
        })
        .unwrap_err()
}
