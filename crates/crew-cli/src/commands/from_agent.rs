//! What `crew ask` and `crew submit` share: they run inside an agent and reach its host
//! through the variables crew set for it.

use crew_core::env_vars::{CREW_AGENT_ID, CREW_PROJECT_ROOT, CREW_SOCKET};
use crew_core::{AgentId, WorkspaceId};
use crew_live::ControlClient;

use crate::CliError;

/// The calling agent's id, its workspace, and a connection to its host.
pub async fn connect(command: &str) -> Result<(AgentId, WorkspaceId, ControlClient), CliError> {
    let variable = |name: &str| {
        std::env::var(name).map_err(|_| {
            CliError::user(format!("{name} is not set: `crew {command}` runs inside an agent started by crew"))
                .with_hint("crew sets CREW_AGENT_ID, CREW_SOCKET and CREW_PROJECT_ROOT for every agent it runs")
        })
    };
    let agent = AgentId::parse(&variable(CREW_AGENT_ID)?)?;
    let socket = variable(CREW_SOCKET)?;
    let workspace = WorkspaceId::from_path(std::path::Path::new(&variable(CREW_PROJECT_ROOT)?))?;
    let client = ControlClient::connect(camino::Utf8Path::new(&socket)).await?;
    Ok((agent, workspace, client))
}
