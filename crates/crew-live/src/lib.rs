//! crew-live: the front door of crew, and its live agents.
//!
//! A program embedding crew (an editor, a bot) holds one [`Project`] per project folder and
//! hosts runs in itself with a [`Host`]; it acts on agents and runs through the typed verbs of
//! `Project` ([`project::verbs`]), which reach the agents of every process hosting runs of that folder,
//! and only that folder's. The `crew` commands, `crew watch`, `crew serve` (editors, over the
//! Agent Client Protocol) and `crew mcp` (lead agents) are clients of the same door.
//!
//! # A run of one task, followed
//!
//! No team file is needed: a team of one task is made on the spot (a team file's is loaded
//! with `project.config_dir().load_team(name)`).
//!
//! ```no_run
//! use std::sync::Arc;
//! use crew_core::{CancelCause, CancelRecord};
//! use crew_live::{AgentEvent, ControlAgentError, Host, HostEvent, HostOptions, Project, RunSpec};
//! use crew_worktree::CrewWorkspaces;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! // The folder, its `.crew/` configuration and state; its tasks' workspaces are git worktrees.
//! let project = Project::open("/path/to/repo".as_ref(), |config| {
//!     Arc::new(CrewWorkspaces::new(config))
//! })?;
//! let options = HostOptions { label: "my editor".into(), crew_dir: None };
//! let host = Host::start(&project, options).await?;
//! let team = project
//!     .config_dir()
//!     .ad_hoc_team("shell", vec![("hello".into(), "echo hello > hello.txt".into())])?;
//! let run = host.create(&RunSpec::of(team)).await?;
//! let mut events = host.events();
//! let running = host.start_run(&run.run_id, Default::default());
//! let cancel = running.canceller(); // an editor's cancel: CancelCause::Editor
//! while let Some(Ok(event)) = events.next().await {
//!     match event {
//!         HostEvent::Agent(agent) => {
//!             if let AgentEvent::Output { line, .. } = *agent {
//!                 println!("{line}");
//!             }
//!         }
//!         HostEvent::Task(change) if change.status.is_finished() => break,
//!         _ => {}
//!     }
//! }
//! # let _ = cancel.cancel(CancelRecord::new(CancelCause::Editor));
//! // Any agent of the folder, hosted here or elsewhere, named as a person names it.
//! match project.steer("hello", "and say goodbye".into()).await {
//!     Ok(steered) => println!("steered {}", steered.agent_id),
//!     Err(ControlAgentError::NotLive { .. }) => println!("it has finished"),
//!     Err(error) => println!("not steered: {error}"),
//! }
//! let finished = running.finish().await?; // statuses, branches, teardowns
//! println!("run {} {}", finished.run_id, finished.status);
//! host.close().await;
//! # Ok(())
//! # }
//! ```
//!
//! # What an embedder needs to know
//!
//! - **Depending on it.** The crates are not published: depend on them by path or by git
//!   (`crew-live = { git = "<crew's repository>" }`, and `crew-core`, `crew-worktree` the same
//!   way), at one commit for all three. crew's `Cargo.lock` holds the versions its tests ran
//!   with; a program depending on it resolves its own lock, within the ranges crew's manifests
//!   give (copy crew's lock entries to build exactly what was tested).
//! - **Runtime.** Every async verb and [`Host`] need a tokio runtime with I/O and time enabled
//!   (`#[tokio::main]`, or `Builder::new_multi_thread().enable_all()`): the multi-thread
//!   runtime is what crew itself and its tests use. Git and file work run through
//!   `spawn_blocking`, so no verb blocks the runtime's threads.
//! - **`crew_dir`.** Agents call `crew ask` and `crew submit`; [`HostOptions::crew_dir`] is
//!   the directory of the `crew` binary they should find first on their `PATH`. `None`: they
//!   find the user's, or none — and then only asking and submitting fail, nothing else.
//! - **Events.** [`HostEvents`] merges three streams, each in order: task status changes
//!   (queued first when several wait), agent events (`Started`, `Output`…, `Exited` of one
//!   agent in order), and preparation progress. Across streams there is no order: an agent's
//!   first `Output` can arrive before its task's `running`. A listener that falls far behind
//!   loses the oldest events and is told how many (`Lagged`); a task's record
//!   ([`Project::manifests`]) is always the truth.
//! - **Cancelling.** [`Canceller::cancel`]: the first call stops the run's agents gracefully,
//!   work kept, recording who asked — an editor records [`CancelCause::Editor`]; the next
//!   kills them (work still saved). [`Project::cancel_run`] cancels a run another process
//!   hosts.
//! - **Closing.** [`Host::close`] (or dropping the host) stops the runs going on in it, work
//!   kept, each `cancelled` by `host_closed`: no agent goes on that nobody could reach. A
//!   [`Project`] holds nothing live and may be dropped at any time.
//! - **Errors** are typed at each verb: [`ControlAgentError`] (not live, ambiguous, refused by
//!   its host with a [`Refusal`]'s code), [`CancelRunError`], [`CleanRunError`],
//!   [`RunError`].
//!
//! [`CancelCause::Editor`]: crew_core::CancelCause::Editor
//!
//! # Underneath: one agent, supervised
//!
//! What a [`Host`] does for each task, an embedder may do for one agent alone with
//! [`AgentHost`].
//!
//! ## Supervisor lifecycle
//!
//! [`AgentHost::start`] launches the agent's command (a template filled argument by argument,
//! never through a shell) in its workspace with an allow-listed environment ([`env`](mod@agent::env)). The
//! process starts under a warden ([`spawn`]): a process group of its own that dies with the
//! host even when the host is SIGKILLed, along with any daemon that left the group but carries
//! the agent's marker, and that kills whatever the agent leaves behind when it exits. Right
//! before exec the agent confines itself with a Landlock ruleset the host built ([`sandbox`]):
//! it may write only beneath its workspace and the few paths it needs. A supervisor task then
//! owns it:
//!
//! - stdout and stderr are drained continuously into `output.log`; only the last lines, each
//!   capped, stay in memory ([`agent::output`]);
//! - `steer` writes to stdin now (`stdin-lines` or `stdin-json`; an `acp` agent gets it as its
//!   next prompt through its protocol, crew being its client), `follow-up` queues a message
//!   for the end of the turn (or resumes an exited agent with it), `resume` restarts a stopped
//!   or finished agent in the same workspace;
//! - the exit is recorded as an exit code or a signal, with how a stop ended it and whether
//!   processes were left behind.
//!
//! ## The signal ladder
//!
//! Stop = TERM to the agent's process group, then KILL when the grace period (10 s by default)
//! runs out; a second stop sends KILL at once. A timeout is a stop the supervisor starts
//! itself. After the agent exits, whatever is left in its group or still holds its pipes is
//! killed with the group and reported; after a stop, processes that escaped the group but carry
//! the agent's `CREW_AGENT_ID` marker are found in `/proc` and killed too.
//!
//! ## Example
//!
//! One agent started and followed, without a run:
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
//!         unreachable_timeout: None,
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
//!         spend: None,
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

