//! Removing a finished run: the workspaces it still keeps are torn down the careful way
//! (their work committed to their branches, which stay), then its state goes.
//!
//! Nothing is changed when the run cannot be removed whole for a reason known up front (it
//! still runs, a newer crew wrote it, it holds the only copy of a dedicated task's work); a
//! workspace that cannot be removed safely keeps the run, unless forced.

use camino::Utf8PathBuf;
use crew_core::config::WorkspaceMode;
use crew_core::model::{MANIFEST_SCHEMA_VERSION, RunManifest, TaskStatus};
use crew_core::provider::{SecurityFinding, TaskWorkspace, TeardownRequest, WorkspaceKind};
use crew_core::store::StateError;
use crew_core::{RunId, TaskId};

use crate::project::open::Project;

/// How to clean a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanOptions {
    /// Say what would be done, change nothing.
    pub dry_run: bool,
    /// Remove the run's state even when one of its workspaces had to be kept, and its
    /// dedicated workspaces with their files.
    pub force: bool,
}

/// The files git ignores that an agent left in its workspace, as its teardown counted them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IgnoredFiles {
    /// How many.
    pub files: u64,
    /// Their size in bytes.
    pub bytes: u64,
    /// The first few, by path in the workspace (a directory once, with a trailing `/`).
    pub named: Vec<String>,
}

/// What cleaning did to one task's workspace.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskCleaned {
    /// A dry run: it would be torn down.
    WouldTearDown {
        /// The task.
        task: TaskId,
        /// Its workspace.
        root: Utf8PathBuf,
    },
    /// Torn down: its work saved on `branch` (a `single` task's commits; `None` for one: its
    /// git work taken into the repository), the workspace removed.
    TornDown {
        /// The task.
        task: TaskId,
        /// What its workspace was.
        kind: WorkspaceKind,
        /// The branch its work is on.
        branch: Option<String>,
        /// What the agent changed that it must not have (said even though the run's record,
        /// where it would be kept, goes).
        security: Vec<SecurityFinding>,
        /// The files git ignores that the agent wrote (build output, logs): how many, how
        /// large, and the first few by name. They go with the run's state.
        ignored: IgnoredFiles,
    },
    /// Its worktree, left unfinished by a preparation its host's death cut short (nothing of
    /// an agent's in it: see `crew_worktree::unfinished`), removed; in a dry run, it would be.
    Unfinished {
        /// The task.
        task: TaskId,
    },
    /// Kept as it is: it could not be removed safely.
    Kept {
        /// The task.
        task: TaskId,
        /// Why.
        why: String,
    },
}

/// A run cleaned (or, in a dry run, what cleaning it would do).
#[derive(Debug, Clone, PartialEq)]
pub struct Cleaned {
    /// What became of each workspace it kept.
    pub tasks: Vec<TaskCleaned>,
    /// Its creation had been interrupted before its manifest was written: it held nothing.
    pub never_written: bool,
}

/// A run that was not removed.
#[derive(Debug, thiserror::Error)]
pub enum CleanRunError {
    /// A newer crew wrote it: this one leaves it as it is.
    #[error(
        "run {run_id} was written by a newer crew (schema version {version}); this crew leaves it as it is"
    )]
    Newer {
        /// The run.
        run_id: RunId,
        /// Its manifest's schema version.
        version: u32,
    },
    /// It still runs.
    #[error("run {run_id} is still running")]
    Running {
        /// The run.
        run_id: RunId,
    },
    /// It has no manifest yet, and may be being made right now.
    #[error("run {run_id} has no manifest yet: it may be being made right now")]
    BeingMade {
        /// The run.
        run_id: RunId,
    },
    /// Its dedicated workspaces hold the only copy of their tasks' work (they have no branch),
    /// and the caller did not force it. Nothing was changed.
    #[error(
        "run {run_id} holds the only copy of its dedicated tasks' work, which has no branch: {}",
        dirs.join(", ")
    )]
    OnlyCopy {
        /// The run.
        run_id: RunId,
        /// The dedicated workspaces.
        dirs: Vec<String>,
    },
    /// Some of its workspaces could not be removed safely, and the caller did not force it:
    /// the run stays, and `cleaned` says what became of each.
    #[error("run {run_id} keeps {kept} workspace(s) that could not be removed safely")]
    Kept {
        /// The run.
        run_id: RunId,
        /// How many were kept.
        kept: usize,
        /// What became of each workspace.
        cleaned: Cleaned,
    },
    /// Its state could not be read or removed.
    #[error(transparent)]
    State(#[from] StateError),
}

