//! One supervisor per agent: a tokio task that owns the agent's process and `select!`s over its
//! exit, control messages, the stop ladder and the timeout.
//!
//! Lifecycle of a supervisor:
//!
//! ```text
//! launch ─► running ──exit──► exited ──resume / follow-up──► running …
//!              │  ▲                │
//!              │  └─ steer (stdin) └─ close (the runner tore the workspace down)
//!              └─ stop: TERM to the group ─ grace ─► KILL to the group
//! ```
//!
//! The signal ladder: a stop sends TERM to the agent's process group and arms a KILL after the
//! grace period (10 s by default); a second stop, or the end of the grace, sends KILL at once.
//! A timeout is a stop the supervisor starts itself. After the agent exits, anything still in
//! its group, or still holding its output pipes, is killed with the group and reported as
//! leaked; after a stop, processes that left the group but still carry the agent's marker
//! (`CREW_AGENT_ID`) are found in `/proc` and killed too.

use std::collections::VecDeque;
use std::os::unix::fs::DirBuilderExt as _;
use std::os::unix::process::ExitStatusExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use camino::{Utf8Path, Utf8PathBuf};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crew_core::config::{AgentDef, Protocol, SteerMode, fill_template};
use crew_core::env_vars;
use crew_core::model::{
    CheckRecord, ExitRecord, SandboxRecord, SandboxState, StopSignal, Timestamp, Usage, UsageLimit,
};
use crew_core::{AgentId, TaskId, WorkspaceId};

use crate::acp::{AcpInput, AcpLink, AcpStart};
use crate::env::{BaseEnv, agent_env};
use crate::error::{AgentOpError, SpawnAgentError};
use crate::events::{AgentEvent, OutputStream, answer, emit};
use crate::output::{LogWriter, OutputSink, OutputTail, drain};
use crate::placed::PlacedInput;
use crate::procscan;
use crate::protocol::ProtocolEvent;
use crate::refusals::Refusals;
use crate::sandbox::{self, SandboxPlan};
use crate::spawn::{LeftoverCount, Spawner, WardedCommand};
use crate::toolchains::{self, ToolchainCaches};

/// The message a resume without one sends to agents whose `resume` template wants one.
pub const DEFAULT_RESUME_MESSAGE: &str = "Continue where you left off.";
/// How long a steering message may wait for the agent to read its stdin.
const STEER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the output pipes may stay open after the agent exited before crew counts the
/// holders as leaked processes.
const PIPE_GRACE: Duration = Duration::from_millis(300);
/// How long an `acp` agent whose session is over may take to exit before crew ends it (TERM,
/// then KILL as late again).
const SESSION_OVER_GRACE: Duration = Duration::from_secs(5);

/// Everything needed to run one agent.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    /// The agent's id: its run and task.
    pub agent_id: AgentId,
    /// The workspace (project root) the agent belongs to.
    pub workspace: WorkspaceId,
    /// Where it works.
    pub dir: Utf8PathBuf,
    /// The agent definition it runs.
    pub definition: AgentDef,
    /// What it is asked to do.
    pub prompt: String,
    /// Stop the agent when one of its processes runs longer than this.
    pub timeout: Option<Duration>,
    /// Time between TERM and KILL.
    pub stop_grace: Duration,
    /// `output.log`; its directory is created when missing.
    pub output_log: Utf8PathBuf,
    /// How large `output.log` may grow before it starts over (the part before is kept as
    /// `output.log.1`).
    pub output_log_limit: u64,
    /// The control socket agents reach their host on (`crew ask`), passed as `CREW_SOCKET`.
    pub socket: Option<Utf8PathBuf>,
    /// What the kernel lets the agent write.
    pub sandbox: SandboxPlan,
    /// Variables crew sets for this kind of workspace (such as `GIT_CEILING_DIRECTORIES`, so
    /// that git in a workspace inside the project never finds the project's repository).
    pub workspace_env: Vec<(String, String)>,
    /// git settings of the project the agent's git runs with whatever its home (its identity,
    /// `user.name` and `user.email`, as the repository resolves them), through git's
    /// `GIT_CONFIG_COUNT` variables.
    pub git_config: Vec<(String, String)>,
    /// The task whose agent submitted this one (a lead agent's sub-task), if any.
    pub parent: Option<TaskId>,
    /// The session an earlier start reported (see `Protocol`): what `{session_id}` in the
    /// resume template takes up, until the agent reports one itself.
    pub session_id: Option<String>,
    /// What that session has cost so far in US dollars, as recorded on the task (starts of
    /// other hosts): an `acp` agent reports its session's cost as a running total, and a
    /// resumed task's share is what comes on top.
    pub session_cost: Option<f64>,
    /// The task runs on a placement: `definition` is its transport, and this what runs there.
    pub placed: Option<crate::placed::Placed>,
    /// Follow-ups sent to it that an earlier host had not delivered yet (recorded on its task
    /// when it was stopped): they wait for it as ones queued here do.
    pub follow_ups: Vec<String>,
    /// Where its proxy reports each request (`network = "proxy"`): the run's events.
    pub network_log: Option<crate::proxy::NetworkLog>,
}

/// Whether the agent's process is alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentState {
    /// Its process is alive and no stop is under way.
    Running,
    /// A stop is under way: TERM was sent, KILL may follow.
    Stopping,
    /// Its process ended.
    Exited,
}

/// The live status of an agent, published on its watch channel.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentStatus {
    /// Whether its process is alive.
    pub state: AgentState,
    /// The pid of the process group (its warden) of the agent's latest process, kept after it
    /// exits so that whoever looks late still learns which process ran; `state` says whether
    /// it is alive, [`AgentStatus::live_pid`] gives it only while it is.
    pub pid: Option<u32>,
    /// How many times a process of the agent was started.
    pub attempt: u32,
    /// When its latest process started.
    pub started_at: Timestamp,
    /// How the last process ended.
    pub exit: Option<ExitRecord>,
    /// The question the agent asked and waits on.
    pub question: Option<String>,
    /// Follow-ups waiting for the end of the turn.
    pub queued_follow_ups: usize,
    /// Those follow-ups, oldest first: what is recorded on the task when it is stopped, so
    /// that a later host delivers them.
    pub follow_up_queue: Vec<String>,
    /// The runner tore the workspace down: the agent cannot be resumed here any more.
    pub closed: bool,
    /// How the kernel confined its latest process.
    pub sandbox: Option<SandboxRecord>,
    /// The session the agent's protocol reported.
    pub session_id: Option<String>,
    /// Tokens and cost of its turns so far (this host's starts), when its protocol reports
    /// them.
    pub usage: Option<Usage>,
    /// Why its last turn failed, when its protocol said.
    pub turn_error: Option<String>,
    /// The usage or rate limit its last turn hit, when that is why it failed.
    pub limit: Option<UsageLimit>,
    /// The paths its last process said the sandbox refused it (see `refusals`).
    pub refused_writes: Vec<String>,
    /// Why its last process's proxy refused hosts (`network = "proxy"`), the first few.
    pub refused_hosts: Vec<String>,
    /// Output that did not follow the agent's protocol (shown as plain lines).
    pub protocol_warning: Option<String>,
    /// Its turn is over and it waits, alive, for a message (an agent that reads its input
    /// between turns).
    pub idle: bool,
    /// Its question waits on the live agent (an `acp` permission request): the answer goes to
    /// it as it runs, with no restart.
    pub asks_alive: bool,
    /// Its task's check command runs (the agent's process has exited): a stop stops the
    /// check.
    pub checking: bool,
    /// A placed task's work came back, was checked, and this branch holds it (its name and
    /// tip).
    pub landed: Option<(String, String)>,
    /// A placed task's connection was lost before its work came back: where the work is.
    pub lost: Option<String>,
}

