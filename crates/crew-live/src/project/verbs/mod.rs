//! What hosts do, as typed verbs of the front door: every client of crew — the `crew`
//! commands, the board, `crew serve`, `crew mcp` — acts through these, never through the wire
//! protocol of the control socket ([`crate::control`]), which they leave to crew-live.
//!
//! - [`agent`]: a person's verbs on one live agent of a [`crate::Project`] (steer, follow up,
//!   stop, resume);
//! - [`run`]: on a run (cancel, follow its events, wait for it); [`clean`]: removing a finished run;
//! - [`land`]: landing tasks' work on a branch;
//! - [`from_agent`]: what an agent may do for itself ([`AgentSelf`]: ask, submit).
//!
//! Each answers with a typed outcome and a typed error naming what was refused and by whom.

pub mod agent;
pub mod clean;
pub mod from_agent;
pub mod land;
pub mod run;

pub(crate) mod refusal;

pub use agent::{FollowedUp, ResumeOutcome, Resumed, Steered, Stopped};
pub use clean::{CleanOptions, CleanRunError, Cleaned, IgnoredFiles, TaskCleaned};
pub use from_agent::{AgentSelf, AgentSelfError, Submitted};
pub use land::{LandOptions, LandWorkError, LandedWork, NotPicked, picked_attempt};
pub use refusal::Refusal;
pub use run::{CancelRunError, Cancelled, RunFollower, RunWaiter, WaitOver, WaitStep};
