//! What a host can subscribe to: status changes and output lines of its agents.

use crew_core::AgentId;
use crew_core::model::ExitRecord;
use serde::Serialize;

use crate::agent::status::AgentStatus;

/// Which pipe a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Something that happened to a live agent.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum AgentEvent {
    /// A process of the agent started (the first start, or a resume).
    Started {
        /// The agent.
        agent_id: AgentId,
        /// The process's group id (its warden).
        pid: u32,
        /// Which start of the agent it is, from 1.
        attempt: u32,
    },
    /// A complete line of output (capped at [`crate::agent::output::MAX_LINE_BYTES`]).
    Output {
        /// The agent.
        agent_id: AgentId,
        /// The pipe.
        stream: OutputStream,
        /// The line, without its newline.
        line: String,
    },
    /// The agent asked a question and waits for the answer.
    Question {
        /// The agent.
        agent_id: AgentId,
        /// The question.
        question: String,
    },
    /// The agent's status changed.
    Status {
        /// The agent.
        agent_id: AgentId,
        /// Its status now.
        status: Box<AgentStatus>,
    },
    /// A process of the agent ended.
    Exited {
        /// The agent.
        agent_id: AgentId,
        /// How the process ended.
        exit: ExitRecord,
    },
}

impl AgentEvent {
    /// The agent the event is about.
    pub fn agent_id(&self) -> &AgentId {
        match self {
            AgentEvent::Started { agent_id, .. }
            | AgentEvent::Output { agent_id, .. }
            | AgentEvent::Question { agent_id, .. }
            | AgentEvent::Status { agent_id, .. }
            | AgentEvent::Exited { agent_id, .. } => agent_id,
        }
    }
}

/// Sends `event` to whoever watches the host's agents. Nobody watching is no error: events are
/// for those who follow along, and the run's state holds the record.
pub(crate) fn emit(events: &tokio::sync::broadcast::Sender<AgentEvent>, event: AgentEvent) {
    // No subscriber is no error: the run's state holds the record.
    let _ = events.send(event);
}

/// Answers a request made over a oneshot channel. The asker may have stopped waiting (it timed
/// out, or hung up): the answer then has nobody to go to, which is no error of the answerer.
pub(crate) fn answer<T>(reply: tokio::sync::oneshot::Sender<T>, value: T) {
    // Nobody waiting for the answer is no error of the answerer.
    let _ = reply.send(value);
}
