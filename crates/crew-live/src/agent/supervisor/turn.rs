//! What a supervisor does with what the agent's protocol says during a turn: sessions,
//! usage, tool calls, questions, the end of a turn.

use crew_core::config::Protocol;
use crew_core::model::{Timestamp, Usage};

use super::{Supervisor, protocol_name};
use crate::agent::acp::AcpInput;
use crate::agent::events::{AgentEvent, emit};
use crate::agent::launch::Running;
use crate::agent::protocol::ProtocolEvent;

impl Supervisor {
    /// What the agent's protocol said: a session is recorded, a turn's usage counted; at the
    /// end of a turn the next follow-up goes in, and a stream-json agent with none left is
    /// told its input is over, so that it ends.
    pub(super) async fn heard(&mut self, event: ProtocolEvent, running: &mut Running) {
        match event {
            ProtocolEvent::Session(session) => {
                self.status
                    .send_modify(|status| status.session_id = Some(session));
                self.publish_status();
            }
            ProtocolEvent::NotProtocol(start) => {
                let warning = format!(
                    "the agent printed lines that are not {} messages (the first: `{start}`); they are shown as they are",
                    protocol_name(self.spec.definition.protocol)
                );
                self.status
                    .send_modify(|status| status.protocol_warning = Some(warning));
            }
            ProtocolEvent::Warning(warning) => {
                self.status
                    .send_modify(|status| status.protocol_warning = Some(warning));
            }
            ProtocolEvent::Asked(question) => {
                self.status.send_modify(|status| {
                    status.question = Some(question.clone());
                    status.asks_alive = true;
                });
                emit(
                    &self.launcher.events,
                    AgentEvent::Question {
                        agent_id: self.spec.agent_id.clone(),
                        question,
                    },
                );
                self.publish_status();
            }
            ProtocolEvent::Answered => {
                if self.status.borrow().asks_alive {
                    self.status.send_modify(|status| {
                        status.question = None;
                        status.asks_alive = false;
                    });
                    self.publish_status();
                }
            }
            ProtocolEvent::Failed(reason) => {
                self.status
                    .send_modify(|status| status.turn_error = Some(reason));
                self.publish_status();
                // Nothing more can be asked of it (a refused `session/new`): an agent that
                // stays (claude-code-acp does) is ended as one whose session is over.
                running.session_over = true;
            }
            ProtocolEvent::Lost {
                reason,
                before_start,
            } => {
                running.lost_before_start = before_start;
                self.status.send_modify(|status| status.lost = Some(reason));
            }
            ProtocolEvent::Landed { branch, tip } => {
                self.status
                    .send_modify(|status| status.landed = Some((branch, tip)));
            }
            ProtocolEvent::ToolsDone {
                succeeded,
                failed,
                change_failed,
            } => {
                self.turn_tools.succeeded += succeeded;
                self.turn_tools.failed.extend(failed);
                self.turn_tools.change_failed |= change_failed;
            }
            ProtocolEvent::ApiRetry { status, wait } => {
                if status == Some(429) {
                    self.limit_wait = Some(wait);
                }
            }
            ProtocolEvent::TurnEnded {
                mut usage,
                error,
                mut limit,
            } => {
                // A program that reports tokens and no cost is priced by its definition.
                if let (Some(usage), Some(prices)) = (&mut usage, &self.spec.definition.prices)
                    && usage.cost_usd.is_none()
                {
                    usage.cost_usd = prices.cost_of(usage);
                }
                let tools = std::mem::take(&mut self.turn_tools);
                let error = error.or_else(|| tools.all_failed());
                // A limit that says nothing of when it lifts lifts when the API last said.
                if let (Some(limit), Some(wait)) = (&mut limit, self.limit_wait.take())
                    && limit.resets_at.is_none()
                {
                    limit.resets_at = Some(Timestamp(std::time::SystemTime::now() + wait));
                }
                self.status.send_modify(|status| {
                    if let Some(usage) = usage {
                        status.usage = Some(status.usage.map_or(usage, |sum| sum.plus(usage)));
                    }
                    status.turn_error = error;
                    status.limit = limit;
                });
                self.publish_status();
                if self.reached_cap(usage, running) {
                    return;
                }
                if let Some(acp) = &running.acp {
                    // The next follow-up is the next prompt; with none, the session is over.
                    let input = match self.follow_ups.pop_front() {
                        Some(message) => AcpInput::Prompt(message),
                        None => {
                            running.session_over = true;
                            AcpInput::End
                        }
                    };
                    // The driver is gone only with the connection, when the agent is ending.
                    let _ = acp.inputs.send(input);
                    self.status
                        .send_modify(|status| status.set_follow_ups(&self.follow_ups));
                } else if let Some(message) = self.follow_ups.pop_front() {
                    if let Err(error) = self.steer(running.stdin.as_mut(), &message).await {
                        // The agent's input is closed (it is ending): the follow-up waits for
                        // its next start, as one sent to an exited agent does.
                        tracing::debug!(agent = %self.spec.agent_id, "follow-up kept for the next start: {error}");
                        self.follow_ups.push_front(message);
                    }
                    self.status.send_modify(|status| {
                        status.set_follow_ups(&self.follow_ups);
                        status.idle = false;
                    });
                } else if self.spec.definition.protocol == Protocol::ClaudeStreamJson {
                    // Its result was its last word: its input ends, and one that stays anyway
                    // is ended as an ACP agent whose session is over is.
                    drop(running.stdin.take());
                    running.session_over = true;
                } else {
                    // Its turn is over and it reads on: it waits for the user.
                    self.status.send_modify(|status| status.idle = true);
                    self.publish_status();
                }
            }
        }
    }

    /// The turn's cost against the task's spend caps: one that reached a cap with a follow-up
    /// still to come is stopped short of it (its input ends, its session kept) for a person to
    /// decide; `true` then. A turn that was its last anyway only records the cap reached.
    fn reached_cap(&mut self, usage: Option<Usage>, running: &mut Running) -> bool {
        let (Some(meter), Some(cost)) = (&self.spec.spend, usage.and_then(|usage| usage.cost_usd))
        else {
            return false;
        };
        let Some(mut over) = meter.turn_cost(cost) else {
            return false;
        };
        over.stopped_short = !self.follow_ups.is_empty();
        let stopped_short = over.stopped_short;
        self.status.send_modify(|status| {
            status.over_cap = Some(over);
            status.idle = false;
        });
        self.publish_status();
        if !stopped_short {
            return false;
        }
        // Nothing more goes in: it ends as one whose session is over does.
        if let Some(acp) = &running.acp {
            // The driver is gone only with the connection, when the agent is ending.
            let _ = acp.inputs.send(AcpInput::End);
        }
        drop(running.stdin.take());
        running.session_over = true;
        true
    }
}
