//! The rest of what the `crew` command promises: fail-fast, agent-authored plans, unanswered
//! questions and `runs clean`, logs, listings, colors and neutralized escapes.

use camino::Utf8Path;
use crew_tests::{Redactor, TestEnv, render_output, tree_fingerprint, wait_until, write};

use crate::common::runs::{finished_run, manifest, repo_with_config, run_ids, task};

mod hosts;
mod listings;
mod output;
mod resume;
mod retention;

/// Starts `crew run` in the background with an agent `twice` whose resume prints the message
/// and the `draft.txt` of its workspace, in worktree mode, with `tasks` (`--task id=prompt`…).
fn start_twice(env: &TestEnv, repo: &Utf8Path, tasks: &[&str]) -> std::process::Child {
    write(
        &repo.join(".crew/agents/twice.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\nresume = [\"sh\", \"-c\", \"echo resumed with $(cat draft.txt): {message}\"]\n",
    );
    let mut args = vec!["run", "--agent", "twice", "--workspace-mode", "worktree"];
    args.extend_from_slice(tasks);
    env.spawn_crew(repo, args)
}

/// The task status and agent state `crew agents list --json` gives for task `id`.
fn listed_agent(env: &TestEnv, repo: &Utf8Path, id: &str) -> Option<(String, String)> {
    let agents = env.agents_json(repo)?;
    let agent = agents
        .as_array()?
        .iter()
        .find(|agent| agent["task_id"] == id)?
        .clone();
    Some((
        agent["task_status"].as_str()?.to_owned(),
        agent["state"].as_str()?.to_owned(),
    ))
}
