//! The team runner: a run's task graph, executed with bounded parallelism, every step recorded
//! in the run's manifest.
//!
//! Per task: allocate its workspace through the `WorkspaceProvider`, start its agent, wait for
//! it (through questions, follow-ups and resumes), tear the workspace down in every outcome and
//! record the teardown report. A task whose upstream did not succeed is skipped with the reason;
//! with `fail_fast`, the first failure cancels the rest. Cancelling (the first Ctrl-C) stops
//! every agent gracefully and tears down preserving work; the second kills at once — the
//! teardown still saves the work.
//!
//! Where each part lives:
//! - `lifecycle`: a run on disk — created, resumed, taken over, cancelled, a task requeued;
//! - `schedule`: which task starts next and how the run ends (no I/O);
//! - `execute`: the loop that carries out the schedule and answers the control channel;
//! - `task`: one task's life, from its workspace to its teardown (where its status changes);
//! - `submit`: task plans an agent submits to its own run.
//!
//! A change that cannot be saved (the state directory turned read-only, a full disk) never
//! stops the agents: it is logged, the run goes on, and the run ends with
//! [`RunError::Unrecorded`], which names what was not recorded and where the work is.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

// What a host announces of each task change lives with the host's watch feed.
pub use crate::control::watch::TaskProgress;

use camino::Utf8PathBuf;

use crew_core::config::{OnLimit, ProjectConfig, WorkspaceMode};
use crew_core::host::{HostIdentity, HostIdentityError};
use crew_core::model::{EventKind, HostRecord, RunEvent, RunStatus, TaskRecord, TaskStatus};
use crew_core::provider::{AllocateWorkspaceError, Progress, WorkspaceProvider};
use crew_core::store::StateError;
use crew_core::{AgentDef, RunId, StateStore, TaskId, Team, Workspace};

use crate::control::agents::AgentHost;
use crate::control::{ErrorBody, ErrorCode};

mod execute;
mod lifecycle;
mod schedule;
mod spend;
mod submit;
mod succeeded;
mod task;

pub use succeeded::AlreadySucceeded;

/// How far a cancellation goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CancelLevel {
    /// No cancellation.
    None,
    /// Stop every agent gracefully (TERM, grace, KILL) and keep their work.
    Graceful,
    /// Kill every agent at once; the teardown still saves their work.
    Kill,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// The team to run.
    pub team: Team,
    /// `--workspace-mode`: overrides the team's mode and every task's own.
    pub mode: Option<WorkspaceMode>,
    /// `--max-parallel`: how many tasks run at once, over the team's setting.
    pub max_parallel: Option<usize>,
    /// `--base`: the commit or ref tasks start from; the leader's HEAD when absent.
    pub base: Option<String>,
    /// `--fail-fast` / `--keep-going`, over the team's setting.
    pub fail_fast: Option<bool>,
    /// `--name`: the run's id, chosen by a person, so that branches read `crew/<name>-<task>`.
    pub name: Option<RunId>,
    /// `--attempts`: run every task this many times (best of N), overriding the team's counts.
    pub attempts: Option<u32>,
    /// `--check`: the check command of every task, overriding the team's.
    pub check: Option<String>,
    /// `--on-limit`: what every task does when its agent hits a usage limit, overriding the
    /// team's.
    pub on_limit: Option<OnLimit>,
    /// `--placement`: where every task runs, overriding the team's and the tasks' own.
    pub placement: Option<String>,
    /// `--network`: the network of every task, as the user names it (the narrowest of this,
    /// the project's and each agent's definition's applies; a team and a task narrow it).
    pub network: Option<crew_core::config::NetworkMode>,
    /// `--allow-open-network`: where the kernel cannot give a task's agent the narrower network
    /// it asks for (no unprivileged user namespaces, or no Landlock), the agent runs with the
    /// network open, said on the task, instead of being refused.
    pub allow_open_network: bool,
    /// `--memory`, `--cpus`, `--processes`: every task's caps, at most (the narrowest of these,
    /// the project's, the team's and the task's own applies).
    pub resources: crew_core::config::Resources,
    /// `--allow-uncapped`: where no cgroup can be had, a task with caps runs without them, said
    /// on the task, instead of being refused.
    pub allow_uncapped: bool,
    /// `--max-cost-usd`: the most the run may spend, its tasks together (the narrowest of this,
    /// the team's and the project's applies).
    pub max_cost_usd: Option<crew_core::config::CostCap>,
    /// The run of the host a placement's run works for (`crew shim`): see
    /// [`crew_core::model::RunManifest::placed_for`].
    pub placed_for: Option<RunId>,
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
            attempts: None,
            check: None,
            on_limit: None,
            placement: None,
            network: None,
            allow_open_network: false,
            resources: crew_core::config::Resources::default(),
            allow_uncapped: false,
            max_cost_usd: None,
            placed_for: None,
        }
    }
}

