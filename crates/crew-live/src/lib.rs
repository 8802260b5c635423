//! crew-live: live agents.
//!
//! It owns the agent processes (one supervisor task per agent, [`agent`]), the live registry
//! scoped by workspace ([`registry`]), the control channel between processes ([`control`]) and
//! the team runner. It receives a `WorkspaceProvider` and never names git; it never prints.
//!
//! # Supervisor lifecycle
//!
//! [`AgentHost::start`] launches the agent's command (a template filled argument by argument,
//! never through a shell) in its workspace with an allow-listed environment ([`env`](mod@env)). The
//! process starts under a warden ([`spawn`]): a process group of its own that dies with the
//! host even when the host is SIGKILLed, along with any daemon that left the group but carries
//! the agent's marker, and that kills whatever the agent leaves behind when it exits. Right
//! before exec the agent confines itself with a Landlock ruleset the host built ([`sandbox`]):
//! it may write only beneath its workspace and the few paths it needs. A supervisor task then
//! owns it:
//!
//! - stdout and stderr are drained continuously into `output.log`; only the last lines, each
//!   capped, stay in memory ([`output`]);
//! - `steer` writes to stdin now (`stdin-lines` or `stdin-json`; an `acp` agent gets it as its
//!   next prompt through its protocol, crew being its client), `follow-up` queues a message
//!   for the end of the turn (or resumes an exited agent with it), `resume` restarts a stopped
//!   or finished agent in the same workspace;
//! - the exit is recorded as an exit code or a signal, with how a stop ended it and whether
//!   processes were left behind.
//!
//! # The signal ladder
//!
//! Stop = TERM to the agent's process group, then KILL when the grace period (10 s by default)
//! runs out; a second stop sends KILL at once. A timeout is a stop the supervisor starts
//! itself. After the agent exits, whatever is left in its group or still holds its pipes is
//! killed with the group and reported; after a stop, processes that escaped the group but carry
//! the agent's `CREW_AGENT_ID` marker are found in `/proc` and killed too.
//!
//! # Example
//!
//! An editor host starting an agent and following it:
//!
//! ```no_run
//! use std::time::Duration;
//! use crew_core::{AgentId, RunId, TaskId, WorkspaceId, config::AgentDef};
//! use crew_live::{AgentHost, AgentSpec, AgentEvent, SandboxPlan};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let host = AgentHost::new()?;
//! let workspace = WorkspaceId::from_path(std::path::Path::new("/path/to/project"))?;
//! let mut events = host.subscribe();
//! let handle = host
//!     .start(AgentSpec {
//!         agent_id: AgentId::new(RunId::generate(), TaskId::parse("hello")?),
//!         workspace: workspace.clone(),
//!         dir: workspace.as_path().to_owned(),
//!         definition: AgentDef::builtin_shell(),
//!         prompt: "echo hello; read answer; echo got $answer".into(),
//!         timeout: Some(Duration::from_secs(60)),
//!         stop_grace: Duration::from_secs(10),
//!         output_log: "/tmp/hello.log".into(),
//!         output_log_limit: 64 << 20,
//!         socket: None,
//!         sandbox: SandboxPlan::confined_to(workspace.as_path()),
//!         workspace_env: Vec::new(),
//!         git_config: Vec::new(),
//!         session_id: None,
//!         session_cost: None,
//!         placed: None,
//!         follow_ups: Vec::new(),
//!         network_log: None,
//!         parent: None,
//!     })
//!     .await?;
//! host.registry().steer(&workspace, "hello", "yes").await?;
//! while let Ok(event) = events.recv().await {
//!     if let AgentEvent::Output { line, .. } = &event {
//!         println!("{line}");
//!     }
//!     if matches!(event, AgentEvent::Exited { .. }) {
//!         break;
//!     }
//! }
//! let status = handle.wait_exited().await;
//! assert_eq!(status.exit.and_then(|exit| exit.code), Some(0));
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

// Agents are confined with Landlock, tied to their host with the parent-death signal and
// found again through `/proc`: Linux only, said plainly rather than through a missing symbol.
#[cfg(not(target_os = "linux"))]
compile_error!(
    "crew runs on Linux only: it relies on /proc, PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER and Landlock"
);

mod acp;
pub mod agent;
mod check;
pub mod control;
pub mod env;
pub mod error;
pub mod events;
pub mod host;
pub mod hosting;
pub mod hosts;
pub mod lease;
pub mod limits;
pub mod output;
pub mod placed;
pub mod procscan;
pub mod project;
pub mod protocol;
pub mod proxy;
pub mod publish;
pub mod refusals;
pub mod registry;
pub mod runner;
pub mod sandbox;
pub mod shim;
pub mod spawn;
pub mod toolchains;
pub mod verbs;
pub mod watch;

pub use agent::{Activity, AgentSpec, AgentState, AgentStatus, FollowUpOutcome, StopOutcome};
pub use control::{ControlClient, ControlError, ControlServer, ErrorCode, SubmittedTask};
pub use error::{AgentOpError, SpawnAgentError};
pub use events::{AgentEvent, OutputStream};
pub use host::AgentHost;
pub use hosting::{Canceller, Host, HostError, HostEvent, HostEvents, HostOptions, RunningRun};
pub use project::{
    ControlAgentError, FindAgentError, LiveAgents, OpenProjectError, Project, resolve_spec,
};
pub use registry::{AgentHandle, AgentSnapshot, Registry};
pub use runner::{CancelLevel, RunError, RunSpec, Runner};
pub use sandbox::SandboxPlan;
pub use verbs::{
    AgentSelf, AgentSelfError, CancelRunError, Cancelled, FollowedUp, Refusal, ResumeOutcome,
    Resumed, RunFollower, Steered, Stopped, Submitted,
};
pub use watch::{ProjectWatch, WatchError, WatchEvent, Watched};
