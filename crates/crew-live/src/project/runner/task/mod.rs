//! One task's life, from its workspace to its teardown: where a task's status changes.
//!
//! 1. Load its agent's definition and allocate its workspace (`preparing`); a failure of
//!    either fails the task.
//! 2. Start its agent (`running`), or resume it when a person asked for that.
//! 3. Follow the agent through questions (`waiting`), stops by a person (`stopped`, the
//!    workspace held for a resume while the run goes on) and restarts.
//! 4. Tear the workspace down in every outcome (the work is saved first) and record the
//!    report, then the task's final status ([`outcome`]).
//!
//! This file holds what every task of a run shares ([`RunContext`]) and the starts (1, 2);
//! `prepare.rs` is step 1, `follow.rs` step 3, `ending.rs` step 4.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use camino::Utf8PathBuf;
use crew_core::config::{AgentDef, ConfigDir, LoadConfigError};
use crew_core::model::{
    RunManifest, TaskRecord, TaskStatus, Timestamp, TransitionError, UsageLimit,
};
use crew_core::provider::{AllocateWorkspaceError, TaskWorkspace};
use crew_core::{RunId, TaskId};
use tokio::sync::{mpsc, watch};

mod ending;
mod follow;
mod prepare;

use super::schedule::Hold;
use super::{CancelLevel, RunError, Runner, blocking};
use crate::agent::AgentSpec;
use crate::control::registry::AgentHandle;

/// What every task of one run shares.
#[derive(Debug)]
pub(super) struct RunContext {
    runner: Runner,
    run_id: RunId,
    /// The host's run this run works for, when it is a placement's.
    placed_for: Option<RunId>,
    socket: Option<Utf8PathBuf>,
    base: Option<String>,
    invocation_dir: Utf8PathBuf,
    cancel: watch::Sender<CancelLevel>,
    /// Agent definitions by name, as the run found them when it started (or was taken up
    /// again): a task an agent submits takes only these, never a file written since.
    agents: Mutex<HashMap<String, AgentDef>>,
    /// Agents whose definition loosens confinement with content the user has not allowed:
    /// why, for the tasks that would run them.
    refused_agents: HashMap<String, String>,
    /// Tasks to start by resuming their agent (`crew agents resume|follow-up` on a task that
    /// has finished): through the agent's `resume` template, with the message (`None`: the
    /// template's default message).
    resume_messages: Mutex<HashMap<TaskId, Option<String>>>,
    /// Tasks tell the scheduler when their agent was stopped by a person (`true`: the task
    /// holds its workspace for a resume) and when it was resumed (`false`).
    holds: mpsc::UnboundedSender<(TaskId, Hold)>,
    /// Set by the scheduler when nothing but stopped tasks is left: they let go of their
    /// workspaces and the run ends.
    release: watch::Sender<bool>,
    /// Where the work of each torn-down task went: its branch, or the kept directory.
    saved: Mutex<Vec<String>>,
    /// The branches (and tips) that hold the work placed tasks sent back, by task: their
    /// teardown (of a scratch directory here) reports them.
    landed: Mutex<HashMap<TaskId, (String, String)>>,
    /// Each started task's lease (`[lease]`), released when it ends.
    leases: Mutex<HashMap<TaskId, crew_sandbox::lease::Lease>>,
    /// Held while a task's teardown is recorded and the other branches are read for the
    /// radar: of two tasks ending at once, the second always sees the first's branch.
    radar: tokio::sync::Mutex<()>,
    /// What its tasks spent, against their spend caps.
    spend: super::spend::SpendBook,
}

