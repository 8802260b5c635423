//! Landing tasks' work on a branch (`crew land`, `crew mcp`'s `land`): the tasks a user names
//! (one task, a task with attempts by its picked result, or a run by its tasks with work), put
//! in dependency order, refused when a check failed, then handed to the provider to land all of
//! them or none ([`WorkspaceProvider::land`](crew_core::provider::WorkspaceProvider::land)).

use crew_core::model::{RunManifest, TaskStatus};
use crew_core::provider::land::{LandError, LandMode, Landing};
use crew_core::store::StateError;
use crew_core::{RunId, TaskId};

use crate::project::open::{FindAgentError, Project};

/// How to land.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LandOptions {
    /// The branch to land on; `None` for the branch the (first) run started from.
    pub into: Option<String>,
    /// How each task's work goes onto it.
    pub mode: LandMode,
    /// Land tasks whose check failed, too.
    pub force: bool,
}

/// What a landing did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LandedWork {
    /// The branch the tasks landed on.
    pub into: String,
    /// The tasks, in the order they landed.
    pub tasks: Vec<String>,
    /// The check of each landed task that has one: `fix.2 passed`, `docs failed (exit 1)`.
    pub checks: Vec<String>,
    /// The target's commit before.
    pub from: String,
    /// The target's commit after (equal to `from` when everything was already there).
    pub to: String,
    /// The user's checkout of the target was brought up to date.
    pub checkout_updated: bool,
}

/// A task with attempts (best of N) none of which is picked yet as its result: it has nothing
/// to land or show until one is (`crew pick`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("task {spec} ran {attempts} attempts and none is picked yet as its result")]
pub struct NotPicked {
    /// The task, as `<run>:<task>`.
    pub spec: String,
    /// How many attempts it ran.
    pub attempts: usize,
}

/// A landing that did not happen: nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum LandWorkError {
    /// The project is not in a git repository: its tasks have no branches.
    #[error("this workspace is not in a git repository: its tasks have no branches")]
    NotInRepository,
    /// A name matched several tasks, or the runs could not be read.
    #[error(transparent)]
    Find(#[from] FindAgentError),
    /// A name is no task and no run (or the run could not be read).
    #[error(transparent)]
    State(#[from] StateError),
    /// A task with attempts has no picked result.
    #[error(transparent)]
    NotPicked(#[from] NotPicked),
    /// The check of these tasks failed, and `force` was not given.
    #[error(
        "the check of {} failed: landing would bring in work that does not pass it; nothing was landed",
        tasks.join(", ")
    )]
    CheckFailed {
        /// Each task with its verdict: `fix (failed (exit 1))`.
        tasks: Vec<String>,
    },
    /// No target was named and the run started from no branch.
    #[error("the run started from no branch: name one with --into BRANCH")]
    NoTarget,
    /// A named task has no branch with work.
    #[error("task {run_id}:{task} has no branch with work (it is {status})")]
    NoWork {
        /// Its run.
        run_id: RunId,
        /// The task.
        task: TaskId,
        /// What it is.
        status: TaskStatus,
    },
    /// The provider did not land them (a conflict, a dirty checkout of the target, …).
    #[error("{error}")]
    Land {
        /// What it said (boxed: a conflict names many files).
        error: Box<LandError>,
        /// The branch it was landing on.
        into: String,
        /// The agent of the task that conflicted, when one did.
        agent: Option<String>,
        /// More than one task was being landed.
        several: bool,
    },
}

