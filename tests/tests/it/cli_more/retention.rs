//! What a run's end tidies, and what it leaves the user.

use super::*;

#[test]
fn retention_prunes_by_itself_after_a_run_and_keeps_work_that_is_on_no_branch() {
    let env = TestEnv::new();
    let repo = repo_with_config(&env, "[retention]\nmax_kept_runs = 2\n");
    // The oldest run's work is in its dedicated workspace, on no branch.
    let kept = finished_run(
        &env,
        &repo,
        &[
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "dedicated",
            "echo mine > mine.txt",
        ],
    );
    let mut others = Vec::new();
    for index in 0..3 {
        others.push(finished_run(
            &env,
            &repo,
            &["run", "--agent", "shell", &format!("echo {index}")],
        ));
    }
    // The last run's end started the prune; it does not wait for it.
    let left = wait_until(30, "the background prune", || {
        let left = run_ids(&env, &repo);
        (left.len() == 3).then_some(left)
    });
    assert!(
        left.contains(&kept),
        "the dedicated run's work stays: {left:?}"
    );
    assert_eq!(
        left[..2],
        [others[2].clone(), others[1].clone()],
        "the newest two stay"
    );
    let workspace = repo.join(format!(".crew/state/ws/{kept}/shell/mine.txt"));
    assert!(workspace.exists(), "{workspace}");
}

#[test]
fn the_user_s_own_worktrees_under_the_worktrees_directory_are_not_listed_as_crew_s() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // The user keeps worktrees of their own there too: one at `.worktrees/feature/x` (whose
    // names read as a run and a task), one at `.worktrees/mine` (its subdirectories too).
    env.git(
        &repo,
        [
            "worktree",
            "add",
            "-q",
            "-b",
            "feature-x",
            ".worktrees/feature/x",
        ],
    );
    env.git(
        &repo,
        ["worktree", "add", "-q", "-b", "mine", ".worktrees/mine"],
    );
    std::fs::create_dir_all(repo.join(".worktrees/mine/docs")).unwrap();
    let listing = env.crew(&repo, ["worktrees", "list", "--json"]);
    assert!(listing.status.success(), "{}", render_output(&listing));
    let listing: serde_json::Value = serde_json::from_slice(&listing.stdout).unwrap();
    assert_eq!(listing["worktrees"], serde_json::json!([]), "{listing:#}");
    // And pruning leaves them be.
    let prune = env.crew(&repo, ["worktrees", "prune"]);
    assert!(prune.status.success(), "{}", render_output(&prune));
    assert!(repo.join(".worktrees/feature/x/README.md").is_file());
    assert!(repo.join(".worktrees/mine/docs").is_dir());
}
