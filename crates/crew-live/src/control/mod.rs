//! The control channel: a host serves its registry over a Unix socket, so that other `crew`
//! processes of the same workspace (and agents running `crew ask`) can list and steer its
//! agents.
//!
//! This is crew's own wire protocol, not an API: a program acts on agents and runs through
//! the typed verbs of [`crate::Project`] ([`crate::project::verbs`]) and [`crate::AgentSelf`], which
//! speak it. It is public (and hidden from the docs) for crew's tests, whose hostile clients
//! speak it raw.
//!
//! - The socket lives in a directory only the user can enter (0700, owner checked, never a
//!   symlink): `$XDG_RUNTIME_DIR/crew`, else `$TMPDIR/crew-<uid>`, else `/tmp/crew-<uid>`, the
//!   first whose paths fit a socket address. Its name is a hash of the workspace plus the host's
//!   pid, so long project paths never matter; the path is recorded in the run's manifest.
//! - The socket is 0600 whatever the umask, and the peer's uid is checked before anything is
//!   read.
//! - Requests and responses are JSON, one per line, each request at most [`MAX_REQUEST_BYTES`].
//!   A connection idle for [`IDLE_TIMEOUT`] is closed; at most [`MAX_CONNECTIONS`] are served
//!   at once. Malformed input gets a structured error, never a panic, and the server goes on.
//! - A client that finds no listener (a stale socket of a dead host) learns it at once.

mod client;
mod server;
mod socket;
mod wire;

// Who holds agents and who may act on them: a host's agents, the live hosts of a folder and
// the listings they publish.
pub mod agents;
pub mod live_hosts;
pub mod publish;
pub mod registry;
pub mod watch;

pub use client::*;
pub use server::*;
pub use socket::*;
pub use wire::*;

// An agent's refusal as the control protocol codes it: the code is the protocol's, so it is
// given here, above the agent room that defines the error.
impl crate::agent::error::AgentOpError {
    /// A stable code for `--json` output and the control protocol.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::NotFound { .. } => ErrorCode::NotFound,
            Self::ForeignWorkspace { .. } => ErrorCode::ForeignWorkspace,
            Self::Ambiguous { .. } => ErrorCode::Ambiguous,
            Self::SteerUnsupported { .. } => ErrorCode::SteerUnsupported,
            Self::NotRunning { .. } => ErrorCode::NotRunning,
            Self::AlreadyRunning { .. } => ErrorCode::AlreadyRunning,
            Self::Closed { .. } => ErrorCode::Closed,
            Self::Input { .. } => ErrorCode::Input,
            Self::Restart { .. } => ErrorCode::Restart,
            Self::Gone { .. } => ErrorCode::Gone,
            Self::Checking { .. } => ErrorCode::Checking,
        }
    }
}
