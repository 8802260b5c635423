//! Errors of crew-live.

use camino::Utf8PathBuf;
use crew_core::{AgentId, WorkspaceId};

/// An agent could not be started. This fails that agent's task only.
#[derive(Debug, thiserror::Error)]
pub enum SpawnAgentError {
    /// The agent's program could not be started.
    #[error(
        "failed to start agent {agent_id}: cannot run `{program}`: {}",
        spawn_reason(program, source)
    )]
    Spawn {
        /// The agent.
        agent_id: AgentId,
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The agent's command is empty.
    #[error("agent {agent_id} has an empty command")]
    EmptyCommand {
        /// The agent.
        agent_id: AgentId,
    },
    /// The agent's resume template takes up a session, and none was reported.
    #[error(
        "agent {agent_id} cannot be resumed: its resume template takes up its session, and its protocol reported none"
    )]
    NoSession {
        /// The agent.
        agent_id: AgentId,
    },
    /// The agent's working directory does not exist.
    #[error("the working directory {dir} of agent {agent_id} does not exist")]
    MissingDir {
        /// The agent.
        agent_id: AgentId,
        /// The directory.
        dir: Utf8PathBuf,
    },
    /// Its workspace is no longer the directory crew made for it.
    #[error("agent {agent_id} was not started: {reason}")]
    NotItsWorkspace {
        /// The agent.
        agent_id: AgentId,
        /// What its workspace's path names instead.
        reason: String,
    },
    /// Its caps could not be held: no cgroup here, or its own could not be made.
    #[error("agent {agent_id} was not started: its caps cannot be held: {reason}")]
    Caps {
        /// The agent.
        agent_id: AgentId,
        /// Why, and what to do.
        reason: String,
    },
    /// The agent's output log could not be opened.
    #[error("failed to open the output log {path}")]
    OutputLog {
        /// The log file.
        path: Utf8PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The agent is already live in this host.
    #[error("agent {agent_id} is already live in this host")]
    Duplicate {
        /// The agent.
        agent_id: AgentId,
    },
    /// The agent's private temp directory could not be made.
    #[error("failed to make the private temp dir of agent {agent_id}")]
    TempDir {
        /// The agent.
        agent_id: AgentId,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The agent's sandbox could not be built.
    #[error("failed to confine agent {agent_id}")]
    Sandbox {
        /// The agent.
        agent_id: AgentId,
        /// Why.
        #[source]
        source: crew_sandbox::sandbox::BuildSandboxError,
    },
}

/// This process's soft limit on open files, as a message shows it.
fn open_files_limit() -> String {
    match rustix::process::getrlimit(rustix::process::Resource::Nofile).current {
        Some(limit) => limit.to_string(),
        None => "unlimited".to_owned(),
    }
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
        Some(libc::EMFILE) => format!(
            "crew's host has no descriptor left, about six for each live agent (its limit: {}): raise the hard limit (`ulimit -Hn`, `LimitNOFILE=` of a service), or start fewer agents at once (`--max-parallel`)",
            open_files_limit()
        ),
        _ => error.to_string(),
    }
}

/// An operation on a live agent that was refused or failed. The agent received nothing unless
/// the variant says otherwise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentOpError {
    /// No live agent of the workspace matches.
    #[error("no live agent '{spec}' in workspace {workspace}")]
    NotFound {
        /// The agent as the caller named it.
        spec: String,
        /// The workspace searched.
        workspace: WorkspaceId,
    },
    /// The agent belongs to another workspace.
    #[error("live agent '{agent_id}' does not belong to workspace {workspace}")]
    ForeignWorkspace {
        /// The agent.
        agent_id: AgentId,
        /// The caller's workspace.
        workspace: WorkspaceId,
    },
    /// Several live agents match.
    #[error("'{spec}' matches several live agents: {}", candidates.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    Ambiguous {
        /// The agent as the caller named it.
        spec: String,
        /// The agents it matches.
        candidates: Vec<AgentId>,
    },
    /// The agent's steer mode is `none`.
    #[error(
        "live agent '{agent_id}' cannot be steered while it runs (its steer mode is \"none\"); send a follow-up instead"
    )]
    SteerUnsupported {
        /// The agent.
        agent_id: AgentId,
    },
    /// The agent is not running.
    #[error("live agent '{agent_id}' is not running")]
    NotRunning {
        /// The agent.
        agent_id: AgentId,
    },
    /// The agent is already running.
    #[error("live agent '{agent_id}' is already running")]
    AlreadyRunning {
        /// The agent.
        agent_id: AgentId,
    },
    /// The agent ended and its workspace was torn down.
    #[error(
        "live agent '{agent_id}' has ended and its workspace was torn down; resume its run instead"
    )]
    Closed {
        /// The agent.
        agent_id: AgentId,
    },
    /// The agent did not take the message (its input is closed or failed).
    #[error("live agent '{agent_id}' did not take the message: {reason}")]
    Input {
        /// The agent.
        agent_id: AgentId,
        /// Why.
        reason: String,
    },
    /// The agent could not be started again.
    #[error("failed to restart live agent '{agent_id}': {reason}")]
    Restart {
        /// The agent.
        agent_id: AgentId,
        /// Why.
        reason: String,
    },
    /// The agent is no longer supervised (its supervisor ended).
    #[error("live agent '{agent_id}' is no longer supervised")]
    Gone {
        /// The agent.
        agent_id: AgentId,
    },
    /// The agent has exited and its task's check runs: only a stop reaches it.
    #[error(
        "live agent '{agent_id}' has finished and its check runs; stop it with `crew agents stop {agent_id}`, or wait for it"
    )]
    Checking {
        /// The agent.
        agent_id: AgentId,
    },
}

/// An error and each of its causes, as one line (`failed to confine agent x: … needs …`): what
/// a task's recorded reason says, where nothing prints the chain.
pub(crate) fn with_causes(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    line
}