/// Why the tasks asked for cannot be run as asked: each says which task and what to do.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// Attempts asked for as they cannot be (a count out of range, attempts of a task others
    /// depend on).
    #[error(transparent)]
    Attempts(#[from] crew_core::config::AttemptsError),
    /// Caps the run asked for that no task could run under (`crew run --processes 2`).
    #[error("the run's caps: {message}")]
    Caps {
        /// What is wrong, and what to give.
        message: String,
    },
    /// Attempts of a task in a mode without branches.
    #[error(
        "task `{task}` would run {of} attempts in {mode} mode: attempts need worktree mode, each in its own worktree and branch (`--workspace-mode worktree`)"
    )]
    AttemptsNeedWorktrees {
        /// The task.
        task: TaskId,
        /// How many attempts.
        of: u32,
        /// The mode it would run in.
        mode: WorkspaceMode,
    },
    /// A placement `.crew/config.toml` does not define.
    #[error(
        "task `{task}` names the placement `{placement}`, which .crew/config.toml does not define ({})",
        if known.is_empty() {
            "it defines none: add a [placements.<name>] section".to_owned()
        } else {
            format!("it defines: {}", known.join(", "))
        }
    )]
    UnknownPlacement {
        /// The task.
        task: TaskId,
        /// The placement it names.
        placement: String,
        /// The placements the project defines.
        known: Vec<String>,
    },
    /// A placed task that asks for a mode other than worktree.
    #[error(
        "task `{task}` runs on the placement `{placement}`, where tasks work in worktrees; it asks for {asked} mode"
    )]
    PlacedMode {
        /// The task.
        task: TaskId,
        /// Its placement.
        placement: String,
        /// The mode it asks for.
        asked: WorkspaceMode,
    },
    /// A placed task with attempts.
    #[error("task `{task}` runs on the placement `{placement}`, which does not run attempts yet")]
    PlacedAttempts {
        /// The task.
        task: TaskId,
        /// Its placement.
        placement: String,
    },
    /// A prompt longer than the kernel lets one program argument be, for an agent that takes
    /// it as one.
    #[error(
        "task `{task}`'s prompt is {length} bytes as its agent `{agent}` passes it (one program argument), and an argument can hold at most {max}: put the long part in a file and name the file in the prompt, or use an agent whose protocol reads the prompt from its input (claude-stream-json, acp)"
    )]
    PromptTooLong {
        /// The task.
        task: TaskId,
        /// Its agent.
        agent: String,
        /// The prompt's length as passed.
        length: usize,
        /// The most an argument holds.
        max: usize,
    },
    /// A checked-in settings file loosens the sandbox in a way the user has not allowed.
    #[error(transparent)]
    NotAllowed(#[from] crew_core::config::NotAllowed),
    /// The user's own settings (a day's spend cap) cannot be read.
    #[error("your crew settings: {0}")]
    UserConfig(#[source] Box<crew_core::config::LoadConfigError>),
}

/// A run that could not be created, resumed or finished.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The state could not be read or written.
    #[error(transparent)]
    State(#[from] StateError),
    /// The provider refused the run before any task started.
    #[error("the run cannot start")]
    Prepare(#[source] AllocateWorkspaceError),
    /// The tasks asked for cannot be run as asked; nothing was made.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// This process's identity could not be read.
    #[error("failed to record this process as the run's host")]
    Host(#[from] HostIdentityError),
    /// The run cannot be resumed in its status.
    #[error(
        "run {run_id} is {status}; only an interrupted, failed or cancelled run can be resumed"
    )]
    NotResumable {
        /// The run.
        run_id: RunId,
        /// Its status.
        status: RunStatus,
    },
    /// Another live process hosts the run.
    #[error("run {run_id} is still hosted by process {pid}")]
    AlreadyHosted {
        /// The run.
        run_id: RunId,
        /// The host's pid.
        pid: u32,
    },
    /// Changes to the run's record could not be saved while it went on: its manifest and
    /// events may be behind. The agents' work was saved all the same, as `saved` says.
    #[error(
        "run {run_id} ended, but {} of its changes could not be recorded in .crew/state (first: {})",
        .problems.len(),
        .problems.first().map_or("", String::as_str)
    )]
    Unrecorded {
        /// The run.
        run_id: RunId,
        /// What could not be recorded.
        problems: Vec<String>,
        /// Where the work of each task went (its branch, or the preserved directory).
        saved: Vec<String>,
    },
}

impl RunError {
    /// What the user can do about it.
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
            RunError::Unrecorded {
                run_id,
                saved,
                problems,
            } => {
                let work = if saved.is_empty() {
                    "no task left work to save".to_owned()
                } else {
                    format!("the agents' work is saved: {}", saved.join(", "))
                };
                // Out of descriptors (EMFILE), the directory was writable all along.
                let cause = if problems
                    .iter()
                    .any(|problem| problem.contains("(os error 24)"))
                {
                    "crew ran out of open files: raise the hard limit (`ulimit -Hn`) or start fewer agents at once (`--max-parallel`)"
                } else {
                    "make .crew/state writable again"
                };
                Some(format!(
                    "{work}; {cause}, and `crew runs show {run_id}` may still show an older state of the run"
                ))
            }
            _ => None,
        }
    }
}