/// How long a run directory may be without its manifest while the run is being made (they are
/// written one right after the other): an older one is a run whose creation was interrupted.
const BEING_MADE: std::time::Duration = std::time::Duration::from_secs(10);

impl Project {
    /// Removes the finished run `run_id`: its kept workspaces torn down (work committed to
    /// their branches, which stay), then its state. See [`CleanOptions`].
    pub async fn clean_run(
        &self,
        run_id: &RunId,
        options: CleanOptions,
    ) -> Result<Cleaned, CleanRunError> {
        let manifest = match self.store().read_run(run_id) {
            Ok(manifest) => manifest,
            Err(_) if self.never_written(run_id) => {
                return self.clean_unwritten(run_id, options);
            }
            Err(error) => return Err(error.into()),
        };
        if manifest.schema_version > MANIFEST_SCHEMA_VERSION {
            return Err(CleanRunError::Newer {
                run_id: run_id.clone(),
                version: manifest.schema_version,
            });
        }
        if !manifest.status.is_finished() {
            return Err(CleanRunError::Running {
                run_id: run_id.clone(),
            });
        }
        // A dedicated workspace is the only copy of its task's work (it has no branch): said
        // before anything is torn down.
        let dirs = self.dedicated_with_work(&manifest);
        if !dirs.is_empty() && !options.force {
            return Err(CleanRunError::OnlyCopy {
                run_id: run_id.clone(),
                dirs,
            });
        }
        let mut tasks = Vec::new();
        for (task, workspace) in kept_workspaces(&manifest) {
            if options.dry_run {
                tasks.push(TaskCleaned::WouldTearDown {
                    task,
                    root: workspace.root,
                });
                continue;
            }
            let request = TeardownRequest {
                workspace: self.workspace().id().clone(),
                repo_root: self.workspace().repo_root().map(Into::into),
                run_id: run_id.clone(),
                task_id: task.clone(),
                agent_alive: false,
                keep: false,
                placed_for: manifest.placed_for.clone(),
            };
            let provider = self.provider().clone();
            let kind = workspace.kind;
            let result =
                tokio::task::spawn_blocking(move || provider.teardown(&workspace, &request)).await;
            tasks.push(match result {
                Ok(Ok(report)) => TaskCleaned::TornDown {
                    task,
                    kind,
                    ignored: IgnoredFiles {
                        files: report.ignored_files,
                        bytes: report.ignored_bytes,
                        named: report.ignored_paths,
                    },
                    branch: report.branch,
                    security: report.security,
                },
                Ok(Err(error)) => TaskCleaned::Kept {
                    task,
                    why: error.message,
                },
                Err(panicked) => TaskCleaned::Kept {
                    task,
                    why: format!("its teardown failed: {panicked}"),
                },
            });
        }
        let mut cleaned = Cleaned {
            tasks,
            never_written: false,
        };
        let kept = cleaned
            .tasks
            .iter()
            .filter(|task| matches!(task, TaskCleaned::Kept { .. }))
            .count();
        if kept > 0 && !options.force {
            return Err(CleanRunError::Kept {
                run_id: run_id.clone(),
                kept,
                cleaned,
            });
        }
        cleaned
            .tasks
            .extend(self.take_away_unfinished(&manifest, options.dry_run).await);
        if !options.dry_run {
            self.store().remove_run(run_id)?;
        }
        Ok(cleaned)
    }

