//! The supervisor of one agent: the tokio task that owns its process and `select!`s over
//! its exit, control messages, the stop ladder and the timeout (the lifecycle in the module
//! above); its restarts, steers, follow-ups and checks.

use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crew_core::config::Protocol;
use crew_core::model::{CheckRecord, ExitRecord, StopSignal};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::launch::launch;
use crate::agent::acp::AcpInput;
use crate::agent::error::AgentOpError;
use crate::agent::events::{AgentEvent, answer, emit};
use crate::agent::launch::Running;
use crate::agent::output::OutputTail;
use crate::agent::placed::PlacedInput;
use crate::agent::spec::{AgentSpec, DEFAULT_RESUME_MESSAGE, Launcher};
use crate::agent::status::{AgentState, AgentStatus, FollowUpOutcome, StopOutcome};

mod between;
mod handle;
mod turn;

pub(crate) use handle::{Control, Started};

/// How long the output pipes may stay open after the agent exited before crew counts the
/// holders as leaked processes.
const PIPE_GRACE: Duration = Duration::from_millis(300);
/// How long an agent whose session is over (an `acp` agent's, a `claude-stream-json` agent's
/// after its result) may take to exit before crew ends it (TERM, then KILL as late again).
const SESSION_OVER_GRACE: Duration = Duration::from_secs(5);
/// How often an agent's proxy is asked whether all its requests fail upstream.
const NETWORK_CHECK: Duration = Duration::from_secs(1);
/// The fewest failed requests that make an agent's network unreachable.
const MIN_UNREACHABLE_FAILURES: u64 = 3;
/// How recent the last failed request must be: an agent whose requests failed a while ago and
/// that has asked for nothing since works on without the network, and is left to.
const STILL_TRYING: Duration = Duration::from_secs(60);

pub(super) struct Supervisor {
    spec: AgentSpec,
    launcher: Launcher,
    control: mpsc::Receiver<Control>,
    status: watch::Sender<AgentStatus>,
    tail: Arc<Mutex<OutputTail>>,
    follow_ups: VecDeque<String>,
    /// The tool calls of the turn under way.
    turn_tools: TurnTools,
    /// How long the program last waited to try the model's API again after a 429, in the turn
    /// under way: the API's `retry-after` as the program read it, and so when a limit it then
    /// gave up on may lift.
    limit_wait: Option<Duration>,
}

/// The tool calls of one turn, for a turn whose every call failed: a program that cannot run
/// anything (its own sandbox refused inside crew's, a home it may not write) says only that
/// its turn ended, and its task would look done.
#[derive(Debug, Default)]
pub(super) struct TurnTools {
    succeeded: u32,
    failed: Vec<String>,
    change_failed: bool,
}

impl TurnTools {
    /// Why the turn failed, when every tool call failed and that cannot be an ordinary answer:
    /// two calls or more, or a change to files. One failing command (a `grep` that found
    /// nothing) may be how the agent learnt its answer.
    fn all_failed(&self) -> Option<String> {
        let calls = self.failed.len();
        (self.succeeded == 0 && (calls >= 2 || (calls == 1 && self.change_failed))).then(|| {
            format!(
                "every tool call of its last turn failed ({calls}); the first: {}",
                self.failed[0]
            )
        })
    }
}

/// How far a supervisor has gone in stopping its agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stopping {
    /// Nobody asked it to stop.
    No,
    /// TERM sent: KILL follows at `kill_at` unless the agent exits first.
    Terminated { kill_at: Instant },
    /// KILL sent.
    Killed,
}

impl Stopping {
    /// When KILL is due.
    fn kill_at(self) -> Option<Instant> {
        match self {
            Stopping::Terminated { kill_at } => Some(kill_at),
            Stopping::No | Stopping::Killed => None,
        }
    }
}

/// What a running process's supervision ended with.
pub(super) struct Ended {
    exit: ExitRecord,
    stop_waiters: Vec<oneshot::Sender<StopOutcome>>,
    /// The host dropped every handle: shut down.
    host_gone: bool,
}