/// Why a task could not get its agent's definition or its workspace.
#[derive(Debug, thiserror::Error)]
enum PrepareError {
    #[error(transparent)]
    Agent(#[from] LoadConfigError),
    #[error(transparent)]
    Workspace(#[from] AllocateWorkspaceError),
    #[error(transparent)]
    Run(#[from] RunError),
    /// A task names an agent it may not run by (one submitted since the run started, one
    /// whose definition loosens confinement unallowed).
    #[error("{0}")]
    Refused(String),
}

impl PrepareError {
    /// The task's recorded reason: the message, and what to do about it.
    fn reason(&self) -> String {
        match self {
            PrepareError::Workspace(error) => match &error.hint {
                Some(hint) => format!("{}\nhint: {hint}", error.message),
                None => error.message.clone(),
            },
            error => error.to_string(),
        }
    }
}

/// Where a task's agent is, as its task follows it.
#[derive(Debug, Clone, Copy)]
pub(super) enum Phase {
    Running,
    /// Exited with a question, waiting for an answer.
    Waiting,
    /// Stopped by a person: the workspace is held for a resume while the run goes on.
    Held,
    /// Exited on a usage limit: the agent takes up its session again when the limit lifts
    /// (`None`: when a person resumes it).
    Paused {
        resets_at: Option<Timestamp>,
    },
    /// Reached a spend cap: the agent goes on only when a person lets it.
    Capped {
        kind: crew_core::model::CapKind,
    },
}

impl RunContext {
    pub(super) fn new(
        runner: Runner,
        manifest: &RunManifest,
        socket: Option<Utf8PathBuf>,
        cancel: watch::Sender<CancelLevel>,
        resume_messages: HashMap<TaskId, Option<String>>,
        holds: mpsc::UnboundedSender<(TaskId, Hold)>,
        release: watch::Sender<bool>,
    ) -> Self {
        let mut agents = runner.take_given_agents(&manifest.run_id);
        // Before any agent of the run starts: what an agent writes in `.crew/agents/` later (in
        // `single` mode it can) is nothing a task of this run runs by.
        let config_dir = ConfigDir::new(runner.workspace.crew_dir());
        let allowed = crew_core::config::AllowList::of_user();
        let mut refused_agents = HashMap::new();
        for name in config_dir.agent_names().unwrap_or_default() {
            if agents.contains_key(&name) {
                continue;
            }
            if let Err(refused) = config_dir.check_agent_allowed(&name, allowed.as_ref()) {
                refused_agents.insert(name, refused.to_string());
            } else if let Ok(definition) = config_dir.load_agent(&name) {
                agents.insert(name, definition);
            }
        }
        RunContext {
            runner,
            run_id: manifest.run_id.clone(),
            placed_for: manifest.placed_for.clone(),
            socket,
            base: manifest.base.clone(),
            invocation_dir: manifest.invocation_dir.clone(),
            cancel,
            agents: Mutex::new(agents),
            refused_agents,
            resume_messages: Mutex::new(resume_messages),
            holds,
            release,
            saved: Mutex::default(),
            landed: Mutex::default(),
            leases: Mutex::default(),
            radar: tokio::sync::Mutex::default(),
            spend: super::spend::SpendBook::of(manifest),
        }
    }

    /// The next start of `task` resumes its agent with `message` (see `resume_messages`).
    pub(super) fn resume_with_message(&self, task: &TaskId, message: Option<String>) {
        self.resume_messages
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(task.clone(), message);
    }

    /// Where the work of the tasks torn down so far went.
    pub(super) fn saved(&self) -> Vec<String> {
        self.saved
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Saves `change` to the run's manifest, together with the changes other tasks make
    /// meanwhile (one write for all of them, see `StateStore::update_run_together`). A
    /// failure is noted as unrecorded (the run goes on, and says so when it ends) and gives
    /// `None`.
    async fn save<T: Send + 'static>(
        &self,
        what: &str,
        change: impl FnOnce(&mut RunManifest) -> Result<T, TransitionError> + Send + 'static,
    ) -> Option<T> {
        let store = self.runner.store.clone();
        let run_id = self.run_id.clone();
        match blocking(move || store.update_run_together(&run_id, change)).await {
            Ok(value) => Some(value),
            Err(error) => {
                self.runner.unrecorded(&self.run_id, what, &error);
                None
            }
        }
    }

    /// [`RunContext::save`] for a change to `task_id`'s record alone: appended to the run's
    /// journal, so that what a task records costs the same in a run of ten tasks or a thousand
    /// (`StateStore::update_task_together`).
    async fn save_task<T: Send + 'static>(
        &self,
        what: &str,
        task_id: &TaskId,
        change: impl FnOnce(&mut TaskRecord) -> Result<T, TransitionError> + Send + 'static,
    ) -> Option<T> {
        let store = self.runner.store.clone();
        let (run_id, task_id) = (self.run_id.clone(), task_id.clone());
        match blocking(move || store.update_task_together(&run_id, &task_id, change)).await {
            Ok(value) => Some(value),
            Err(error) => {
                self.runner.unrecorded(&self.run_id, what, &error);
                None
            }
        }
    }

    async fn record_status(&self, task_id: &TaskId, status: TaskStatus, reason: Option<String>) {
        let (run_id, why) = (self.run_id.clone(), reason.clone());
        let record = self
            .save_task(
                &format!("task {task_id} {status}"),
                task_id,
                move |record| {
                    record.set_status(&run_id, status, Timestamp::now())?;
                    if why.is_some() {
                        record.reason = why;
                    }
                    Ok(record.clone())
                },
            )
            .await;
        self.runner
            .announce(&self.run_id, task_id, status, reason, record);
    }

    fn cancel_level(&self) -> CancelLevel {
        *self.cancel.borrow()
    }

    /// Why agent `name` may not run, when its definition loosens confinement unallowed.
    pub(super) fn refused_agent(&self, name: &str) -> Option<&str> {
        self.refused_agents.get(name).map(String::as_str)
    }

    /// The definition of agent `name` the run started with, if it had one.
    pub(super) fn started_agent(&self, name: &str) -> Option<AgentDef> {
        self.agents
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(name)
            .cloned()
    }

    /// What the run's tasks spent, against their caps.
    pub(super) fn spend(&self) -> &super::spend::SpendBook {
        &self.spend
    }

    /// Whose rate limits `task`'s agent meets (see `AgentDef::provider`): its agent's name
    /// where the run has no definition of it.
    pub(in crate::project::runner) fn provider_of(&self, task: &TaskRecord) -> String {
        self.started_agent(&task.agent)
            .map_or_else(|| task.agent.clone(), |definition| definition.provider())
    }

    /// The provider of each definition the run started with, by its name.
    pub(in crate::project::runner) fn providers(&self) -> HashMap<String, String> {
        self.agents
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
            .map(|(name, definition)| (name.clone(), definition.provider()))
            .collect()
    }

    /// The names of the definitions the run started with, sorted.
    pub(super) fn started_agent_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .agents
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// Whether a task some agent submitted descends from an agent that ran confined: then it
    /// runs confined too, whatever its own definition says — a sub-task is never wider than
    /// its submitter.
    async fn submitted_under_confinement(&self, task: &TaskRecord) -> bool {
        let Some(parent) = task.parent.clone() else {
            return false;
        };
        let chain = self
            .runner
            .look(&self.run_id, move |manifest| {
                let mut agents = Vec::new();
                let mut next = Some(parent.clone());
                while let Some(id) = next {
                    let Some(record) = manifest.task(&id) else {
                        break;
                    };
                    agents.push(record.agent.clone());
                    next = record.parent.clone().filter(|_| agents.len() < 64);
                }
                agents
            })
            .await
            .unwrap_or_default();
        let project = self.runner.config.sandbox.mode;
        chain.iter().any(|agent| {
            self.started_agent(agent).is_none_or(|definition| {
                project.and(definition.sandbox.mode) == crew_core::config::SandboxMode::Enforce
            })
        })
    }

    /// One task, from its workspace to its teardown. Returns its final status.
    pub(super) async fn run_task(self: Arc<Self>, task_id: TaskId) -> TaskStatus {
        let wanted = task_id.clone();
        let task = match self
            .runner
            .look(&self.run_id, move |manifest| {
                manifest.task(&wanted).cloned()
            })
            .await
        {
            Ok(task) => task,
            Err(error) => {
                let reason = format!("could not read the run's manifest: {error}");
                self.record_status(&task_id, TaskStatus::Failed, Some(reason))
                    .await;
                return TaskStatus::Failed;
            }
        };
        let Some(task) = task else {
            // Tasks are only ever added to a manifest: the scheduler started one it holds.
            unreachable!("task {task_id} is in run {}", self.run_id);
        };
        self.record_status(&task_id, TaskStatus::Preparing, None)
            .await;
        let Some((definition, workspace)) = self.prepare(&task).await else {
            return TaskStatus::Failed;
        };
        if self.cancel_level() > CancelLevel::None {
            self.finish(
                &task_id,
                &workspace,
                TaskStatus::Cancelled,
                Some("the run was cancelled".into()),
            )
            .await;
            return TaskStatus::Cancelled;
        }
        if self.spend.caps(&task_id) && !reports_cost(&definition) {
            let warning = unmeasured(&definition);
            self.runner.record_event(
                &self.run_id,
                crew_core::model::RunEvent::new(
                    Some(task_id.clone()),
                    crew_core::model::EventKind::Message {
                        text: warning.clone(),
                    },
                ),
            );
            self.record_warning(&task_id, warning).await;
        }
        let spec = self.agent_spec(&task, definition, &workspace);
        let spec = match &task.placement {
            Some(placement) => match self.placed_spec(spec, &task, placement) {
                Ok(spec) => spec,
                Err(reason) => return self.fail_to_start(&task_id, &workspace, reason).await,
            },
            None => spec,
        };
        let resume_message = self
            .resume_messages
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&task_id);
        // Its agent had finished its work when its previous host died (the exit was recorded,
        // the teardown was not): it is not run again over its own work, which is finished
        // here — checked, torn down, saved on its branch. A message to resume it with asks
        // for more, and it runs.
        if resume_message.is_none() && task.placement.is_none() && task.exit_was_clean() {
            return self.finish_exited(task, workspace, spec).await;
        }
        if let Some(message) = resume_message {
            return self
                .resume_with(task, workspace, spec, message.as_deref())
                .await;
        }
        // The run or the day is at its spend cap (this task starts only because nothing else
        // is going): it pauses before it begins, and asks.
        if let Some(over) = self.spend.run_or_day_reached() {
            let Some(handle) = self.adopt_exited(&task, &workspace, spec).await else {
                return TaskStatus::Failed;
            };
            self.pause_at_cap(&task_id, &over, false).await;
            let attempt = task.attempts;
            let from = Phase::Capped { kind: over.kind };
            return self
                .follow_through(task, workspace, handle, from, attempt)
                .await;
        }
        let handle = match self.runner.host.start(spec).await {
            Ok(handle) => handle,
            Err(error) => {
                return self
                    .fail_to_start(
                        &task_id,
                        &workspace,
                        crate::agent::error::with_causes(&error),
                    )
                    .await;
            }
        };
        self.record_started(&task_id, &handle).await;
        #[cfg(debug_assertions)]
        panic_point(&task_id, &handle).await;
        self.follow_through(task, workspace, handle, Phase::Running, 0)
            .await
    }

    /// A task that waited for an answer when its previous host went away: its workspace is
    /// taken up again, and the agent waits (exited) for a follow-up.
    pub(super) async fn adopt_waiting(
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
            Ok(handle) => {
                self.handed_follow_ups(&task).await;
                handle
            }
            Err(error) => {
                self.record_status(&task_id, TaskStatus::Failed, Some(error.to_string()))
                    .await;
                return TaskStatus::Failed;
            }
        };
        if let Some(answer) = answer
            && let Err(error) = handle.follow_up(&answer).await
        {
            // The agent waits on: the answer can be given again.
            self.record_warning(
                &task_id,
                format!("the answer given with the resume was not delivered: {error}"),
            )
            .await;
        }
        let attempt = task.attempts;
        self.follow_through(task, workspace, handle, Phase::Waiting, attempt)
            .await
    }

