//! One task's life, from its workspace to its teardown: where a task's status changes.
//!
//! 1. Load its agent's definition and allocate its workspace (`preparing`); a failure of
//!    either fails the task.
//! 2. Start its agent (`running`), or resume it when a person asked for that.
//! 3. Follow the agent through questions (`waiting`), stops by a person (`stopped`, the
//!    workspace held for a resume while the run goes on) and restarts.
//! 4. Tear the workspace down in every outcome (the work is saved first) and record the
//!    report, then the task's final status ([`outcome`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use camino::Utf8PathBuf;
use tokio::sync::{mpsc, watch};

use crew_core::config::{AgentDef, ConfigDir, LoadConfigError, OnLimit};
use crew_core::model::{
    CheckRecord, EventKind, ExitRecord, RunEvent, RunManifest, TaskOverlap, TaskRecord, TaskStatus,
    Timestamp, TransitionError, Usage, UsageLimit, WorkspaceRecord,
};
use crew_core::provider::{
    AllocateWorkspaceError, Progress, ProgressSink, TaskWorkspace, TeardownRequest, UpstreamWork,
    WorkspaceKind, WorkspaceRequest,
};
use crew_core::{AgentId, RunId, TaskId};

use super::schedule::Hold;
use super::{CancelLevel, RunError, Runner, TaskActivity, blocking};
use crate::agent::AgentSpec;
use crate::registry::AgentHandle;
use crate::sandbox::SandboxPlan;