/// Why the exited phase ended.
pub(super) enum Next {
    Restart {
        message: Option<String>,
        reply: Option<oneshot::Sender<Result<u32, AgentOpError>>>,
        follow_up_reply: Option<oneshot::Sender<Result<FollowUpOutcome, AgentOpError>>>,
    },
    Shutdown,
}

impl Supervisor {
    pub(super) async fn run_from_idle(mut self) {
        let next = self.idle().await;
        if let Some(running) = self.restart(next).await {
            self.run(running).await;
        }
    }

    pub(super) async fn run(mut self, mut running: Running) {
        loop {
            let ended = self.supervise(running).await;
            let stopped = ended.exit.stopped_by.is_some();
            emit(
                &self.launcher.events,
                AgentEvent::Exited {
                    agent_id: self.spec.agent_id.clone(),
                    exit: ended.exit.clone(),
                },
            );
            if ended.host_gone {
                return;
            }
            // Follow-ups queued during the run resume the agent at once, unless it was stopped
            // (by a person, or short of them at a spend cap: a person decides).
            let capped = self
                .status
                .borrow()
                .over_cap
                .as_ref()
                .is_some_and(|over| over.stopped_short);
            let queued = if stopped || capped {
                None
            } else {
                self.follow_ups.pop_front()
            };
            let next = match queued {
                Some(message) => Next::Restart {
                    message: Some(message),
                    reply: None,
                    follow_up_reply: None,
                },
                None => {
                    self.status.send_modify(|status| {
                        status.state = AgentState::Exited;
                        status.exit = Some(ended.exit.clone());
                        status.set_follow_ups(&self.follow_ups);
                    });
                    self.publish_status();
                    let outcome = match ended.exit.stopped_by {
                        Some(StopSignal::Kill) => StopOutcome::Killed,
                        Some(StopSignal::Term) => StopOutcome::Terminated,
                        None => StopOutcome::AlreadyExited,
                    };
                    for waiter in ended.stop_waiters {
                        answer(waiter, outcome);
                    }
                    self.idle().await
                }
            };
            match self.restart(next).await {
                Some(next_running) => running = next_running,
                None => return,
            }
        }
    }

    /// Starts the agent again in its workspace (the `resume` template when it has one); a
    /// restart that fails is reported to whoever asked, and the agent stays exited until the
    /// next request.
    async fn restart(&mut self, mut next: Next) -> Option<Running> {
        loop {
            let Next::Restart {
                message,
                reply,
                follow_up_reply,
            } = next
            else {
                return None;
            };
            // A resume without a message delivers the oldest follow-up still queued (one sent
            // before a stop), else the default message of a `resume` template.
            let definition = &self.spec.definition;
            // An agent that never started (its task paused at a spend cap before it began)
            // starts as it would have: its command, its prompt.
            let never_started = self.status.borrow().attempt == 0;
            let message = match never_started {
                true => None,
                false => message.or_else(|| self.follow_ups.pop_front()).or_else(|| {
                    (definition.resume.is_some() || definition.protocol == Protocol::Acp)
                        .then(|| DEFAULT_RESUME_MESSAGE.to_owned())
                }),
            };
            let (session, cost_here) = {
                let status = self.status.borrow();
                (
                    status
                        .session_id
                        .clone()
                        .or_else(|| self.spec.session_id.clone()),
                    status.usage.map(|usage| usage.cost_usd),
                )
            };
            // Recorded starts, and this host's: unknown when either did not say.
            let session_cost = match cost_here {
                None => self.spec.session_cost,
                Some(here) => here
                    .zip(self.spec.session_cost.or(Some(0.0)))
                    .map(|(a, b)| a + b),
            };
            if let Some(meter) = &self.spec.spend {
                meter.going_on();
            }
            match launch(
                &self.spec,
                &self.launcher,
                &self.tail,
                message.as_deref(),
                session.as_deref(),
                session_cost,
            )
            .await
            {
                Ok(running) => {
                    let pid = running.pid;
                    let sandbox = running.sandbox.clone();
                    let meter = running.cgroup.as_ref().map(|group| group.meter());
                    // A new process starts its turn afresh.
                    self.turn_tools = TurnTools::default();
                    self.limit_wait = None;
                    self.status.send_modify(|status| {
                        status.state = AgentState::Running;
                        status.idle = false;
                        status.pid = Some(pid);
                        status.sandbox = Some(sandbox);
                        status.meter = meter;
                        status.attempt += 1;
                        status.question = None;
                        status.asks_alive = false;
                        // A limit its last start hit is behind it, and a cap it reached was
                        // let go on.
                        status.limit = None;
                        status.over_cap = None;
                        status.set_follow_ups(&self.follow_ups);
                    });
                    let attempt = self.status.borrow().attempt;
                    emit(
                        &self.launcher.events,
                        AgentEvent::Started {
                            agent_id: self.spec.agent_id.clone(),
                            pid,
                            attempt,
                        },
                    );
                    self.publish_status();
                    if let Some(reply) = reply {
                        answer(reply, Ok(pid));
                    }
                    if let Some(reply) = follow_up_reply {
                        answer(reply, Ok(FollowUpOutcome::Resumed { pid }));
                    }
                    return Some(running);
                }
                Err(error) => {
                    let failure = AgentOpError::Restart {
                        agent_id: self.spec.agent_id.clone(),
                        reason: error.to_string(),
                    };
                    if let Some(reply) = reply {
                        answer(reply, Err(failure.clone()));
                    }
                    if let Some(reply) = follow_up_reply {
                        answer(reply, Err(failure));
                    }
                    self.status
                        .send_modify(|status| status.state = AgentState::Exited);
                    self.publish_status();
                    next = self.idle().await;
                }
            }
        }
    }