    /// The workspaces of the run's tasks that a preparation cut short left behind: never
    /// recorded on their task, so the teardowns above did not see them.
    async fn take_away_unfinished(
        &self,
        manifest: &RunManifest,
        dry_run: bool,
    ) -> Vec<TaskCleaned> {
        let Some(repo_root) = self.workspace().repo_root().map(ToOwned::to_owned) else {
            return Vec::new();
        };
        let tasks: Vec<TaskId> = manifest
            .tasks
            .iter()
            .filter(|task| task.workspace.is_none())
            .map(|task| task.id.clone())
            .collect();
        if tasks.is_empty() {
            return Vec::new();
        }
        let (provider, run_id) = (self.provider().clone(), manifest.run_id.clone());
        let gone = tokio::task::spawn_blocking(move || {
            provider.take_away_unfinished(&repo_root, &run_id, &tasks, dry_run)
        })
        .await
        .unwrap_or_default();
        gone.into_iter()
            .map(|task| TaskCleaned::Unfinished { task })
            .collect()
    }

    /// Whether the run's directory is there and its manifest never was.
    pub fn never_written(&self, run_id: &RunId) -> bool {
        let missing = |path: &camino::Utf8Path| {
            path.symlink_metadata()
                .is_err_and(|error| error.kind() == std::io::ErrorKind::NotFound)
        };
        self.store()
            .run_dir(run_id)
            .symlink_metadata()
            .is_ok_and(|metadata| metadata.is_dir())
            && missing(&self.store().manifest_path(run_id))
    }

    /// Removes a run whose creation was interrupted between its directory and its manifest:
    /// no task of it ever started, so it holds no work and no workspace.
    fn clean_unwritten(
        &self,
        run_id: &RunId,
        options: CleanOptions,
    ) -> Result<Cleaned, CleanRunError> {
        let age = self
            .store()
            .run_dir(run_id)
            .symlink_metadata()
            .and_then(|metadata| metadata.modified())
            .ok()
            .and_then(|modified| modified.elapsed().ok())
            .unwrap_or_default();
        if age < BEING_MADE {
            return Err(CleanRunError::BeingMade {
                run_id: run_id.clone(),
            });
        }
        if !options.dry_run {
            self.store().remove_run(run_id)?;
        }
        Ok(Cleaned {
            tasks: Vec::new(),
            never_written: true,
        })
    }

    /// The dedicated workspaces of `manifest` that hold files.
    fn dedicated_with_work(&self, manifest: &RunManifest) -> Vec<String> {
        manifest
            .tasks
            .iter()
            .filter(|task| task.workspace_mode == WorkspaceMode::Dedicated)
            .map(|task| self.store().dedicated_dir(&manifest.run_id, &task.id))
            .filter(|dir| {
                dir.symlink_metadata()
                    .is_ok_and(|metadata| metadata.is_dir())
                    && dir
                        .read_dir_utf8()
                        .is_ok_and(|mut entries| entries.next().is_some())
            })
            .map(|dir| dir.to_string())
            .collect()
    }
}

/// The workspaces a finished run still keeps: worktrees and temp dirs of waiting tasks, those
/// a teardown preserved, and those never torn down (an interrupted run's); and the `single`
/// tasks never torn down (their agents' commits are in their views of the git directory, and
/// the tripwire's copy is checked).
fn kept_workspaces(manifest: &RunManifest) -> Vec<(TaskId, TaskWorkspace)> {
    manifest
        .tasks
        .iter()
        .filter_map(|task| {
            let record = task.workspace.as_ref()?;
            if record.kind == WorkspaceKind::Single {
                let untorn = task.teardown.is_none() || task.status == TaskStatus::Waiting;
                return untorn.then(|| (task.id.clone(), record.to_task_workspace()));
            }
            if !matches!(record.kind, WorkspaceKind::Worktree | WorkspaceKind::Temp) {
                return None;
            }
            let preserved = task
                .teardown
                .as_ref()
                .is_some_and(|report| report.preserved.is_some());
            let waiting = task.status == TaskStatus::Waiting;
            // Never torn down: its host died with it (the run was interrupted). Its work is in
            // the workspace, and perhaps nowhere else.
            let untorn = task.teardown.is_none();
            let root = if record.root.as_str().is_empty() {
                record.dir.clone()
            } else {
                record.root.clone()
            };
            ((preserved || waiting || untorn) && root.exists()).then(|| {
                (
                    task.id.clone(),
                    TaskWorkspace {
                        root,
                        reused: true,
                        ..record.to_task_workspace()
                    },
                )
            })
        })
        .collect()
}
