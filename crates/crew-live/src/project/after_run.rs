//! What follows a run's end, as the front door decides it for every client: how far the branch
//! the run started from moved on meanwhile (`[run] base_moved`), and the tidying a run's end
//! starts in the background (a prune of history when `[retention]` says one is due, a refill
//! of the provider's pool). The client starts the tidying its own way: the `crew` command as
//! processes of its own that outlive it.

use std::time::SystemTime;

use crew_core::config::{BaseMoved, WorkspaceMode};
use crew_core::model::RunManifest;
use crew_core::provider::BaseMovement;

use crate::project::open::Project;

/// What a run's end should start in the background.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AfterRun {
    /// A prune of finished runs is due (judged from the runs' names alone).
    pub prune: bool,
    /// The provider's pool lacks workspaces, and the run used them.
    pub refill: bool,
}

impl Project {
    /// How far the branch `manifest`'s run started from moved on since it started, when it did
    /// and the project wants to hear it (`[run] base_moved` not `off`): the branch and how.
    pub fn base_movement(&self, manifest: &RunManifest) -> Option<(String, BaseMovement)> {
        if self.config().run.base_moved == BaseMoved::Off {
            return None;
        }
        let branch = manifest.base_branch.as_ref()?;
        let moved = self.provider().base_movement(
            self.workspace().repo_root()?,
            manifest.base.as_deref()?,
            branch,
        )?;
        (moved.gained > 0 || moved.diverged).then(|| (branch.clone(), moved))
    }

    /// What a run's end should start in the background, `finished` being the run when it
    /// ended (none when it failed before it began).
    pub fn after_run(&self, finished: Option<&RunManifest>) -> AfterRun {
        let retention = &self.config().retention;
        let prune = retention.automatic && self.store().prune_due(retention, SystemTime::now());
        let used_worktrees = finished.is_some_and(|manifest| {
            manifest
                .tasks
                .iter()
                .any(|task| task.workspace_mode == WorkspaceMode::Worktree)
        });
        let refill = used_worktrees
            && self.config().worktree.pool_size > 0
            && self
                .workspace()
                .repo_root()
                .is_some_and(|repo_root| self.provider().pool_missing(repo_root) > 0);
        AfterRun { prune, refill }
    }
}
