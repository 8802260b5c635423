//! Hosting runs in this process, for one project folder: the agent host, the control socket
//! other processes reach it through, the listing they read, cancellation, and one stream of
//! what happens.
//!
//! ```text
//! Host::start(&project, options)   agents, socket, published listing, runner
//!   .create(&spec) / .prepare_resume(&run) / .take_over(&run)
//!   .start_run(&run, resumes)  -> RunningRun
//!        .cancel(by)            first: graceful (work kept); again: kill (work still kept)
//!        .finish().await        the run's manifest once it ended
//!   .events()                  task status changes and agent events, as they happen
//!   .close().await             stops its runs (work kept) and waits for them; a drop starts it
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use camino::Utf8PathBuf;
use crew_core::model::{HostRecord, RunManifest};
use crew_core::{AgentId, CancelCause, CancelRecord, RunId, TaskId};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;

use crate::agent::FollowUpOutcome;
use crate::agent::env::BaseEnv;
use crate::agent::error::AgentOpError;
use crate::agent::events::AgentEvent;
use crate::control::agents::AgentHost;
use crate::control::publish::{Publisher, listing_path};
use crate::control::{ControlError, ControlServer};
use crate::project::open::Project;
use crate::project::runner::{CancelLevel, RunError, RunSpec, Runner, TaskActivity, TaskProgress};

/// The label of a detached run's host (`crew run --detach`): a session of its own, with no
/// terminal, started by this user for this user, so its run is theirs to cancel.
pub const DETACHED_HOST_LABEL: &str = "crew run --detach";

/// The label of the background host of a run a lead agent started over `crew mcp`: detached
/// the same way, so that the run outlives the lead agent's session.
pub const MCP_HOST_LABEL: &str = "crew mcp, detached";

/// Whether a host of this label was started detached: a session of its own, started by this
/// user for this user.
pub fn is_detached(label: &str) -> bool {
    [DETACHED_HOST_LABEL, MCP_HOST_LABEL].contains(&label)
}

/// How a host presents itself.
#[derive(Debug, Clone, Default)]
pub struct HostOptions {
    /// Says who hosts a run, in listings and refusals (`crew run`, an editor's name).
    pub label: String,
    /// A directory put first on every agent's `PATH`: the one holding the `crew` binary that
    /// agents call for `crew ask` and `crew submit`.
    pub crew_dir: Option<PathBuf>,
}