impl Project {
    /// Lands what `targets` name (`<run>:<task>`, `<runPrefix>:<task>`, `<task>`, or a run:
    /// all its tasks with work) on `options.into`: all of them, or none. Each result is made
    /// away from the user's checkout; the target moves only when every task landed cleanly.
    ///
    /// This is git work that blocks: call it from a blocking thread in async code.
    pub fn land(
        &self,
        targets: &[String],
        options: &LandOptions,
    ) -> Result<LandedWork, LandWorkError> {
        let repo_root = self
            .workspace()
            .repo_root()
            .ok_or(LandWorkError::NotInRepository)?;
        let picked = self.pick_landings(targets)?;
        let failed: Vec<String> = picked
            .iter()
            .filter_map(|(manifest, id)| {
                let check = manifest.task(id)?.check.as_ref()?;
                (check.passed == Some(false)).then(|| format!("{id} ({})", check.verdict()))
            })
            .collect();
        if !failed.is_empty() && !options.force {
            return Err(LandWorkError::CheckFailed { tasks: failed });
        }
        let into = match &options.into {
            Some(branch) => branch.clone(),
            None => picked
                .first()
                .and_then(|(manifest, _)| manifest.base_branch.clone())
                .ok_or(LandWorkError::NoTarget)?,
        };
        let prefix = &self.config().worktree.branch_prefix;
        let mut landings = Vec::new();
        for (manifest, task_id) in &picked {
            let task = manifest.task(task_id).expect("picked from this manifest");
            let Some((_, branch)) = task.work_range() else {
                return Err(LandWorkError::NoWork {
                    run_id: manifest.run_id.clone(),
                    task: task_id.clone(),
                    status: task.status,
                });
            };
            landings.push(Landing {
                name: task_id.to_string(),
                branch,
                conflict_branch: Some(format!("{prefix}/conflict/{}-{task_id}", manifest.run_id)),
            });
        }
        let landed = self
            .provider()
            .land(repo_root, &into, &landings, options.mode)
            .map_err(|error| {
                let agent = match &error {
                    LandError::Conflict { task, .. } => picked.iter().find_map(|(manifest, id)| {
                        (id.as_str() == task)
                            .then(|| manifest.task(id).map(|task| task.agent.clone()))
                            .flatten()
                    }),
                    _ => None,
                };
                LandWorkError::Land {
                    error: Box::new(error),
                    into: into.clone(),
                    agent,
                    several: picked.len() > 1,
                }
            })?;
        let checks = picked
            .iter()
            .filter_map(|(manifest, id)| {
                let check = manifest.task(id)?.check.as_ref()?;
                Some(format!("{id} {}", check.verdict()))
            })
            .collect();
        Ok(LandedWork {
            into,
            checks,
            tasks: landings.into_iter().map(|landing| landing.name).collect(),
            from: landed.from,
            to: landed.to,
            checkout_updated: landed.checkout_updated,
        })
    }

    /// The tasks `targets` name, in dependency order: a run's tasks with work (a task with
    /// attempts by its picked result), or each task.
    fn pick_landings(
        &self,
        targets: &[String],
    ) -> Result<Vec<(RunManifest, TaskId)>, LandWorkError> {
        let mut picked: Vec<(RunManifest, TaskId)> = Vec::new();
        for target in targets {
            if let Some(found) = self.find_task(target)? {
                picked.push(found);
            } else if let Some((manifest, task)) = self.find_attempted(target)? {
                let result = picked_attempt(&manifest, &task)?;
                picked.push((manifest, result));
            } else {
                let run_id = self.store().resolve_run(target)?;
                let manifest = self.store().read_run(&run_id)?;
                let mut results = Vec::new();
                for task in &manifest.tasks {
                    match &task.attempt_of {
                        Some(attempt) => {
                            let result = picked_attempt(&manifest, &attempt.task)?;
                            if !results.contains(&result) {
                                results.push(result);
                            }
                        }
                        None if task.work_range().is_some() => results.push(task.id.clone()),
                        None => {}
                    }
                }
                picked.extend(results.into_iter().map(|task| (manifest.clone(), task)));
            }
        }
        // A task after those it depends on (stable otherwise).
        let mut ordered: Vec<(RunManifest, TaskId)> = Vec::new();
        while !picked.is_empty() {
            let ready = picked
                .iter()
                .position(|(manifest, id)| {
                    let depends_on = manifest
                        .task(id)
                        .map(|task| task.depends_on.clone())
                        .unwrap_or_default();
                    depends_on.iter().all(|dep| {
                        !picked.iter().any(|(other, other_id)| {
                            other.run_id == manifest.run_id && other_id == dep
                        })
                    })
                })
                .unwrap_or(0);
            ordered.push(picked.remove(ready));
        }
        Ok(ordered)
    }
}

/// The attempt of `task` that was picked as its result; until one is, the task has no result
/// to land or show.
pub fn picked_attempt(manifest: &RunManifest, task: &TaskId) -> Result<TaskId, NotPicked> {
    let attempts = manifest.attempts_of(task);
    attempts
        .iter()
        .find(|record| record.attempt_of.as_ref().is_some_and(|a| a.picked))
        .map(|record| record.id.clone())
        .ok_or_else(|| NotPicked {
            spec: format!("{}:{task}", manifest.run_id),
            attempts: attempts.len(),
        })
}
