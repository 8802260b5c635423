//! Statuses of runs and tasks, the transitions between them, and when things happened.

use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ids::{AgentId, RunId, TaskId};

/// The manifest format this crew writes. A newer manifest is read-only to this crew.
pub const MANIFEST_SCHEMA_VERSION: u32 = 1;

/// A point in time, stored as RFC 3339 with milliseconds (`2026-11-29T22:40:15.123Z`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub SystemTime);

impl Timestamp {
    /// The current time.
    pub fn now() -> Self {
        Timestamp(SystemTime::now())
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_rfc3339_millis(self.0))
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_rfc3339_weak(&text)
            .map(Timestamp)
            .map_err(serde::de::Error::custom)
    }
}

/// `running → completed | failed | cancelled | interrupted`, and back to `running` when a run is
/// resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Its host is working on it.
    Running,
    /// Every task that was to run succeeded.
    Completed,
    /// A task failed, or the run could not go on.
    Failed,
    /// Someone cancelled it.
    Cancelled,
    /// Set by reconciliation: the process hosting the run is gone.
    Interrupted,
}

impl RunStatus {
    /// Whether the run has ended (interrupted counts: nothing works on it).
    pub fn is_finished(self) -> bool {
        !matches!(self, RunStatus::Running)
    }

    /// Whether a run may go from this status to `next`.
    pub fn can_become(self, next: RunStatus) -> bool {
        use RunStatus::*;
        match (self, next) {
            (Running, Completed | Failed | Cancelled | Interrupted) => true,
            // Resuming a run that did not complete, or one whose agent gets a follow-up.
            (Completed | Failed | Cancelled | Interrupted, Running) => true,
            // Cancelling a run whose host is gone.
            (Interrupted, Cancelled) => true,
            _ => false,
        }
    }

    /// The name written in manifests and listings.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Interrupted => "interrupted",
        }
    }
}

/// `pending → preparing → running (⇄ waiting) → succeeded | failed | stopped | cancelled |
/// skipped | interrupted`; a finished task goes back to `pending` or `preparing` when it is resumed, and a
/// stopped one whose workspace its run still holds back to `running`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    /// Waiting for its dependencies or a free slot.
    Pending,
    /// Its workspace is being made.
    Preparing,
    /// Its agent is working.
    Running,
    /// The agent asked a question and waits for the answer.
    Waiting,
    /// The agent hit a usage limit: the task keeps its workspace, and its agent takes up its
    /// session again when the limit lifts (`on_limit = "pause"`).
    Paused,
    /// Its agent finished with success (and its check passed, when it has one).
    Succeeded,
    /// Its agent failed, could not start, or its check failed.
    Failed,
    /// Someone stopped its agent (or its timeout did).
    Stopped,
    /// Its run was cancelled before or while it ran.
    Cancelled,
    /// A task it depends on did not succeed, so it never ran.
    Skipped,
    /// Its placement's connection was lost before its work came back: the work is there (its
    /// reason says where), and `crew runs resume` takes the task up from it.
    Interrupted,
}

impl TaskStatus {
    /// Whether the task has ended: nothing works on it until it is resumed.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            TaskStatus::Succeeded
                | TaskStatus::Failed
                | TaskStatus::Stopped
                | TaskStatus::Cancelled
                | TaskStatus::Skipped
                | TaskStatus::Interrupted
        )
    }

    /// A task whose agent process may be alive.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            TaskStatus::Preparing | TaskStatus::Running | TaskStatus::Waiting
        )
    }

    /// Whether a task may go from this status to `next`.
    pub fn can_become(self, next: TaskStatus) -> bool {
        use TaskStatus::*;
        match (self, next) {
            (Pending, Preparing | Cancelled | Skipped) => true,
            (Preparing, Running | Failed | Cancelled | Stopped) => true,
            (Running, Waiting | Succeeded | Failed | Stopped | Cancelled | Interrupted) => true,
            (Waiting, Running | Succeeded | Failed | Stopped | Cancelled | Interrupted) => true,
            (Running, Paused) => true,
            // The run or the day was at its spend cap when it was to start: it asks first.
            (Preparing, Paused) => true,
            // Refused by its provider before it began (a limit at its first request): queued
            // again, to start afresh when the limit lifts.
            (Running, Pending) => true,
            (Paused, Running | Failed | Stopped | Cancelled) => true,
            // A stopped agent resumed in the workspace its task kept while the run went on.
            (Stopped, Running) => true,
            // Resume: a finished task is prepared again, or queued again with its run.
            (
                Succeeded | Failed | Stopped | Cancelled | Skipped | Interrupted,
                Pending | Preparing,
            ) => true,
            _ => false,
        }
    }

    /// The name written in manifests and listings.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Pending => "pending",
            TaskStatus::Preparing => "preparing",
            TaskStatus::Running => "running",
            TaskStatus::Waiting => "waiting",
            TaskStatus::Paused => "paused",
            TaskStatus::Succeeded => "succeeded",
            TaskStatus::Failed => "failed",
            TaskStatus::Stopped => "stopped",
            TaskStatus::Cancelled => "cancelled",
            TaskStatus::Skipped => "skipped",
            TaskStatus::Interrupted => "interrupted",
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status change that the model does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// A run status change the lifecycle does not allow.
    #[error("run {run_id} cannot go from {from} to {to}")]
    Run {
        /// The run.
        run_id: RunId,
        /// Its status.
        from: RunStatus,
        /// The status asked for.
        to: RunStatus,
    },
    /// A task status change the lifecycle does not allow.
    #[error("task {agent_id} cannot go from {from} to {to}")]
    Task {
        /// The task's agent.
        agent_id: AgentId,
        /// Its status.
        from: TaskStatus,
        /// The status asked for.
        to: TaskStatus,
    },
    /// The run has no task of that id.
    #[error("run {run_id} has no task {task_id}")]
    UnknownTask {
        /// The run.
        run_id: RunId,
        /// The id asked for.
        task_id: TaskId,
    },
}