/// What every task of one run shares.
#[derive(Debug)]
pub(super) struct RunContext {
    runner: Runner,
    run_id: RunId,
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
    leases: Mutex<HashMap<TaskId, crew_core::model::LeaseRecord>>,
    /// Held while a task's teardown is recorded and the other branches are read for the
    /// radar: of two tasks ending at once, the second always sees the first's branch.
    radar: tokio::sync::Mutex<()>,
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

/// How a task's agent ended, before the task's status is decided.
enum Ending {
    Exited(ExitRecord),
    /// The agent asked a question and the run stopped before an answer came: the workspace is
    /// kept for it.
    StillWaiting,
    /// A person stopped the agent, and the run ended without a resume: the task stays
    /// `stopped`.
    Stopped,
    /// A usage limit paused the task and the run stopped before it lifted: the workspace is
    /// kept, and the task stays `paused` for `crew runs resume`.
    StillPaused,
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
}

/// How long after a limit's reset time a paused agent starts again: clocks differ a little.
const LIMIT_SLACK: Duration = Duration::from_secs(1);

/// When crew next tries again a task whose limit said nothing of when it lifts, by the
/// backoff of its `tries` so far (counted here).
fn next_try(tries: &mut u32) -> Timestamp {
    let wait = crate::limits::retry_backoff(*tries);
    *tries += 1;
    Timestamp(std::time::SystemTime::now() + wait)
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

    async fn record_status(&self, task_id: &TaskId, status: TaskStatus, reason: Option<String>) {
        let (task, why) = (task_id.clone(), reason.clone());
        let record = self
            .save(&format!("task {task_id} {status}"), move |manifest| {
                let record = manifest.set_task_status(&task, status)?;
                if why.is_some() {
                    record.reason = why;
                }
                Ok(record.clone())
            })
            .await;
        self.runner
            .announce(&self.run_id, task_id, status, reason, record);
    }

    fn cancel_level(&self) -> CancelLevel {
        *self.cancel.borrow()
    }

    /// The definition of agent `name` as the run started with it. One the run did not have
    /// (a file that did not parse then) is read now, for the user's own tasks; a task an agent
    /// submitted gets none (see [`RunContext::started_agent`]).
    fn agent_definition(&self, task: &TaskRecord) -> Result<AgentDef, PrepareError> {
        let name = &task.agent;
        if let Some(refused) = self.refused_agents.get(name) {
            return Err(PrepareError::Refused(refused.clone()));
        }
        if let Some(found) = self.started_agent(name) {
            return Ok(found);
        }
        if task.parent.is_some() {
            return Err(PrepareError::Refused(format!(
                "the agent `{name}` was not defined when the run started; a task an agent submits runs only by a definition the run started with"
            )));
        }
        let definition = ConfigDir::new(self.runner.workspace.crew_dir()).load_agent(name)?;
        self.agents
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(name.to_owned(), definition.clone());
        Ok(definition)
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

    /// Where the provider tells how the preparation of `task`'s workspace moves on.
    fn progress_sink(&self, task: &TaskId) -> ProgressSink {
        let activity = self.runner.activity.clone();
        let (run_id, task_id) = (self.run_id.clone(), task.clone());
        ProgressSink::new(move |progress| {
            // Nobody watching is no error: progress is only for those who do.
            let _ = activity.send(TaskActivity {
                run_id: run_id.clone(),
                task_id: task_id.clone(),
                progress,
            });
        })
    }

    /// The workspace request of a task, with its upstream tasks' branches.
    async fn workspace_request(
        &self,
        task: &TaskRecord,
        unconfined: bool,
    ) -> Result<WorkspaceRequest, RunError> {
        let depends_on = task.depends_on.clone();
        let upstream = self
            .runner
            .look(&self.run_id, move |manifest| {
                depends_on
                    .iter()
                    .filter_map(|dep| manifest.task(dep))
                    .map(|dep| UpstreamWork {
                        task_id: dep.id.clone(),
                        branch: dep
                            .teardown
                            .as_ref()
                            .and_then(|report| report.branch.clone()),
                    })
                    .collect()
            })
            .await?;
        Ok(WorkspaceRequest {
            workspace: self.runner.workspace.id().clone(),
            repo_root: self.runner.workspace.repo_root().map(Into::into),
            invocation_dir: self.invocation_dir.clone(),
            run_id: self.run_id.clone(),
            task_id: task.id.clone(),
            mode: task.workspace_mode,
            base: self.base.clone(),
            upstream,
            progress: Some(self.progress_sink(&task.id)),
            env: self
                .leases
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .get(&task.id)
                .map(crew_core::model::LeaseRecord::vars)
                .unwrap_or_default(),
            unconfined,
        })
    }

    async fn allocate(
        &self,
        task: &TaskRecord,
        definition: &AgentDef,
    ) -> Result<TaskWorkspace, PrepareError> {
        let unconfined = self.runner.config.sandbox.mode.and(definition.sandbox.mode)
            == crew_core::config::SandboxMode::Off
            || crate::sandbox::kernel_abi().is_none();
        let request = self.workspace_request(task, unconfined).await?;
        let provider = self.runner.provider.clone();
        let allocated = blocking(move || provider.allocate(&request)).await?;
        let record = WorkspaceRecord::of(&allocated);
        let warnings = allocated.warnings.clone();
        let task_id = task.id.clone();
        self.save(&format!("task {task_id}'s workspace"), move |manifest| {
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
                read_only: workspace.read_only.clone(),
                private: workspace.private.clone(),
                network: self
                    .runner
                    .config
                    .sandbox
                    .network
                    .and(task.network.unwrap_or_default()),
                hosts: self
                    .runner
                    .config
                    .sandbox
                    .allow_hosts
                    .iter()
                    .map(|hosts| crew_core::config::HostList {
                        file: ".crew/config.toml".to_owned(),
                        hosts: hosts.clone(),
                    })
                    .collect(),
                allow_open_network: task.allow_open_network,
            },
            git_config: workspace.git_config.clone(),
            workspace_env: workspace_env(workspace)
                .into_iter()
                .chain(
                    self.leases
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .get(&task.id)
                        .map(crew_core::model::LeaseRecord::vars)
                        .unwrap_or_default(),
                )
                .collect(),
            session_id: task.session_id.clone(),
            session_cost: task.usage.and_then(|usage| usage.cost_usd),
            parent: task.parent.clone(),
            placed: None,
            follow_ups: task.follow_ups.clone(),
            network_log: Some(self.network_log(&task.id)),
        }
    }

    /// Where the proxy of `task`'s agent reports each request: an event of the run, written
    /// as it comes (an unwritten one is logged; the counts on the task still hold it).
    fn network_log(&self, task: &TaskId) -> crate::proxy::NetworkLog {
        let store = self.runner.store.clone();
        let (run_id, task) = (self.run_id.clone(), task.clone());
        crate::proxy::NetworkLog::new(move |request| {
            let event = RunEvent::new(
                Some(task.clone()),
                EventKind::Network {
                    host: request.host,
                    port: request.port,
                    allowed: request.allowed,
                    reason: request.reason,
                },
            );
            if let Err(error) = store.append_event(&run_id, &event) {
                tracing::warn!(run = %run_id, "could not record a network request: {error}");
            }
        })
    }

    /// The spec of a task that runs on a placement: its agent runs there, and what this host
    /// supervises is the placement's transport (`crew shim`, or ssh to one), unconfined (it is
    /// crew's own; the agent is confined there). `None` with the reason it cannot run there.
    fn placed_spec(
        &self,
        mut spec: AgentSpec,
        task: &TaskRecord,
        placement: &str,
    ) -> Result<AgentSpec, String> {
        let def = self
            .runner
            .config
            .placements
            .get(placement)
            .ok_or_else(|| {
                format!("the placement `{placement}` is no longer in .crew/config.toml")
            })?;
        let base = self.base.clone().ok_or_else(|| {
            format!("the run has no base commit to start from on the placement `{placement}`")
        })?;
        let repo_root = self.runner.workspace.repo_root().ok_or_else(|| {
            format!("the placement `{placement}` takes tasks of a git repository, and this project is not one")
        })?;
        let branch = format!(
            "{}/{}-{}",
            self.runner.config.worktree.branch_prefix,
            self.run_id,
            spec.agent_id.task_id()
        );
        // Confined there as here: the narrowest network of the project, the task and its
        // definition travels in the definition, with one list of hosts. Where both the
        // project and the definition list hosts, only the definition's entries the project
        // names too go (narrower than here, where wildcards of the project's cover more).
        let mut agent = spec.definition.clone();
        agent.sandbox.network = spec.sandbox.network.and(agent.sandbox.network);
        let project = spec.sandbox.hosts.first().map(|list| &list.hosts);
        agent.sandbox.allow_hosts = match (agent.sandbox.allow_hosts.take(), project) {
            (None, project) => project.cloned(),
            (Some(own), None) => Some(own),
            (Some(own), Some(project)) => Some(
                own.into_iter()
                    .filter(|entry| project.contains(entry))
                    .collect(),
            ),
        };
        let mut pass_env = vec![
            "SSH_AUTH_SOCK".to_owned(),
            "SSH_AGENT_PID".to_owned(),
            "KUBECONFIG".to_owned(),
        ];
        pass_env.extend(agent.pass_env.iter().cloned());
        spec.definition = AgentDef {
            name: format!("{}@{placement}", agent.name),
            description: Some(format!("{} on the placement {placement}", agent.name)),
            command: def.transport(
                "crew",
                &crew_core::config::PlacedTask {
                    project: self.runner.workspace.id().to_string(),
                    run: self.run_id.to_string(),
                    task: spec.agent_id.task_id().to_string(),
                    pass_env: agent.pass_env.clone(),
                },
            ),
            steer: crew_core::config::SteerMode::Protocol,
            protocol: crew_core::config::Protocol::Shim,
            resume: None,
            env: std::collections::BTreeMap::new(),
            pass_env,
            sandbox: crew_core::config::AgentSandbox {
                mode: crew_core::config::SandboxMode::Off,
                network: crew_core::config::NetworkMode::Open,
                allow_hosts: None,
                write: Vec::new(),
                confined: Default::default(),
            },
            builtin: false,
        };
        // Taken up again after its work came back once: it goes on from that work, and its
        // branch moves on from there.
        let from = task
            .teardown
            .as_ref()
            .filter(|report| report.branch.as_deref() == Some(branch.as_str()))
            .and_then(|report| report.tip.clone());
        spec.placed = Some(crate::placed::Placed {
            name: placement.to_owned(),
            // A pod gets them from its Secret, never through the attach stream.
            send_env: def.kind != crew_core::config::PlacementKind::Kubernetes,
            agent,
            project: self.runner.workspace.id().to_string(),
            base,
            from,
            repo_root: repo_root.to_owned(),
            branch,
            provider: self.runner.provider.clone(),
        });
        Ok(spec)
    }

    /// The task's agent definition and workspace; a failure of either fails the task (recorded
    /// with the reason) and returns `None`.
    async fn prepare(&self, task: &TaskRecord) -> Option<(AgentDef, TaskWorkspace)> {
        let mut definition = self.agent_definition(task);
        if let Ok(definition) = &mut definition
            && definition.sandbox.mode == crew_core::config::SandboxMode::Off
            && self.submitted_under_confinement(task).await
        {
            definition.sandbox.mode = crew_core::config::SandboxMode::Enforce;
            self.record_warning(
                &task.id,
                format!(
                    "sandbox: the agent `{}` would run unconfined, and the agent that submitted this task ran confined: it runs confined (a sub-task is never wider than its submitter)",
                    task.agent
                ),
            )
            .await;
        }
        if definition.is_ok()
            && let Err(reason) = self.lease(task).await
        {
            self.record_status(&task.id, TaskStatus::Failed, Some(reason))
                .await;
            return None;
        }
        let prepared = match definition {
            Ok(definition) => self
                .allocate(task, &definition)
                .await
                .map(|workspace| (definition, workspace)),
            Err(reason) => Err(reason),
        };
        match prepared {
            Ok(prepared) => Some(prepared),
            Err(error) => {
                self.release_lease(&task.id);
                self.record_status(&task.id, TaskStatus::Failed, Some(error.reason()))
                    .await;
                None
            }
        }
    }

    /// Takes `task`'s lease (its record's ports again on a resume, where free) and records it.
    async fn lease(&self, task: &TaskRecord) -> Result<(), String> {
        let settings = self.runner.config.lease.clone();
        let (run, id, earlier) = (
            self.run_id.to_string(),
            task.id.to_string(),
            task.lease.clone(),
        );
        let lease = blocking(move || match crate::lease::Leases::of_user() {
            Some(leases) => leases.acquire(&settings, &run, &id, earlier.as_ref()),
            // No state directory to record leases in: a name, no ports.
            None => Ok(crew_core::model::LeaseRecord {
                port: None,
                ports: 0,
                name: crew_core::model::LeaseRecord::name_of(&run, &id),
                names: settings.names.clone(),
            }),
        })
        .await
        .map_err(|reason| format!("its lease: {reason}"))?;
        self.leases
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(task.id.clone(), lease.clone());
        let task_id = task.id.clone();
        self.save(&format!("task {task_id}'s lease"), move |manifest| {
            manifest.task_mut(&task_id)?.lease = Some(lease);
            Ok(())
        })
        .await;
        Ok(())
    }

    /// Releases the ports of `task`'s lease: it ended.
    fn release_lease(&self, task: &TaskId) {
        let lease = self
            .leases
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(task);
        if let (Some(lease), Some(leases)) = (lease, crate::lease::Leases::of_user()) {
            leases.release(&lease);
        }
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
        let handle = match self.runner.host.start(spec).await {
            Ok(handle) => handle,
            Err(error) => {
                return self
                    .fail_to_start(&task_id, &workspace, crate::error::with_causes(&error))
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
        self.tell_scheduler(&task_id, Hold::Paused);
        if let Some(message) = message
            && let Err(error) = handle.resume(message.as_deref()).await
        {
            return self
                .fail_to_start(&task_id, &workspace, crate::error::with_causes(&error))
                .await;
        }
        let attempt = task.attempts;
        let resets_at = task.limit.as_ref().and_then(UsageLimit::continues_at);
        self.follow_through(
            task,
            workspace,
            handle,
            Phase::Paused { resets_at },
            attempt,
        )
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
        self.save(&format!("task {task_id}'s follow-ups"), move |manifest| {
            manifest.task_mut(&task_id)?.follow_ups.clear();
            Ok(())
        })
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
                self.fail_to_start(&task.id, workspace, crate::error::with_causes(&error))
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
                .fail_to_start(&task_id, &workspace, crate::error::with_causes(&error))
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
        // than open that the kernel could not give, where the run allowed the open one. Said
        // where it shows.
        let unmade: Vec<String> = status
            .sandbox
            .as_ref()
            .map(|sandbox| {
                let unmet = sandbox.network_unmet.map(|mode| {
                    format!(
                        "network: `{}` could not be had here (the kernel refuses what it needs: unprivileged user namespaces, or Landlock): the agent ran with the network open, as --allow-open-network allowed",
                        mode.as_str()
                    )
                });
                sandbox
                    .unmade
                    .iter()
                    .map(|why| {
                        format!(
                            "crew could not make {why}, which the agent's definition declares: the agent cannot keep its state there (its sessions, its transcripts); make the directory yourself, or check HOME"
                        )
                    })
                    .chain(unmet)
                    .collect()
            })
            .unwrap_or_default();
        let record = self
            .save(&format!("task {task_id}'s start"), move |manifest| {
                let record = manifest.set_task_status(&task, TaskStatus::Running)?;
                record.pid = status.pid;
                record.attempts += 1;
                record.question = None;
                // Its supervisor holds the follow-ups now.
                record.follow_ups.clear();
                // Why it stopped or paused before is over now.
                record.reason = None;
                record.sandbox = status.sandbox;
                for warning in unmade {
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
        let id = task_id.clone();
        self.save(&format!("task {task_id}'s warning"), move |manifest| {
            manifest.task_mut(&id)?.warnings.push(warning);
            Ok(())
        })
        .await;
    }

    /// The running agent's question was answered and it goes on: the task is `running` again.
    async fn record_answered(&self, task_id: &TaskId) {
        let task = task_id.clone();
        let record = self
            .save(&format!("task {task_id}'s answer"), move |manifest| {
                let record = manifest.set_task_status(&task, TaskStatus::Running)?;
                record.question = None;
                Ok(record.clone())
            })
            .await;
        self.runner
            .announce(&self.run_id, task_id, TaskStatus::Running, None, record);
    }

    /// Waits for the agent through questions, stops and restarts, then tears down and records
    /// the outcome.
    async fn follow_through(
        &self,
        task: TaskRecord,
        workspace: TaskWorkspace,
        handle: AgentHandle,
        from: Phase,
        waiting_since: u32,
    ) -> TaskStatus {
        let task_id = task.id.clone();
        let mut cancel = self.cancel.subscribe();
        let mut release = self.release.subscribe();
        let mut stop_requests = 0;
        let mut phase = from;
        // The attempt that last exited (asked, or was stopped): any later attempt goes on.
        let mut exited_attempt = waiting_since;
        // The running agent waits on a question of its own (an `acp` permission request).
        let mut asking = false;
        // How often crew has tried again after a limit that said nothing of when it lifts.
        let mut limit_tries = 0;
        let ending = loop {
            match phase {
                Phase::Running => {
                    // Checked on every turn, not only on a change: a cancel may have come
                    // before this task was listening.
                    let level = *cancel.borrow_and_update();
                    stop_as_cancelled(&handle, level, &mut stop_requests).await;
                    tokio::select! {
                        status = handle.wait_exited() => {
                            exited_attempt = status.attempt;
                            if let Some(question) = status.question.clone() {
                                self.record_waiting(&task_id, &question, &handle, task.usage).await;
                                phase = Phase::Waiting;
                                continue;
                            }
                            let exit = status.exit.unwrap_or(ExitRecord {
                                code: None,
                                signal: None,
                                stopped_by: None,
                                leaked_processes: 0,
                                timed_out: false,
                                ended_after_session: false,
                                network: None,
                            });
                            if let Some(limit) = status.limit.clone()
                                && task.on_limit == OnLimit::Pause
                                && exit.stopped_by.is_none()
                                && self.cancel_level() == CancelLevel::None
                            {
                                let retry = limit
                                    .resets_at
                                    .is_none()
                                    .then(|| next_try(&mut limit_tries));
                                self.pause(&task_id, exit, &limit, retry, &handle, task.usage)
                                    .await;
                                phase = Phase::Paused {
                                    resets_at: limit.resets_at.or(retry),
                                };
                                continue;
                            }
                            if exit.stopped_by.is_some()
                                && !exit.timed_out
                                && self.cancel_level() == CancelLevel::None
                            {
                                self.hold(&task_id, exit, &handle, task.usage).await;
                                phase = Phase::Held;
                                continue;
                            }
                            if handle.close().await {
                                break Ending::Exited(exit);
                            }
                        }
                        status = handle.wait_asking(asking) => match status {
                            Some(status) => {
                                asking = status.asks_alive;
                                match status.question {
                                    Some(question) if asking => {
                                        self.record_waiting(&task_id, &question, &handle, task.usage).await;
                                    }
                                    // Answered, and it goes on.
                                    None => self.record_answered(&task_id).await,
                                    // It exits with its question: the exit records it.
                                    Some(_) => {}
                                }
                            }
                            None => {
                                handle.wait_exited().await;
                            }
                        },
                        changed = cancel.changed() => {
                            if changed.is_err() {
                                // The run is over for this task's purposes; its exit decides
                                // on the next turn.
                                handle.wait_exited().await;
                            }
                        }
                    }
                }
                Phase::Paused { resets_at } => {
                    if self.cancel_level() > CancelLevel::None {
                        break Ending::StillPaused;
                    }
                    // No reset to wait for (it could not start again when its limit lifted,
                    // or a new host took the task over): crew tries again by its backoff.
                    let Some(resets_at) = resets_at else {
                        let retry = next_try(&mut limit_tries);
                        let reason = format!(
                            "paused: {}; crew tries again at {retry}, or it goes on with `crew agents resume {}:{task_id}`",
                            task.limit.as_ref().map_or_else(
                                || "it hit a usage limit".to_owned(),
                                |limit| format!("it hit {limit}")
                            ),
                            self.run_id
                        );
                        self.record_paused(&task_id, reason, Some(retry)).await;
                        phase = Phase::Paused {
                            resets_at: Some(retry),
                        };
                        continue;
                    };
                    // The limit's reset time, on this machine's clock; one that is past is now.
                    let wait = resets_at
                        .0
                        .duration_since(std::time::SystemTime::now())
                        .unwrap_or_default();
                    let wake = tokio::time::Instant::now() + wait + LIMIT_SLACK;
                    tokio::select! {
                        restarted = handle.wait_restarted(exited_attempt) => {
                            if restarted.is_none() {
                                break Ending::StillPaused;
                            }
                            self.tell_scheduler(&task_id, Hold::Going);
                            self.record_started(&task_id, &handle).await;
                            phase = Phase::Running;
                        }
                        () = tokio::time::sleep_until(wake) => {
                            // The limit lifted: its session goes on (the restart is seen above),
                            // or, when it cannot start, crew tries again by its backoff. Either
                            // way the reset time is spent: it never wakes the task twice.
                            phase = match handle.resume(None).await {
                                // Started: its restart is seen next; should that never come,
                                // crew tries again later.
                                Ok(_) => Phase::Paused {
                                    resets_at: Some(next_try(&mut limit_tries)),
                                },
                                Err(error) => {
                                    self.record_warning(
                                        &task_id,
                                        format!("could not start the agent again when its limit lifted: {error}"),
                                    )
                                    .await;
                                    Phase::Paused { resets_at: None }
                                }
                            };
                        }
                        _ = cancel.changed() => {}
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
                                self.tell_scheduler(&task_id, Hold::Going);
                            }
                            self.record_started(&task_id, &handle).await;
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
            Ending::StillPaused => {
                self.teardown(&task_id, &workspace, true).await;
                TaskStatus::Paused
            }
            Ending::Stopped => {
                self.teardown(&task_id, &workspace, false).await;
                let task = task_id.clone();
                self.save(&format!("task {task_id}'s reason"), move |manifest| {
                    manifest.task_mut(&task)?.reason = Some(STOPPED_BY_REQUEST.to_owned());
                    Ok(())
                })
                .await;
                TaskStatus::Stopped
            }
            Ending::Exited(exit) => {
                let cancelled = self.cancel_level() > CancelLevel::None;
                let (mut status, mut reason) =
                    outcome(&exit, cancelled, task.timeout.map(|timeout| timeout.0));
                let agent = handle.status();
                // A placed task whose connection was lost: its work is there, for a resume.
                if let (Some(lost), false) = (&agent.lost, cancelled) {
                    status = TaskStatus::Interrupted;
                    reason = Some(lost.clone());
                }
                // A limit is named as one: what it is, and when it lifts. A last turn that
                // ended on one leaves the work undone, whatever the exit says.
                match (status, agent.limit, &mut reason) {
                    (TaskStatus::Succeeded, Some(limit), _) => {
                        status = TaskStatus::Failed;
                        reason = Some(format!("the agent stopped when it hit {limit}"));
                    }
                    // Its protocol said its last turn (or the session itself) failed: an exit
                    // code of 0 does not make that a success.
                    (TaskStatus::Succeeded, None, _) if agent.turn_error.is_some() => {
                        status = TaskStatus::Failed;
                        let how = if exit.ended_after_session {
                            "crew ended the agent once its session was over"
                        } else {
                            "the agent exited 0"
                        };
                        reason = Some(format!(
                            "{how}, but its protocol said it failed: {}",
                            agent.turn_error.as_deref().unwrap_or_default()
                        ));
                    }
                    (TaskStatus::Failed, Some(limit), Some(why)) => {
                        why.push_str(&format!(" after it hit {limit}"));
                    }
                    (TaskStatus::Failed, None, Some(why)) => {
                        if let Some(turn_error) = agent.turn_error {
                            why.push_str(&format!(" (its last turn: {turn_error})"));
                        }
                    }
                    _ => {}
                }
                // A toolchain that failed inside the sandbox says what to add.
                if let (TaskStatus::Failed, Some(why), false) =
                    (status, &mut reason, agent.refused_writes.is_empty())
                {
                    why.push_str(&format!(
                        "; {}",
                        crate::refusals::note(&agent.refused_writes, &task.agent)
                    ));
                }
                if let Some(branch) = agent.landed {
                    self.landed
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .insert(task_id.clone(), branch);
                }
                self.record_exit(&task_id, exit, &handle, task.usage).await;
                if status == TaskStatus::Succeeded
                    && let Some(check) = &task.check
                {
                    self.check(&task, &check.command, &handle).await;
                }
                self.finish(&task_id, &workspace, status, reason).await;
                status
            }
        }
    }

    /// A person stopped the task's agent while the run goes on: the task is `stopped`, and
    /// holds its workspace so that `crew agents resume` starts the agent again in it.
    async fn hold(
        &self,
        task_id: &TaskId,
        exit: ExitRecord,
        handle: &AgentHandle,
        prior: Option<Usage>,
    ) {
        self.record_exit(task_id, exit, handle, prior).await;
        let reason = format!(
            "{STOPPED_BY_REQUEST}; its workspace is kept while the run goes on (`crew agents resume {}:{task_id}` starts it again)",
            self.run_id
        );
        self.record_status(task_id, TaskStatus::Stopped, Some(reason))
            .await;
        self.tell_scheduler(task_id, Hold::Stopped);
    }

    /// The agent hit a usage limit and the task pauses on it (`on_limit = "pause"`): its
    /// workspace is kept, its slot freed, and the run waits for it.
    async fn pause(
        &self,
        task_id: &TaskId,
        exit: ExitRecord,
        limit: &UsageLimit,
        retry: Option<Timestamp>,
        handle: &AgentHandle,
        prior: Option<Usage>,
    ) {
        self.record_exit(task_id, exit, handle, prior).await;
        let resume = format!("crew agents resume {}:{task_id}", self.run_id);
        let reason = match retry {
            Some(at) => format!(
                "paused: it hit {limit}; crew tries again at {at}, or it goes on with `{resume}`"
            ),
            None => format!("paused: it hit {limit}; it goes on then, or with `{resume}`"),
        };
        self.record_paused(task_id, reason, retry).await;
        self.tell_scheduler(task_id, Hold::Paused);
    }

    /// Records the task `paused` for `reason`, and when crew tries it again by its backoff
    /// (`limit.retry_at`) where the limit said nothing of when it lifts.
    async fn record_paused(&self, task_id: &TaskId, reason: String, retry: Option<Timestamp>) {
        let (task, why) = (task_id.clone(), reason.clone());
        let record = self
            .save(&format!("task {task_id} paused"), move |manifest| {
                let record = manifest.set_task_status(&task, TaskStatus::Paused)?;
                record.reason = Some(why);
                if let Some(limit) = &mut record.limit {
                    limit.retry_at = retry;
                }
                Ok(record.clone())
            })
            .await;
        self.runner.announce(
            &self.run_id,
            task_id,
            TaskStatus::Paused,
            Some(reason),
            record,
        );
    }

    /// Tells the scheduler what became of the task's agent: stopped by a person, paused by a
    /// limit, or going again.
    fn tell_scheduler(&self, task_id: &TaskId, hold: Hold) {
        // Sending fails only once the scheduler has gone, when the run is over: nobody is
        // left to tell.
        let _ = self.holds.send((task_id.clone(), hold));
    }

    /// Records how the agent's process ended, with what its protocol reported.
    async fn record_exit(
        &self,
        task_id: &TaskId,
        exit: ExitRecord,
        handle: &AgentHandle,
        prior: Option<Usage>,
    ) {
        let task = task_id.clone();
        let report = AgentReport::of(handle, prior);
        let usage = report.usage;
        // Follow-ups it has not had yet (sent before a stop) outlive this host on the record.
        let follow_ups = handle.status().follow_up_queue;
        self.save(&format!("task {task_id}'s exit"), move |manifest| {
            let record = manifest.task_mut(&task)?;
            record.requests = crew_core::model::NetworkCounts::sum(
                record.requests.into_iter().chain(exit.network),
            );
            record.exit = Some(exit);
            record.pid = None;
            record.follow_ups = follow_ups;
            report.apply(record);
            Ok(())
        })
        .await;
        if let Some(usage) = usage {
            self.runner.record_event(
                &self.run_id,
                RunEvent::new(Some(task_id.clone()), EventKind::Usage { usage }),
            );
        }
    }

    async fn record_waiting(
        &self,
        task_id: &TaskId,
        question: &str,
        handle: &AgentHandle,
        prior: Option<Usage>,
    ) {
        let (task, asked) = (task_id.clone(), question.to_owned());
        let report = AgentReport::of(handle, prior);
        let record = self
            .save(&format!("task {task_id}'s question"), move |manifest| {
                let status = manifest.task(&task).map(|record| record.status);
                if status != Some(TaskStatus::Waiting) {
                    manifest.set_task_status(&task, TaskStatus::Waiting)?;
                }
                let record = manifest.task_mut(&task)?;
                record.question = Some(asked);
                report.apply(record);
                Ok(record.clone())
            })
            .await;
        self.runner.announce(
            &self.run_id,
            task_id,
            TaskStatus::Waiting,
            Some(question.to_owned()),
            record,
        );
    }

    /// Runs the task's check command in its workspace, confined like its agent (by the agent's
    /// supervisor, so that `crew agents stop` stops it), and records how it ended. A cancel of
    /// the run stops it as it would the agent. The task's status stays what its agent's exit
    /// made it.
    async fn check(&self, task: &TaskRecord, command: &str, handle: &AgentHandle) {
        self.progress_sink(&task.id).tell(Progress::Check {
            command: command.to_owned(),
        });
        let log = self.runner.store.check_log_path(&self.run_id, &task.id);
        let timeout = task.timeout.map_or(CHECK_TIMEOUT, |timeout| timeout.0);
        let mut cancel = self.cancel.subscribe();
        let check = handle.check(command, &log, timeout);
        tokio::pin!(check);
        let mut stop_requests = 0;
        let record = loop {
            let level = *cancel.borrow_and_update();
            stop_as_cancelled(handle, level, &mut stop_requests).await;
            tokio::select! {
                record = &mut check => break record,
                changed = cancel.changed() => {
                    if changed.is_err() {
                        break (&mut check).await;
                    }
                }
            }
        };
        let record = record.unwrap_or_else(|error| CheckRecord {
            passed: Some(false),
            error: Some(error.to_string()),
            ..CheckRecord::pending(command.to_owned())
        });
        let task_id = task.id.clone();
        self.save(&format!("task {task_id}'s check"), move |manifest| {
            manifest.task_mut(&task_id)?.check = Some(record);
            Ok(())
        })
        .await;
    }

    /// Tears the workspace down and records the report. A teardown error is recorded as a
    /// warning; it never replaces the task's outcome.
    async fn teardown(&self, task_id: &TaskId, workspace: &TaskWorkspace, keep: bool) {
        self.teardown_then(task_id, workspace, keep, None).await;
    }

    /// Tears the workspace down, then records the report and the task's final `status` (with
    /// its reason) in one write.
    async fn finish(
        &self,
        task_id: &TaskId,
        workspace: &TaskWorkspace,
        status: TaskStatus,
        reason: Option<String>,
    ) {
        self.teardown_then(task_id, workspace, false, Some((status, reason)))
            .await;
    }

    async fn teardown_then(
        &self,
        task_id: &TaskId,
        workspace: &TaskWorkspace,
        keep: bool,
        finish: Option<(TaskStatus, Option<String>)>,
    ) {
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
        let mut result = blocking(move || {
            provider
                .teardown(&allocated, &request)
                .map_err(|error| (error.message.clone(), error.partial))
        })
        .await;
        let landed = self
            .landed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(task_id);
        // A placed task's work started from the run's base, as a worktree task's does: its
        // record says so, so that its work can be diffed and landed like theirs.
        let placed_base = landed.as_ref().and(self.base.clone());
        if let (Ok(report), Some((branch, tip))) = (&mut result, landed) {
            // A placed task: its work is on its branch here, checked as it came back; what it
            // changes is counted here, as a worktree's teardown counts it.
            if let (Some(base), Some(repo_root)) =
                (placed_base.clone(), self.runner.workspace.repo_root())
            {
                let (provider, repo_root, counted) = (
                    self.runner.provider.clone(),
                    repo_root.to_owned(),
                    branch.clone(),
                );
                report.diffstat = blocking(move || {
                    Ok::<_, std::convert::Infallible>(
                        provider.branch_diffstat(&repo_root, &base, &counted),
                    )
                })
                .await
                .unwrap_or_else(|never| match never {});
            }
            report.merge_hint = Some(format!("git merge {branch}"));
            report.branch = Some(branch);
            report.tip = Some(tip);
        }
        let saved_at = match &result {
            Ok(report) => report
                .branch
                .clone()
                .or(report.preserved.as_ref().map(ToString::to_string)),
            Err((_, partial)) => Some(workspace.dir.to_string()).filter(|_| !partial.removed),
        };
        if let Some(saved_at) = saved_at.filter(|_| !keep) {
            self.saved
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(format!("{task_id} in {saved_at}"));
        }
        // Ended, it lets go of its ports; a task kept for a resume keeps them (its host's
        // lease files name a host that will be gone, and a resume takes them again).
        if finish.is_some() {
            self.release_lease(task_id);
        }
        let task = task_id.clone();
        let radar_turn = self.radar.lock().await;
        let finishing = finish.clone();
        let saved = self
            .save(&format!("task {task_id}'s teardown"), move |manifest| {
                let record = manifest.task_mut(&task)?;
                if let (Some(base), Some(workspace)) = (placed_base, record.workspace.as_mut()) {
                    workspace.base_commit.get_or_insert(base);
                }
                match result {
                    Ok(report) => {
                        record.warnings.extend(
                            report
                                .warnings
                                .iter()
                                .map(|warning| format!("teardown: {warning}")),
                        );
                        record.teardown = Some(report);
                    }
                    Err((message, partial)) => {
                        record.warnings.push(format!("teardown: {message}"));
                        record.teardown = Some(*partial);
                    }
                }
                // A refused status never costs the report its record.
                let finished = finishing.map(|(status, why)| {
                    manifest.set_task_status(&task, status).map(|record| {
                        if why.is_some() {
                            record.reason = why;
                        }
                        record.clone()
                    })
                });
                let branches = manifest
                    .task_branches()
                    .into_iter()
                    .filter(|(other, _)| !manifest.rivals(task.as_str(), other))
                    .collect::<Vec<_>>();
                Ok((branches, manifest.base_branch.clone(), finished))
            })
            .await;
        drop(radar_turn);
        if let Some((status, reason)) = finish {
            let record = match saved.as_ref().and_then(|(_, _, finished)| finished.clone()) {
                Some(Ok(record)) => Some(record),
                Some(Err(refused)) => {
                    self.runner.unrecorded(
                        &self.run_id,
                        &format!("task {task_id} {status}"),
                        &refused,
                    );
                    None
                }
                None => None,
            };
            self.runner
                .announce(&self.run_id, task_id, status, reason, record);
        }
        if let Some((branches, target, _)) = saved {
            self.radar(task_id, branches, target).await;
        }
    }

    /// The conflict radar, when a task's branch appears: which other task branches of the run,
    /// and the branch the run started from, its work would conflict with. Each overlap is
    /// recorded on both tasks and as an event of this one.
    async fn radar(
        &self,
        task_id: &TaskId,
        branches: Vec<(String, String)>,
        target: Option<String>,
    ) {
        let Some(repo_root) = self.runner.workspace.repo_root().map(ToOwned::to_owned) else {
            return;
        };
        let name = task_id.to_string();
        let Some(own) = branches
            .iter()
            .find(|(task, _)| *task == name)
            .map(|(_, branch)| branch.clone())
        else {
            return;
        };
        let others: Vec<(String, String)> = branches
            .into_iter()
            .filter(|(task, _)| *task != name)
            .collect();
        let provider = self.runner.provider.clone();
        let found = blocking(move || {
            Ok::<_, std::convert::Infallible>(provider.overlaps(
                &repo_root,
                &own,
                &others,
                target.as_deref(),
            ))
        })
        .await
        .unwrap_or_else(|never| match never {});
        if found.is_empty() {
            return;
        }
        let task = task_id.clone();
        let recorded = found.clone();
        self.save(&format!("task {task_id}'s overlaps"), move |manifest| {
            for overlap in recorded {
                let mine = TaskOverlap {
                    with: overlap.with.clone(),
                    files: overlap.files.clone(),
                };
                let record = manifest.task_mut(&task)?;
                if !record.overlaps.contains(&mine) {
                    record.overlaps.push(mine);
                }
                // The other side learns of it too, when it is a task of the run.
                if let Ok(other) = TaskId::parse(&overlap.with)
                    && let Ok(record) = manifest.task_mut(&other)
                {
                    let theirs = TaskOverlap {
                        with: task.to_string(),
                        files: overlap.files,
                    };
                    if !record.overlaps.contains(&theirs) {
                        record.overlaps.push(theirs);
                    }
                }
            }
            Ok(())
        })
        .await;
        for overlap in found {
            self.runner.record_event(
                &self.run_id,
                RunEvent::new(
                    Some(task_id.clone()),
                    EventKind::Overlap {
                        with: overlap.with,
                        files: overlap.files,
                    },
                ),
            );
        }
    }
}

/// What an agent's protocol reported, as its task records it.
struct AgentReport {
    session_id: Option<String>,
    /// The task's usage before this host's starts, plus theirs.
    usage: Option<Usage>,
    warning: Option<String>,
    limit: Option<UsageLimit>,
    refused_writes: Vec<String>,
    refused_hosts: Vec<String>,
}

impl AgentReport {
    fn of(handle: &AgentHandle, prior: Option<Usage>) -> Self {
        let status = handle.status();
        AgentReport {
            session_id: status.session_id,
            usage: Usage::sum(prior.into_iter().chain(status.usage)),
            warning: status.protocol_warning,
            limit: status.limit,
            refused_writes: status.refused_writes,
            refused_hosts: status.refused_hosts,
        }
    }

    fn apply(self, record: &mut TaskRecord) {
        if self.session_id.is_some() {
            record.session_id = self.session_id;
        }
        if self.usage.is_some() {
            record.usage = self.usage;
        }
        // The last start's: a limit that lifted and let a resume finish is no longer there.
        record.limit = self.limit;
        let refused = (!self.refused_writes.is_empty())
            .then(|| crate::refusals::note(&self.refused_writes, &record.agent));
        let refused_hosts = (!self.refused_hosts.is_empty()).then(|| {
            format!(
                "crew's proxy refused its agent's requests: {}",
                self.refused_hosts.join("; ")
            )
        });
        for warning in self.warning.into_iter().chain(refused).chain(refused_hosts) {
            if !record.warnings.contains(&warning) {
                record.warnings.push(warning);
            }
        }
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

/// Sends the agent (or its check) as many stops as the run's cancel `level` asks, beyond the
/// `sent` ones: Graceful one (TERM, grace, KILL), Kill a second at once. Each goes from a task
/// of its own, as a stop is answered only once the agent has ended.
async fn stop_as_cancelled(handle: &AgentHandle, level: CancelLevel, sent: &mut u32) {
    let wanted = match level {
        CancelLevel::None => 0,
        CancelLevel::Graceful => 1,
        CancelLevel::Kill => 2,
    };
    while *sent < wanted {
        *sent += 1;
        let handle = handle.clone();
        tokio::spawn(async move { handle.stop().await });
        // The second comes after the first, as a second stop.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How long a check command may run when its task has no timeout of its own: long enough for
/// a real test suite, short enough that a hung one does not hold the run for half an hour.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10 * 60);

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
    if exit.ended_after_session {
        return (TaskStatus::Succeeded, None);
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

/// A fail point for the tests of what a defect of crew's does to a run: in a debug build, the
/// task `CREW_TEST_PANIC_TASK` names panics once its agent has said something (so that it did
/// some work first). Release builds have none.
#[cfg(debug_assertions)]
async fn panic_point(task_id: &TaskId, handle: &crate::registry::AgentHandle) {
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
