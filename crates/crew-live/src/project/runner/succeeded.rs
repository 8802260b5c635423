//! Why a task that succeeded does not run again.

use crew_core::model::{TaskRecord, TaskStatus};
use crew_core::{RunId, TaskId};

/// A task that succeeded, asked to run again: without a message it has nothing to do (a
/// follow-up gives it more, in its session), and without a session there is no conversation
/// to go on with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AlreadySucceeded {
    /// Its agent keeps a session: a follow-up goes on in it.
    #[error(
        "task {task} of run {run} already succeeded; for more work, send it a follow-up (`crew agents follow-up {run}:{task} \"…\"`): it goes on in its session, on its branch"
    )]
    FollowUpInstead {
        /// Its run.
        run: RunId,
        /// The task.
        task: TaskId,
    },
    /// Its agent keeps no session: only a new run does more.
    #[error(
        "task {task} of run {run} already succeeded, and its agent keeps no session to go on with; for more work, start a new run (its branch is where the work is)"
    )]
    NoSession {
        /// Its run.
        run: RunId,
        /// The task.
        task: TaskId,
    },
}

impl AlreadySucceeded {
    /// Refuses to run `task` of `run` (its `record`) again when it succeeded, unless it is
    /// given `more_work` and keeps a session to do it in.
    pub fn check(
        run: &RunId,
        task: &TaskId,
        record: &TaskRecord,
        more_work: bool,
    ) -> Result<(), Self> {
        let has_session = record.session_id.is_some();
        if record.status != TaskStatus::Succeeded || (more_work && has_session) {
            return Ok(());
        }
        let (run, task) = (run.clone(), task.clone());
        Err(match has_session {
            true => Self::FollowUpInstead { run, task },
            false => Self::NoSession { run, task },
        })
    }
}