    /// A task a usage limit paused when its previous host went away: its workspace is taken up
    /// again, and its agent starts again in its session when the limit lifts — at once when it
    /// already has, or when the resume names the task (`message`).
    pub(super) async fn adopt_paused(
        self: Arc<Self>,
        task: TaskRecord,
        message: Option<Option<String>>,
    ) -> TaskStatus {
        let task_id = task.id.clone();
        let Some((definition, workspace)) = self.prepare(&task).await else {
            return TaskStatus::Failed;
        };
        let spec = self.agent_spec(&task, definition, &workspace);
        let Some(handle) = self.adopt_exited(&task, &workspace, spec).await else {
            return TaskStatus::Failed;
        };
        let hold = match task.capped {
            Some(_) => Hold::Capped,
            None => Hold::Paused,
        };
        self.tell_scheduler(&task_id, hold);
        if let Some(message) = message
            && let Err(error) = handle.resume(message.as_deref()).await
        {
            return self
                .fail_to_start(
                    &task_id,
                    &workspace,
                    crate::agent::error::with_causes(&error),
                )
                .await;
        }
        let attempt = task.attempts;
        let resets_at = task.limit.as_ref().and_then(UsageLimit::continues_at);
        // Paused at a spend cap: it waits for a person, whatever time it is.
        let from = match task.capped {
            Some(kind) => Phase::Capped { kind },
            None => Phase::Paused { resets_at },
        };
        self.follow_through(task, workspace, handle, from, attempt)
            .await
    }