/// A long step of preparing a task's workspace moved on: what a host shows while it waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskActivity {
    /// The run.
    pub run_id: RunId,
    /// The task.
    pub task_id: TaskId,
    /// How far the step has come.
    pub progress: Progress,
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
    activity: tokio::sync::broadcast::Sender<TaskActivity>,
    /// Per run, the changes that could not be saved (see [`RunError::Unrecorded`]).
    unrecorded: Arc<Mutex<HashMap<RunId, Vec<String>>>>,
    /// Per run, agent definitions given with it (see [`Runner::give_agents`]).
    given_agents: Arc<Mutex<HashMap<RunId, HashMap<String, AgentDef>>>>,
    /// The lock files its agents' sandboxes cover (see [`Runner::agent_locks`]).
    agent_locks: Arc<std::sync::OnceLock<Vec<camino::Utf8PathBuf>>>,
}

impl Runner {
    /// A runner that starts agents in `host` and places tasks with `provider`.
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
            activity: tokio::sync::broadcast::channel(256).0,
            given_agents: Arc::default(),
            unrecorded: Arc::default(),
            agent_locks: Arc::default(),
        }
    }

    /// The lock files its agents must not hold: its state's, and its provider's for the
    /// project's repository. Asked once.
    pub(crate) fn agent_locks(&self) -> Vec<camino::Utf8PathBuf> {
        self.agent_locks
            .get_or_init(|| {
                let mut locks = vec![self.store.lock_path()];
                if let Some(repo_root) = self.workspace.repo_root() {
                    locks.extend(self.provider.lock_files(repo_root));
                }
                locks
            })
            .clone()
    }

    /// Every task status change of the runs this runner executes.
    pub fn progress(&self) -> tokio::sync::broadcast::Receiver<TaskProgress> {
        self.progress.subscribe()
    }

    /// Where [`Runner::progress`] comes from, for whoever subscribes later.
    pub(crate) fn progress_sender(&self) -> tokio::sync::broadcast::Sender<TaskProgress> {
        self.progress.clone()
    }

    /// How the long steps of preparing workspaces move on (checkouts).
    pub fn activity(&self) -> tokio::sync::broadcast::Receiver<TaskActivity> {
        self.activity.subscribe()
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
        self.record_event(
            run_id,
            RunEvent::new(
                Some(task_id.clone()),
                EventKind::TaskStatus {
                    status,
                    reason: reason.clone(),
                },
            ),
        );
        // Nobody listening is not an error: the change is recorded in the run's state.
        let _ = self.progress.send(TaskProgress {
            run_id: run_id.clone(),
            task_id: task_id.clone(),
            status,
            reason,
            task,
        });
    }

    /// Appends `event` to the run's events; a failure is noted as unrecorded.
    pub(super) fn record_event(&self, run_id: &RunId, event: RunEvent) {
        if let Err(error) = self.store.append_event(run_id, &event) {
            self.unrecorded(run_id, "an event", &error);
        }
    }

    /// Notes a change to `run_id`'s record that could not be saved: the run goes on, and ends
    /// with [`RunError::Unrecorded`], saying why with each cause (the system's error last: a
    /// full disk, a refused write, no descriptor left).
    fn unrecorded(&self, run_id: &RunId, what: &str, error: &dyn std::error::Error) {
        let mut error_text = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            // A wrapper that says what its cause says adds nothing.
            let cause_text = cause.to_string();
            if !error_text.ends_with(&cause_text) {
                error_text.push_str(&format!(": {cause_text}"));
            }
            source = cause.source();
        }
        let error = error_text;
        tracing::warn!(run = %run_id, "could not record {what}: {error}");
        self.unrecorded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(run_id.clone())
            .or_default()
            .push(format!("{what}: {error}"));
    }

    /// The changes to `run_id`'s record that could not be saved, forgotten here.
    fn take_unrecorded(&self, run_id: &RunId) -> Vec<String> {
        self.unrecorded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(run_id)
            .unwrap_or_default()
    }

    /// Names the host in listings (`crew run`, an editor).
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// The next execution of `run_id` runs its tasks' agents by these definitions, before any
    /// file of the project: a host that got them from elsewhere (`crew shim`, from the crew
    /// host whose task it runs) needs no agent file.
    pub fn give_agents(&self, run_id: &RunId, agents: HashMap<String, AgentDef>) {
        self.given_agents
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(run_id.clone(), agents);
    }

    /// The definitions given with `run_id`, taken.
    pub(crate) fn take_given_agents(&self, run_id: &RunId) -> HashMap<String, AgentDef> {
        self.given_agents
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(run_id)
            .unwrap_or_default()
    }

    /// The state store of the runner's project.
    pub fn store(&self) -> &Arc<StateStore> {
        &self.store
    }

    /// The project folder its runs belong to.
    pub fn workspace(&self) -> &Workspace {
        &self.workspace
    }

    /// The agent host the runner starts agents in.
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
}

fn foreign_run(run_id: &RunId, workspace: &crew_core::WorkspaceId) -> ErrorBody {
    ErrorBody {
        code: ErrorCode::ForeignWorkspace,
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
