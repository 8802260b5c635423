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
use crew_sandbox::spawn::{AgentInput, Warden};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crew_core::config::{AgentDef, Protocol, SteerMode, fill_template};
use crew_core::env_vars;
use crew_core::model::{
    CheckRecord, ExitRecord, SandboxRecord, SandboxState, StopSignal, Timestamp, Usage, UsageLimit,
};
use crew_core::{AgentId, TaskId, WorkspaceId};

use crate::agent::acp::{AcpInput, AcpLink, AcpStart};
use crate::agent::env::{BaseEnv, agent_env};
use crate::agent::error::{AgentOpError, SpawnAgentError};
use crate::agent::events::{AgentEvent, OutputStream, answer, emit};
use crate::agent::output::{LogWriter, OutputSink, OutputTail, drain};
use crate::agent::placed::PlacedInput;
use crate::agent::protocol::ProtocolEvent;
use crate::agent::refusals::Refusals;
use crate::agent::toolchains::ToolchainCaches;
use crew_sandbox::procscan;
use crew_sandbox::sandbox::{self, SandboxPlan};
use crew_sandbox::spawn::{AgentIo, LeftoverCount, Spawner, WardedCommand};

mod launch;
mod supervisor;

// What the agent room holds besides one agent's supervisor and start: its environment, its
// events and output, the protocols programs speak, limits, placed agents, checks.
pub(crate) mod acp;
pub(crate) mod check;
pub mod env;
pub mod error;
pub mod events;
pub mod limits;
pub mod output;
pub mod placed;
pub mod protocol;
pub mod refusals;
pub mod toolchains;

pub(crate) use launch::{confinement, private_temp_dir, start, start_idle};

/// The message a resume without one sends to agents whose `resume` template wants one.
pub const DEFAULT_RESUME_MESSAGE: &str = "Continue where you left off.";
/// How long a steering message may wait for the agent to read its stdin.
const STEER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the output pipes may stay open after the agent exited before crew counts the
/// holders as leaked processes.
const PIPE_GRACE: Duration = Duration::from_millis(300);
/// How long an agent whose session is over (an `acp` agent's, a `claude-stream-json` agent's
/// after its result) may take to exit before crew ends it (TERM, then KILL as late again).
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
    /// End the agent when every request through its proxy has failed upstream for this long
    /// and none got through (`[run] unreachable_timeout`); `None`: never.
    pub unreachable_timeout: Option<Duration>,
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
    pub placed: Option<crate::agent::placed::Placed>,
    /// Follow-ups sent to it that an earlier host had not delivered yet (recorded on its task
    /// when it was stopped): they wait for it as ones queued here do.
    pub follow_ups: Vec<String>,
    /// Where its proxy reports each request (`network = "proxy"`): the run's events.
    pub network_log: Option<crew_sandbox::proxy::NetworkLog>,
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
    /// Every request of its last process through crew's proxy was failing upstream when it
    /// ended: why, and whether crew ended it for that.
    pub unreachable: Option<Unreachable>,
}

/// Why an agent's requests through crew's proxy were all failing when it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unreachable {
    /// What the task's reason says of it.
    pub said: String,
    /// crew ended the agent for it (`[run] unreachable_timeout`).
    pub ended_by_crew: bool,
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

/// Serves an agent's own connection to its host (see [`crew_sandbox::sandbox::Namespace::control`]):
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
    child: Warden,
    pid: u32,
    stdin: Option<AgentInput>,
    readers: Vec<JoinHandle<()>>,
    /// What the agent's protocol says: sessions, ends of turns (see `OutputSink::supervisor`).
    protocol: mpsc::UnboundedReceiver<ProtocolEvent>,
    /// The client connection of an `acp` agent, which holds its stdin.
    acp: Option<AcpLink>,
    placed: Option<crate::agent::placed::PlacedLink>,
    sandbox: SandboxRecord,
    /// The writes the sandbox refused, as the agent said them (a confined agent's).
    refusals: Option<Arc<Mutex<Refusals>>>,
    /// How many processes the warden killed after the agent exited.
    leftovers: LeftoverCount,
    /// Its proxy (`network = "proxy"`), serving as long as this process lives.
    proxy: Option<crew_sandbox::proxy::Proxy>,
    /// Its own connection to its host, served as long as this process lives.
    _own_connection: Option<Box<dyn std::any::Any + Send>>,
    /// The agent's private temp dir (its `TMPDIR`), removed when this process is done.
    _temp_dir: crew_sandbox::temp_dirs::AgentTempDir,
    /// A placed task's transport ended before the task started there: once its output is
    /// read to the end, what it said last goes into the reason.
    lost_before_start: bool,
    /// The agent's session is over (an `acp` agent's last turn ended with nothing more to
    /// say; a `claude-stream-json` agent gave its result): it should exit.
    session_over: bool,
}

/// The handle parts a new supervisor hands to the registry.
pub(crate) struct Started {
    pub control: mpsc::Sender<Control>,
    pub status: watch::Receiver<AgentStatus>,
    pub tail: Arc<Mutex<OutputTail>>,
}
