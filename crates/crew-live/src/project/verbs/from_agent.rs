//! What an agent may do for itself: ask the user a question, submit tasks to its own run.
//!
//! A process crew runs as an agent reaches its host through what crew set for it
//! (`CREW_AGENT_ID`, `CREW_SOCKET`, `CREW_PROJECT_ROOT`); its host serves it as that agent
//! only, whatever it claims. `crew ask`, `crew submit` and a lead agent's `crew mcp` act
//! through [`AgentSelf`].

use std::time::Duration;

use crew_core::env_vars::{CREW_AGENT_ID, CREW_PROJECT_ROOT, CREW_SOCKET};
use crew_core::{AgentId, WorkspaceId};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::control::{ControlClient, ControlError, Op, SubmittedTask};

/// How long a question may take to be recorded.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a submission may take to be accepted (its tasks are checked and recorded).
const SUBMIT_TIMEOUT: Duration = Duration::from_secs(30);

/// This process, as the agent crew runs it as, connected to its host.
#[derive(Debug)]
pub struct AgentSelf {
    agent_id: AgentId,
    workspace: WorkspaceId,
    client: ControlClient,
}

/// What an agent asked for itself that did not happen.
#[derive(Debug, thiserror::Error)]
pub enum AgentSelfError {
    /// A variable crew sets for every agent is missing: this process is no agent of crew's.
    #[error("{variable} is not set")]
    NotSet {
        /// The variable.
        variable: &'static str,
    },
    /// A variable crew sets holds what crew never writes there.
    #[error("{variable} is not valid: {problem}")]
    Invalid {
        /// The variable.
        variable: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// Its host could not be reached, or did not answer.
    #[error(transparent)]
    Host(#[from] ControlError),
    /// Its host refused (see the code: `forbidden`, `not_hosted`, …).
    #[error(transparent)]
    Refused(#[from] crate::project::verbs::refusal::Refusal),
}

/// Tasks a run took from an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submitted {
    /// Their ids, as the run has them now.
    pub accepted: Vec<String>,
}

impl AgentSelf {
    /// The agent this process runs as, from the variables crew set for it, connected to its
    /// host.
    pub async fn from_env() -> Result<AgentSelf, AgentSelfError> {
        let variable = |variable: &'static str| {
            std::env::var(variable).map_err(|_| AgentSelfError::NotSet { variable })
        };
        let invalid = |variable: &'static str| {
            move |problem: &dyn std::fmt::Display| AgentSelfError::Invalid {
                variable,
                problem: problem.to_string(),
            }
        };
        let agent_id = AgentId::parse(&variable(CREW_AGENT_ID)?)
            .map_err(|error| invalid(CREW_AGENT_ID)(&error))?;
        let socket = variable(CREW_SOCKET)?;
        let workspace = WorkspaceId::from_path(std::path::Path::new(&variable(CREW_PROJECT_ROOT)?))
            .map_err(|error| invalid(CREW_PROJECT_ROOT)(&error))?;
        let client = ControlClient::connect(camino::Utf8Path::new(&socket)).await?;
        Ok(AgentSelf {
            agent_id,
            workspace,
            client,
        })
    }

    /// The agent.
    pub fn agent_id(&self) -> &AgentId {
        &self.agent_id
    }

    /// Records `question` as what the agent waits on; the answer comes back as a follow-up
    /// once the agent ends its turn.
    pub async fn ask(&mut self, question: String) -> Result<(), AgentSelfError> {
        let op = Op::Ask {
            agent: self.agent_id.clone(),
            question,
        };
        self.call(op, ASK_TIMEOUT).await.map(drop)
    }

    /// Adds `tasks` to the agent's own run, as its children.
    pub async fn submit(&mut self, tasks: Vec<SubmittedTask>) -> Result<Submitted, AgentSelfError> {
        let op = Op::SubmitTasks {
            agent: self.agent_id.clone(),
            tasks,
        };
        let answer = self.call(op, SUBMIT_TIMEOUT).await?;
        serde_json::from_value(answer).map_err(|source| {
            AgentSelfError::Host(ControlError::Protocol {
                path: self.client.path().to_owned(),
                source,
            })
        })
    }

    async fn call(&mut self, op: Op, timeout: Duration) -> Result<Value, AgentSelfError> {
        let response = self.client.call(&self.workspace, op, timeout).await?;
        response
            .answer
            .map_err(|error| AgentSelfError::Refused(error.into()))
    }
}