    /// A task whose agent finished before its host died: what remains of it (its check, its
    /// teardown) is done, and it succeeds as its agent's exit said.
    async fn finish_exited(
        &self,
        task: TaskRecord,
        workspace: TaskWorkspace,
        spec: AgentSpec,
    ) -> TaskStatus {
        let task_id = task.id.clone();
        let Some(handle) = self.adopt_exited(&task, &workspace, spec).await else {
            return TaskStatus::Failed;
        };
        self.record_status(&task_id, TaskStatus::Running, None)
            .await;
        if let Some(check) = &task.check {
            self.check(&task, &check.command, &handle).await;
        }
        self.finish(&task_id, &workspace, TaskStatus::Succeeded, None)
            .await;
        TaskStatus::Succeeded
    }

    /// The task's recorded follow-ups went to its new supervisor: the record lets them go, so
    /// that no later host delivers them twice.
    async fn handed_follow_ups(&self, task: &TaskRecord) {
        if task.follow_ups.is_empty() {
            return;
        }
        let task_id = task.id.clone();
        self.save_task(
            &format!("task {task_id}'s follow-ups"),
            &task_id,
            |record| {
                record.follow_ups.clear();
                Ok(())
            },
        )
        .await;
    }

    /// Registers the task's agent as exited, for a resume to start it in its workspace; an
    /// agent that cannot be registered fails its task (`None`).
    async fn adopt_exited(
        &self,
        task: &TaskRecord,
        workspace: &TaskWorkspace,
        spec: AgentSpec,
    ) -> Option<AgentHandle> {
        match self.runner.host.adopt(spec, None, task.attempts) {
            Ok(handle) => {
                self.handed_follow_ups(task).await;
                Some(handle)
            }
            Err(error) => {
                self.fail_to_start(
                    &task.id,
                    workspace,
                    crate::agent::error::with_causes(&error),
                )
                .await;
                None
            }
        }
    }

