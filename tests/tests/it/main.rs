//! crew's black-box tests, compiled into one binary.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)]

mod cli_errors;
mod cli_lifecycle;
mod cli_more;
mod cli_run;
mod core_config;
mod core_discovery;
mod core_ids;
mod core_paths;
mod core_state;
mod editor_protocol;
mod hostile;
mod lead_agents;
mod library;
mod live_agents;
mod live_control;
mod run_records;
mod worktree_listing;
mod worktree_pool;
mod worktree_prepare;
mod worktree_teardown;
