//! What a person, or a program acting for one, does to one live agent of a project — steer,
//! follow up, stop, resume.
//!
//! Each verb finds the agent among the project's hosts ([`Project::find_live`]), asks its host
//! over the control socket, and reads the answer into the outcome below; a host's refusal is
//! [`ControlAgentError::Refused`] with its code. The outcomes serialize as the host answers
//! (`agent_id`, and `follow_up`, `stop`, `pid` or `requeued`), which is what `crew serve`
//! hands an editor.

use crew_core::AgentId;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::agent::{FollowUpOutcome, StopOutcome};
use crate::control::{ControlError, Op};
use crate::project::open::{ControlAgentError, Project};

/// A steer delivered to the running agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Steered {
    /// The agent.
    pub agent_id: AgentId,
}

/// What became of a follow-up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowedUp {
    /// The agent.
    pub agent_id: AgentId,
    /// Queued, resumed, answered or requeued.
    pub follow_up: FollowUpOutcome,
}

/// How a stop ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stopped {
    /// The agent.
    pub agent_id: AgentId,
    /// After TERM, after KILL, or it had exited already.
    pub stop: StopOutcome,
}

/// What a resume started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "ResumedWire", from = "ResumedWire")]
pub struct Resumed {
    /// The agent.
    pub agent_id: AgentId,
    /// Started again in its workspace, or its task requeued.
    pub outcome: ResumeOutcome,
}

/// How an agent was resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeOutcome {
    /// Its process was started again in its workspace.
    Restarted {
        /// The new process's id.
        pid: u32,
    },
    /// Its task had finished in a run that goes on: it starts again in a new workspace on its
    /// branch.
    Requeued,
}

/// [`Resumed`] as a host answers it: `{agent_id, pid}` or `{agent_id, requeued: true}`.
#[derive(Serialize, Deserialize)]
struct ResumedWire {
    agent_id: AgentId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pid: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    requeued: bool,
}

impl From<Resumed> for ResumedWire {
    fn from(resumed: Resumed) -> Self {
        let (pid, requeued) = match resumed.outcome {
            ResumeOutcome::Restarted { pid } => (Some(pid), false),
            ResumeOutcome::Requeued => (None, true),
        };
        ResumedWire {
            agent_id: resumed.agent_id,
            pid,
            requeued,
        }
    }
}

impl From<ResumedWire> for Resumed {
    fn from(wire: ResumedWire) -> Self {
        let outcome = match wire.pid {
            Some(pid) if !wire.requeued => ResumeOutcome::Restarted { pid },
            _ => ResumeOutcome::Requeued,
        };
        Resumed {
            agent_id: wire.agent_id,
            outcome,
        }
    }
}

impl Project {
    /// Delivers `message` to the running agent `spec` names now, through its steer mode.
    pub async fn steer(&self, spec: &str, message: String) -> Result<Steered, ControlAgentError> {
        self.agent_verb(spec, |agent| Op::Steer { agent, message })
            .await
    }

    /// Sends `message` to the agent `spec` names after its current turn, or as the answer it
    /// waits for; an agent that exited is resumed with it.
    pub async fn follow_up(
        &self,
        spec: &str,
        message: String,
    ) -> Result<FollowedUp, ControlAgentError> {
        self.agent_verb(spec, |agent| Op::FollowUp { agent, message })
            .await
    }

    /// Stops the agent `spec` names: TERM, then KILL after its grace period.
    pub async fn stop(&self, spec: &str) -> Result<Stopped, ControlAgentError> {
        self.agent_verb(spec, |agent| Op::Stop { agent }).await
    }

    /// Starts the stopped or finished agent `spec` names again, with `message` if any.
    pub async fn resume(
        &self,
        spec: &str,
        message: Option<String>,
    ) -> Result<Resumed, ControlAgentError> {
        self.agent_verb(spec, |agent| Op::Resume { agent, message })
            .await
    }

    async fn agent_verb<T: DeserializeOwned>(
        &self,
        spec: &str,
        op: impl FnOnce(String) -> Op,
    ) -> Result<T, ControlAgentError> {
        let (_, host, response) = self.control(spec, op).await?;
        serde_json::from_value(response.answer.unwrap_or_default()).map_err(|source| {
            ControlAgentError::Host(ControlError::Protocol {
                path: host.socket.unwrap_or_default(),
                source,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_read_as_hosts_answer_and_write_back_the_same() {
        let agent_id = AgentId::new(
            crew_core::RunId::generate(),
            crew_core::TaskId::parse("t").unwrap(),
        );
        let answers = [
            serde_json::json!({ "agent_id": agent_id, "pid": 7 }),
            serde_json::json!({ "agent_id": agent_id, "requeued": true }),
        ];
        let read: Vec<Resumed> = answers
            .iter()
            .map(|answer| serde_json::from_value(answer.clone()).unwrap())
            .collect();
        assert_eq!(read[0].outcome, ResumeOutcome::Restarted { pid: 7 });
        assert_eq!(read[1].outcome, ResumeOutcome::Requeued);
        for (resumed, answer) in read.into_iter().zip(answers) {
            assert_eq!(serde_json::to_value(resumed).unwrap(), answer);
        }
        let requeued = serde_json::json!({
            "agent_id": agent_id, "follow_up": { "outcome": "requeued" }, "requeued": true
        });
        let read: FollowedUp = serde_json::from_value(requeued).unwrap();
        assert_eq!(read.follow_up, FollowUpOutcome::Requeued);
        let stopped: Stopped = serde_json::from_value(
            serde_json::json!({ "agent_id": agent_id, "stop": "already_exited" }),
        )
        .unwrap();
        assert_eq!(stopped.stop, StopOutcome::AlreadyExited);
    }
}