    fn publish_status(&self) {
        emit(
            &self.launcher.events,
            AgentEvent::Status {
                agent_id: self.spec.agent_id.clone(),
                status: Box::new(self.status.borrow().clone()),
            },
        );
    }

    fn signal_group(&self, pid: u32, signal: rustix::process::Signal) {
        // A Slurm job is signalled through Slurm: TERM reaches its shim, which stops its task
        // gracefully and sends its work back (a TERM to `srun` would end the job at once);
        // KILL cancels it, and `srun` goes with its group.
        if let Some(job) = self
            .spec
            .placed
            .as_ref()
            .and_then(|placed| placed.slurm_job.as_deref())
        {
            if signal == rustix::process::Signal::TERM {
                crate::agent::slurm::signal(job, Some("TERM"));
                return;
            }
            crate::agent::slurm::signal(job, None);
        }
        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
            // Fails only when the group is gone: nothing left to signal.
            let _ = rustix::process::kill_process_group(pid, signal);
        }
    }

    /// Sends TERM to the agent's group, says it is stopping, and gives it `grace` before KILL.
    fn terminate(&self, pid: u32, grace: Duration) -> Stopping {
        self.signal_group(pid, rustix::process::Signal::TERM);
        self.status
            .send_modify(|status| status.state = AgentState::Stopping);
        self.publish_status();
        Stopping::Terminated {
            kill_at: Instant::now() + grace,
        }
    }

    /// Supervises one running process until it has exited and its leftovers are gone.
    async fn supervise(&mut self, mut running: Running) -> Ended {
        let pid = running.pid;
        let grace = self.spec.stop_grace;
        let timeout_at = self.spec.timeout.map(|timeout| Instant::now() + timeout);
        let mut stopping = Stopping::No;
        let mut timed_out = false;
        let mut host_gone = false;
        let mut stop_waiters = Vec::new();
        let far_future = Instant::now() + Duration::from_secs(100 * 365 * 86_400);
        // When an agent whose session is over and that has not exited is ended by crew.
        let mut linger_until: Option<Instant> = None;
        let mut ended_after_session = false;
        // Whether its requests through its proxy have all failed upstream for too long.
        let unreachable_timeout = self
            .spec
            .unreachable_timeout
            .filter(|_| running.proxy.is_some());
        let mut network_checks = tokio::time::interval(NETWORK_CHECK);
        network_checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ended_unreachable = false;

        let status = loop {
            tokio::select! {
                status = running.child.wait() => break status,
                message = self.control.recv(), if !host_gone => match message {
                    Some(Control::Stop { reply }) => {
                        stop_waiters.push(reply);
                        if stopping == Stopping::No {
                            stopping = self.terminate(pid, grace);
                        } else {
                            // A second stop kills at once.
                            self.signal_group(pid, rustix::process::Signal::KILL);
                            stopping = Stopping::Killed;
                        }
                    }
                    Some(Control::Steer { message, reply }) => {
                        let closed = || AgentOpError::Input {
                            agent_id: self.spec.agent_id.clone(),
                            reason: "its protocol connection is closed".to_owned(),
                        };
                        let result = match (&running.acp, &running.placed) {
                            (Some(acp), _) => {
                                acp.inputs.send(AcpInput::Steer(message)).map_err(|_| closed())
                            }
                            (_, Some(placed)) => placed
                                .inputs
                                .send(PlacedInput::Steer(message))
                                .map_err(|_| closed()),
                            (None, None) => self.steer(running.stdin.as_mut(), &message).await,
                        };
                        if result.is_ok() {
                            self.status.send_modify(|status| status.idle = false);
                        }
                        answer(reply, result);
                    }
                    Some(Control::FollowUp { message, reply }) if running.placed.is_some() => {
                        // The placement's agent takes it: as the answer to its question, or
                        // queued there for the end of its turn.
                        let asked = self.status.borrow().question.is_some();
                        let sent = running.placed.as_ref().is_some_and(|placed| {
                            placed.inputs.send(PlacedInput::FollowUp(message)).is_ok()
                        });
                        answer(reply, match (sent, asked) {
                            (false, _) => Err(AgentOpError::Input {
                                agent_id: self.spec.agent_id.clone(),
                                reason: "its placement's connection is closed".to_owned(),
                            }),
                            (true, true) => Ok(FollowUpOutcome::Answered),
                            (true, false) => Ok(FollowUpOutcome::Queued { position: 1 }),
                        });
                    }
                    Some(Control::FollowUp { message, reply }) => {
                        // A question the live agent waits on takes the message as its answer.
                        let answered = self.status.borrow().asks_alive
                            && running.acp.as_ref().is_some_and(|acp| {
                                acp.inputs.send(AcpInput::Answer(message.clone())).is_ok()
                            });
                        if answered {
                            self.status.send_modify(|status| {
                                status.question = None;
                                status.asks_alive = false;
                            });
                            self.publish_status();
                            answer(reply, Ok(FollowUpOutcome::Answered));
                        } else {
                            self.follow_ups.push_back(message);
                            let position = self.follow_ups.len();
                            self.status
                                .send_modify(|status| status.set_follow_ups(&self.follow_ups));
                            answer(reply, Ok(FollowUpOutcome::Queued { position }));
                        }
                    }
                    Some(Control::Resume { reply, .. }) => {
                        answer(reply, Err(AgentOpError::AlreadyRunning {
                            agent_id: self.spec.agent_id.clone(),
                        }));
                    }
                    Some(Control::Ask { question, reply }) => {
                        self.status.send_modify(|status| status.question = Some(question.clone()));
                        emit(&self.launcher.events, AgentEvent::Question {
                            agent_id: self.spec.agent_id.clone(),
                            question,
                        });
                        self.publish_status();
                        answer(reply, Ok(()));
                    }
                    Some(Control::Close { reply }) => {
                        answer(reply, false);
                    }
                    Some(Control::Check { command, reply, .. }) => {
                        answer(reply, refused_check(command, "its agent is running again"));
                    }
                    None => {
                        // Every handle is gone: the host is shutting down.
                        host_gone = true;
                        self.signal_group(pid, rustix::process::Signal::KILL);
                        stopping = Stopping::Killed;
                    }
                },
                _ = tokio::time::sleep_until(stopping.kill_at().unwrap_or(far_future)), if stopping.kill_at().is_some() => {
                    self.signal_group(pid, rustix::process::Signal::KILL);
                    stopping = Stopping::Killed;
                }
                _ = tokio::time::sleep_until(timeout_at.unwrap_or(far_future)), if timeout_at.is_some() && stopping == Stopping::No => {
                    timed_out = true;
                    stopping = self.terminate(pid, grace);
                }
                _ = network_checks.tick(), if unreachable_timeout.is_some() && stopping == Stopping::No => {
                    let down = running.proxy.as_ref().and_then(|proxy| proxy.counts().unreachable());
                    if let (Some(down), Some(timeout)) = (down, unreachable_timeout)
                        && down.since.elapsed() >= timeout
                        && down.failures >= MIN_UNREACHABLE_FAILURES
                        && down.last_at.elapsed() <= STILL_TRYING
                    {
                        let said = format!(
                            "crew ended the agent: for {} every request it made through crew's proxy failed ({} of them) and none got through; the last: {} (`[run] unreachable_timeout`; `crew agents resume {}` once it can be reached)",
                            crew_core::config::HumanDuration(Duration::from_secs(down.since.elapsed().as_secs())),
                            down.failures,
                            down.last,
                            self.spec.agent_id,
                        );
                        self.status.send_modify(|status| {
                            status.unreachable = Some(crate::agent::status::Unreachable { said, ended_by_crew: true });
                        });
                        ended_unreachable = true;
                        stopping = self.terminate(pid, grace);
                    }
                }
                _ = tokio::time::sleep_until(linger_until.unwrap_or(far_future)), if linger_until.is_some() && stopping == Stopping::No => {
                    // Its session is over and it does not exit (claude-code-acp ignores the
                    // end of its input): crew ends it, which is no failure of its task.
                    ended_after_session = true;
                    stopping = self.terminate(pid, grace.min(SESSION_OVER_GRACE));
                }
                Some(event) = running.protocol.recv() => {
                    self.heard(event, &mut running).await;
                    if running.session_over && linger_until.is_none() {
                        linger_until = Some(Instant::now() + SESSION_OVER_GRACE);
                    }
                }
            }
        };
        drop(running.stdin.take());
        let acp = running.acp.take();
        let placed = running.placed.take();

        let mut exit = ExitRecord {
            code: None,
            signal: None,
            stopped_by: None,
            leaked_processes: 0,
            timed_out,
            ended_after_session: false,
            network: None,
            used: None,
        };
        match status {
            Ok(status) => {
                exit.code = status.code();
                exit.signal = status.signal();
            }
            Err(_) => exit.signal = Some(libc::SIGKILL),
        }
        exit.stopped_by = match stopping {
            Stopping::No => None,
            Stopping::Terminated { .. } => Some(StopSignal::Term),
            Stopping::Killed => Some(StopSignal::Kill),
        };
        if ended_after_session && stop_waiters.is_empty() && !timed_out {
            // crew's own end of a finished session: not a stop anyone asked for.
            exit.stopped_by = None;
            exit.ended_after_session = true;
        }
        if ended_unreachable && stop_waiters.is_empty() && !timed_out {
            // crew's own end of an agent that could reach nothing: its task fails, saying so.
            exit.stopped_by = None;
        }
        exit.leaked_processes = running.leftovers.get().saturating_add(
            self.clean_up_leftovers(pid, &mut running.readers, stopping == Stopping::Killed)
                .await,
        );
        // Its output is read to the end now: what its protocol said last (often the end of
        // its turn, printed just before it exited) counts too.
        if let Some(acp) = acp {
            // Its stdout is read to the end: the connection ends with what it said last.
            let mut driver = acp.driver;
            if tokio::time::timeout(PIPE_GRACE, &mut driver).await.is_err() {
                driver.abort();
            }
        }
        if let Some(placed) = placed {
            // The transport's stdout is read to the end: the driver has heard all it will.
            let mut driver = placed.driver;
            if tokio::time::timeout(PIPE_GRACE, &mut driver).await.is_err() {
                driver.abort();
            }
        }
        while let Ok(event) = running.protocol.try_recv() {
            self.heard(event, &mut running).await;
        }
        if running.lost_before_start
            && let Some(said) = transport_said(&self.tail)
        {
            // Where the user looks (the task's reason), not only in `output.log`.
            self.status.send_modify(|status| {
                if let Some(lost) = &mut status.lost {
                    lost.push_str(&format!("; the transport said: {said}"));
                }
            });
        }
        // A question that waited on the live agent waits for its next start now.
        let refused = running.refusals.as_ref().map(|refusals| {
            refusals
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .found()
                .to_vec()
        });
        // What its caps' cgroup measured; the group goes (its processes were killed with it,
        // and the kernel may take a moment to let go of the last: not on this thread).
        if let Some(group) = running.cgroup.take() {
            exit.used = Some(group.usage());
            tokio::task::spawn_blocking(move || drop(group));
        }
        // Its last connections ended with it; the proxy goes with this process.
        let proxy = running.proxy.take();
        // Counted where it asked: a proxy nobody used (crew's default for a shell) says nothing.
        exit.network = proxy
            .as_ref()
            .map(|proxy| proxy.counts().record())
            .filter(|counts| counts.allowed > 0 || counts.refused > 0);
        let refused_hosts = proxy
            .as_ref()
            .map(|proxy| proxy.counts().refusals())
            .unwrap_or_default();
        // Failing upstream as it ended by itself: what its proxy met is part of why.
        let down = proxy
            .as_ref()
            .and_then(|proxy| proxy.counts().unreachable())
            .filter(|_| !ended_unreachable)
            .map(|down| crate::agent::status::Unreachable {
                said: format!(
                    "its last {} request(s) through crew's proxy failed and none got through since: {}",
                    down.failures, down.last
                ),
                ended_by_crew: false,
            });
        drop(proxy);
        self.status.send_modify(|status| {
            status.asks_alive = false;
            status.refused_writes = refused.unwrap_or_default();
            status.refused_hosts = refused_hosts;
            if down.is_some() {
                status.unreachable = down;
            }
        });
        Ended {
            exit,
            stop_waiters,
            host_gone,
        }
    }
}

