//! A run on disk: created (checked, then recorded as `running` and hosted here), resumed after
//! its host went away, taken over from the process that created it, cancelled, and a finished
//! task of a live run queued again.

use camino::Utf8PathBuf;
use crew_core::config::{AllowList, ConfigDir, CostCap, WorkspaceMode};
use crew_core::model::{
    CheckRecord, EventKind, RunEvent, RunManifest, RunStatus, SpendCap, TaskRecord, TaskStatus,
};
use crew_core::provider::RunRequest;
use crew_core::{CancelRecord, RunId, TaskId};

use super::succeeded::AlreadySucceeded;
use super::{PlanError, RunError, RunSpec, Runner, blocking};
use crate::control::{ErrorBody, ErrorCode};

impl Runner {
    /// Checks the run can start (before any agent does) and records it as `running`, hosted by
    /// this process.
    pub async fn create(
        &self,
        spec: &RunSpec,
        socket: Option<Utf8PathBuf>,
    ) -> Result<RunManifest, RunError> {
        let team = &spec.team.def;
        spec.resources
            .check()
            .map_err(|message| PlanError::Caps { message })?;
        self.check_allowed(team.tasks.iter().map(|task| task.agent.as_str()))?;
        let user = crew_core::config::UserConfig::of_user()
            .map_err(|error| PlanError::UserConfig(Box::new(error)))?;
        let task_cap =
            CostCap::narrowest(team.task_max_cost_usd, self.config.run.task_max_cost_usd);
        let run_cap = CostCap::narrowest(
            spec.max_cost_usd,
            CostCap::narrowest(team.max_cost_usd, self.config.run.max_cost_usd),
        );
        let run_mode = spec.mode.or(team.workspace_mode).unwrap_or_default();
        let mut run_tasks =
            crew_core::config::run_tasks(team, spec.attempts).map_err(PlanError::Attempts)?;
        if let Some(check) = &spec.check {
            for task in &mut run_tasks {
                task.def.check = Some(check.clone());
            }
        }
        let mut tasks: Vec<TaskRecord> = Vec::with_capacity(run_tasks.len());
        for run_task in run_tasks {
            let task = run_task.def;
            // Attempts work in worktrees unless a mode was asked for.
            let asked = spec.mode.or(task.workspace_mode).or(team.workspace_mode);
            let mode = match (asked, &run_task.attempt_of) {
                (Some(mode), _) => mode,
                (None, Some(_)) => WorkspaceMode::Worktree,
                (None, None) => run_mode,
            };
            if let Some(attempt) = &run_task.attempt_of
                && mode != WorkspaceMode::Worktree
            {
                return Err(PlanError::AttemptsNeedWorktrees {
                    task: attempt.task.clone(),
                    of: attempt.of,
                    mode,
                }
                .into());
            }
            let mut record = TaskRecord::new(
                task.id.clone(),
                task.agent.clone(),
                task.prompt.clone(),
                task.depends_on.clone(),
                mode,
            );
            self.check_prompt_fits(&record)?;
            record.timeout = task.timeout.or(self.config.run.task_timeout);
            record.attempt_of = run_task.attempt_of;
            record.check = task.check.map(CheckRecord::pending);
            record.on_limit = spec.on_limit.or(task.on_limit).unwrap_or_default();
            record.placement = spec.placement.clone().or(task.placement);
            record.network = task.network;
            record.named_network = spec.network;
            record.allow_open_network = spec.allow_open_network;
            record.resources = self
                .config
                .resources
                .narrowed(task.resources)
                .narrowed(spec.resources);
            record.allow_uncapped = spec.allow_uncapped;
            record.max_cost = CostCap::narrowest(task.max_cost_usd, task_cap).map(SpendCap::new);
            if let Some(placement) = &record.placement {
                if !self.config.placements.contains_key(placement) {
                    return Err(PlanError::UnknownPlacement {
                        task: record.id.clone(),
                        placement: placement.clone(),
                        known: self.config.placements.keys().cloned().collect(),
                    }
                    .into());
                }
                // Elsewhere a task works in a worktree of the placement's clone; here it has
                // only a scratch directory, where its work arrives.
                if let Some(asked) = asked.filter(|asked| *asked != WorkspaceMode::Worktree) {
                    return Err(PlanError::PlacedMode {
                        task: record.id.clone(),
                        placement: placement.clone(),
                        asked,
                    }
                    .into());
                }
                if record.attempt_of.is_some() {
                    return Err(PlanError::PlacedAttempts {
                        task: record.id.clone(),
                        placement: placement.clone(),
                    }
                    .into());
                }
                record.workspace_mode = WorkspaceMode::Temp;
            }
            tasks.push(record);
        }
        // The run's mode is its tasks' when they agree (attempts run in worktrees whatever the
        // default); a mixed run keeps the mode it was asked for, and each task says its own.
        let run_mode = match tasks.split_first() {
            Some((first, rest))
                if first.placement.is_none()
                    && rest.iter().all(|task| {
                        task.workspace_mode == first.workspace_mode && task.placement.is_none()
                    }) =>
            {
                first.workspace_mode
            }
            _ => run_mode,
        };
        let mut modes: Vec<WorkspaceMode> = tasks.iter().map(|task| task.workspace_mode).collect();
        // A placed task starts from the run's base commit, fixed as for worktrees.
        if tasks.iter().any(|task| task.placement.is_some()) {
            modes.push(WorkspaceMode::Worktree);
        }
        modes.sort_by_key(|mode| mode.as_str());
        modes.dedup();
        let provider = self.provider.clone();
        let request = RunRequest {
            workspace: self.workspace.id().clone(),
            repo_root: self.workspace.repo_root().map(Into::into),
            base: spec.base.clone(),
            modes,
            name: spec.name.clone(),
            tasks: tasks.iter().map(|task| task.id.clone()).collect(),
        };
        let plan = tokio::task::spawn_blocking(move || provider.prepare_run(&request))
            .await
            .expect("prepare_run does not panic")
            .map_err(RunError::Prepare)?;
        let host = self.host_record(socket)?;
        let store = self.store.clone();
        let workspace = self.workspace.clone();
        let max_parallel = spec
            .max_parallel
            .or(team.max_parallel.map(|parallel| parallel.get()))
            .unwrap_or(self.config.run.max_parallel.get())
            .max(1);
        let fail_fast = spec
            .fail_fast
            .or(team.fail_fast)
            .unwrap_or(self.config.run.fail_fast);
        let team_name = team.name.clone();
        let name = spec.name.clone();
        let placed_for = spec.placed_for.clone();
        let manifest = blocking(move || {
            let build = |run_id| {
                let mut manifest =
                    RunManifest::new(run_id, workspace.id().clone(), run_mode, tasks);
                manifest.invocation_dir = workspace.relative_invocation_dir();
                manifest.team = Some(team_name);
                manifest.host = Some(host);
                manifest.base = plan.base_commit.clone();
                manifest.base_branch = plan.base_branch.clone();
                manifest.max_parallel = max_parallel;
                manifest.fail_fast = fail_fast;
                manifest.placed_for = placed_for.clone();
                manifest.max_cost = run_cap.map(SpendCap::new);
                manifest.day_cap = user.max_cost_usd_per_day.map(SpendCap::new);
                if !plan.warnings.is_empty() {
                    manifest.reason = Some(plan.warnings.join("; "));
                }
                manifest
            };
            match &name {
                Some(name) => store.create_named_run(name, build),
                None => store.create_run(build),
            }
        })
        .await?;
        self.record_event(&manifest.run_id, RunEvent::new(None, EventKind::RunCreated));
        Ok(manifest)
    }