/// A host that could not start.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The agent host could not start.
    #[error("failed to start the agent host")]
    Agents(#[source] std::io::Error),
    /// The control socket could not be opened.
    #[error(transparent)]
    Socket(#[from] ControlError),
}

/// Runs of one project, hosted in this process.
///
/// Closing it ([`Host::close`], or dropping it) stops the runs going on in it, as a first
/// Ctrl-C does: their agents are stopped gracefully (TERM, grace, KILL), their work is saved
/// on their branches, and each run ends `cancelled`, recorded as [`CancelCause::HostClosed`].
/// No agent goes on that nobody could reach: its host's socket goes with the host. `close`
/// waits for that; a drop starts it and returns, and the runs end on the runtime they run on
/// (a runtime shut down first leaves them interrupted, as a killed host does: the next
/// `reconcile` marks them, and their work is still in their workspaces).
#[derive(Debug)]
pub struct Host {
    runner: Runner,
    server: ControlServer,
    _publisher: Publisher,
    going: Arc<Mutex<HashMap<RunId, Going>>>,
}

/// A run going on in a [`Host`], as closing the host sees it.
#[derive(Debug)]
struct Going {
    cancel: Arc<watch::Sender<CancelLevel>>,
    /// Closed when the run's task ends.
    ended: watch::Receiver<()>,
}

/// Something that happened in a run hosted here.
#[derive(Debug, Clone)]
pub enum HostEvent {
    /// A task changed status (its record tells its workspace, teardown and findings).
    Task(Box<TaskProgress>),
    /// An agent started, wrote a line, asked, changed state or exited.
    Agent(Box<AgentEvent>),
    /// A long step of preparing a task's workspace moved on (its checkout).
    Activity(TaskActivity),
}

/// The events of a host, as they happen. A listener that falls far behind loses the oldest
/// (and is told how many, as `Lagged`).
#[derive(Debug)]
pub struct HostEvents {
    tasks: broadcast::Receiver<TaskProgress>,
    agents: broadcast::Receiver<AgentEvent>,
    activity: broadcast::Receiver<TaskActivity>,
}

impl HostEvents {
    /// The next event; `None` once the host is gone.
    pub async fn next(&mut self) -> Option<Result<HostEvent, broadcast::error::RecvError>> {
        use broadcast::error::RecvError;
        let event = tokio::select! {
            biased;
            task = self.tasks.recv() => task.map(|task| HostEvent::Task(Box::new(task))),
            agent = self.agents.recv() => agent.map(|agent| HostEvent::Agent(Box::new(agent))),
            activity = self.activity.recv() => activity.map(HostEvent::Activity),
        };
        match event {
            Err(RecvError::Closed) => None,
            other => Some(other),
        }
    }

    /// An event already queued (of any kind, task changes first), without waiting; `None`
    /// when none is. A listener that fell behind skips what it lost.
    pub fn try_next(&mut self) -> Option<HostEvent> {
        use broadcast::error::TryRecvError;
        fn take<T: Clone>(receiver: &mut broadcast::Receiver<T>) -> Option<T> {
            loop {
                match receiver.try_recv() {
                    Ok(value) => return Some(value),
                    Err(TryRecvError::Lagged(_)) => continue,
                    Err(_) => return None,
                }
            }
        }
        if let Some(task) = take(&mut self.tasks) {
            return Some(HostEvent::Task(Box::new(task)));
        }
        if let Some(agent) = take(&mut self.agents) {
            return Some(HostEvent::Agent(Box::new(agent)));
        }
        take(&mut self.activity).map(HostEvent::Activity)
    }

    /// A task status change already queued, without waiting.
    pub fn try_next_task(&mut self) -> Option<TaskProgress> {
        loop {
            match self.tasks.try_recv() {
                Ok(change) => return Some(change),
                Err(broadcast::error::TryRecvError::Lagged(_)) => continue,
                Err(_) => return None,
            }
        }
    }
}

impl Host {
    /// Starts the agent host of `project`, binds its control socket and publishes its listing.
    pub async fn start(project: &Project, options: HostOptions) -> Result<Self, HostError> {
        let mut env = BaseEnv::from_process();
        if let Some(dir) = &options.crew_dir {
            env = env.with_path_first(dir);
        }
        let host = AgentHost::with_env(env).map_err(HostError::Agents)?;
        let server = ControlServer::bind(host.clone(), project.workspace().id()).await?;
        // The record the manifests of its runs will hold (see `Runner`): a listing that
        // carries it is trusted by readers without a manifest read.
        let record = crew_core::host::HostIdentity::current()
            .ok()
            .map(|identity| HostRecord {
                identity,
                socket: Some(server.path().to_owned()),
                label: Some(options.label.clone()),
            });
        let publisher = Publisher::start(
            host.clone(),
            record,
            project.workspace().id().clone(),
            listing_path(project.store().state_dir(), server.path()),
        );
        let runner = Runner::new(
            host,
            project.provider().clone(),
            project.workspace().clone(),
            project.config().clone(),
        )
        .with_label(options.label);
        server.feed_tasks(crate::control::watch::TaskFeed {
            workspace: project.workspace().id().clone(),
            changes: runner.progress_sender(),
        });
        Ok(Host {
            runner,
            server,
            _publisher: publisher,
            going: Arc::default(),
        })
    }

    /// Stops the runs going on here (see [`Host`]) and waits until each has ended and saved
    /// its agents' work.
    pub async fn close(self) {
        let going = self.take_going();
        for (run_id, run) in &going {
            if *run.cancel.borrow() == CancelLevel::None {
                self.runner
                    .record_cancel(run_id, CancelRecord::new(CancelCause::HostClosed))
                    .await;
                run.cancel.send_replace(CancelLevel::Graceful);
            }
        }
        for (_, mut run) in going {
            // Never sent: it returns once the run's task ended and dropped its sender.
            let _ = run.ended.changed().await;
        }
    }

    fn take_going(&self) -> Vec<(RunId, Going)> {
        let mut going = self
            .going
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        going.drain().collect()
    }

    /// The runner that runs this host's runs.
    pub fn runner(&self) -> &Runner {
        &self.runner
    }

    /// The control socket other processes reach this host through.
    pub fn socket(&self) -> Utf8PathBuf {
        self.server.path().to_owned()
    }

    /// Records a new run of `spec`, hosted here (nothing starts until [`Host::start_run`]).
    pub async fn create(&self, spec: &RunSpec) -> Result<RunManifest, RunError> {
        self.runner.create(spec, Some(self.socket())).await
    }

    /// Records a new run of `spec` for a host in another process to take over
    /// ([`Host::take_over`]: `crew run --detach` checks and creates it here, so that a refusal
    /// reaches the user, and hands it on). No host is recorded for it until then.
    pub async fn create_for_handover(&self, spec: &RunSpec) -> Result<RunManifest, RunError> {
        self.runner.create(spec, None).await
    }

    /// Takes up a run whose host is gone (see [`Runner::prepare_resume`]).
    pub async fn prepare_resume(&self, run_id: &RunId) -> Result<RunManifest, RunError> {
        self.runner
            .prepare_resume(run_id, Some(self.socket()))
            .await
    }

    /// Takes up a run whose host is gone for a follow-up of `task`, which runs again even
    /// when it succeeded (see [`Runner::prepare_follow_up`]).
    pub async fn prepare_follow_up(
        &self,
        run_id: &RunId,
        task: &TaskId,
    ) -> Result<RunManifest, RunError> {
        self.runner
            .prepare_follow_up(run_id, task, Some(self.socket()))
            .await
    }

    /// Records this host as the host of a run another process created for it.
    pub async fn take_over(&self, run_id: &RunId) -> Result<RunManifest, RunError> {
        self.runner.take_over(run_id, Some(self.socket())).await
    }

    /// Sends `message` to an agent of a run hosted here: after its turn, or as the answer it
    /// waits for ([`Project::follow_up`] reaches the agents of every host of the folder).
    pub async fn follow_up(
        &self,
        agent_id: &AgentId,
        message: &str,
    ) -> Result<FollowUpOutcome, AgentOpError> {
        let workspace = self.runner.workspace().id();
        let registry = self.runner.host().registry();
        registry
            .follow_up(workspace, &agent_id.to_string(), message)
            .await
            .map(|(_, outcome)| outcome)
    }

    /// Subscribes to what happens in the runs hosted here from now on.
    pub fn events(&self) -> HostEvents {
        HostEvents {
            tasks: self.runner.progress(),
            agents: self.runner.host().subscribe(),
            activity: self.runner.activity(),
        }
    }

    /// Runs `run_id` here until it ends, in the background. `resumes` names tasks to resume
    /// and the message for each (see [`Runner::execute`]).
    pub fn start_run(
        &self,
        run_id: &RunId,
        resumes: HashMap<TaskId, Option<String>>,
    ) -> RunningRun {
        let (cancel, cancel_rx) = watch::channel(CancelLevel::None);
        let cancel = Arc::new(cancel);
        let (ended_tx, ended) = watch::channel(());
        let (commands_tx, commands_rx) = mpsc::channel(16);
        self.server.attach_run(run_id.clone(), commands_tx);
        let routes = self.server.routes();
        let runner = self.runner.clone();
        let socket = self.socket();
        let id = run_id.clone();
        let going = self.going.clone();
        going
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(
                run_id.clone(),
                Going {
                    cancel: cancel.clone(),
                    ended,
                },
            );
        let task = tokio::spawn(async move {
            let heartbeat = tokio::spawn(mark_alive(runner.store().clone(), id.clone()));
            let result = runner
                .execute(&id, Some(socket), cancel_rx, commands_rx, resumes)
                .await;
            heartbeat.abort();
            routes.remove(&id);
            forget_run(runner.host(), &id);
            going
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .remove(&id);
            drop(ended_tx);
            result
        });
        RunningRun {
            run_id: run_id.clone(),
            runner: self.runner.clone(),
            cancel,
            task,
        }
    }
}

impl Drop for Host {
    /// Starts stopping the runs going on here (see [`Host`]), without waiting.
    fn drop(&mut self) {
        for (run_id, run) in self.take_going() {
            if *run.cancel.borrow() != CancelLevel::None {
                continue;
            }
            let by = CancelRecord::new(CancelCause::HostClosed);
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    let runner = self.runner.clone();
                    runtime.spawn(async move {
                        runner.record_cancel(&run_id, by).await;
                        run.cancel.send_replace(CancelLevel::Graceful);
                    });
                }
                // No runtime to record on: the run still stops, and says it was cancelled.
                Err(_) => {
                    run.cancel.send_replace(CancelLevel::Graceful);
                }
            }
        }
    }
}