    /// A task whose agent could not be started: its workspace is torn down (what is there is
    /// saved), and it fails with `reason`.
    async fn fail_to_start(
        &self,
        task_id: &TaskId,
        workspace: &TaskWorkspace,
        reason: String,
    ) -> TaskStatus {
        self.finish(task_id, workspace, TaskStatus::Failed, Some(reason))
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
        let Some(handle) = self.adopt_exited(&task, &workspace, spec).await else {
            return TaskStatus::Failed;
        };
        if let Err(error) = handle.resume(message).await {
            return self
                .fail_to_start(
                    &task_id,
                    &workspace,
                    crate::agent::error::with_causes(&error),
                )
                .await;
        }
        let attempt = task.attempts;
        self.follow_through(task, workspace, handle, Phase::Waiting, attempt)
            .await
    }

    /// The agent runs: its process and sandbox, and the task `running`, in one write.
    async fn record_started(&self, task_id: &TaskId, handle: &AgentHandle) {
        let status = handle.status();
        let task = task_id.clone();
        // A state directory its definition declares that could not be made: the agent runs,
        // and cannot keep its state (its sessions, its transcripts) there. A network narrower
        // than open that the kernel could not give, where the run allowed the open one or it
        // was crew's default. Said where it shows.
        let unmade: Vec<String> = status
            .sandbox
            .as_ref()
            .map(|sandbox| {
                sandbox
                    .unmade
                    .iter()
                    .map(|why| {
                        format!(
                            "crew could not make {why}, which the agent's definition declares: the agent cannot keep its state there (its sessions, its transcripts); make the directory yourself, or check HOME"
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let unmet = status
            .sandbox
            .as_ref()
            .and_then(|sandbox| sandbox.network_unmet);
        // Caps it asked for that no cgroup could hold, its run having allowed that.
        let uncapped = status
            .sandbox
            .as_ref()
            .and_then(|sandbox| sandbox.uncapped.clone())
            .map(|why| {
                format!("caps: the agent ran without its caps, as --allow-uncapped allowed: {why}")
            });
        // A credential its definition binds that the agent held itself, where its tools read it.
        let held = status
            .sandbox
            .as_ref()
            .filter(|sandbox| !sandbox.held_by_agent.is_empty())
            .map(|sandbox| {
                format!(
                    "credentials: the agent held {} itself, where its tools can read {}: only behind crew's proxy (network = \"proxy\", the sandbox on) is a credential held by reference",
                    sandbox.held_by_agent.join(", "),
                    if sandbox.held_by_agent.len() == 1 { "it" } else { "them" }
                )
            });
        let run_id = self.run_id.clone();
        let record = self
            .save_task(&format!("task {task_id}'s start"), &task, move |record| {
                record.set_status(&run_id, TaskStatus::Running, Timestamp::now())?;
                record.pid = status.pid;
                record.attempts += 1;
                record.question = None;
                // Its supervisor holds the follow-ups now.
                record.follow_ups.clear();
                // Why it stopped or paused before is over now.
                record.reason = None;
                record.sandbox = status.sandbox;
                let unmet = unmet.map(|mode| {
                    format!(
                        "network: `{}` could not be had here (the kernel refuses what it needs: unprivileged user namespaces, or Landlock): the agent ran with the network open, {}",
                        mode.as_str(),
                        if record.allow_open_network {
                            "as --allow-open-network allowed"
                        } else {
                            "as crew's default does where it cannot be had (no setting names the agent's network: name one in its definition for its start to be refused instead)"
                        }
                    )
                });
                for warning in unmade
                    .iter()
                    .cloned()
                    .chain(unmet)
                    .chain(held.clone())
                    .chain(uncapped.clone())
                {
                    if !record.warnings.contains(&warning) {
                        record.warnings.push(warning);
                    }
                }
                Ok(record.clone())
            })
            .await;
        self.runner
            .announce(&self.run_id, task_id, TaskStatus::Running, None, record);
    }

    /// Adds a warning to the task's record.
    async fn record_warning(&self, task_id: &TaskId, warning: String) {
        self.save_task(&format!("task {task_id}'s warning"), task_id, |record| {
            // Said once, however many starts of the task meet it.
            if !record.warnings.contains(&warning) {
                record.warnings.push(warning);
            }
            Ok(())
        })
        .await;
    }

    /// The running agent's question was answered and it goes on: the task is `running` again.
    async fn record_answered(&self, task_id: &TaskId) {
        let run_id = self.run_id.clone();
        let record = self
            .save_task(
                &format!("task {task_id}'s answer"),
                task_id,
                move |record| {
                    record.set_status(&run_id, TaskStatus::Running, Timestamp::now())?;
                    record.question = None;
                    Ok(record.clone())
                },
            )
            .await;
        self.runner
            .announce(&self.run_id, task_id, TaskStatus::Running, None, record);
    }
}

const STOPPED_BY_REQUEST: &str = "stopped by request";

/// A fail point for the tests of what a defect of crew's does to a run: in a debug build, the
/// task `CREW_TEST_PANIC_TASK` names panics once its agent has said something (so that it did
/// some work first). Release builds have none.
#[cfg(debug_assertions)]
async fn panic_point(task_id: &TaskId, handle: &crate::control::registry::AgentHandle) {
    if std::env::var("CREW_TEST_PANIC_TASK").is_ok_and(|task| task == task_id.as_str()) {
        for _ in 0..1000 {
            if !handle.snapshot().last_lines.is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the fail point of task {task_id}");
    }
}

/// Whether `definition`'s program says what its turns cost (Claude Code's results, an ACP
/// agent's `usage_update`), or reports tokens its `[prices]` price.
fn reports_cost(definition: &AgentDef) -> bool {
    use crew_core::config::Protocol;
    match definition.protocol {
        Protocol::ClaudeStreamJson | Protocol::Acp | Protocol::Shim => true,
        Protocol::CodexJson => definition.prices.is_some(),
        _ => false,
    }
}

/// The warning of a task under a spend cap whose program cannot be measured against it.
fn unmeasured(definition: &AgentDef) -> String {
    use crew_core::config::Protocol;
    let name = &definition.name;
    match definition.protocol {
        Protocol::CodexJson => format!(
            "spend: its program reports tokens and no cost, so no spend cap can be measured on it: give `[prices]` (US dollars per million tokens: input, output, cached_input) in .crew/agents/{name}.toml"
        ),
        _ => "spend: its program reports no cost, so no spend cap can be measured on it; it runs without one (a definition with `protocol = \"claude-stream-json\"`, `\"acp\"`, or `\"codex-json\"` with `[prices]`, is measured)".to_owned(),
    }
}
