//! One supervisor per agent: a tokio task that owns the agent's process and `select!`s over its
//! exit, control messages, the stop ladder and the timeout.
//!
//! Lifecycle of a supervisor:
//!
//! ```text
//! launch ─► running ──exit──► exited ──resume / follow-up──► running …
//!              │  ▲                │
//!              │  └─ steer (stdin) └─ close (the runner tore the workspace down)
//!              └─ stop: TERM to the group ─ grace ─► KILL to the group
//! ```
//!
//! The signal ladder: a stop sends TERM to the agent's process group and arms a KILL after the
//! grace period (10 s by default); a second stop, or the end of the grace, sends KILL at once.
//! A timeout is a stop the supervisor starts itself. After the agent exits, anything still in
//! its group, or still holding its output pipes, is killed with the group and reported as
//! leaked; after a stop, processes that left the group but still carry the agent's marker
//! (`CREW_AGENT_ID`) are found in `/proc` and killed too.

mod confine;
mod credentials;
mod launch;
mod spec;
mod start;
mod status;
mod supervisor;

// What the agent room holds besides one agent's supervisor and start: its environment, its
// events and output, the protocols programs speak, limits, placed agents, checks.
pub(crate) mod acp;
pub(crate) mod check;
pub mod env;
pub mod error;
pub mod events;
pub mod limits;
pub mod output;
pub mod placed;
pub mod protocol;
pub mod refusals;
mod slurm;
pub mod toolchains;

pub use credentials::{by_reference, placed_values};
pub use launch::drop_spare_cgroups;
pub use spec::{AgentSpec, DEFAULT_RESUME_MESSAGE, SpendMeter};
pub(crate) use spec::{Launcher, OwnConnections};
pub(crate) use start::{start, start_idle};
pub use status::{
    Activity, AgentState, AgentStatus, FollowUpOutcome, OverCap, StopOutcome, Unreachable,
};
pub(crate) use supervisor::Control;
