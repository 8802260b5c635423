//! What a run records beyond the agent's work: setup output, git identity, who cancelled, how
//! far the base moved.

use crew_tests::{TestEnv, render_output, write};

use crate::cli_run::{manifest, run_ids, task};

#[test]
fn an_agent_commits_with_an_identity_that_lives_only_in_the_environment() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/agents/committer.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\npass_env = [\"GIT_AUTHOR_*\", \"GIT_COMMITTER_NAME\", \"GIT_COMMITTER_EMAIL\"]\n",
    );
    let output = env
        .crew_command(&repo)
        .args([
            "run",
            "--agent",
            "committer",
            "--workspace-mode",
            "worktree",
            "--task",
            "t=echo x > x.txt && git add x.txt && git commit -q -m agent-commit",
        ])
        .env("GIT_AUTHOR_NAME", "CI Robot")
        .env("GIT_AUTHOR_EMAIL", "robot@ci.example")
        .env("GIT_COMMITTER_NAME", "CI Robot")
        .env("GIT_COMMITTER_EMAIL", "robot@ci.example")
        .env("GIT_DIR", "/nowhere")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let record = task(&manifest(&env, &repo, &run), "t").clone();
    assert_eq!(record["status"], "succeeded", "{record:#}");
    let branch = record["teardown"]["branch"].as_str().unwrap();
    let log = env.git(
        &repo,
        ["log", "-1", "--format=%an <%ae> / %cn / %s", branch],
    );
    assert_eq!(
        log.trim(),
        "CI Robot <robot@ci.example> / CI Robot / agent-commit"
    );
}