/// What a live agent is doing, as far as crew can tell: what listings show to say who needs
/// the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activity {
    /// At work on its turn.
    Working,
    /// It asked a question and waits for the answer.
    WaitingForInput,
    /// Between turns: alive, waiting for a message.
    Idle,
    /// Its process has exited and its task's check command runs.
    Checking,
}

impl AgentStatus {
    /// What it is doing now; `None` once its process has exited without a question.
    pub fn activity(&self) -> Option<Activity> {
        if self.question.is_some() {
            return Some(Activity::WaitingForInput);
        }
        if self.checking {
            return Some(Activity::Checking);
        }
        match self.state {
            AgentState::Exited => None,
            AgentState::Running if self.idle => Some(Activity::Idle),
            AgentState::Running | AgentState::Stopping => Some(Activity::Working),
        }
    }

    /// Records the follow-ups waiting for it, oldest first.
    pub(crate) fn set_follow_ups(&mut self, queue: &VecDeque<String>) {
        self.queued_follow_ups = queue.len();
        self.follow_up_queue = queue.iter().cloned().collect();
    }

    /// Whether its latest process ended.
    pub fn is_exited(&self) -> bool {
        self.state == AgentState::Exited
    }

    /// The pid of the agent's process group while it is alive.
    pub fn live_pid(&self) -> Option<u32> {
        self.pid.filter(|_| !self.is_exited())
    }
}

/// How a stop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopOutcome {
    /// The agent exited after TERM, within the grace period.
    Terminated,
    /// The agent needed KILL.
    Killed,
    /// The agent had already exited.
    AlreadyExited,
}

impl StopOutcome {
    /// Its name, as the host writes it (`terminated`, `killed`, `already_exited`).
    pub fn as_str(self) -> &'static str {
        match self {
            StopOutcome::Terminated => "terminated",
            StopOutcome::Killed => "killed",
            StopOutcome::AlreadyExited => "already_exited",
        }
    }
}

/// What became of a follow-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum FollowUpOutcome {
    /// Queued: delivered when the current turn (or process) ends.
    Queued {
        /// Its place in the queue, from 1.
        position: usize,
    },
    /// The agent had exited and was resumed with the message.
    Resumed {
        /// The new process's id.
        pid: u32,
    },
    /// It answered the question the running agent waits on.
    Answered,
    /// The agent's task had finished in a run that goes on: it starts again, with the
    /// message, in a new workspace on its branch (said by its host, never by the agent).
    Requeued,
}

impl FollowUpOutcome {
    /// Its name, as the host writes it (`queued`, `resumed`, `answered`, `requeued`).
    pub fn as_str(self) -> &'static str {
        match self {
            FollowUpOutcome::Queued { .. } => "queued",
            FollowUpOutcome::Resumed { .. } => "resumed",
            FollowUpOutcome::Answered => "answered",
            FollowUpOutcome::Requeued => "requeued",
        }
    }
}

pub(crate) enum Control {
    Steer {
        message: String,
        reply: oneshot::Sender<Result<(), AgentOpError>>,
    },
    FollowUp {
        message: String,
        reply: oneshot::Sender<Result<FollowUpOutcome, AgentOpError>>,
    },
    Stop {
        reply: oneshot::Sender<StopOutcome>,
    },
    Resume {
        message: Option<String>,
        reply: oneshot::Sender<Result<u32, AgentOpError>>,
    },
    Ask {
        question: String,
        reply: oneshot::Sender<Result<(), AgentOpError>>,
    },
    Close {
        reply: oneshot::Sender<bool>,
    },
    /// Runs the task's check in the exited agent's workspace, confined like the agent.
    Check {
        command: String,
        log: Utf8PathBuf,
        timeout: Duration,
        reply: oneshot::Sender<CheckRecord>,
    },
}

/// The shared parts of a host that every supervisor uses.
#[derive(Debug, Clone)]
pub(crate) struct Launcher {
    pub spawner: Spawner,
    pub env: Arc<BaseEnv>,
    pub events: broadcast::Sender<AgentEvent>,
    /// Where agents' own connections are served, once the host serves a control socket.
    pub own_connections: Arc<std::sync::OnceLock<Arc<dyn OwnConnections>>>,
}

/// Serves an agent's own connection to its host (see [`crate::sandbox::Namespace::control`]):
/// what the host's control server does, for the agents it starts.
pub(crate) trait OwnConnections: std::fmt::Debug + Send + Sync {
    /// Serves every connection on `listener` as the agent whose warden is `warden`, until the
    /// returned guard is dropped.
    fn serve(
        &self,
        listener: std::os::unix::net::UnixListener,
        warden: u32,
    ) -> Box<dyn std::any::Any + Send>;
}

/// A process of the agent, running.
struct Running {
    child: Child,
    pid: u32,
    stdin: Option<ChildStdin>,
    readers: Vec<JoinHandle<()>>,
    /// What the agent's protocol says: sessions, ends of turns (see `OutputSink::supervisor`).
    protocol: mpsc::UnboundedReceiver<ProtocolEvent>,
    /// The client connection of an `acp` agent, which holds its stdin.
    acp: Option<AcpLink>,
    placed: Option<crate::placed::PlacedLink>,
    sandbox: SandboxRecord,
    /// The writes the sandbox refused, as the agent said them (a confined agent's).
    refusals: Option<Arc<Mutex<Refusals>>>,
    /// How many processes the warden killed after the agent exited.
    leftovers: LeftoverCount,
    /// Its proxy (`network = "proxy"`), serving as long as this process lives.
    proxy: Option<crate::proxy::Proxy>,
    /// Its own connection to its host, served as long as this process lives.
    _own_connection: Option<Box<dyn std::any::Any + Send>>,
    /// The agent's private temp dir (its `TMPDIR`), removed when this process is done.
    _temp_dir: tempfile::TempDir,
    /// A placed task's transport ended before the task started there: once its output is
    /// read to the end, what it said last goes into the reason.
    lost_before_start: bool,
    /// An `acp` agent's session is over (its last turn ended, nothing more to say): the
    /// connection is ended, and the agent should exit.
    session_over: bool,
}

/// The handle parts a new supervisor hands to the registry.
pub(crate) struct Started {
    pub control: mpsc::Sender<Control>,
    pub status: watch::Receiver<AgentStatus>,
    pub tail: Arc<Mutex<OutputTail>>,
}

/// Launches the agent's first process and starts its supervisor. A program that cannot be
/// started is an error for this agent only.
pub(crate) async fn start(spec: AgentSpec, launcher: Launcher) -> Result<Started, SpawnAgentError> {
    let tail = Arc::new(Mutex::new(OutputTail::default()));
    let running = launch(
        &spec,
        &launcher,
        &tail,
        None,
        spec.session_id.as_deref(),
        None,
    )
    .await?;
    // The first `Started` event is sent by the host once the agent is registered, so that a
    // subscriber reacting to it finds the agent.
    let status = AgentStatus {
        state: AgentState::Running,
        pid: Some(running.pid),
        attempt: 1,
        started_at: Timestamp::now(),
        exit: None,
        question: None,
        queued_follow_ups: 0,
        follow_up_queue: Vec::new(),
        closed: false,
        sandbox: Some(running.sandbox.clone()),
        session_id: None,
        usage: None,
        turn_error: None,
        limit: None,
        refused_writes: Vec::new(),
        refused_hosts: Vec::new(),
        protocol_warning: None,
        idle: false,
        asks_alive: false,
        checking: false,
        landed: None,
        lost: None,
    };
    Ok(supervise_from(spec, launcher, tail, status, Some(running)))
}

