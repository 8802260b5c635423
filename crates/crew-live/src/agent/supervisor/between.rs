//! What a supervisor does outside the running turn: a steer delivered (stdin, or the
//! protocol's next prompt), the wait of an exited agent for a follow-up, a resume or its
//! close, the task's check run confined like the agent, and the leftovers of an exit killed.

use std::time::Duration;

use camino::Utf8Path;
use crew_core::config::SteerMode;
use crew_core::model::CheckRecord;
use crew_sandbox::procscan;
use crew_sandbox::spawn::AgentInput;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::handle::Control;
use super::{Next, PIPE_GRACE, Supervisor, join_all, refused_check};
use crate::agent::error::AgentOpError;
use crate::agent::events::answer;
use crate::agent::launch::{STEER_TIMEOUT, user_message_line};
use crate::agent::status::StopOutcome;

impl Supervisor {
    /// After the agent exited (and its warden killed what it left beneath it): kills what is
    /// still in its group and what still holds its pipes, and — when the warden itself was
    /// killed (`warden_killed`, a KILL to the group), so nothing was left beneath it to catch
    /// daemons — what carries the agent's marker anywhere. Returns how many processes that was.
    pub(super) async fn clean_up_leftovers(
        &self,
        pid: u32,
        readers: &mut Vec<JoinHandle<()>>,
        warden_killed: bool,
    ) -> u32 {
        let mut leaked = 0;
        let group_alive = rustix::process::Pid::from_raw(pid as i32)
            .is_some_and(|pid| rustix::process::test_kill_process_group(pid).is_ok());
        if group_alive {
            leaked += 1;
            self.signal_group(pid, rustix::process::Signal::KILL);
        }
        let pipes_closed = tokio::time::timeout(PIPE_GRACE, join_all(readers))
            .await
            .is_ok();
        if warden_killed || !pipes_closed {
            let marker = procscan::agent_marker(&self.spec.agent_id);
            let killed = tokio::task::spawn_blocking(move || procscan::kill_marked(&marker))
                .await
                .unwrap_or(0);
            leaked += u32::try_from(killed).unwrap_or(u32::MAX);
        }
        if !pipes_closed {
            leaked = leaked.max(1);
            self.signal_group(pid, rustix::process::Signal::KILL);
            if tokio::time::timeout(PIPE_GRACE, join_all(readers))
                .await
                .is_err()
            {
                // Someone outside crew's reach holds the pipes: stop reading, never block.
                for reader in readers.iter() {
                    reader.abort();
                }
            }
        }
        leaked
    }

    pub(super) async fn steer(
        &self,
        stdin: Option<&mut AgentInput>,
        message: &str,
    ) -> Result<(), AgentOpError> {
        let agent_id = self.spec.agent_id.clone();
        let mode = self.spec.definition.steer;
        let Some(stdin) = stdin.filter(|_| mode != SteerMode::None) else {
            return Err(AgentOpError::SteerUnsupported { agent_id });
        };
        let mut line = match mode {
            SteerMode::StdinJson => user_message_line(message),
            _ => message.to_owned(),
        };
        line.push('\n');
        let write = async {
            stdin.write_all(line.as_bytes()).await?;
            stdin.flush().await
        };
        match tokio::time::timeout(STEER_TIMEOUT, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(AgentOpError::Input {
                agent_id,
                reason: error.to_string(),
            }),
            Err(_) => Err(AgentOpError::Input {
                agent_id,
                reason: format!("the agent did not read its input within {STEER_TIMEOUT:?}"),
            }),
        }
    }

