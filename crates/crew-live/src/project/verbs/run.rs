//! A person's verbs on a run of a project: cancel it, follow what it records, wait for it.

use std::time::Duration;

use crew_core::model::{EventKind, RunEvent, RunManifest, RunStatus, TaskStatus};
use crew_core::store::StateError;
use crew_core::{CancelCause, CancelRecord, RunId, TaskId};

use crate::control::{ControlError, Op};
use crate::project::open::Project;

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
    /// Another terminal session hosts it (another `crew run`, an editor), or crew cannot tell
    /// whether its host's session is the caller's, and the caller did not force the cancel.
    #[error(
        "run {run_id} is hosted by {}({label}, pid {pid})",
        if *known { "another session " } else { "a session crew cannot tell from this one " }
    )]
    OtherSession {
        /// The run.
        run_id: RunId,
        /// Who hosts it, as its host says.
        label: String,
        /// Its host's process.
        pid: u32,
        /// Whether crew knows the session is another (false: the two sessions' leaders lie
        /// outside this pid namespace and neither has a terminal, as in a container's job).
        known: bool,
    },
    /// Its state could not be read or written.
    #[error(transparent)]
    State(#[from] StateError),
    /// Its host could not be reached, or did not answer.
    #[error(transparent)]
    Host(#[from] ControlError),
    /// Its host refused.
    #[error(transparent)]
    Refused(#[from] crate::project::verbs::refusal::Refusal),
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
        let own_session = crew_sandbox::procscan::session_of(None);
        let host_session = crew_sandbox::procscan::session_of(Some(host.identity.pid));
        let detached = host
            .label
            .as_deref()
            .is_some_and(crate::project::host::is_detached);
        let same_session = crew_sandbox::procscan::same_session(own_session, host_session);
        if !force && !detached && same_session != Some(true) {
            return Err(CancelRunError::OtherSession {
                run_id: run_id.clone(),
                label: host
                    .label
                    .clone()
                    .unwrap_or_else(|| "another process".to_owned()),
                pid: host.identity.pid,
                known: same_session.is_some(),
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

/// How often a waited-on run's manifest is read again.
const WAIT_INTERVAL: Duration = Duration::from_millis(100);

/// A step of a wait on a run (see [`Project::wait_run`]).
#[derive(Debug, Clone, PartialEq)]
pub enum WaitStep {
    /// How many of the tasks waited on have finished, of how many: said first at once, then
    /// at each change.
    Progress {
        /// Finished so far.
        finished: usize,
        /// Waited on.
        of: usize,
    },
    /// The wait is over: why, and the run as it was then.
    Over {
        /// Why.
        why: WaitOver,
        /// The run's manifest.
        manifest: Box<RunManifest>,
    },
}

/// Why a wait on a run is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOver {
    /// The run ended (its host gone counts: it is then marked interrupted), or every task
    /// waited on finished.
    Ended,
    /// A task asks a question: someone must answer it before the run goes on.
    Asks,
    /// The time given ran out.
    TimedOut,
}

/// A wait on a run, step by step: see [`Project::wait_run`].
#[derive(Debug)]
pub struct RunWaiter {
    project: Project,
    run_id: RunId,
    ignore: Option<TaskId>,
    deadline: tokio::time::Instant,
    reported: Option<usize>,
    pending: Option<WaitStep>,
}

impl RunWaiter {
    /// The next step: progress when it changed, else [`WaitStep::Over`] once the wait is
    /// over (call no more after that).
    pub async fn next(&mut self) -> Result<WaitStep, StateError> {
        if let Some(step) = self.pending.take() {
            return Ok(step);
        }
        loop {
            let manifest = self.project.store().read_run(&self.run_id)?;
            let waited: Vec<_> = manifest
                .tasks
                .iter()
                .filter(|task| self.ignore.as_ref() != Some(&task.id))
                .collect();
            let asks = waited.iter().any(|task| task.status == TaskStatus::Waiting);
            let finished = waited
                .iter()
                .filter(|task| task.status.is_finished())
                .count();
            let of = waited.len();
            let ended = if self.ignore.is_some() {
                finished == of
            } else {
                // A run whose host died ends too (marked interrupted), never a wait to the
                // deadline.
                manifest.status != RunStatus::Running
                    || self.project.run_ended(&self.run_id).unwrap_or(true)
            };
            let why = if ended {
                Some(WaitOver::Ended)
            } else if asks {
                Some(WaitOver::Asks)
            } else if tokio::time::Instant::now() >= self.deadline {
                Some(WaitOver::TimedOut)
            } else {
                None
            };
            let over = match why {
                Some(why) => Some(WaitStep::Over {
                    why,
                    manifest: Box::new(self.settled(manifest, why).await),
                }),
                None => None,
            };
            if self.reported != Some(finished) {
                self.reported = Some(finished);
                self.pending = over;
                return Ok(WaitStep::Progress { finished, of });
            }
            if let Some(over) = over {
                return Ok(over);
            }
            tokio::time::sleep(WAIT_INTERVAL).await;
        }
    }

    /// The run as it ended: one that ended here between a read of its manifest and the look
    /// at its host says so in its record a moment later (a host that died leaves it running,
    /// and it is reported as it is).
    async fn settled(&self, mut manifest: RunManifest, why: WaitOver) -> RunManifest {
        if why != WaitOver::Ended || self.ignore.is_some() {
            return manifest;
        }
        for _ in 0..20 {
            if manifest.status != RunStatus::Running {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            match self.project.store().read_run(&self.run_id) {
                Ok(again) => manifest = again,
                Err(_) => break,
            }
        }
        manifest
    }
}

impl Project {
    /// Waits until `run_id` ends or one of its tasks asks a question, at most `timeout`,
    /// saying how many tasks have finished as it goes. `ignore` leaves one task out: a lead
    /// agent waiting in its own run, whose own task cannot finish while it waits — the wait
    /// is then over once every other task finished.
    pub fn wait_run(&self, run_id: &RunId, timeout: Duration, ignore: Option<TaskId>) -> RunWaiter {
        RunWaiter {
            project: self.clone(),
            run_id: run_id.clone(),
            ignore,
            deadline: tokio::time::Instant::now() + timeout,
            reported: None,
            pending: None,
        }
    }
}
