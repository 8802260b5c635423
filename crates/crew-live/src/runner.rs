//! The team runner: a run's task graph, executed with bounded parallelism, every step recorded
//! in the run's manifest.
//!
//! Per task: allocate its workspace through the `WorkspaceProvider`, start its agent, wait for
//! it (through questions, follow-ups and resumes), tear the workspace down in every outcome and
//! record the teardown report. A task whose upstream did not succeed is skipped with the reason;
//! with `fail_fast`, the first failure cancels the rest. Cancelling (the first Ctrl-C) stops
//! every agent gracefully and tears down preserving work; the second kills at once — the
//! teardown still saves the work.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use camino::Utf8PathBuf;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crew_core::config::{
    AgentDef, ConfigDir, ProjectConfig, WorkspaceMode, validate_plain_task_graph,
};
use crew_core::host::{HostIdentity, HostIdentityError};
use crew_core::model::{
    EventKind, ExitRecord, HostRecord, RunEvent, RunGlance, RunManifest, RunStatus, TaskRecord,
    TaskStatus, TransitionError, WorkspaceRecord,
};
use crew_core::provider::{
    AllocateWorkspaceError, RunRequest, TaskWorkspace, TeardownRequest, UpstreamWork,
    WorkspaceKind, WorkspaceProvider, WorkspaceRequest,
};
use crew_core::store::StateError;
use crew_core::{AgentId, CancelCause, CancelRecord, RunId, StateStore, TaskId, Team, Workspace};

use crate::agent::AgentSpec;
use crate::control::{ErrorBody, RunCommand, SubmittedTask};
use crate::host::AgentHost;
use crate::registry::AgentHandle;
use crate::sandbox::SandboxPlan;

/// How far a cancellation goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CancelLevel {
    None,
    /// Stop every agent gracefully (TERM, grace, KILL) and keep their work.
    Graceful,
    /// Kill every agent at once; the teardown still saves their work.
    Kill,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub team: Team,
    /// `--workspace-mode`: overrides the team's mode and every task's own.
    pub mode: Option<WorkspaceMode>,
    pub max_parallel: Option<usize>,
    pub base: Option<String>,
    pub fail_fast: Option<bool>,
    /// `--name`: the run's id, chosen by a person, so that branches read `crew/<name>-<task>`.
    pub name: Option<RunId>,
}

impl RunSpec {
    /// `team` as its files and the project's configuration say, nothing overridden.
    pub fn of(team: Team) -> Self {
        RunSpec {
            team,
            mode: None,
            max_parallel: None,
            base: None,
            fail_fast: None,
            name: None,
        }
    }
}

/// A run that could not be created, resumed or finished.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("the run cannot start")]
    Prepare(#[source] AllocateWorkspaceError),
    #[error("failed to record this process as the run's host")]
    Host(#[from] HostIdentityError),
    #[error(
        "run {run_id} is {status}; only an interrupted, failed or cancelled run can be resumed"
    )]
    NotResumable { run_id: RunId, status: RunStatus },
    #[error("run {run_id} is still hosted by process {pid}")]
    AlreadyHosted { run_id: RunId, pid: u32 },
}

impl RunError {
    pub fn hint(&self) -> Option<String> {
        match self {
            RunError::Prepare(error) => error.hint.clone(),
            RunError::State(StateError::NameTaken { .. }) => Some(
                "pick another name (`crew runs list` shows the runs of this project)".to_owned(),
            ),
            RunError::AlreadyHosted { .. } => Some(
                "use `crew agents list` to see its agents, or `crew runs cancel` to stop it"
                    .to_owned(),
            ),
            RunError::NotResumable {
                status: RunStatus::Completed,
                ..
            } => Some(
                "every task of it succeeded; for more work, start a new run (its branches are where the work is)"
                    .to_owned(),
            ),
            _ => None,
        }
    }
}

/// A task changed status: what a host shows while a run goes on.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskProgress {
    pub run_id: RunId,
    pub task_id: TaskId,
    pub status: TaskStatus,
    pub reason: Option<String>,
    /// The task's record as this change left it (its pid, workspace, teardown), so that a
    /// listener need not read the manifest, which may already have moved on. `None` when the
    /// change could not be saved.
    pub task: Option<TaskRecord>,
}

/// Runs teams of agents in one workspace, on one host.
#[derive(Debug, Clone)]
pub struct Runner {
    host: AgentHost,
    provider: Arc<dyn WorkspaceProvider>,
    store: Arc<StateStore>,
    workspace: Workspace,
    config: ProjectConfig,
    label: Option<String>,
    progress: tokio::sync::broadcast::Sender<TaskProgress>,
}

impl Runner {
    pub fn new(
        host: AgentHost,
        provider: Arc<dyn WorkspaceProvider>,
        workspace: Workspace,
        config: ProjectConfig,
    ) -> Self {
        let store = Arc::new(StateStore::new(workspace.id(), workspace.repo_root()));
        Runner {
            host,
            provider,
            store,
            workspace,
            config,
            label: None,
            progress: tokio::sync::broadcast::channel(1024).0,
        }
    }

    /// Every task status change of the runs this runner executes.
    pub fn progress(&self) -> tokio::sync::broadcast::Receiver<TaskProgress> {
        self.progress.subscribe()
    }

    /// Logs a saved status change in the run's events and announces it to progress listeners.
    fn announce(
        &self,
        run_id: &RunId,
        task_id: &TaskId,
        status: TaskStatus,
        reason: Option<String>,
        task: Option<TaskRecord>,
    ) {
        tracing::debug!(run = %run_id, task = %task_id, %status, reason = reason.as_deref().unwrap_or(""), "task status");
        let _ = self.store.append_event(
            run_id,
            &RunEvent::new(
                Some(task_id.clone()),
                EventKind::TaskStatus {
                    status,
                    reason: reason.clone(),
                },
            ),
        );
        let _ = self.progress.send(TaskProgress {
            run_id: run_id.clone(),
            task_id: task_id.clone(),
            status,
            reason,
            task,
        });
    }