/// Starts a supervisor for an agent whose process is not running, such as one that asked a
/// question before its host went away: it waits, exited, until a follow-up or a resume starts
/// it again in its workspace.
pub(crate) fn start_idle(
    spec: AgentSpec,
    launcher: Launcher,
    question: Option<String>,
    attempt: u32,
) -> Started {
    let status = AgentStatus {
        state: AgentState::Exited,
        pid: None,
        attempt,
        started_at: Timestamp::now(),
        exit: None,
        question,
        queued_follow_ups: 0,
        follow_up_queue: Vec::new(),
        closed: false,
        sandbox: None,
        session_id: None,
        usage: None,
        turn_error: None,
        limit: None,
        refused_writes: Vec::new(),
        refused_hosts: Vec::new(),
        protocol_warning: None,
        idle: false,
        asks_alive: false,
        checking: false,
        landed: None,
        lost: None,
    };
    supervise_from(
        spec,
        launcher,
        Arc::new(Mutex::new(OutputTail::default())),
        status,
        None,
    )
}

/// Spawns the supervisor task, from a running process or from the exited phase.
fn supervise_from(
    spec: AgentSpec,
    launcher: Launcher,
    tail: Arc<Mutex<OutputTail>>,
    mut status: AgentStatus,
    running: Option<Running>,
) -> Started {
    let follow_ups = VecDeque::from(spec.follow_ups.clone());
    status.set_follow_ups(&follow_ups);
    let (control_tx, control_rx) = mpsc::channel(64);
    let (status_tx, status_rx) = watch::channel(status);
    let supervisor = Supervisor {
        spec,
        launcher,
        control: control_rx,
        status: status_tx,
        tail: tail.clone(),
        follow_ups,
        turn_tools: TurnTools::default(),
        limit_wait: None,
    };
    match running {
        Some(running) => tokio::spawn(supervisor.run(running)),
        None => tokio::spawn(supervisor.run_from_idle()),
    };
    Started {
        control: control_tx,
        status: status_rx,
        tail,
    }
}

/// Builds and spawns one process of the agent: the `command` template, or the `resume`
/// template when resuming; never through a shell.
async fn launch(
    spec: &AgentSpec,
    launcher: &Launcher,
    tail: &Arc<Mutex<OutputTail>>,
    resume_message: Option<&str>,
    session_id: Option<&str>,
    session_cost: Option<f64>,
) -> Result<Running, SpawnAgentError> {
    let definition = &spec.definition;
    let template = match (resume_message, &definition.resume) {
        (Some(_), Some(resume)) => resume,
        _ => &definition.command,
    };
    let uses = |placeholder: &str| {
        template
            .iter()
            .any(|arg| crew_core::config::placeholders(arg).any(|name| name == placeholder))
    };
    if uses("session_id") && session_id.is_none() {
        return Err(SpawnAgentError::NoSession {
            agent_id: spec.agent_id.clone(),
        });
    }
    let acp = definition.protocol == Protocol::Acp;
    let shim = definition.protocol == Protocol::Shim;
    // A stream-json agent takes what it is asked as its first input message, unless its
    // template passes it as an argument.
    let first_message = match resume_message {
        _ if definition.protocol != Protocol::ClaudeStreamJson => None,
        None => (!uses("prompt")).then_some(spec.prompt.as_str()),
        Some(message) => (!uses("message") && !message.is_empty()).then_some(message),
    };
    let dir = spec.dir.as_str();
    let run_id = spec.agent_id.run_id().as_str();
    let task_id = spec.agent_id.task_id().as_str();
    let message = resume_message.unwrap_or("");
    let values = [
        ("prompt", spec.prompt.as_str()),
        ("workspace", dir),
        ("run_id", run_id),
        ("task_id", task_id),
        ("message", message),
        ("session_id", session_id.unwrap_or("")),
    ];
    let mut argv: Vec<String> = template
        .iter()
        .map(|arg| fill_template(arg, &values))
        .collect();
    if argv.is_empty() {
        return Err(SpawnAgentError::EmptyCommand {
            agent_id: spec.agent_id.clone(),
        });
    }
    if !spec.dir.is_dir() {
        return Err(SpawnAgentError::MissingDir {
            agent_id: spec.agent_id.clone(),
            dir: spec.dir.clone(),
        });
    }
    let mut crew_vars = vec![
        (env_vars::CREW_RUN_ID, run_id.to_owned()),
        (env_vars::CREW_TASK_ID, task_id.to_owned()),
        (env_vars::CREW_AGENT_ID, spec.agent_id.to_string()),
        (env_vars::CREW_WORKSPACE, dir.to_owned()),
        (env_vars::CREW_PROJECT_ROOT, spec.workspace.to_string()),
    ];
    if let Some(socket) = &spec.socket {
        crew_vars.push((env_vars::CREW_SOCKET, socket.to_string()));
    }
    if let Some(message) = resume_message {
        crew_vars.push((env_vars::CREW_MESSAGE, message.to_owned()));
    }
    let temp_dir = private_temp_dir(spec)?;
    let temp_path = Utf8PathBuf::from_path_buf(temp_dir.path().to_owned()).map_err(|path| {
        SpawnAgentError::TempDir {
            agent_id: spec.agent_id.clone(),
            source: std::io::Error::other(format!("{} is not UTF-8", path.display())),
        }
    })?;
    crew_vars.push((env_vars::TMPDIR, temp_path.to_string()));
    crew_vars.push((env_vars::XDG_RUNTIME_DIR, temp_path.to_string()));
    for (name, value) in &spec.workspace_env {
        crew_vars.push((name.as_str(), value.clone()));
    }
    let own_connection = launcher.own_connections.get().is_some();
    let (mut sandbox, caches) =
        confinement(spec, launcher, temp_path, own_connection).map_err(|source| {
            SpawnAgentError::Sandbox {
                agent_id: spec.agent_id.clone(),
                source,
            }
        })?;
    // With a connection of its own, that is the socket it knows.
    if let Some(name) = sandbox
        .namespace
        .as_ref()
        .and_then(|namespace| namespace.control.as_ref())
    {
        crew_vars.retain(|(variable, _)| *variable != env_vars::CREW_SOCKET);
        crew_vars.push((env_vars::CREW_SOCKET, format!("@{name}")));
    }
    // Confined by crew, the program's own sandbox stands down as its definition says, and
    // what it starts knows it is confined already.
    let confined = sandbox.record.state == SandboxState::Enforced;
    if confined {
        argv.extend(definition.sandbox.confined.args.iter().cloned());
        sandbox.record.stood_down = definition.sandbox.confined.given();
        crew_vars.push((
            env_vars::CREW_SANDBOX,
            SandboxState::Enforced.as_str().to_owned(),
        ));
    }
    if sandbox.proxy.is_some() {
        crew_vars.extend(
            crate::proxy::PROXY_VARS
                .iter()
                .map(|(name, value)| (*name, (*value).to_owned())),
        );
    }
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| SpawnAgentError::EmptyCommand {
            agent_id: spec.agent_id.clone(),
        })?;
    let steerable = definition.steer != SteerMode::None || acp;
    let mut warded = WardedCommand::new(
        program,
        args,
        agent_env(
            &launcher.env,
            definition,
            confined.then(|| caches.as_ref().map_or(&[][..], |caches| &caches.env[..])),
            &crew_vars,
            &spec.git_config,
        ),
        &procscan::agent_marker(&spec.agent_id),
        sandbox.ruleset,
        sandbox.namespace.as_ref(),
        sandbox.proxy.map(|lists| crate::proxy::Rules {
            lists,
            log: spec.network_log.clone(),
        }),
    )
    .map_err(|source| SpawnAgentError::Spawn {
        agent_id: spec.agent_id.clone(),
        program: program.clone(),
        source,
    })?;
    warded.current_dir(&spec.dir).stdio(
        if steerable {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        },
        std::process::Stdio::piped(),
        std::process::Stdio::piped(),
    );

    let mut log = open_log(spec)?;
    if log.written() > 0 {
        // A resume or a follow-up appends to the same log: say where the new start begins. A
        // log that cannot be written to fails the agent's own output first, with its error.
        let _ = log.write(
            format!(
                "\n[crew: the agent started again at {}]\n",
                Timestamp::now()
            )
            .as_bytes(),
        );
    }
    let crate::spawn::Spawned {
        mut child,
        leftovers,
        proxy,
        own_connection,
    } = launcher
        .spawner
        .spawn(warded)
        .await
        .map_err(|source| SpawnAgentError::Spawn {
            agent_id: spec.agent_id.clone(),
            program: program.clone(),
            source,
        })?;
    let pid = child.id().ok_or_else(|| SpawnAgentError::Spawn {
        agent_id: spec.agent_id.clone(),
        program: program.clone(),
        source: std::io::Error::other("the process exited before its pid was known"),
    })?;
    // Served as this agent (its warden's pid) for as long as this process lives.
    let own_connection = own_connection.and_then(|listener| {
        launcher
            .own_connections
            .get()
            .map(|connections| connections.serve(listener, pid))
    });
    let (protocol_tx, protocol_rx) = mpsc::unbounded_channel();
    let (acp_lines, acp_incoming) = mpsc::unbounded_channel();
    let sink = OutputSink {
        agent_id: spec.agent_id.clone(),
        log: Arc::new(Mutex::new(Some(log))),
        tail: tail.clone(),
        events: launcher.events.clone(),
        protocol: definition.protocol,
        supervisor: (definition.steer == SteerMode::StdinJson
            || definition.protocol != Protocol::Lines)
            .then_some(protocol_tx),
        acp: (acp || shim).then_some(acp_lines),
        refusals: confined
            .then(|| Arc::new(Mutex::new(Refusals::new(sandbox.record.write.clone())))),
    };
    let refusals = sink.refusals.clone();
    let mut stdin = child.stdin.take();
    let mut driver_lines = Some(acp_incoming);
    // An ACP agent's input belongs to its client connection, which sends the first prompt:
    // the task's, or the message it is resumed with, in the session it had.
    let acp = match stdin.take() {
        Some(input) if acp => Some(crate::acp::start(
            AcpStart {
                workspace: spec.dir.clone(),
                first: resume_message
                    .filter(|message| !message.is_empty())
                    .unwrap_or(&spec.prompt)
                    .to_owned(),
                resume: resume_message.and(session_id).map(str::to_owned),
                prompt: spec.prompt.clone(),
                resume_cost: session_cost,
                terminals: crate::acp::Terminals::new(launcher.clone(), spec.clone()),
            },
            input,
            driver_lines.take().expect("one driver reads the lines"),
            // Without the line sender: the connection ends when the agent's stdout does.
            OutputSink {
                acp: None,
                ..sink.clone()
            },
        )),
        input => {
            stdin = input;
            None
        }
    };
    // A placed task's transport speaks the shim protocol with its driver, which sends the
    // task's prompt (or, started again, the message) to the placement.
    let placed = match (stdin.take(), spec.placed.clone(), driver_lines.take()) {
        (Some(input), Some(placed), Some(lines)) if shim => Some(crate::placed::start(
            placed,
            spec.agent_id.clone(),
            resume_message
                .filter(|message| !message.is_empty())
                .unwrap_or(&spec.prompt)
                .to_owned(),
            spec.dir.clone(),
            input,
            lines,
            OutputSink {
                acp: None,
                ..sink.clone()
            },
        )),
        (input, _, _) => {
            stdin = input;
            None
        }
    };
    if let (Some(message), Some(input)) = (first_message, stdin.as_mut()) {
        let line = format!("{}\n", user_message_line(message));
        let written = async {
            input.write_all(line.as_bytes()).await?;
            input.flush().await
        };
        if let Err(source) = tokio::time::timeout(STEER_TIMEOUT, written)
            .await
            .unwrap_or_else(|_| Err(std::io::Error::other("the agent did not read its input")))
        {
            // The agent exits without its prompt; its exit says the rest.
            tracing::warn!(agent = %spec.agent_id, "could not give the agent its first message: {source}");
        }
    }
    let mut readers = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        readers.push(tokio::spawn(drain(
            stdout,
            OutputStream::Stdout,
            sink.clone(),
        )));
    }
    if let Some(stderr) = child.stderr.take() {
        readers.push(tokio::spawn(drain(stderr, OutputStream::Stderr, sink)));
    }
    Ok(Running {
        stdin,
        child,
        pid,
        readers,
        protocol: protocol_rx,
        acp,
        placed,
        sandbox: sandbox.record,
        refusals,
        leftovers,
        proxy,
        _own_connection: own_connection,
        _temp_dir: temp_dir,
        lost_before_start: false,
        session_over: false,
    })
}