    /// Refuses a run whose checked-in settings loosen confinement in a way the user has not
    /// allowed (`crew_core::config::allow`): the project's `config.toml`, or the definition of
    /// an agent among `agents`.
    fn check_allowed<'a>(&self, agents: impl IntoIterator<Item = &'a str>) -> Result<(), RunError> {
        let list = AllowList::of_user();
        let config_dir = ConfigDir::new(self.workspace.crew_dir());
        let refused = |error: crew_core::config::NotAllowed| RunError::Plan(error.into());
        config_dir
            .check_config_allowed(list.as_ref())
            .map_err(refused)?;
        for agent in agents {
            config_dir
                .check_agent_allowed(agent, list.as_ref())
                .map_err(refused)?;
        }
        Ok(())
    }

    /// Refuses, before anything is made, a prompt that cannot reach its agent: one that its
    /// agent's command gives as a program argument, longer than the kernel lets an argument be.
    fn check_prompt_fits(&self, task: &TaskRecord) -> Result<(), RunError> {
        // Linux: MAX_ARG_STRLEN, 32 pages, the terminating NUL included.
        const ARGUMENT_MAX: usize = 32 * 4096 - 1;
        if task.prompt.len() <= ARGUMENT_MAX {
            return Ok(());
        }
        // An unknown agent is reported where the task starts, as before.
        let Ok(definition) = ConfigDir::new(self.workspace.crew_dir()).load_agent(&task.agent)
        else {
            return Ok(());
        };
        let values = [("prompt", task.prompt.as_str())];
        let longest = definition
            .command
            .iter()
            .filter(|arg| crew_core::config::placeholders(arg).any(|name| name == "prompt"))
            .map(|arg| crew_core::config::fill_template(arg, &values).len())
            .max();
        match longest {
            Some(length) if length > ARGUMENT_MAX => Err(PlanError::PromptTooLong {
                task: task.id.clone(),
                agent: task.agent.clone(),
                length,
                max: ARGUMENT_MAX,
            }
            .into()),
            _ => Ok(()),
        }
    }

    /// Takes up a run whose host is gone: finished tasks are kept, the others run again (their
    /// worktree branches are reused), tasks waiting for an answer wait again — or go on with
    /// the answer given in `answers`.
    pub async fn prepare_resume(
        &self,
        run_id: &RunId,
        socket: Option<Utf8PathBuf>,
    ) -> Result<RunManifest, RunError> {
        self.prepare_resume_for(run_id, socket, None).await
    }

    /// [`Runner::prepare_resume`] for a follow-up of `task`: it runs again even when it
    /// succeeded (the conversation goes on, on its branch), and the run is taken up even when
    /// every task of it succeeded.
    pub async fn prepare_follow_up(
        &self,
        run_id: &RunId,
        task: &TaskId,
        socket: Option<Utf8PathBuf>,
    ) -> Result<RunManifest, RunError> {
        self.prepare_resume_for(run_id, socket, Some(task)).await
    }

    async fn prepare_resume_for(
        &self,
        run_id: &RunId,
        socket: Option<Utf8PathBuf>,
        follow_up: Option<&TaskId>,
    ) -> Result<RunManifest, RunError> {
        let follow_up = follow_up.cloned();
        let store = self.store.clone();
        blocking({
            let store = store.clone();
            move || crate::control::live_hosts::reconcile_workspace(&store)
        })
        .await?;
        let agents: Vec<String> = self
            .look(run_id, |manifest| {
                manifest
                    .tasks
                    .iter()
                    .map(|task| task.agent.clone())
                    .collect()
            })
            .await?;
        self.check_allowed(agents.iter().map(String::as_str))?;
        let host = self.host_record(socket)?;
        let pid = host.identity.pid;
        let run = run_id.clone();
        let (manifest, again) = blocking(move || {
            store.update_run(&run, |manifest| {
                if manifest.status == RunStatus::Running {
                    return Ok(Err(RunError::AlreadyHosted {
                        run_id: manifest.run_id.clone(),
                        pid: manifest.host.as_ref().map_or(0, |host| host.identity.pid),
                    }));
                }
                if follow_up.is_none()
                    && manifest.status == RunStatus::Completed
                    && manifest
                        .tasks
                        .iter()
                        .all(|task| task.status == TaskStatus::Succeeded)
                {
                    return Ok(Err(RunError::NotResumable {
                        run_id: manifest.run_id.clone(),
                        status: manifest.status,
                    }));
                }
                manifest.set_status(RunStatus::Running)?;
                manifest.reason = None;
                // The events keep who cancelled it before.
                manifest.cancelled_by = None;
                manifest.host = Some(host);
                let again: Vec<TaskId> = match &follow_up {
                    // One agent taken up again: that task, and the tasks skipped for want of
                    // it; no other task of the run runs again (one that failed on its own
                    // stays failed: its agent may have done what must not be done twice).
                    Some(task_id) => {
                        let mut again = vec![task_id.clone()];
                        let mut at = 0;
                        while let Some(upstream) = again.get(at).cloned() {
                            at += 1;
                            again.extend(
                                manifest
                                    .tasks
                                    .iter()
                                    .filter(|task| {
                                        task.status == TaskStatus::Skipped
                                            && task.depends_on.contains(&upstream)
                                            && !again.contains(&task.id)
                                    })
                                    .map(|task| task.id.clone())
                                    .collect::<Vec<_>>(),
                            );
                        }
                        again.retain(|id| {
                            manifest
                                .task(id)
                                .is_some_and(|task| task.status.is_finished())
                        });
                        again
                    }
                    None => manifest
                        .tasks
                        .iter()
                        .filter(|task| {
                            task.status.is_finished() && task.status != TaskStatus::Succeeded
                        })
                        .map(|task| task.id.clone())
                        .collect(),
                };
                for task_id in &again {
                    let task = manifest.set_task_status(task_id, TaskStatus::Pending)?;
                    // An agent that finished its work before its host died keeps its exit:
                    // the task is finished without running it again (`finish_exited`).
                    if !task.finished_before_its_host_died() {
                        task.exit = None;
                    }
                    task.reason = None;
                }
                Ok(Ok((manifest.clone(), again)))
            })
        })
        .await??;
        // The run's history says it was taken up again, and which tasks start over.
        self.record_event(
            run_id,
            RunEvent::new(
                None,
                EventKind::RunStatus {
                    status: RunStatus::Running,
                    reason: Some(format!("resumed by pid {pid}")),
                },
            ),
        );
        for task_id in again {
            self.record_event(
                run_id,
                RunEvent::new(
                    Some(task_id),
                    EventKind::TaskStatus {
                        status: TaskStatus::Pending,
                        reason: Some("runs again: the run was resumed".to_owned()),
                    },
                ),
            );
        }
        Ok(manifest)
    }

    /// Records this process as the host of a run another process created for it
    /// (`crew run --detach` creates the run, then hands it to a background host).
    pub async fn take_over(
        &self,
        run_id: &RunId,
        socket: Option<Utf8PathBuf>,
    ) -> Result<RunManifest, RunError> {
        let host = self.host_record(socket)?;
        let store = self.store.clone();
        let run_id = run_id.clone();
        Ok(blocking(move || {
            store.update_run(&run_id, |manifest| {
                manifest.host = Some(host);
                Ok(manifest.clone())
            })
        })
        .await?)
    }

    /// Records who asked for the run to be cancelled, and why: in the manifest (the first
    /// request only) and as an event. The request itself goes to the run through its cancel
    /// watch or a [`crate::control::RunCommand::Cancel`].
    pub async fn record_cancel(&self, run_id: &RunId, by: CancelRecord) {
        let store = self.store.clone();
        let (run, record) = (run_id.clone(), by.clone());
        let saved = blocking(move || {
            store.update_run(&run, |manifest| {
                manifest.cancelled_by.get_or_insert(record);
                Ok(())
            })
        })
        .await;
        if let Err(error) = saved {
            self.unrecorded(run_id, "who cancelled the run", &error);
        }
        self.record_event(
            run_id,
            RunEvent::new(None, EventKind::CancelRequested { by }),
        );
    }

    pub(super) async fn read(&self, run_id: &RunId) -> Result<RunManifest, RunError> {
        let store = self.store.clone();
        let run_id = run_id.clone();
        Ok(blocking(move || store.read_run(&run_id)).await?)
    }

    /// What `look` finds in the run's manifest, without copying all of it.
    pub(super) async fn look<T: Send + 'static>(
        &self,
        run_id: &RunId,
        look: impl Fn(&RunManifest) -> T + Send + 'static,
    ) -> Result<T, RunError> {
        let store = self.store.clone();
        let run_id = run_id.clone();
        Ok(blocking(move || store.look_at_run(&run_id, look)).await?)
    }

    /// Records that a pending task ends without starting (cancelled, or skipped).
    pub(super) async fn finish_unstarted(
        &self,
        run_id: &RunId,
        task_id: &TaskId,
        status: TaskStatus,
        reason: &str,
    ) {
        let store = self.store.clone();
        let (run, task, why) = (run_id.clone(), task_id.clone(), reason.to_owned());
        let record = blocking(move || {
            store.update_run(&run, |manifest| {
                let record = manifest.set_task_status(&task, status)?;
                record.reason = Some(why);
                Ok(record.clone())
            })
        })
        .await;
        let record = match record {
            Ok(record) => Some(record),
            Err(error) => {
                self.unrecorded(run_id, &format!("task {task_id} {status}"), &error);
                None
            }
        };
        self.announce(run_id, task_id, status, Some(reason.to_owned()), record);
    }

    /// Queues a finished task of this live run again, to be resumed in a workspace of its own
    /// (its worktree branch is taken up again). A task that succeeded goes on only with
    /// `more_work` (a follow-up's message): without one it is done.
    pub(super) async fn requeue(
        &self,
        run_id: &RunId,
        task_id: &TaskId,
        more_work: bool,
    ) -> Result<(), ErrorBody> {
        let store = self.store.clone();
        let (run, task) = (run_id.clone(), task_id.clone());
        let requeued = blocking(move || {
            store.update_run(&run, |manifest| {
                let Some(record) = manifest.task(&task) else {
                    return Ok(Err(ErrorBody {
                        code: ErrorCode::NotFound,
                        message: format!("run {run} has no task {task}"),
                    }));
                };
                if let Err(refusal) = AlreadySucceeded::check(&run, &task, record, more_work) {
                    return Ok(Err(ErrorBody {
                        code: ErrorCode::Succeeded,
                        message: refusal.to_string(),
                    }));
                }
                if !record.status.is_finished() {
                    return Ok(Err(ErrorBody {
                        code: ErrorCode::AlreadyRunning,
                        message: format!("task {task} of run {run} is {}", record.status),
                    }));
                }
                let record = manifest.set_task_status(&task, TaskStatus::Pending)?;
                record.reason = None;
                record.exit = None;
                Ok(Ok(record.clone()))
            })
        })
        .await
        .map_err(|error| ErrorBody {
            code: ErrorCode::State,
            message: error.to_string(),
        })??;
        self.announce(run_id, task_id, TaskStatus::Pending, None, Some(requeued));
        Ok(())
    }
}