    /// Names the host in listings (`crew run`, an editor).
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    pub fn store(&self) -> &Arc<StateStore> {
        &self.store
    }

    pub fn host(&self) -> &AgentHost {
        &self.host
    }

    fn host_record(&self, socket: Option<Utf8PathBuf>) -> Result<HostRecord, RunError> {
        Ok(HostRecord {
            identity: HostIdentity::current()?,
            socket,
            label: self.label.clone(),
        })
    }

    /// Checks the run can start (before any agent does) and records it as `running`, hosted by
    /// this process.
    pub async fn create(
        &self,
        spec: &RunSpec,
        socket: Option<Utf8PathBuf>,
    ) -> Result<RunManifest, RunError> {
        let team = &spec.team.def;
        let run_mode = spec.mode.or(team.workspace_mode).unwrap_or_default();
        let tasks: Vec<TaskRecord> = team
            .tasks
            .iter()
            .map(|task| {
                let mut record = TaskRecord::new(
                    task.id.clone(),
                    task.agent.clone(),
                    task.prompt.clone(),
                    task.depends_on.clone(),
                    spec.mode.or(task.workspace_mode).unwrap_or(run_mode),
                );
                record.timeout = task.timeout.or(self.config.run.task_timeout);
                record
            })
            .collect();
        let mut modes: Vec<WorkspaceMode> = tasks.iter().map(|task| task.workspace_mode).collect();
        modes.dedup();
        let provider = self.provider.clone();
        let request = RunRequest {
            workspace: self.workspace.id().clone(),
            repo_root: self.workspace.repo_root().map(Into::into),
            base: spec.base.clone(),
            modes,
            name: spec.name.clone(),
            tasks: team.tasks.iter().map(|task| task.id.clone()).collect(),
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
        let event = RunEvent::new(None, EventKind::RunCreated);
        let _ = self.store.append_event(&manifest.run_id, &event);
        Ok(manifest)
    }

    /// Takes up a run whose host is gone: finished tasks are kept, the others run again (their
    /// worktree branches are reused), tasks waiting for an answer wait again — or go on with
    /// the answer given in `answers`.
    pub async fn prepare_resume(
        &self,
        run_id: &RunId,
        socket: Option<Utf8PathBuf>,
    ) -> Result<RunManifest, RunError> {
        let store = self.store.clone();
        blocking({
            let store = store.clone();
            move || reconcile_workspace(&store)
        })
        .await?;
        let host = self.host_record(socket)?;
        let run_id = run_id.clone();
        blocking(move || {
            store.update_run(&run_id, |manifest| {
                if manifest.status == RunStatus::Running {
                    return Ok(Err(RunError::AlreadyHosted {
                        run_id: manifest.run_id.clone(),
                        pid: manifest.host.as_ref().map_or(0, |host| host.identity.pid),
                    }));
                }
                if manifest.status == RunStatus::Completed
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
                let again: Vec<TaskId> = manifest
                    .tasks
                    .iter()
                    .filter(|task| {
                        task.status.is_finished() && task.status != TaskStatus::Succeeded
                    })
                    .map(|task| task.id.clone())
                    .collect();
                for task_id in again {
                    let task = manifest.set_task_status(&task_id, TaskStatus::Pending)?;
                    task.reason = None;
                    task.exit = None;
                }
                Ok(Ok(manifest.clone()))
            })
        })
        .await?
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

    /// Runs the tasks of `run_id` to the end. `cancel` is watched for Ctrl-C; `commands` brings
    /// requests from the control channel. `resumes` names tasks to resume and the message for
    /// each: a waiting task goes on with it as its answer, a finished one starts through its
    /// agent's `resume` template (`None`: the template's default message).
    pub async fn execute(
        &self,
        run_id: &RunId,
        socket: Option<Utf8PathBuf>,
        mut cancel: watch::Receiver<CancelLevel>,
        mut commands: mpsc::Receiver<RunCommand>,
        resumes: HashMap<TaskId, Option<String>>,
    ) -> Result<RunManifest, RunError> {
        let manifest = self.read(run_id).await?;
        let (run_cancel, _) = watch::channel(CancelLevel::None);
        let (holds, mut hold_changes) = mpsc::unbounded_channel();
        let (release, _) = watch::channel(false);
        let context = Arc::new(RunContext {
            runner: self.clone(),
            run_id: run_id.clone(),
            socket,
            base: manifest.base.clone(),
            invocation_dir: manifest.invocation_dir.clone(),
            cancel: run_cancel.clone(),
            agents: std::sync::Mutex::new(HashMap::new()),
            resume_messages: std::sync::Mutex::new(
                resumes
                    .iter()
                    .filter(|(task_id, _)| {
                        manifest
                            .task(task_id)
                            .is_some_and(|task| task.status != TaskStatus::Waiting)
                    })
                    .map(|(task_id, message)| (task_id.clone(), message.clone()))
                    .collect(),
            ),
            holds,
            release: release.clone(),
        });
        let mut statuses: BTreeMap<TaskId, TaskStatus> = manifest
            .tasks
            .iter()
            .map(|task| (task.id.clone(), task.status))
            .collect();
        let mut order: Vec<TaskId> = manifest.tasks.iter().map(|task| task.id.clone()).collect();
        let mut depends: HashMap<TaskId, Vec<TaskId>> = manifest
            .tasks
            .iter()
            .map(|task| (task.id.clone(), task.depends_on.clone()))
            .collect();
        let max_parallel = manifest.max_parallel.max(1);
        let fail_fast = manifest.fail_fast;
        let mut running: JoinSet<(TaskId, TaskStatus)> = JoinSet::new();
        let mut active: HashSet<TaskId> = HashSet::new();
        // Active tasks whose agent a person stopped: they take no slot, and keep the run going
        // only while something else is.
        let mut held: HashSet<TaskId> = HashSet::new();
        let mut cancelled_by_user = false;
        let mut failed_fast = false;
        let mut commands_open = true;
        let mut cancel_open = true;

        // Tasks that were waiting for an answer when their host went away wait again here.
        for task in manifest
            .tasks
            .iter()
            .filter(|task| task.status == TaskStatus::Waiting)
        {
            let context = context.clone();
            let task = task.clone();
            let answer = resumes.get(&task.id).cloned().flatten();
            active.insert(task.id.clone());
            running.spawn(async move {
                let id = task.id.clone();
                (id, context.adopt_waiting(task, answer).await)
            });
        }

        loop {
            let level = *cancel.borrow();
            if level > CancelLevel::None {
                cancelled_by_user = true;
                if *run_cancel.borrow() < level {
                    run_cancel.send_replace(level);
                }
            }
            let stopping = cancelled_by_user || failed_fast;
            for task_id in order.clone() {
                if statuses[&task_id] != TaskStatus::Pending {
                    continue;
                }
                if stopping {
                    self.finish_unstarted(
                        run_id,
                        &task_id,
                        TaskStatus::Cancelled,
                        "the run was cancelled before the task started",
                    )
                    .await?;
                    statuses.insert(task_id, TaskStatus::Cancelled);
                    continue;
                }
                let deps = &depends[&task_id];
                if let Some(blocker) = deps.iter().find(|dep| {
                    statuses.get(*dep).is_some_and(|status| {
                        status.is_finished() && *status != TaskStatus::Succeeded
                    })
                }) {
                    let reason = format!(
                        "upstream task {blocker} did not succeed ({})",
                        statuses[blocker]
                    );
                    self.finish_unstarted(run_id, &task_id, TaskStatus::Skipped, &reason)
                        .await?;
                    statuses.insert(task_id, TaskStatus::Skipped);
                    continue;
                }
                let ready = deps
                    .iter()
                    .all(|dep| statuses.get(dep) == Some(&TaskStatus::Succeeded));
                if ready && active.len() - held.len() < max_parallel {
                    active.insert(task_id.clone());
                    statuses.insert(task_id.clone(), TaskStatus::Preparing);
                    let context = context.clone();
                    running.spawn(async move {
                        let status = context.run_task(task_id.clone()).await;
                        (task_id, status)
                    });
                }
            }
            // Nothing left but stopped tasks (every ready task was started above): they let
            // go, and the run ends.
            release.send_if_modified(|released| {
                let now = !active.is_empty() && active.is_subset(&held);
                std::mem::replace(released, now) != now
            });
            if running.is_empty() {
                let pending = statuses
                    .values()
                    .any(|status| *status == TaskStatus::Pending);
                if !pending {
                    break;
                }
            }
            tokio::select! {
                Some(joined) = running.join_next() => {
                    let (task_id, status) = match joined {
                        Ok(result) => result,
                        Err(error) => panic!("a task of run {run_id} panicked: {error}"),
                    };
                    active.remove(&task_id);
                    held.remove(&task_id);
                    statuses.insert(task_id.clone(), status);
                    if fail_fast && matches!(status, TaskStatus::Failed | TaskStatus::Stopped) && !failed_fast {
                        let by = CancelRecord { task: Some(task_id.clone()), ..CancelRecord::new(CancelCause::FailFast) };
                        self.record_cancel(run_id, by).await;
                        failed_fast = true;
                        run_cancel.send_replace(CancelLevel::Graceful);
                    }
                }
                Some((task_id, stopped)) = hold_changes.recv() => {
                    if !stopped {
                        held.remove(&task_id);
                    } else if active.contains(&task_id) {
                        held.insert(task_id);
                    }
                }
                changed = cancel.changed(), if cancel_open => {
                    // A canceller that is gone can send nothing more: stop listening to it (a
                    // closed channel answers at once, and the loop would spin).
                    cancel_open = changed.is_ok();
                }
                command = commands.recv(), if commands_open => match command {
                    Some(RunCommand::Cancel { workspace, by, reply }) => {
                        if &workspace != self.workspace.id() {
                            let _ = reply.send(Err(foreign_run(run_id, &workspace)));
                        } else {
                            self.record_cancel(run_id, by).await;
                            cancelled_by_user = true;
                            run_cancel.send_replace(CancelLevel::Graceful);
                            let _ = reply.send(Ok(serde_json::json!({ "run_id": run_id, "cancelled": true })));
                        }
                    }
                    Some(RunCommand::Submit { workspace, agent, tasks, reply }) => {
                        let result = if &workspace != self.workspace.id() {
                            Err(foreign_run(run_id, &workspace))
                        } else if stopping {
                            Err(ErrorBody { code: "run_stopping".into(), message: format!("run {run_id} is stopping; it takes no new tasks") })
                        } else {
                            self.accept_submission(run_id, &agent, tasks).await
                        };
                        if let Ok(added) = &result {
                            for record in added {
                                order.push(record.id.clone());
                                depends.insert(record.id.clone(), record.depends_on.clone());
                                statuses.insert(record.id.clone(), TaskStatus::Pending);
                            }
                        }
                        let _ = reply.send(result.map(|added| serde_json::json!({
                            "accepted": added.iter().map(|task| task.id.as_str()).collect::<Vec<_>>()
                        })));
                    }
                    Some(RunCommand::Resume { workspace, task, message, reply }) => {
                        let result = if &workspace != self.workspace.id() {
                            Err(foreign_run(run_id, &workspace))
                        } else if stopping {
                            Err(ErrorBody { code: "run_stopping".into(), message: format!("run {run_id} is stopping; it starts no task again") })
                        } else if active.contains(&task) {
                            Err(ErrorBody { code: "already_running".into(), message: format!("task {task} of run {run_id} is still going") })
                        } else {
                            self.requeue(run_id, &task).await
                        };
                        if result.is_ok() {
                            statuses.insert(task.clone(), TaskStatus::Pending);
                            context
                                .resume_messages
                                .lock()
                                .unwrap_or_else(|poisoned| poisoned.into_inner())
                                .insert(task.clone(), message);
                        }
                        let _ = reply.send(result.map(|()| serde_json::json!({
                            "agent_id": AgentId::new(run_id.clone(), task),
                            "requeued": true,
                        })));
                    }
                    None => commands_open = false,
                },
            }
        }

        let final_status = if cancelled_by_user {
            RunStatus::Cancelled
        } else if statuses
            .values()
            .all(|status| *status == TaskStatus::Succeeded)
        {
            RunStatus::Completed
        } else {
            RunStatus::Failed
        };
        let store = self.store.clone();
        let id = run_id.clone();
        let manifest = blocking(move || {
            store.update_run(&id, |manifest| {
                manifest.set_status(final_status)?;
                Ok(manifest.clone())
            })
        })
        .await?;
        let _ = self.store.append_event(
            run_id,
            &RunEvent::new(
                None,
                EventKind::RunStatus {
                    status: final_status,
                    reason: None,
                },
            ),
        );
        Ok(manifest)
    }

    /// Records who asked for the run to be cancelled, and why: in the manifest (the first
    /// request only) and as an event. The request itself goes to the run through its cancel
    /// watch or a [`RunCommand::Cancel`].
    pub async fn record_cancel(&self, run_id: &RunId, by: CancelRecord) {
        let store = self.store.clone();
        let (run, record) = (run_id.clone(), by.clone());
        let _ = blocking(move || {
            store.update_run(&run, |manifest| {
                manifest.cancelled_by.get_or_insert(record);
                Ok(())
            })
        })
        .await;
        let _ = self.store.append_event(
            run_id,
            &RunEvent::new(None, EventKind::CancelRequested { by }),
        );
    }

    async fn read(&self, run_id: &RunId) -> Result<RunManifest, RunError> {
        let store = self.store.clone();
        let run_id = run_id.clone();
        Ok(blocking(move || store.read_run(&run_id)).await?)
    }

    async fn finish_unstarted(
        &self,
        run_id: &RunId,
        task_id: &TaskId,
        status: TaskStatus,
        reason: &str,
    ) -> Result<(), RunError> {
        let store = self.store.clone();
        let (run, task, why) = (run_id.clone(), task_id.clone(), reason.to_owned());
        let record = blocking(move || {
            store.update_run(&run, |manifest| {
                let record = manifest.set_task_status(&task, status)?;
                record.reason = Some(why);
                Ok(record.clone())
            })
        })
        .await?;
        self.announce(
            run_id,
            task_id,
            status,
            Some(reason.to_owned()),
            Some(record),
        );
        Ok(())
    }

    /// Queues a finished task of this live run again, to be resumed in a workspace of its own
    /// (its worktree branch is taken up again). A task that succeeded is done.
    async fn requeue(&self, run_id: &RunId, task_id: &TaskId) -> Result<(), ErrorBody> {
        let store = self.store.clone();
        let (run, task) = (run_id.clone(), task_id.clone());
        let requeued = blocking(move || {
            store.update_run(&run, |manifest| {
                let Some(record) = manifest.task(&task) else {
                    return Ok(Err(ErrorBody {
                        code: "not_found".into(),
                        message: format!("run {run} has no task {task}"),
                    }));
                };
                if record.status == TaskStatus::Succeeded {
                    return Ok(Err(ErrorBody {
                        code: "succeeded".into(),
                        message: format!(
                            "task {task} of run {run} already succeeded; for more work, start a new run (its branch is where the work is)"
                        ),
                    }));
                }
                if !record.status.is_finished() {
                    return Ok(Err(ErrorBody {
                        code: "already_running".into(),
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
            code: "state".into(),
            message: error.to_string(),
        })??;
        self.announce(run_id, task_id, TaskStatus::Pending, None, Some(requeued));
        Ok(())
    }

    /// Validates an agent-authored plan and adds its tasks to the run, in the run's mode.
    async fn accept_submission(
        &self,
        run_id: &RunId,
        agent: &AgentId,
        submitted: Vec<SubmittedTask>,
    ) -> Result<Vec<TaskRecord>, ErrorBody> {
        let refuse = |message: String| ErrorBody {
            code: "invalid_tasks".into(),
            message,
        };
        let manifest = self
            .read(run_id)
            .await
            .map_err(|error| refuse(error.to_string()))?;
        let Some(submitter) = manifest
            .task(agent.task_id())
            .filter(|_| agent.run_id() == run_id)
        else {
            return Err(refuse(format!(
                "agent {agent} is not a task of run {run_id}"
            )));
        };
        if submitted.is_empty() {
            return Err(refuse("no tasks submitted".into()));
        }
        let existing: Vec<&TaskRecord> = manifest.tasks.iter().collect();
        let graph: Vec<(String, Vec<String>)> = existing
            .iter()
            .map(|task| {
                (
                    task.id.to_string(),
                    task.depends_on.iter().map(ToString::to_string).collect(),
                )
            })
            .chain(
                submitted
                    .iter()
                    .map(|task| (task.id.clone(), task.depends_on.clone())),
            )
            .collect();
        let parsed = validate_plain_task_graph(&graph).map_err(refuse)?;
        let config_dir = ConfigDir::new(self.workspace.crew_dir());
        let mut records = Vec::new();
        for (task, (id, depends_on)) in submitted
            .iter()
            .zip(parsed.into_iter().skip(existing.len()))
        {
            let agent_name = task
                .agent
                .clone()
                .unwrap_or_else(|| submitter.agent.clone());
            config_dir
                .load_agent(&agent_name)
                .map_err(|error| refuse(format!("task {id}: {error}")))?;
            let mut record = TaskRecord::new(
                id,
                agent_name,
                task.prompt.clone(),
                depends_on,
                manifest.workspace_mode,
            );
            record.timeout = self.config.run.task_timeout;
            records.push(record);
        }
        let store = self.store.clone();
        let run = run_id.clone();
        let added = records.clone();
        blocking(move || {
            store.update_run(&run, |manifest| {
                manifest.tasks.extend(added);
                Ok(())
            })
        })
        .await
        .map_err(|error| refuse(error.to_string()))?;
        let _ = self.store.append_event(
            run_id,
            &RunEvent::new(
                Some(agent.task_id().clone()),
                EventKind::Message {
                    text: format!(
                        "submitted tasks {}",
                        records
                            .iter()
                            .map(|task| task.id.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                },
            ),
        );
        Ok(records)
    }
}

fn foreign_run(run_id: &RunId, workspace: &crew_core::WorkspaceId) -> ErrorBody {
    ErrorBody {
        code: "foreign_workspace".into(),
        message: format!("run {run_id} does not belong to workspace {workspace}"),
    }
}

/// Runs blocking state or git work off the async threads.
async fn blocking<T: Send + 'static, E: Send + 'static>(
    work: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, E> {
    tokio::task::spawn_blocking(work)
        .await
        .expect("state and workspace work does not panic")
}

/// What every task of one run shares.
#[derive(Debug)]
struct RunContext {
    runner: Runner,
    run_id: RunId,
    socket: Option<Utf8PathBuf>,
    base: Option<String>,
    invocation_dir: Utf8PathBuf,
    cancel: watch::Sender<CancelLevel>,
    /// Agent definitions by name, loaded once per run.
    agents: std::sync::Mutex<HashMap<String, AgentDef>>,
    /// Tasks to start by resuming their agent (`crew agents resume|follow-up` on a task that
    /// has finished): through the agent's `resume` template, with the message (`None`: the
    /// template's default message).
    resume_messages: std::sync::Mutex<HashMap<TaskId, Option<String>>>,
    /// Tasks tell the scheduler when their agent was stopped by a person (`true`: the task
    /// holds its workspace for a resume) and when it was resumed (`false`).
    holds: mpsc::UnboundedSender<(TaskId, bool)>,
    /// Set by the scheduler when nothing but stopped tasks is left: they let go of their
    /// workspaces and the run ends.
    release: watch::Sender<bool>,
}

/// How a task's agent ended, before the task's status is decided.
enum Ending {
    Exited(ExitRecord),
    /// The agent asked a question and the run stopped before an answer came: the workspace is
    /// kept for it.
    StillWaiting,
    /// A person stopped the agent, and the run ended without a resume: the task stays
    /// `stopped`.
    Stopped,
}

/// Where a task's agent is, as its task follows it.
enum Phase {
    Running,
    /// Exited with a question, waiting for an answer.
    Waiting,
    /// Stopped by a person: the workspace is held for a resume while the run goes on.
    Held,
}

impl RunContext {
    async fn update<T: Send + 'static>(
        &self,
        change: impl FnOnce(&mut RunManifest) -> Result<T, TransitionError> + Send + 'static,
    ) -> Result<T, StateError> {
        let store = self.runner.store.clone();
        let run_id = self.run_id.clone();
        blocking(move || store.update_run(&run_id, change)).await
    }

    async fn record_status(&self, task_id: &TaskId, status: TaskStatus, reason: Option<String>) {
        let (task, why) = (task_id.clone(), reason.clone());
        let record = self
            .update(move |manifest| {
                let record = manifest.set_task_status(&task, status)?;
                if why.is_some() {
                    record.reason = why;
                }
                Ok(record.clone())
            })
            .await
            .ok();
        self.runner
            .announce(&self.run_id, task_id, status, reason, record);
    }

    fn cancel_level(&self) -> CancelLevel {
        *self.cancel.borrow()
    }

    fn agent_definition(&self, name: &str) -> Result<AgentDef, String> {
        let mut agents = self
            .agents
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(found) = agents.get(name) {
            return Ok(found.clone());
        }
        let definition = ConfigDir::new(self.runner.workspace.crew_dir())
            .load_agent(name)
            .map_err(|error| error.to_string())?;
        agents.insert(name.to_owned(), definition.clone());
        Ok(definition)
    }

    /// The workspace request of a task, with its upstream tasks' branches.
    async fn workspace_request(&self, task: &TaskRecord) -> Result<WorkspaceRequest, RunError> {
        let manifest = self.runner.read(&self.run_id).await?;
        let upstream = task
            .depends_on
            .iter()
            .filter_map(|dep| manifest.task(dep))
            .map(|dep| UpstreamWork {
                task_id: dep.id.clone(),
                branch: dep
                    .teardown
                    .as_ref()
                    .and_then(|report| report.branch.clone()),
            })
            .collect();
        Ok(WorkspaceRequest {
            workspace: self.runner.workspace.id().clone(),
            repo_root: self.runner.workspace.repo_root().map(Into::into),
            invocation_dir: self.invocation_dir.clone(),
            run_id: self.run_id.clone(),
            task_id: task.id.clone(),
            mode: task.workspace_mode,
            base: self.base.clone(),
            upstream,
        })
    }

    async fn allocate(&self, task: &TaskRecord) -> Result<TaskWorkspace, String> {
        let request = self
            .workspace_request(task)
            .await
            .map_err(|error| error.to_string())?;
        let provider = self.runner.provider.clone();
        let allocated = blocking(move || provider.allocate(&request))
            .await
            .map_err(|error| match &error.hint {
                Some(hint) => format!("{}\nhint: {hint}", error.message),
                None => error.message.clone(),
            })?;
        let record = WorkspaceRecord::of(&allocated);
        let warnings = allocated.warnings.clone();
        let task_id = task.id.clone();
        let _ = self
            .update(move |manifest| {
                let task = manifest.task_mut(&task_id)?;
                task.workspace = Some(record);
                for warning in warnings {
                    if !task.warnings.contains(&warning) {
                        task.warnings.push(warning);
                    }
                }
                Ok(())
            })
            .await;
        Ok(allocated)
    }

    fn agent_spec(
        &self,
        task: &TaskRecord,
        definition: AgentDef,
        workspace: &TaskWorkspace,
    ) -> AgentSpec {
        let store = &self.runner.store;
        AgentSpec {
            agent_id: AgentId::new(self.run_id.clone(), task.id.clone()),
            workspace: self.runner.workspace.id().clone(),
            dir: workspace.dir.clone(),
            definition,
            prompt: task.prompt.clone(),
            timeout: task.timeout.map(|timeout| timeout.0),
            stop_grace: self.runner.config.run.stop_grace.0,
            output_log: store.output_log_path(&self.run_id, &task.id),
            output_log_limit: self.runner.config.run.max_output_log.0,
            socket: self.socket.clone(),
            sandbox: SandboxPlan {
                mode: self.runner.config.sandbox.mode,
                write: std::iter::once(workspace.root.clone())
                    .chain(workspace.writable.iter().cloned())
                    .collect(),
            },
            workspace_env: workspace_env(workspace),
        }
    }

    /// The task's agent definition and workspace; a failure of either fails the task (recorded
    /// with the reason) and returns `None`.
    async fn prepare(&self, task: &TaskRecord) -> Option<(AgentDef, TaskWorkspace)> {
        let prepared = match self.agent_definition(&task.agent) {
            Ok(definition) => self
                .allocate(task)
                .await
                .map(|workspace| (definition, workspace)),
            Err(reason) => Err(reason),
        };
        match prepared {
            Ok(prepared) => Some(prepared),
            Err(reason) => {
                self.record_status(&task.id, TaskStatus::Failed, Some(reason))
                    .await;
                None
            }
        }
    }

    /// One task, from its workspace to its teardown. Returns its final status.
    async fn run_task(self: Arc<Self>, task_id: TaskId) -> TaskStatus {
        let Ok(manifest) = self.runner.read(&self.run_id).await else {
            return TaskStatus::Failed;
        };
        let Some(task) = manifest.task(&task_id).cloned() else {
            return TaskStatus::Failed;
        };
        self.record_status(&task_id, TaskStatus::Preparing, None)
            .await;
        let Some((definition, workspace)) = self.prepare(&task).await else {
            return TaskStatus::Failed;
        };
        if self.cancel_level() > CancelLevel::None {
            self.teardown(&task_id, &workspace, false).await;
            self.record_status(
                &task_id,
                TaskStatus::Cancelled,
                Some("the run was cancelled".into()),
            )
            .await;
            return TaskStatus::Cancelled;
        }
        let spec = self.agent_spec(&task, definition, &workspace);
        let resume_message = self
            .resume_messages
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&task_id);
        if let Some(message) = resume_message {
            return self
                .resume_with(task, workspace, spec, message.as_deref())
                .await;
        }
        let handle = match self.runner.host.start(spec).await {
            Ok(handle) => handle,
            Err(error) => {
                return self
                    .fail_to_start(&task_id, &workspace, error.to_string())
                    .await;
            }
        };
        self.note_started(&task_id, &handle).await;
        self.record_status(&task_id, TaskStatus::Running, None)
            .await;
        self.follow_through(task, workspace, handle, true, 0).await
    }

    /// A task that waited for an answer when its previous host went away: its workspace is
    /// taken up again, and the agent waits (exited) for a follow-up.
    async fn adopt_waiting(
        self: Arc<Self>,
        task: TaskRecord,
        answer: Option<String>,
    ) -> TaskStatus {
        let task_id = task.id.clone();
        let Some((definition, workspace)) = self.prepare(&task).await else {
            return TaskStatus::Failed;
        };
        let spec = self.agent_spec(&task, definition, &workspace);
        let handle = match self
            .runner
            .host
            .adopt(spec, task.question.clone(), task.attempts)
        {
            Ok(handle) => handle,
            Err(error) => {
                self.record_status(&task_id, TaskStatus::Failed, Some(error.to_string()))
                    .await;
                return TaskStatus::Failed;
            }
        };
        if let Some(answer) = answer {
            let _ = handle.follow_up(&answer).await;
        }
        let attempt = task.attempts;
        self.follow_through(task, workspace, handle, false, attempt)
            .await
    }

    /// A task whose agent could not be started: its workspace is torn down (what is there is
    /// saved), and it fails with `reason`.
    async fn fail_to_start(
        &self,
        task_id: &TaskId,
        workspace: &TaskWorkspace,
        reason: String,
    ) -> TaskStatus {
        self.teardown(task_id, workspace, false).await;
        self.record_status(task_id, TaskStatus::Failed, Some(reason))
            .await;
        TaskStatus::Failed
    }

    /// Starts a task's agent by resuming it with `message`: its `resume` template (or its
    /// command, with the message in `CREW_MESSAGE`), as the attempt after its last one.
    async fn resume_with(
        &self,
        task: TaskRecord,
        workspace: TaskWorkspace,
        spec: AgentSpec,
        message: Option<&str>,
    ) -> TaskStatus {
        let task_id = task.id.clone();
        let handle = match self.runner.host.adopt(spec, None, task.attempts) {
            Ok(handle) => handle,
            Err(error) => {
                return self
                    .fail_to_start(&task_id, &workspace, error.to_string())
                    .await;
            }
        };
        if let Err(error) = handle.resume(message).await {
            return self
                .fail_to_start(&task_id, &workspace, error.to_string())
                .await;
        }
        let attempt = task.attempts;
        self.follow_through(task, workspace, handle, false, attempt)
            .await
    }

    async fn note_started(&self, task_id: &TaskId, handle: &AgentHandle) {
        let status = handle.status();
        let task = task_id.clone();
        let _ = self
            .update(move |manifest| {
                let record = manifest.task_mut(&task)?;
                record.pid = status.pid;
                record.attempts += 1;
                record.question = None;
                record.sandbox = status.sandbox;
                Ok(())
            })
            .await;
    }

    /// Waits for the agent through questions, stops and restarts, then tears down and records
    /// the outcome.
    async fn follow_through(
        &self,
        task: TaskRecord,
        workspace: TaskWorkspace,
        handle: AgentHandle,
        started: bool,
        waiting_since: u32,
    ) -> TaskStatus {
        let task_id = task.id.clone();
        let mut cancel = self.cancel.subscribe();
        let mut release = self.release.subscribe();
        let mut stop_requests = 0;
        let mut phase = if started {
            Phase::Running
        } else {
            Phase::Waiting
        };
        // The attempt that last exited (asked, or was stopped): any later attempt goes on.
        let mut exited_attempt = waiting_since;
        let ending = loop {
            match phase {
                Phase::Running => {
                    // Checked on every turn, not only on a change: a cancel may have come
                    // before this task was listening.
                    let level = *cancel.borrow_and_update();
                    // Graceful: one stop (TERM, grace, KILL); Kill: a second stop at once.
                    let wanted = match level {
                        CancelLevel::None => 0,
                        CancelLevel::Graceful => 1,
                        CancelLevel::Kill => 2,
                    };
                    while stop_requests < wanted {
                        stop_requests += 1;
                        let handle = handle.clone();
                        tokio::spawn(async move { handle.stop().await });
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    tokio::select! {
                        status = handle.wait_exited() => {
                            exited_attempt = status.attempt;
                            if let Some(question) = status.question.clone() {
                                self.record_waiting(&task_id, &question).await;
                                phase = Phase::Waiting;
                                continue;
                            }
                            let exit = status.exit.unwrap_or(ExitRecord {
                                code: None,
                                signal: None,
                                stopped_by: None,
                                leaked_processes: 0,
                                timed_out: false,
                            });
                            if exit.stopped_by.is_some()
                                && !exit.timed_out
                                && self.cancel_level() == CancelLevel::None
                            {
                                self.hold(&task_id, exit).await;
                                phase = Phase::Held;
                                continue;
                            }
                            if handle.close().await {
                                break Ending::Exited(exit);
                            }
                        }
                        changed = cancel.changed() => {
                            if changed.is_err() {
                                // The run is over for this task's purposes; its exit decides.
                                let _ = handle.wait_exited().await;
                            }
                        }
                    }
                }
                Phase::Waiting | Phase::Held => {
                    let held = matches!(phase, Phase::Held);
                    if self.cancel_level() > CancelLevel::None {
                        if !held {
                            break Ending::StillWaiting;
                        }
                        if handle.close().await {
                            break Ending::Stopped;
                        }
                    } else if held && *release.borrow_and_update() && handle.close().await {
                        break Ending::Stopped;
                    }
                    // A follow-up (to a question) or a resume (after a stop) starts the agent
                    // again.
                    tokio::select! {
                        restarted = handle.wait_restarted(exited_attempt) => {
                            if restarted.is_none() {
                                break if held { Ending::Stopped } else { Ending::StillWaiting };
                            }
                            if held {
                                let _ = self.holds.send((task_id.clone(), false));
                            }
                            self.note_started(&task_id, &handle).await;
                            self.record_status(&task_id, TaskStatus::Running, None).await;
                            phase = Phase::Running;
                        }
                        _ = release.changed(), if held => {}
                        _ = cancel.changed() => {}
                    }
                }
            }
        };
        match ending {
            Ending::StillWaiting => {
                self.teardown(&task_id, &workspace, true).await;
                TaskStatus::Waiting
            }
            Ending::Stopped => {
                self.teardown(&task_id, &workspace, false).await;
                let task = task_id.clone();
                let _ = self
                    .update(move |manifest| {
                        manifest.task_mut(&task)?.reason = Some(STOPPED_BY_REQUEST.to_owned());
                        Ok(())
                    })
                    .await;
                TaskStatus::Stopped
            }
            Ending::Exited(exit) => {
                let cancelled = self.cancel_level() > CancelLevel::None;
                let (status, reason) =
                    outcome(&exit, cancelled, task.timeout.map(|timeout| timeout.0));
                self.record_exit(&task_id, exit).await;
                self.teardown(&task_id, &workspace, false).await;
                self.record_status(&task_id, status, reason).await;
                status
            }
        }
    }

    /// A person stopped the task's agent while the run goes on: the task is `stopped`, and
    /// holds its workspace so that `crew agents resume` starts the agent again in it.
    async fn hold(&self, task_id: &TaskId, exit: ExitRecord) {
        self.record_exit(task_id, exit).await;
        let reason = format!(
            "{STOPPED_BY_REQUEST}; its workspace is kept while the run goes on (`crew agents resume {}:{task_id}` starts it again)",
            self.run_id
        );
        self.record_status(task_id, TaskStatus::Stopped, Some(reason))
            .await;
        let _ = self.holds.send((task_id.clone(), true));
    }

    async fn record_exit(&self, task_id: &TaskId, exit: ExitRecord) {
        let task = task_id.clone();
        let _ = self
            .update(move |manifest| {
                let record = manifest.task_mut(&task)?;
                record.exit = Some(exit);
                record.pid = None;
                Ok(())
            })
            .await;
    }

    async fn record_waiting(&self, task_id: &TaskId, question: &str) {
        let (task, asked) = (task_id.clone(), question.to_owned());
        let record = self
            .update(move |manifest| {
                let status = manifest.task(&task).map(|record| record.status);
                if status != Some(TaskStatus::Waiting) {
                    manifest.set_task_status(&task, TaskStatus::Waiting)?;
                }
                let record = manifest.task_mut(&task)?;
                record.question = Some(asked);
                Ok(record.clone())
            })
            .await
            .ok();
        self.runner.announce(
            &self.run_id,
            task_id,
            TaskStatus::Waiting,
            Some(question.to_owned()),
            record,
        );
    }

    /// Tears the workspace down and records the report. A teardown error is recorded as a
    /// warning; it never replaces the task's outcome.
    async fn teardown(&self, task_id: &TaskId, workspace: &TaskWorkspace, keep: bool) {
        let provider = self.runner.provider.clone();
        let request = TeardownRequest {
            workspace: self.runner.workspace.id().clone(),
            repo_root: self.runner.workspace.repo_root().map(Into::into),
            run_id: self.run_id.clone(),
            task_id: task_id.clone(),
            agent_alive: false,
            keep,
        };
        let allocated = workspace.clone();
        let result = blocking(move || {
            provider
                .teardown(&allocated, &request)
                .map_err(|error| (error.message.clone(), error.partial))
        })
        .await;
        let task_id = task_id.clone();
        let _ = self
            .update(move |manifest| {
                let record = manifest.task_mut(&task_id)?;
                match result {
                    Ok(report) => record.teardown = Some(report),
                    Err((message, partial)) => {
                        record.warnings.push(format!("teardown: {message}"));
                        record.teardown = Some(*partial);
                    }
                }
                Ok(())
            })
            .await;
    }
}

/// What an agent's environment carries for its kind of workspace: in `temp` and `dedicated`
/// workspaces (which may lie inside the project, as `.crew/state/ws/…` does), git must not
/// climb above the workspace into a repository around it.
fn workspace_env(workspace: &TaskWorkspace) -> Vec<(String, String)> {
    match (workspace.kind, workspace.root.parent()) {
        (WorkspaceKind::Temp | WorkspaceKind::Dedicated, Some(parent)) => vec![(
            crew_core::env_vars::GIT_CEILING_DIRECTORIES.to_owned(),
            parent.to_string(),
        )],
        _ => Vec::new(),
    }
}

const STOPPED_BY_REQUEST: &str = "stopped by request";

/// The task status an exit means, and why.
fn outcome(
    exit: &ExitRecord,
    cancelled: bool,
    timeout: Option<Duration>,
) -> (TaskStatus, Option<String>) {
    if cancelled {
        return (
            TaskStatus::Cancelled,
            Some("the run was cancelled".to_owned()),
        );
    }
    if exit.timed_out {
        let limit = timeout.map_or_else(String::new, |timeout| {
            format!(" after {}", crew_core::config::HumanDuration(timeout))
        });
        return (TaskStatus::Failed, Some(format!("timed out{limit}")));
    }
    if exit.stopped_by.is_some() {
        return (TaskStatus::Stopped, Some(STOPPED_BY_REQUEST.to_owned()));
    }
    match (exit.code, exit.signal) {
        (Some(0), _) => (TaskStatus::Succeeded, None),
        (Some(code), _) => (
            TaskStatus::Failed,
            Some(format!("the agent exited with code {code}")),
        ),
        (None, Some(signal)) => (
            TaskStatus::Failed,
            Some(format!("the agent was killed by signal {signal}")),
        ),
        (None, None) => (
            TaskStatus::Failed,
            Some("the agent ended without a status".to_owned()),
        ),
    }
}

/// Stops and forgets every agent of `run_id` in the host (after the run ended).
pub fn forget_run(host: &AgentHost, run_id: &RunId) {
    for handle in host.registry().all() {
        if handle.agent_id().run_id() == run_id {
            host.registry().remove(handle.agent_id());
        }
    }
}

/// Reconciles the workspace's runs (runs whose host is gone become `interrupted`) and kills
/// what is left of their agents: processes that left their group but carry the run's marker.
pub fn reconcile_workspace(store: &StateStore) -> Result<Vec<RunId>, StateError> {
    let interrupted = store.reconcile()?;
    for run_id in &interrupted {
        crate::procscan::kill_marked(&crate::procscan::run_marker(run_id));
        // The socket its host never removed: only one a host would have made is touched.
        if let Ok(glance) = store.glance_run(run_id)
            && let Some(socket) = glance.host.and_then(|host| host.socket)
            && crate::control::is_plausible_socket(&socket)
            && std::os::unix::net::UnixStream::connect(&socket).is_err()
        {
            let _ = std::fs::remove_file(&socket);
        }
    }
    crate::publish::remove_stale_listings(store.state_dir());
    Ok(interrupted)
}

/// Every run of the workspace whose host is alive and serves a socket: where other processes
/// find the live agents of the workspace.
pub fn live_hosts(store: &StateStore) -> Vec<(RunId, HostRecord)> {
    live_hosts_of(&store.glance_runs().unwrap_or_default())
}

/// The live hosts among runs already glanced at.
pub fn live_hosts_of(runs: &[RunGlance]) -> Vec<(RunId, HostRecord)> {
    runs.iter()
        .filter(|run| run.status == RunStatus::Running)
        .filter_map(|run| {
            let host = run.host.clone()?;
            let socket = host.socket.as_deref()?;
            (host.identity.is_alive() && crate::control::is_plausible_socket(socket))
                .then(|| (run.run_id.clone(), host))
        })
        .collect()
}