/// The ruleset of one start of the agent (or of its check): the plan, narrowed by its
/// definition's mode, plus its definition's paths, its private temp dir and, confined, its
/// project's toolchain caches (returned with it, for its environment).
pub(crate) fn confinement(
    spec: &AgentSpec,
    launcher: &Launcher,
    temp_path: Utf8PathBuf,
    own_connection: bool,
) -> Result<(sandbox::Prepared, Option<ToolchainCaches>), sandbox::BuildSandboxError> {
    let home = launcher
        .env
        .get("HOME")
        .and_then(|home| home.to_str())
        .map(Utf8Path::new);
    // A state directory the definition declares (`~/.claude/`) is made when missing, before
    // the sandbox: a first run in a fresh home keeps its state. One that cannot be made stays
    // missing, and the record says so.
    let mut unmade = Vec::new();
    for dir in spec.definition.sandbox.declared_dirs(home) {
        if std::fs::symlink_metadata(&dir).is_err()
            && let Err(error) = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
        {
            unmade.push(format!("{dir} ({error})"));
        }
    }
    let mut extra_writes = spec.definition.sandbox.write_paths(home);
    extra_writes.push(temp_path);
    let mut plan = spec.sandbox.clone();
    plan.mode = plan.mode.and(spec.definition.sandbox.mode);
    plan.network = plan.network.and(spec.definition.sandbox.network);
    if let Some(hosts) = &spec.definition.sandbox.allow_hosts {
        plan.hosts.push(crew_core::config::HostList {
            file: format!(".crew/agents/{}.toml", spec.definition.name),
            hosts: hosts.clone(),
        });
    }
    // Confined, its toolchains build with the project's caches, which it may write.
    let caches = (plan.mode == crew_core::config::SandboxMode::Enforce)
        .then(|| project_caches(spec, launcher))
        .flatten();
    if let Some(caches) = &caches {
        extra_writes.push(caches.dir.clone());
    }
    let own_socket = spec.socket.as_deref().filter(|_| own_connection);
    let mut prepared = sandbox::prepare(&plan, &extra_writes, own_socket)?;
    if prepared.record.state == SandboxState::Enforced {
        prepared.record.unmade = unmade;
    }
    let caches = caches.filter(|_| prepared.record.state == SandboxState::Enforced);
    Ok((prepared, caches))
}

/// The toolchain caches of the agent's project, made for this start (see `toolchains`).
fn project_caches(spec: &AgentSpec, launcher: &Launcher) -> Option<ToolchainCaches> {
    let var = |name: &str| {
        launcher
            .env
            .get(name)
            .and_then(|value| value.to_str())
            .map(str::to_owned)
    };
    let dir = toolchains::cache_dir(spec.workspace.as_path(), var)?;
    let home = Utf8PathBuf::from(var("HOME").filter(|home| home.starts_with('/'))?);
    let user_cargo = var("CARGO_HOME")
        .filter(|path| path.starts_with('/'))
        .map(Utf8PathBuf::from)
        .unwrap_or_else(|| home.join(".cargo"));
    toolchains::prepare(&dir, &home, &user_cargo)
}