    /// The exited phase: answers control messages until a resume or follow-up restarts the
    /// agent, or the host lets go.
    pub(super) async fn idle(&mut self) -> Next {
        loop {
            let Some(message) = self.control.recv().await else {
                return Next::Shutdown;
            };
            let agent_id = self.spec.agent_id.clone();
            let closed = self.status.borrow().closed;
            match message {
                Control::Resume { message, reply } => {
                    if closed {
                        answer(reply, Err(AgentOpError::Closed { agent_id }));
                        continue;
                    }
                    return Next::Restart {
                        message,
                        reply: Some(reply),
                        follow_up_reply: None,
                    };
                }
                Control::FollowUp { message, reply } => {
                    if closed {
                        answer(reply, Err(AgentOpError::Closed { agent_id }));
                        continue;
                    }
                    return Next::Restart {
                        message: Some(message),
                        reply: None,
                        follow_up_reply: Some(reply),
                    };
                }
                Control::Stop { reply } => {
                    // Its task, paused at a cap or a limit, ends on it.
                    let paused = {
                        let status = self.status.borrow();
                        status.over_cap.is_some() || status.limit.is_some()
                    };
                    self.status.send_modify(|status| status.stops_asked += 1);
                    answer(
                        reply,
                        match paused {
                            true => StopOutcome::EndedPaused,
                            false => StopOutcome::AlreadyExited,
                        },
                    );
                }
                Control::Steer { reply, .. } => {
                    answer(reply, Err(AgentOpError::NotRunning { agent_id }));
                }
                Control::Ask { reply, .. } => {
                    answer(reply, Err(AgentOpError::NotRunning { agent_id }));
                }
                Control::Close { reply } => {
                    self.status.send_modify(|status| status.closed = true);
                    answer(reply, true);
                }
                Control::Check {
                    command,
                    log,
                    timeout,
                    reply,
                } => {
                    let (record, host_gone) = self.check(&command, &log, timeout).await;
                    answer(reply, record);
                    if host_gone {
                        return Next::Shutdown;
                    }
                }
            }
        }
    }

    /// Runs the task's check while answering control messages: a stop stops the check (TERM,
    /// grace, KILL; a second stop kills at once), as it would the agent. Returns the record,
    /// and whether the host let go meanwhile.
    pub(super) async fn check(
        &mut self,
        command: &str,
        log: &Utf8Path,
        timeout: Duration,
    ) -> (CheckRecord, bool) {
        self.status.send_modify(|status| status.checking = true);
        self.publish_status();
        let (stop, stop_requests) = watch::channel(0u32);
        let launcher = self.launcher.clone();
        let spec = self.spec.clone();
        let check =
            crate::agent::check::run_check(&launcher, &spec, command, log, timeout, stop_requests);
        tokio::pin!(check);
        let mut stop_waiters = Vec::new();
        let mut host_gone = false;
        let (record, ending) = loop {
            tokio::select! {
                ended = &mut check => break ended,
                message = self.control.recv(), if !host_gone => {
                    let agent_id = self.spec.agent_id.clone();
                    match message {
                        Some(Control::Stop { reply }) => {
                            stop_waiters.push(reply);
                            stop.send_modify(|requests| *requests += 1);
                        }
                        None => {
                            // Every handle is gone: the host is shutting down.
                            host_gone = true;
                            stop.send_modify(|requests| *requests += 2);
                        }
                        Some(Control::Resume { reply, .. }) => {
                            answer(reply, Err(AgentOpError::Checking { agent_id }));
                        }
                        Some(Control::FollowUp { reply, .. }) => {
                            answer(reply, Err(AgentOpError::Checking { agent_id }));
                        }
                        Some(Control::Steer { reply, .. }) => {
                            answer(reply, Err(AgentOpError::Checking { agent_id }));
                        }
                        Some(Control::Ask { reply, .. }) => {
                            answer(reply, Err(AgentOpError::NotRunning { agent_id }));
                        }
                        Some(Control::Close { reply }) => answer(reply, false),
                        Some(Control::Check { command, reply, .. }) => {
                            answer(reply, refused_check(command, "another check of the task runs"));
                        }
                    }
                }
            }
        };
        let outcome = if ending.killed {
            StopOutcome::Killed
        } else {
            StopOutcome::Terminated
        };
        for waiter in stop_waiters {
            answer(waiter, outcome);
        }
        self.status.send_modify(|status| status.checking = false);
        self.publish_status();
        (record, host_gone)
    }
}