/// A run going on in a [`Host`].
#[derive(Debug)]
pub struct RunningRun {
    run_id: RunId,
    runner: Runner,
    cancel: Arc<watch::Sender<CancelLevel>>,
    task: JoinHandle<Result<RunManifest, RunError>>,
}

/// Cancels a [`RunningRun`] from elsewhere (a signal handler, an editor's cancel).
#[derive(Debug, Clone)]
pub struct Canceller {
    run_id: RunId,
    runner: Runner,
    cancel: Arc<watch::Sender<CancelLevel>>,
}

impl Canceller {
    /// The first call stops every agent gracefully (TERM, grace, KILL) and keeps their work,
    /// recording who asked; the next kills them at once (the work is still saved). Returns the
    /// level reached.
    pub async fn cancel(&self, by: CancelRecord) -> CancelLevel {
        let next = match *self.cancel.borrow() {
            CancelLevel::None => CancelLevel::Graceful,
            _ => CancelLevel::Kill,
        };
        if next == CancelLevel::Graceful {
            self.runner.record_cancel(&self.run_id, by).await;
        }
        self.cancel.send_replace(next);
        next
    }
}

impl RunningRun {
    /// The run's id.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// A handle that cancels this run, for whoever decides when.
    pub fn canceller(&self) -> Canceller {
        Canceller {
            run_id: self.run_id.clone(),
            runner: self.runner.clone(),
            cancel: self.cancel.clone(),
        }
    }