/// A temp dir of the agent's own (mode 0700) in the host's temp directory: its `TMPDIR`, and
/// the one place outside its workspace the sandbox lets every agent write.
pub(crate) fn private_temp_dir(spec: &AgentSpec) -> Result<tempfile::TempDir, SpawnAgentError> {
    tempfile::Builder::new()
        .prefix(&format!(
            "crew-agent-{}-",
            crew_core::safe_segment(spec.agent_id.task_id().as_str())
        ))
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir()
        .map_err(|source| SpawnAgentError::TempDir {
            agent_id: spec.agent_id.clone(),
            source,
        })
}

fn open_log(spec: &AgentSpec) -> Result<LogWriter, SpawnAgentError> {
    let log_error = |source| SpawnAgentError::OutputLog {
        path: spec.output_log.clone(),
        source,
    };
    if let Some(parent) = spec.output_log.parent() {
        std::fs::create_dir_all(parent).map_err(log_error)?;
    }
    LogWriter::open(&spec.output_log, spec.output_log_limit)
        .map_err(|error| log_error(std::io::Error::other(error.to_string())))
}

struct Supervisor {
    spec: AgentSpec,
    launcher: Launcher,
    control: mpsc::Receiver<Control>,
    status: watch::Sender<AgentStatus>,
    tail: Arc<Mutex<OutputTail>>,
    follow_ups: VecDeque<String>,
    /// The tool calls of the turn under way.
    turn_tools: TurnTools,
    /// How long the program last waited to try the model's API again after a 429, in the turn
    /// under way: the API's `retry-after` as the program read it, and so when a limit it then
    /// gave up on may lift.
    limit_wait: Option<Duration>,
}

/// The tool calls of one turn, for a turn whose every call failed: a program that cannot run
/// anything (its own sandbox refused inside crew's, a home it may not write) says only that
/// its turn ended, and its task would look done.
#[derive(Debug, Default)]
struct TurnTools {
    succeeded: u32,
    failed: Vec<String>,
    change_failed: bool,
}

impl TurnTools {
    /// Why the turn failed, when every tool call failed and that cannot be an ordinary answer:
    /// two calls or more, or a change to files. One failing command (a `grep` that found
    /// nothing) may be how the agent learnt its answer.
    fn all_failed(&self) -> Option<String> {
        let calls = self.failed.len();
        (self.succeeded == 0 && (calls >= 2 || (calls == 1 && self.change_failed))).then(|| {
            format!(
                "every tool call of its last turn failed ({calls}); the first: {}",
                self.failed[0]
            )
        })
    }
}

/// How far a supervisor has gone in stopping its agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopping {
    /// Nobody asked it to stop.
    No,
    /// TERM sent: KILL follows at `kill_at` unless the agent exits first.
    Terminated { kill_at: Instant },
    /// KILL sent.
    Killed,
}

impl Stopping {
    /// When KILL is due.
    fn kill_at(self) -> Option<Instant> {
        match self {
            Stopping::Terminated { kill_at } => Some(kill_at),
            Stopping::No | Stopping::Killed => None,
        }
    }
}

/// What a running process's supervision ended with.
struct Ended {
    exit: ExitRecord,
    stop_waiters: Vec<oneshot::Sender<StopOutcome>>,
    /// The host dropped every handle: shut down.
    host_gone: bool,
}

/// Why the exited phase ended.
enum Next {
    Restart {
        message: Option<String>,
        reply: Option<oneshot::Sender<Result<u32, AgentOpError>>>,
        follow_up_reply: Option<oneshot::Sender<Result<FollowUpOutcome, AgentOpError>>>,
    },
    Shutdown,
}

impl Supervisor {
    async fn run_from_idle(mut self) {
        let next = self.idle().await;
        if let Some(running) = self.restart(next).await {
            self.run(running).await;
        }
    }

    async fn run(mut self, mut running: Running) {
        loop {
            let ended = self.supervise(running).await;
            let stopped = ended.exit.stopped_by.is_some();
            emit(
                &self.launcher.events,
                AgentEvent::Exited {
                    agent_id: self.spec.agent_id.clone(),
                    exit: ended.exit.clone(),
                },
            );
            if ended.host_gone {
                return;
            }
            // Follow-ups queued during the run resume the agent at once, unless it was stopped.
            let queued = if stopped {
                None
            } else {
                self.follow_ups.pop_front()
            };
            let next = match queued {
                Some(message) => Next::Restart {
                    message: Some(message),
                    reply: None,
                    follow_up_reply: None,
                },
                None => {
                    self.status.send_modify(|status| {
                        status.state = AgentState::Exited;
                        status.exit = Some(ended.exit.clone());
                        status.set_follow_ups(&self.follow_ups);
                    });
                    self.publish_status();
                    let outcome = match ended.exit.stopped_by {
                        Some(StopSignal::Kill) => StopOutcome::Killed,
                        Some(StopSignal::Term) => StopOutcome::Terminated,
                        None => StopOutcome::AlreadyExited,
                    };
                    for waiter in ended.stop_waiters {
                        answer(waiter, outcome);
                    }
                    self.idle().await
                }
            };
            match self.restart(next).await {
                Some(next_running) => running = next_running,
                None => return,
            }
        }
    }

    /// Starts the agent again in its workspace (the `resume` template when it has one); a
    /// restart that fails is reported to whoever asked, and the agent stays exited until the
    /// next request.
    async fn restart(&mut self, mut next: Next) -> Option<Running> {
        loop {
            let Next::Restart {
                message,
                reply,
                follow_up_reply,
            } = next
            else {
                return None;
            };
            // A resume without a message delivers the oldest follow-up still queued (one sent
            // before a stop), else the default message of a `resume` template.
            let definition = &self.spec.definition;
            let message = message.or_else(|| self.follow_ups.pop_front()).or_else(|| {
                (definition.resume.is_some() || definition.protocol == Protocol::Acp)
                    .then(|| DEFAULT_RESUME_MESSAGE.to_owned())
            });
            let (session, cost_here) = {
                let status = self.status.borrow();
                (
                    status
                        .session_id
                        .clone()
                        .or_else(|| self.spec.session_id.clone()),
                    status.usage.map(|usage| usage.cost_usd),
                )
            };
            // Recorded starts, and this host's: unknown when either did not say.
            let session_cost = match cost_here {
                None => self.spec.session_cost,
                Some(here) => here
                    .zip(self.spec.session_cost.or(Some(0.0)))
                    .map(|(a, b)| a + b),
            };
            match launch(
                &self.spec,
                &self.launcher,
                &self.tail,
                message.as_deref(),
                session.as_deref(),
                session_cost,
            )
            .await
            {
                Ok(running) => {
                    let pid = running.pid;
                    let sandbox = running.sandbox.clone();
                    // A new process starts its turn afresh.
                    self.turn_tools = TurnTools::default();
                    self.limit_wait = None;
                    self.status.send_modify(|status| {
                        status.state = AgentState::Running;
                        status.idle = false;
                        status.pid = Some(pid);
                        status.sandbox = Some(sandbox);
                        status.attempt += 1;
                        status.question = None;
                        status.asks_alive = false;
                        // A limit its last start hit is behind it.
                        status.limit = None;
                        status.set_follow_ups(&self.follow_ups);
                    });
                    let attempt = self.status.borrow().attempt;
                    emit(
                        &self.launcher.events,
                        AgentEvent::Started {
                            agent_id: self.spec.agent_id.clone(),
                            pid,
                            attempt,
                        },
                    );
                    self.publish_status();
                    if let Some(reply) = reply {
                        answer(reply, Ok(pid));
                    }
                    if let Some(reply) = follow_up_reply {
                        answer(reply, Ok(FollowUpOutcome::Resumed { pid }));
                    }
                    return Some(running);
                }
                Err(error) => {
                    let failure = AgentOpError::Restart {
                        agent_id: self.spec.agent_id.clone(),
                        reason: error.to_string(),
                    };
                    if let Some(reply) = reply {
                        answer(reply, Err(failure.clone()));
                    }
                    if let Some(reply) = follow_up_reply {
                        answer(reply, Err(failure));
                    }
                    self.status
                        .send_modify(|status| status.state = AgentState::Exited);
                    self.publish_status();
                    next = self.idle().await;
                }
            }
        }
    }

