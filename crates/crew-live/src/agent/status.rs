//! What a live agent is and does, as its supervisor publishes it: its state, its status on
//! its watch channel, its activity, and how a stop or a follow-up ended.

use std::collections::VecDeque;

use crew_core::model::{ExitRecord, SandboxRecord, Timestamp, Usage, UsageLimit};
use serde::{Deserialize, Serialize};

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
    /// Reads the cgroup of its caps as it goes (its latest process's, while it lives).
    #[serde(skip)]
    pub meter: Option<crew_sandbox::caps::Meter>,
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
    /// The spend cap its last turn reached, if it did.
    pub over_cap: Option<OverCap>,
    /// How many times a person asked to stop it while it was not running (paused at a cap
    /// or a limit): its task ends on that.
    pub stops_asked: u32,
}

/// A spend cap a task reached, and what to tell the person who decides whether it goes on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OverCap {
    /// Whose cap it is.
    pub kind: crew_core::model::CapKind,
    /// What was spent against which cap, as a reason says it.
    pub reason: String,
    /// The agent was stopped short of what it would have done next (a follow-up, its next
    /// turn); `false`: the turn that reached the cap was its last anyway.
    pub stopped_short: bool,
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
    /// The status of a supervisor as it starts: its `attempt`, in `state`, with the question
    /// it waits on from before its host, if any; no process yet, nothing heard from it.
    pub(crate) fn new(state: AgentState, attempt: u32, question: Option<String>) -> Self {
        AgentStatus {
            state,
            pid: None,
            attempt,
            started_at: Timestamp::now(),
            exit: None,
            question,
            queued_follow_ups: 0,
            follow_up_queue: Vec::new(),
            closed: false,
            sandbox: None,
            meter: None,
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
            unreachable: None,
            over_cap: None,
            stops_asked: 0,
        }
    }

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
    /// The agent had exited and its task was paused (at a spend cap, or on a usage limit):
    /// the task ends, `stopped`, its work saved.
    EndedPaused,
}

impl StopOutcome {
    /// Its name, as the host writes it (`terminated`, `killed`, `already_exited`,
    /// `ended_paused`).
    pub fn as_str(self) -> &'static str {
        match self {
            StopOutcome::Terminated => "terminated",
            StopOutcome::Killed => "killed",
            StopOutcome::AlreadyExited => "already_exited",
            StopOutcome::EndedPaused => "ended_paused",
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
