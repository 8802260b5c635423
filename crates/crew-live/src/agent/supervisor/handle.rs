//! What a host holds of an agent's supervisor: the messages it takes, and the handle parts a
//! new one gives the registry.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use camino::Utf8PathBuf;
use crew_core::model::CheckRecord;
use tokio::sync::{mpsc, oneshot, watch};

use crate::agent::error::AgentOpError;
use crate::agent::output::OutputTail;
use crate::agent::status::{AgentStatus, FollowUpOutcome, StopOutcome};

/// What a host asks of an agent's supervisor.
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

/// The handle parts a new supervisor hands to the registry.
pub(crate) struct Started {
    pub control: mpsc::Sender<Control>,
    pub status: watch::Receiver<AgentStatus>,
    pub tail: Arc<Mutex<OutputTail>>,
}
