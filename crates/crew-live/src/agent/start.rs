//! An agent's supervisor started: with its first process running, or idle, for an agent that
//! waits on an answer from before its host.

use std::sync::{Arc, Mutex};

use crate::agent::error::SpawnAgentError;
use crate::agent::launch::launch;
use crate::agent::output::OutputTail;
use crate::agent::spec::{AgentSpec, Launcher};
use crate::agent::status::{AgentState, AgentStatus};
use crate::agent::supervisor::{Started, supervise_from};

/// Launches the agent's first process and starts its supervisor. A program that cannot be
/// started is an error for this agent only.
pub(crate) async fn start(spec: AgentSpec, launcher: Launcher) -> Result<Started, SpawnAgentError> {
    let tail = Arc::new(Mutex::new(OutputTail::default()));
    let running = launch(
        &spec,
        &launcher,
        &tail,
        None,
        spec.session_id.as_deref(),
        None,
    )
    .await?;
    // The first `Started` event is sent by the host once the agent is registered, so that a
    // subscriber reacting to it finds the agent.
    let status = AgentStatus {
        pid: Some(running.pid),
        sandbox: Some(running.sandbox.clone()),
        meter: running.cgroup.as_ref().map(|group| group.meter()),
        ..AgentStatus::new(AgentState::Running, 1, None)
    };
    Ok(supervise_from(spec, launcher, tail, status, Some(running)))
}

/// Starts a supervisor for an agent whose process is not running, such as one that asked a
/// question before its host went away: it waits, exited, until a follow-up or a resume starts
/// it again in its workspace.
pub(crate) fn start_idle(
    spec: AgentSpec,
    launcher: Launcher,
    question: Option<String>,
    attempt: u32,
) -> Started {
    let status = AgentStatus::new(AgentState::Exited, attempt, question);
    supervise_from(
        spec,
        launcher,
        Arc::new(Mutex::new(OutputTail::default())),
        status,
        None,
    )
}