    /// Waits for the run to end; its manifest as it ended.
    pub async fn finish(self) -> Result<RunManifest, RunError> {
        self.task.await.expect("a run's task does not panic")
    }
}

/// Stops and forgets every agent of `run_id` in the host (after the run ended).
fn forget_run(host: &AgentHost, run_id: &RunId) {
    for handle in host.registry().all() {
        if handle.agent_id().run_id() == run_id {
            host.registry().remove(handle.agent_id());
        }
    }
}

/// How often a host says that a run it hosts is alive.
const ALIVE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Marks `run_id` alive in `store` every [`ALIVE_EVERY`] until aborted: if this host dies
/// unrecorded (SIGKILL, a lost machine), its tasks end when it was last seen alive, not when an
/// agent last printed. A mark that cannot be made costs only that precision.
async fn mark_alive(store: std::sync::Arc<crew_core::store::StateStore>, run_id: RunId) {
    let mut every = tokio::time::interval(ALIVE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once: the run's start wrote its record just now.
    every.tick().await;
    loop {
        every.tick().await;
        let (store, run_id) = (store.clone(), run_id.clone());
        // A mark not made (a full disk) only makes the host look older to a reconcile; the next
        // tick tries again.
        let _ = tokio::task::spawn_blocking(move || store.mark_alive(&run_id)).await;
    }
}
