//! A person's verbs on a run of a project: cancel it, follow what it records.

use std::time::Duration;

use crew_core::model::{EventKind, RunEvent, RunStatus};
use crew_core::store::StateError;
use crew_core::{CancelCause, CancelRecord, RunId};

use crate::control::{ControlError, Op};
use crate::project::Project;

/// What cancelling a run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// Its host was told: its agents stop gracefully and their work is kept.
    Cancelling,
    /// No process hosted it any more: it is marked cancelled.
    HostWasGone,
}

/// A run that was not cancelled; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum CancelRunError {
    /// It has ended already.
    #[error("run {run_id} is already {status}")]
    Ended {
        /// The run.
        run_id: RunId,
        /// How it ended.
        status: RunStatus,
    },
    /// Another terminal session hosts it (another `crew run`, an editor), and the caller did
    /// not force the cancel.
    #[error("run {run_id} is hosted by another session ({label}, pid {pid})")]
    OtherSession {
        /// The run.
        run_id: RunId,
        /// Who hosts it, as its host says.
        label: String,
        /// Its host's process.
        pid: u32,
    },
    /// Its state could not be read or written.
    #[error(transparent)]
    State(#[from] StateError),
    /// Its host could not be reached, or did not answer.
    #[error(transparent)]
    Host(#[from] ControlError),
    /// Its host refused.
    #[error(transparent)]
    Refused(#[from] crate::verbs::Refusal),
}

impl Project {
    /// Cancels `run_id`: its host stops its agents gracefully and keeps their work; a run no
    /// process hosts any more is marked cancelled. A run another terminal session hosts is
    /// cancelled only when `force`d (the cancel records it); a detached host's (`crew run
    /// --detach`, a lead agent's) is the user's own.
    pub async fn cancel_run(
        &self,
        run_id: &RunId,
        force: bool,
    ) -> Result<Cancelled, CancelRunError> {
        let manifest = self.store().read_run(run_id)?;
        let live_host = manifest
            .host
            .clone()
            .filter(|host| manifest.status == RunStatus::Running && host.identity.is_alive());
        let Some(host) = live_host else {
            if manifest.status.is_finished() && manifest.status != RunStatus::Interrupted {
                return Err(CancelRunError::Ended {
                    run_id: run_id.clone(),
                    status: manifest.status,
                });
            }
            let by = CancelRecord::by_this_process(CancelCause::HostGone);
            let event = RunEvent::new(None, EventKind::CancelRequested { by: by.clone() });
            self.store().update_run(run_id, |manifest| {
                manifest.set_status(RunStatus::Cancelled)?;
                manifest.reason = Some("cancelled after its host was gone".into());
                manifest.cancelled_by.get_or_insert(by);
                Ok(())
            })?;
            // The event only tells watchers sooner; the manifest says it.
            let _ = self.store().append_event(run_id, &event);
            return Ok(Cancelled::HostWasGone);
        };
        let own_session = crate::procscan::session_of(None);
        let host_session = crate::procscan::session_of(Some(host.identity.pid));
        let detached = host
            .label
            .as_deref()
            .is_some_and(crate::hosting::is_detached);
        let same_session = crate::procscan::same_session(own_session, host_session);
        if !force && !detached && same_session != Some(true) {
            return Err(CancelRunError::OtherSession {
                run_id: run_id.clone(),
                label: host
                    .label
                    .clone()
                    .unwrap_or_else(|| "another process".to_owned()),
                pid: host.identity.pid,
            });
        }
        let response = self
            .call(
                &host,
                Op::CancelRun {
                    run: run_id.clone(),
                    force,
                },
            )
            .await?;
        response
            .answer
            .map(|_| Cancelled::Cancelling)
            .map_err(|error| CancelRunError::Refused(error.into()))
    }
}

/// How often a followed run's log is read again.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(100);

/// The events a run records, read as they are appended (`crew events --follow`, an editor's
/// session showing a run): see [`Project::follow_run`].
#[derive(Debug)]
pub struct RunFollower {
    project: Project,
    run_id: RunId,
    offset: u64,
    follow: bool,
    done: bool,
}

impl RunFollower {
    /// The events recorded since the last call, waiting until there are some or the run
    /// ended; `None` once the run ended and every event it recorded was given. A run whose
    /// host died ends too (it is marked interrupted), never a wait forever.
    pub async fn next(&mut self) -> Result<Option<Vec<RunEvent>>, StateError> {
        loop {
            if self.done {
                return Ok(None);
            }
            // Whether the run was over before this read: then this read holds its last events.
            let ended = !self.follow || self.project.run_ended(&self.run_id)?;
            let (events, next) = self
                .project
                .store()
                .read_events_since(&self.run_id, self.offset)?;
            self.offset = next;
            self.done = ended;
            if ended || !events.is_empty() {
                return Ok(Some(events));
            }
            tokio::time::sleep(FOLLOW_INTERVAL).await;
        }
    }

    /// Where in the run's log the next read starts.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

impl Project {
    /// The events `run_id` records from `offset` of its log (0: from the start), until it
    /// ends.
    pub fn follow_run(&self, run_id: &RunId, offset: u64) -> RunFollower {
        RunFollower {
            project: self.clone(),
            run_id: run_id.clone(),
            offset,
            follow: true,
            done: false,
        }
    }

    /// The events `run_id` recorded so far, in one batch.
    pub fn run_events(&self, run_id: &RunId) -> RunFollower {
        RunFollower {
            follow: false,
            ..self.follow_run(run_id, 0)
        }
    }
}
