//! The front door for one project folder: its configuration and state, the runs recorded
//! there, and the live agents of its hosts — only this folder's, whichever process hosts them.
//!
//! A program holding several project folders (an editor) opens a [`Project`] for each; one
//! never sees another's runs or agents. Hosting runs in this process is [`crate::project::host`].

// The front door's parts: hosting runs, the runner, the verbs, the shim, the watch feed.
pub mod host;
pub mod runner;
pub mod shim;
pub mod verbs;
pub mod watch;

mod after_run;
mod open;

pub use after_run::AfterRun;
pub use open::{
    ControlAgentError, FindAgentError, LiveAgents, OpenProjectError, Project, resolve_spec,
};