/// Waits for the readers, dropping each as it finishes, so that a wait cut short by a timeout
/// can be taken up again without polling a finished task twice.
pub(super) async fn join_all(readers: &mut Vec<JoinHandle<()>>) {
    while let Some(reader) = readers.last_mut() {
        // A reader that panicked has stopped reading: its output is over either way.
        let _ = reader.await;
        readers.pop();
    }
}

/// What a placement's transport said last about why it failed: its `error:`/`caused by:`/
/// `hint:` lines (crew's own way of failing), else its last line that is not crew's note.
pub(super) fn transport_said(tail: &Mutex<OutputTail>) -> Option<String> {
    let lines = tail
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .last_lines();
    let errors: Vec<&str> = lines
        .iter()
        .map(|line| line.trim())
        .filter(|line| {
            ["error:", "caused by:", "hint:"]
                .iter()
                .any(|prefix| line.starts_with(prefix))
        })
        .collect();
    if !errors.is_empty() {
        return Some(errors.join("; "));
    }
    lines
        .iter()
        .rev()
        .map(|line| line.trim())
        .find(|line| !line.is_empty() && !line.starts_with('['))
        .map(str::to_owned)
}

/// A protocol as its agent definition names it.
pub(super) fn protocol_name(protocol: Protocol) -> String {
    serde_json::to_value(protocol)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Spawns the supervisor task, from a running process or from the exited phase.
pub(super) fn supervise_from(
    spec: AgentSpec,
    launcher: Launcher,
    tail: Arc<Mutex<OutputTail>>,
    mut status: AgentStatus,
    running: Option<Running>,
) -> Started {
    let follow_ups = VecDeque::from(spec.follow_ups.clone());
    status.set_follow_ups(&follow_ups);
    let (control_tx, control_rx) = mpsc::channel(64);
    let (status_tx, status_rx) = watch::channel(status);
    let supervisor = Supervisor {
        spec,
        launcher,
        control: control_rx,
        status: status_tx,
        tail: tail.clone(),
        follow_ups,
        turn_tools: TurnTools::default(),
        limit_wait: None,
    };
    match running {
        Some(running) => tokio::spawn(supervisor.run(running)),
        None => tokio::spawn(supervisor.run_from_idle()),
    };
    Started {
        control: control_tx,
        status: status_rx,
        tail,
    }
}

/// A check that was not run, and why: it did not pass.
fn refused_check(command: String, why: &str) -> CheckRecord {
    CheckRecord {
        passed: Some(false),
        error: Some(why.to_owned()),
        ..CheckRecord::pending(command)
    }
}
