//! crew's black-box tests, compiled into one binary.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)]

mod common;

mod acp_agents;
mod agent_protocols;
mod best_of;
mod board;
mod caps;
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
mod history;
mod hostile;
mod house;
mod lead_agents;
mod lease;
mod library;
mod live_agents;
mod live_control;
mod network;
mod placements;
mod rate_limits;
mod real_agents;
mod remote_work;
mod run_records;
mod shim;
mod slurm;
mod spend_caps;
mod terminal;
mod worktree_listing;
mod worktree_pool;
mod worktree_prepare;
mod worktree_teardown;

/// Every file and directory of `it/` is compiled in: a test file nobody declared would never
/// run, and nothing would say so.
#[test]
fn no_test_file_is_forgotten() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it");
    let main = std::fs::read_to_string(dir.join("main.rs")).unwrap();
    let mut forgotten = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let module = match name.strip_suffix(".rs") {
            Some("main") => continue,
            Some(stem) => stem.to_owned(),
            None if path.is_dir() => name,
            // Snapshot leftovers and the like are not code.
            None => continue,
        };
        if !main.lines().any(|line| line == format!("mod {module};")) {
            forgotten.push(module);
        }
    }
    assert!(
        forgotten.is_empty(),
        "declare these in tests/it/main.rs: {forgotten:?}"
    );
}