// The kernel is asked for everything through crew-sandbox, the one crate with `unsafe`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Agents are confined with Landlock, tied to their host with the parent-death signal and
// found again through `/proc`: Linux only, said plainly rather than through a missing symbol.
#[cfg(not(target_os = "linux"))]
compile_error!(
    "crew runs on Linux only: it relies on /proc, PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER and Landlock"
);

// Three rooms, each a folder, arrows one way (ARCHITECTURE.md, "Rooms"): `agent` knows one
// agent process and nothing above it; `control` who may do what to which agent; `project`
// the front door users and hosts drive.
pub mod agent;
// The wire protocol between crew's own processes is public for crew's tests of it (a hostile
// client speaks it raw); programs act through `Project`'s verbs instead.
#[doc(hidden)]
pub mod control;
pub mod project;

// The sandbox is a crate of its own, the only one with `unsafe` code.
#[doc(inline)]
pub use crew_sandbox::{caps, lease, process, procscan, proxy, sandbox, spawn};

// The door: what an embedder names, at the crate root, documented where it is re-exported.
#[doc(inline)]
pub use agent::error::{AgentOpError, SpawnAgentError};
#[doc(inline)]
pub use agent::events::{AgentEvent, OutputStream};
#[doc(inline)]
pub use agent::{Activity, AgentSpec, AgentState, AgentStatus, FollowUpOutcome, StopOutcome};
#[doc(inline)]
pub use control::agents::AgentHost;
#[doc(inline)]
pub use control::registry::{AgentHandle, AgentSnapshot, Registry};
#[doc(inline)]
pub use control::{ControlClient, ControlError, ControlServer, ErrorCode, SubmittedTask};
#[doc(inline)]
pub use project::host::{
    Canceller, Host, HostError, HostEvent, HostEvents, HostOptions, RunningRun,
};
#[doc(inline)]
pub use project::runner::{AlreadySucceeded, CancelLevel, PlanError, RunError, RunSpec, Runner};
#[doc(inline)]
pub use project::verbs::{
    AgentSelf, AgentSelfError, CancelRunError, Cancelled, CleanOptions, CleanRunError, Cleaned,
    FollowedUp, IgnoredFiles, LandOptions, LandWorkError, LandedWork, NotPicked, Refusal,
    ResumeOutcome, Resumed, RunFollower, RunWaiter, Steered, Stopped, Submitted, TaskCleaned,
    WaitOver, WaitStep,
};
#[doc(inline)]
pub use project::watch::{ProjectWatch, WatchError, WatchEvent, Watched};
#[doc(inline)]
pub use project::{
    AfterRun, ControlAgentError, FindAgentError, LiveAgents, OpenProjectError, Project,
    resolve_spec,
};
#[doc(inline)]
pub use sandbox::SandboxPlan;
