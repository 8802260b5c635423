//! Errors of crew-live.

use camino::Utf8PathBuf;
use crew_core::{AgentId, WorkspaceId};

/// An agent could not be started. This fails that agent's task only.
#[derive(Debug, thiserror::Error)]
pub enum SpawnAgentError {
    #[error(
        "failed to start agent {agent_id}: cannot run `{program}`: {}",
        spawn_reason(program, source)
    )]
    Spawn {
        agent_id: AgentId,
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("agent {agent_id} has an empty command")]
    EmptyCommand { agent_id: AgentId },
    #[error(
        "agent {agent_id} cannot be resumed: its resume template takes up its session, and its protocol reported none"
    )]
    NoSession { agent_id: AgentId },
    #[error("the working directory {dir} of agent {agent_id} does not exist")]
    MissingDir { agent_id: AgentId, dir: Utf8PathBuf },
    #[error("failed to open the output log {path}")]
    OutputLog {
        path: Utf8PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("agent {agent_id} is already live in this host")]
    Duplicate { agent_id: AgentId },
    #[error("failed to make the private temp dir of agent {agent_id}")]
    TempDir {
        agent_id: AgentId,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to confine agent {agent_id}")]
    Sandbox {
        agent_id: AgentId,
        #[source]
        source: crate::sandbox::BuildSandboxError,
    },
}

/// Why a program could not be started, in the words a user needs: the message of an `errno`
/// alone does not say that a program missing from `PATH` is the agent's `PATH`.
fn spawn_reason(program: &str, error: &std::io::Error) -> String {
    match error.raw_os_error() {
        Some(libc::ENOENT) if !program.contains('/') => {
            "it is not on the agent's PATH (agents see the PATH crew was started with)".to_owned()
        }
        Some(libc::ENOENT) => "no such file".to_owned(),
        Some(libc::EACCES) => {
            "permission denied (is it executable, and its directory readable?)".to_owned()
        }
        Some(libc::ENOEXEC) => {
            "not an executable this system can run (a script without `#!`?)".to_owned()
        }
        Some(libc::EAGAIN) => {
            "the system refused another process (the user's process limit?)".to_owned()
        }
        _ => error.to_string(),
    }
}

/// An operation on a live agent that was refused or failed. The agent received nothing unless
/// the variant says otherwise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentOpError {
    #[error("no live agent '{spec}' in workspace {workspace}")]
    NotFound {
        spec: String,
        workspace: WorkspaceId,
    },
    #[error("live agent '{agent_id}' does not belong to workspace {workspace}")]
    ForeignWorkspace {
        agent_id: AgentId,
        workspace: WorkspaceId,
    },
    #[error("'{spec}' matches several live agents: {}", candidates.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    Ambiguous {
        spec: String,
        candidates: Vec<AgentId>,
    },
    #[error(
        "live agent '{agent_id}' cannot be steered while it runs (its steer mode is \"none\"); send a follow-up instead"
    )]
    SteerUnsupported { agent_id: AgentId },
    #[error("live agent '{agent_id}' is not running")]
    NotRunning { agent_id: AgentId },
    #[error("live agent '{agent_id}' is already running")]
    AlreadyRunning { agent_id: AgentId },
    #[error(
        "live agent '{agent_id}' has ended and its workspace was torn down; resume its run instead"
    )]
    Closed { agent_id: AgentId },
    #[error("live agent '{agent_id}' did not take the message: {reason}")]
    Input { agent_id: AgentId, reason: String },
    #[error("failed to restart live agent '{agent_id}': {reason}")]
    Restart { agent_id: AgentId, reason: String },
    #[error("live agent '{agent_id}' is no longer supervised")]
    Gone { agent_id: AgentId },
}

impl AgentOpError {
    /// A stable code for `--json` output and the control protocol.
    pub fn code(&self) -> crate::control::ErrorCode {
        use crate::control::ErrorCode;
        match self {
            AgentOpError::NotFound { .. } => ErrorCode::NotFound,
            AgentOpError::ForeignWorkspace { .. } => ErrorCode::ForeignWorkspace,
            AgentOpError::Ambiguous { .. } => ErrorCode::Ambiguous,
            AgentOpError::SteerUnsupported { .. } => ErrorCode::SteerUnsupported,
            AgentOpError::NotRunning { .. } => ErrorCode::NotRunning,
            AgentOpError::AlreadyRunning { .. } => ErrorCode::AlreadyRunning,
            AgentOpError::Closed { .. } => ErrorCode::Closed,
            AgentOpError::Input { .. } => ErrorCode::Input,
            AgentOpError::Restart { .. } => ErrorCode::Restart,
            AgentOpError::Gone { .. } => ErrorCode::Gone,
        }
    }
}