    fn publish_status(&self) {
        emit(
            &self.launcher.events,
            AgentEvent::Status {
                agent_id: self.spec.agent_id.clone(),
                status: Box::new(self.status.borrow().clone()),
            },
        );
    }

    fn signal_group(&self, pid: u32, signal: rustix::process::Signal) {
        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
            // Fails only when the group is gone: nothing left to signal.
            let _ = rustix::process::kill_process_group(pid, signal);
        }
    }

    /// What the agent's protocol said: a session is recorded, a turn's usage counted; at the
    /// end of a turn the next follow-up goes in, and a stream-json agent with none left is
    /// told its input is over, so that it ends.
    async fn heard(&mut self, event: ProtocolEvent, running: &mut Running) {
        match event {
            ProtocolEvent::Session(session) => {
                self.status
                    .send_modify(|status| status.session_id = Some(session));
                self.publish_status();
            }
            ProtocolEvent::NotProtocol(start) => {
                let warning = format!(
                    "the agent printed lines that are not {} messages (the first: `{start}`); they are shown as they are",
                    protocol_name(self.spec.definition.protocol)
                );
                self.status
                    .send_modify(|status| status.protocol_warning = Some(warning));
            }
            ProtocolEvent::Warning(warning) => {
                self.status
                    .send_modify(|status| status.protocol_warning = Some(warning));
            }
            ProtocolEvent::Asked(question) => {
                self.status.send_modify(|status| {
                    status.question = Some(question.clone());
                    status.asks_alive = true;
                });
                emit(
                    &self.launcher.events,
                    AgentEvent::Question {
                        agent_id: self.spec.agent_id.clone(),
                        question,
                    },
                );
                self.publish_status();
            }
            ProtocolEvent::Answered => {
                if self.status.borrow().asks_alive {
                    self.status.send_modify(|status| {
                        status.question = None;
                        status.asks_alive = false;
                    });
                    self.publish_status();
                }
            }
            ProtocolEvent::Failed(reason) => {
                self.status
                    .send_modify(|status| status.turn_error = Some(reason));
                self.publish_status();
                // Nothing more can be asked of it (a refused `session/new`): an agent that
                // stays (claude-code-acp does) is ended as one whose session is over.
                running.session_over = true;
            }
            ProtocolEvent::Lost {
                reason,
                before_start,
            } => {
                running.lost_before_start = before_start;
                self.status.send_modify(|status| status.lost = Some(reason));
            }
            ProtocolEvent::Landed { branch, tip } => {
                self.status
                    .send_modify(|status| status.landed = Some((branch, tip)));
            }
            ProtocolEvent::ToolsDone {
                succeeded,
                failed,
                change_failed,
            } => {
                self.turn_tools.succeeded += succeeded;
                self.turn_tools.failed.extend(failed);
                self.turn_tools.change_failed |= change_failed;
            }
            ProtocolEvent::ApiRetry { status, wait } => {
                if status == Some(429) {
                    self.limit_wait = Some(wait);
                }
            }
            ProtocolEvent::TurnEnded {
                usage,
                error,
                mut limit,
            } => {
                let tools = std::mem::take(&mut self.turn_tools);
                let error = error.or_else(|| tools.all_failed());
                // A limit that says nothing of when it lifts lifts when the API last said.
                if let (Some(limit), Some(wait)) = (&mut limit, self.limit_wait.take())
                    && limit.resets_at.is_none()
                {
                    limit.resets_at = Some(Timestamp(std::time::SystemTime::now() + wait));
                }
                self.status.send_modify(|status| {
                    if let Some(usage) = usage {
                        status.usage = Some(status.usage.map_or(usage, |sum| sum.plus(usage)));
                    }
                    status.turn_error = error;
                    status.limit = limit;
                });
                self.publish_status();
                if let Some(acp) = &running.acp {
                    // The next follow-up is the next prompt; with none, the session is over.
                    let input = match self.follow_ups.pop_front() {
                        Some(message) => AcpInput::Prompt(message),
                        None => {
                            running.session_over = true;
                            AcpInput::End
                        }
                    };
                    // The driver is gone only with the connection, when the agent is ending.
                    let _ = acp.inputs.send(input);
                    self.status
                        .send_modify(|status| status.set_follow_ups(&self.follow_ups));
                } else if let Some(message) = self.follow_ups.pop_front() {
                    if let Err(error) = self.steer(running.stdin.as_mut(), &message).await {
                        // The agent's input is closed (it is ending): the follow-up waits for
                        // its next start, as one sent to an exited agent does.
                        tracing::debug!(agent = %self.spec.agent_id, "follow-up kept for the next start: {error}");
                        self.follow_ups.push_front(message);
                    }
                    self.status.send_modify(|status| {
                        status.set_follow_ups(&self.follow_ups);
                        status.idle = false;
                    });
                } else if self.spec.definition.protocol == Protocol::ClaudeStreamJson {
                    drop(running.stdin.take());
                } else {
                    // Its turn is over and it reads on: it waits for the user.
                    self.status.send_modify(|status| status.idle = true);
                    self.publish_status();
                }
            }
        }
    }

    /// Sends TERM to the agent's group, says it is stopping, and gives it `grace` before KILL.
    fn terminate(&self, pid: u32, grace: Duration) -> Stopping {
        self.signal_group(pid, rustix::process::Signal::TERM);
        self.status
            .send_modify(|status| status.state = AgentState::Stopping);
        self.publish_status();
        Stopping::Terminated {
            kill_at: Instant::now() + grace,
        }
    }

    /// Supervises one running process until it has exited and its leftovers are gone.
    async fn supervise(&mut self, mut running: Running) -> Ended {
        let pid = running.pid;
        let grace = self.spec.stop_grace;
        let timeout_at = self.spec.timeout.map(|timeout| Instant::now() + timeout);
        let mut stopping = Stopping::No;
        let mut timed_out = false;
        let mut host_gone = false;
        let mut stop_waiters = Vec::new();
        let far_future = Instant::now() + Duration::from_secs(100 * 365 * 86_400);
        // When an agent whose session is over and that has not exited is ended by crew.
        let mut linger_until: Option<Instant> = None;
        let mut ended_after_session = false;

        let status = loop {
            tokio::select! {
                status = running.child.wait() => break status,
                message = self.control.recv(), if !host_gone => match message {
                    Some(Control::Stop { reply }) => {
                        stop_waiters.push(reply);
                        if stopping == Stopping::No {
                            stopping = self.terminate(pid, grace);
                        } else {
                            // A second stop kills at once.
                            self.signal_group(pid, rustix::process::Signal::KILL);
                            stopping = Stopping::Killed;
                        }
                    }
                    Some(Control::Steer { message, reply }) => {
                        let closed = || AgentOpError::Input {
                            agent_id: self.spec.agent_id.clone(),
                            reason: "its protocol connection is closed".to_owned(),
                        };
                        let result = match (&running.acp, &running.placed) {
                            (Some(acp), _) => {
                                acp.inputs.send(AcpInput::Steer(message)).map_err(|_| closed())
                            }
                            (_, Some(placed)) => placed
                                .inputs
                                .send(PlacedInput::Steer(message))
                                .map_err(|_| closed()),
                            (None, None) => self.steer(running.stdin.as_mut(), &message).await,
                        };
                        if result.is_ok() {
                            self.status.send_modify(|status| status.idle = false);
                        }
                        answer(reply, result);
                    }
                    Some(Control::FollowUp { message, reply }) if running.placed.is_some() => {
                        // The placement's agent takes it: as the answer to its question, or
                        // queued there for the end of its turn.
                        let asked = self.status.borrow().question.is_some();
                        let sent = running.placed.as_ref().is_some_and(|placed| {
                            placed.inputs.send(PlacedInput::FollowUp(message)).is_ok()
                        });
                        answer(reply, match (sent, asked) {
                            (false, _) => Err(AgentOpError::Input {
                                agent_id: self.spec.agent_id.clone(),
                                reason: "its placement's connection is closed".to_owned(),
                            }),
                            (true, true) => Ok(FollowUpOutcome::Answered),
                            (true, false) => Ok(FollowUpOutcome::Queued { position: 1 }),
                        });
                    }
                    Some(Control::FollowUp { message, reply }) => {
                        // A question the live agent waits on takes the message as its answer.
                        let answered = self.status.borrow().asks_alive
                            && running.acp.as_ref().is_some_and(|acp| {
                                acp.inputs.send(AcpInput::Answer(message.clone())).is_ok()
                            });
                        if answered {
                            self.status.send_modify(|status| {
                                status.question = None;
                                status.asks_alive = false;
                            });
                            self.publish_status();
                            answer(reply, Ok(FollowUpOutcome::Answered));
                        } else {
                            self.follow_ups.push_back(message);
                            let position = self.follow_ups.len();
                            self.status
                                .send_modify(|status| status.set_follow_ups(&self.follow_ups));
                            answer(reply, Ok(FollowUpOutcome::Queued { position }));
                        }
                    }
                    Some(Control::Resume { reply, .. }) => {
                        answer(reply, Err(AgentOpError::AlreadyRunning {
                            agent_id: self.spec.agent_id.clone(),
                        }));
                    }
                    Some(Control::Ask { question, reply }) => {
                        self.status.send_modify(|status| status.question = Some(question.clone()));
                        emit(&self.launcher.events, AgentEvent::Question {
                            agent_id: self.spec.agent_id.clone(),
                            question,
                        });
                        self.publish_status();
                        answer(reply, Ok(()));
                    }
                    Some(Control::Close { reply }) => {
                        answer(reply, false);
                    }
                    Some(Control::Check { command, reply, .. }) => {
                        answer(reply, refused_check(command, "its agent is running again"));
                    }
                    None => {
                        // Every handle is gone: the host is shutting down.
                        host_gone = true;
                        self.signal_group(pid, rustix::process::Signal::KILL);
                        stopping = Stopping::Killed;
                    }
                },
                _ = tokio::time::sleep_until(stopping.kill_at().unwrap_or(far_future)), if stopping.kill_at().is_some() => {
                    self.signal_group(pid, rustix::process::Signal::KILL);
                    stopping = Stopping::Killed;
                }
                _ = tokio::time::sleep_until(timeout_at.unwrap_or(far_future)), if timeout_at.is_some() && stopping == Stopping::No => {
                    timed_out = true;
                    stopping = self.terminate(pid, grace);
                }
                _ = tokio::time::sleep_until(linger_until.unwrap_or(far_future)), if linger_until.is_some() && stopping == Stopping::No => {
                    // Its session is over and it does not exit (claude-code-acp ignores the
                    // end of its input): crew ends it, which is no failure of its task.
                    ended_after_session = true;
                    stopping = self.terminate(pid, grace.min(SESSION_OVER_GRACE));
                }
                Some(event) = running.protocol.recv() => {
                    self.heard(event, &mut running).await;
                    if running.session_over && linger_until.is_none() {
                        linger_until = Some(Instant::now() + SESSION_OVER_GRACE);
                    }
                }
            }
        };
        drop(running.stdin.take());
        let acp = running.acp.take();
        let placed = running.placed.take();

        let mut exit = ExitRecord {
            code: None,
            signal: None,
            stopped_by: None,
            leaked_processes: 0,
            timed_out,
            ended_after_session: false,
            network: None,
        };
        match status {
            Ok(status) => {
                exit.code = status.code();
                exit.signal = status.signal();
            }
            Err(_) => exit.signal = Some(libc::SIGKILL),
        }
        exit.stopped_by = match stopping {
            Stopping::No => None,
            Stopping::Terminated { .. } => Some(StopSignal::Term),
            Stopping::Killed => Some(StopSignal::Kill),
        };
        if ended_after_session && stop_waiters.is_empty() && !timed_out {
            // crew's own end of a finished session: not a stop anyone asked for.
            exit.stopped_by = None;
            exit.ended_after_session = true;
        }
        exit.leaked_processes = running.leftovers.get().saturating_add(
            self.clean_up_leftovers(pid, &mut running.readers, stopping == Stopping::Killed)
                .await,
        );
        // Its output is read to the end now: what its protocol said last (often the end of
        // its turn, printed just before it exited) counts too.
        if let Some(acp) = acp {
            // Its stdout is read to the end: the connection ends with what it said last.
            let mut driver = acp.driver;
            if tokio::time::timeout(PIPE_GRACE, &mut driver).await.is_err() {
                driver.abort();
            }
        }
        if let Some(placed) = placed {
            // The transport's stdout is read to the end: the driver has heard all it will.
            let mut driver = placed.driver;
            if tokio::time::timeout(PIPE_GRACE, &mut driver).await.is_err() {
                driver.abort();
            }
        }
        while let Ok(event) = running.protocol.try_recv() {
            self.heard(event, &mut running).await;
        }
        if running.lost_before_start
            && let Some(said) = transport_said(&self.tail)
        {
            // Where the user looks (the task's reason), not only in `output.log`.
            self.status.send_modify(|status| {
                if let Some(lost) = &mut status.lost {
                    lost.push_str(&format!("; the transport said: {said}"));
                }
            });
        }
        // A question that waited on the live agent waits for its next start now.
        let refused = running.refusals.as_ref().map(|refusals| {
            refusals
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .found()
                .to_vec()
        });
        // Its last connections ended with it; the proxy goes with this process.
        let proxy = running.proxy.take();
        exit.network = proxy.as_ref().map(|proxy| proxy.counts().record());
        let refused_hosts = proxy
            .as_ref()
            .map(|proxy| proxy.counts().refusals())
            .unwrap_or_default();
        drop(proxy);
        self.status.send_modify(|status| {
            status.asks_alive = false;
            status.refused_writes = refused.unwrap_or_default();
            status.refused_hosts = refused_hosts;
        });
        Ended {
            exit,
            stop_waiters,
            host_gone,
        }
    }

    /// After the agent exited (and its warden killed what it left beneath it): kills what is
    /// still in its group and what still holds its pipes, and — when the warden itself was
    /// killed (`warden_killed`, a KILL to the group), so nothing was left beneath it to catch
    /// daemons — what carries the agent's marker anywhere. Returns how many processes that was.
    async fn clean_up_leftovers(
        &self,
        pid: u32,
        readers: &mut Vec<JoinHandle<()>>,
        warden_killed: bool,
    ) -> u32 {
        let mut leaked = 0;
        let group_alive = rustix::process::Pid::from_raw(pid as i32)
            .is_some_and(|pid| rustix::process::test_kill_process_group(pid).is_ok());
        if group_alive {
            leaked += 1;
            self.signal_group(pid, rustix::process::Signal::KILL);
        }
        let pipes_closed = tokio::time::timeout(PIPE_GRACE, join_all(readers))
            .await
            .is_ok();
        if warden_killed || !pipes_closed {
            let marker = procscan::agent_marker(&self.spec.agent_id);
            let killed = tokio::task::spawn_blocking(move || procscan::kill_marked(&marker))
                .await
                .unwrap_or(0);
            leaked += u32::try_from(killed).unwrap_or(u32::MAX);
        }
        if !pipes_closed {
            leaked = leaked.max(1);
            self.signal_group(pid, rustix::process::Signal::KILL);
            if tokio::time::timeout(PIPE_GRACE, join_all(readers))
                .await
                .is_err()
            {
                // Someone outside crew's reach holds the pipes: stop reading, never block.
                for reader in readers.iter() {
                    reader.abort();
                }
            }
        }
        leaked
    }

    async fn steer(
        &self,
        stdin: Option<&mut ChildStdin>,
        message: &str,
    ) -> Result<(), AgentOpError> {
        let agent_id = self.spec.agent_id.clone();
        let mode = self.spec.definition.steer;
        let Some(stdin) = stdin.filter(|_| mode != SteerMode::None) else {
            return Err(AgentOpError::SteerUnsupported { agent_id });
        };
        let mut line = match mode {
            SteerMode::StdinJson => user_message_line(message),
            _ => message.to_owned(),
        };
        line.push('\n');
        let write = async {
            stdin.write_all(line.as_bytes()).await?;
            stdin.flush().await
        };
        match tokio::time::timeout(STEER_TIMEOUT, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(AgentOpError::Input {
                agent_id,
                reason: error.to_string(),
            }),
            Err(_) => Err(AgentOpError::Input {
                agent_id,
                reason: format!("the agent did not read its input within {STEER_TIMEOUT:?}"),
            }),
        }
    }

    /// The exited phase: answers control messages until a resume or follow-up restarts the
    /// agent, or the host lets go.
    async fn idle(&mut self) -> Next {
        loop {
            let Some(message) = self.control.recv().await else {
                return Next::Shutdown;
            };
            let agent_id = self.spec.agent_id.clone();
            let closed = self.status.borrow().closed;
            match message {
                Control::Resume { message, reply } => {
                    if closed {
                        answer(reply, Err(AgentOpError::Closed { agent_id }));
                        continue;
                    }
                    return Next::Restart {
                        message,
                        reply: Some(reply),
                        follow_up_reply: None,
                    };
                }
                Control::FollowUp { message, reply } => {
                    if closed {
                        answer(reply, Err(AgentOpError::Closed { agent_id }));
                        continue;
                    }
                    return Next::Restart {
                        message: Some(message),
                        reply: None,
                        follow_up_reply: Some(reply),
                    };
                }
                Control::Stop { reply } => {
                    answer(reply, StopOutcome::AlreadyExited);
                }
                Control::Steer { reply, .. } => {
                    answer(reply, Err(AgentOpError::NotRunning { agent_id }));
                }
                Control::Ask { reply, .. } => {
                    answer(reply, Err(AgentOpError::NotRunning { agent_id }));
                }
                Control::Close { reply } => {
                    self.status.send_modify(|status| status.closed = true);
                    answer(reply, true);
                }
                Control::Check {
                    command,
                    log,
                    timeout,
                    reply,
                } => {
                    let (record, host_gone) = self.check(&command, &log, timeout).await;
                    answer(reply, record);
                    if host_gone {
                        return Next::Shutdown;
                    }
                }
            }
        }
    }

    /// Runs the task's check while answering control messages: a stop stops the check (TERM,
    /// grace, KILL; a second stop kills at once), as it would the agent. Returns the record,
    /// and whether the host let go meanwhile.
    async fn check(
        &mut self,
        command: &str,
        log: &Utf8Path,
        timeout: Duration,
    ) -> (CheckRecord, bool) {
        self.status.send_modify(|status| status.checking = true);
        self.publish_status();
        let (stop, stop_requests) = watch::channel(0u32);
        let launcher = self.launcher.clone();
        let spec = self.spec.clone();
        let check = crate::check::run_check(&launcher, &spec, command, log, timeout, stop_requests);
        tokio::pin!(check);
        let mut stop_waiters = Vec::new();
        let mut host_gone = false;
        let (record, ending) = loop {
            tokio::select! {
                ended = &mut check => break ended,
                message = self.control.recv(), if !host_gone => {
                    let agent_id = self.spec.agent_id.clone();
                    match message {
                        Some(Control::Stop { reply }) => {
                            stop_waiters.push(reply);
                            stop.send_modify(|requests| *requests += 1);
                        }
                        None => {
                            // Every handle is gone: the host is shutting down.
                            host_gone = true;
                            stop.send_modify(|requests| *requests += 2);
                        }
                        Some(Control::Resume { reply, .. }) => {
                            answer(reply, Err(AgentOpError::Checking { agent_id }));
                        }
                        Some(Control::FollowUp { reply, .. }) => {
                            answer(reply, Err(AgentOpError::Checking { agent_id }));
                        }
                        Some(Control::Steer { reply, .. }) => {
                            answer(reply, Err(AgentOpError::Checking { agent_id }));
                        }
                        Some(Control::Ask { reply, .. }) => {
                            answer(reply, Err(AgentOpError::NotRunning { agent_id }));
                        }
                        Some(Control::Close { reply }) => answer(reply, false),
                        Some(Control::Check { command, reply, .. }) => {
                            answer(reply, refused_check(command, "another check of the task runs"));
                        }
                    }
                }
            }
        };
        let outcome = if ending.killed {
            StopOutcome::Killed
        } else {
            StopOutcome::Terminated
        };
        for waiter in stop_waiters {
            answer(waiter, outcome);
        }
        self.status.send_modify(|status| status.checking = false);
        self.publish_status();
        (record, host_gone)
    }
}

