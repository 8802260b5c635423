//! What every command starts from: the workspace it acts on, its configuration and state, and
//! the live hosts of that workspace.

use std::sync::Arc;

use crew_core::model::RunManifest;
use crew_core::{RunId, Workspace};
use crew_live::Project;
use crew_worktree::CrewWorkspaces;

use crate::CliError;
use crate::ui::Ui;

/// The project folder a command acts on, and how it prints.
#[derive(Debug, Clone)]
pub struct Context {
    project: Project,
    pub ui: Ui,
}

/// Everything of the project (its workspace, configuration, state, runs and live agents) is
/// the library's front door's.
impl std::ops::Deref for Context {
    type Target = Project;

    fn deref(&self) -> &Project {
        &self.project
    }
}

impl Context {
    /// Discovers the workspace from the current directory and loads its `config.toml`.
    pub fn discover(ui: Ui) -> Result<Self, CliError> {
        let cwd = current_dir()?;
        let workspace = Workspace::discover(&cwd)?;
        Self::for_workspace(workspace, ui)
    }

    pub fn for_workspace(workspace: Workspace, ui: Ui) -> Result<Self, CliError> {
        let project =
            Project::for_workspace(workspace, |config| Arc::new(CrewWorkspaces::new(config)))?;
        Ok(Context { project, ui })
    }

    pub fn project(&self) -> &Project {
        &self.project
    }

    /// The run a user means by `prefix`.
    pub fn resolve_run(&self, prefix: &str) -> Result<RunId, CliError> {
        Ok(self.store().resolve_run(prefix)?)
    }

    pub fn read_run(&self, run_id: &RunId) -> Result<RunManifest, CliError> {
        self.store().read_run(run_id).map_err(CliError::user)
    }

    /// Marks runs whose host died as interrupted (and kills what is left of their agents).
    pub fn reconcile(&self) -> Result<Vec<RunId>, CliError> {
        self.project.reconcile().map_err(CliError::internal)
    }

    /// The readable manifests of the workspace's runs, newest first.
    pub fn manifests(&self) -> Result<Vec<RunManifest>, CliError> {
        self.project.manifests().map_err(CliError::internal)
    }
}

/// The current directory, or an error that says what happened to it.
pub fn current_dir() -> Result<std::path::PathBuf, CliError> {
    std::env::current_dir().map_err(|error| {
        CliError::user(format!("cannot read the current directory: {error}")).with_hint(
            "it may have been deleted (a removed worktree?): cd into your project and run crew again",
        )
    })
}
