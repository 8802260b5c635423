//! What the tests share: each file of `it/` takes its fixtures from here, never from another
//! test file.

pub mod agents;
pub mod live;
pub mod runs;
pub mod sshd;
pub mod tmux;
pub mod worktrees;