/// A `stdin-json` agent's user message, `{"type":"user","message":{"role":"user","content":…}}`:
/// built from structs, so its keys come in this order however serde_json is configured.
fn user_message_line(content: &str) -> String {
    #[derive(serde::Serialize)]
    struct Message<'a> {
        role: &'static str,
        content: &'a str,
    }
    #[derive(serde::Serialize)]
    struct Line<'a> {
        r#type: &'static str,
        message: Message<'a>,
    }
    let line = Line {
        r#type: "user",
        message: Message {
            role: "user",
            content,
        },
    };
    serde_json::to_string(&line).expect("a user message serializes")
}

/// Waits for the readers, dropping each as it finishes, so that a wait cut short by a timeout
/// can be taken up again without polling a finished task twice.
async fn join_all(readers: &mut Vec<JoinHandle<()>>) {
    while let Some(reader) = readers.last_mut() {
        // A reader that panicked has stopped reading: its output is over either way.
        let _ = reader.await;
        readers.pop();
    }
}

/// A check that was not run, and why: it did not pass.
fn refused_check(command: String, why: &str) -> CheckRecord {
    CheckRecord {
        passed: Some(false),
        error: Some(why.to_owned()),
        ..CheckRecord::pending(command)
    }
}

/// What a placement's transport said last about why it failed: its `error:`/`caused by:`/
/// `hint:` lines (crew's own way of failing), else its last line that is not crew's note.
fn transport_said(tail: &Mutex<OutputTail>) -> Option<String> {
    let lines = tail
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .last_lines();
    let errors: Vec<&str> = lines
        .iter()
        .map(|line| line.trim())
        .filter(|line| {
            ["error:", "caused by:", "hint:"]
                .iter()
                .any(|prefix| line.starts_with(prefix))
        })
        .collect();
    if !errors.is_empty() {
        return Some(errors.join("; "));
    }
    lines
        .iter()
        .rev()
        .map(|line| line.trim())
        .find(|line| !line.is_empty() && !line.starts_with('['))
        .map(str::to_owned)
}

/// A protocol as its agent definition names it.
fn protocol_name(protocol: Protocol) -> String {
    serde_json::to_value(protocol)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_default()
}
