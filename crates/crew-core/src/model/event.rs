//! The events of a run's log.

use serde::{Deserialize, Serialize};

use crate::ids::TaskId;
use crate::model::run::CancelRecord;
use crate::model::status::{MANIFEST_SCHEMA_VERSION, RunStatus, TaskStatus, Timestamp};
use crate::model::usage::Usage;

/// One line of `events.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEvent {
    /// The event's format.
    pub schema_version: u32,
    /// When it happened.
    pub at: Timestamp,
    /// The task it is about, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskId>,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

impl RunEvent {
    /// An event that happens now.
    pub fn new(task: Option<TaskId>, kind: EventKind) -> Self {
        RunEvent {
            schema_version: MANIFEST_SCHEMA_VERSION,
            at: Timestamp::now(),
            task,
            kind,
        }
    }
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    /// The run was created.
    RunCreated,
    /// The run's status changed.
    RunStatus {
        /// The new status.
        status: RunStatus,
        /// Why, when that needs saying.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A task's status changed.
    TaskStatus {
        /// The new status.
        status: TaskStatus,
        /// Why, when that needs saying.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Something a user should read, not a change of status.
    Message {
        /// The text.
        text: String,
    },
    /// Someone asked for the run to be cancelled.
    CancelRequested {
        /// The request.
        by: CancelRecord,
    },
    /// A task's tokens and cost so far, when its agent's protocol reports them.
    Usage {
        /// The usage.
        usage: Usage,
    },
    /// A request of the task's agent to its proxy (`network = "proxy"`), let through or
    /// refused.
    Network {
        /// The host asked for.
        host: String,
        /// Its port.
        port: u16,
        /// Whether the rules (`allow_hosts`) let it through.
        allowed: bool,
        /// Why it was refused, or why an allowed one could not be reached (no such name,
        /// nobody listening).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// The task's work would conflict with another's (a task id, or the branch the run
    /// started from), in these files: the radar found it when the task's branch was there.
    Overlap {
        /// The other task's id, or the branch.
        with: String,
        /// The files both change.
        files: Vec<String>,
    },
}
