//! What `crew ask`, `crew submit` and a lead agent's `crew mcp` share: they run inside an
//! agent and reach its host as that agent.

use crew_live::{AgentSelf, AgentSelfError};

use crate::CliError;

/// This process as the agent crew runs it as, connected to its host; `command` names the
/// command in the error that says it is no agent of crew's.
pub async fn connect(command: &str) -> Result<AgentSelf, CliError> {
    AgentSelf::from_env().await.map_err(|error| match error {
        AgentSelfError::NotSet { variable } => CliError::user(format!(
            "{variable} is not set: `crew {command}` runs inside an agent started by crew"
        ))
        .with_hint(
            "crew sets CREW_AGENT_ID, CREW_SOCKET and CREW_PROJECT_ROOT for every agent it runs",
        ),
        error => error.into(),
    })
}
