//! Workspace discovery against real directories, symlinks and git worktrees.

use std::os::unix::ffi::OsStrExt;

use crew_core::discovery::DiscoverWorkspaceError;
use crew_core::{Workspace, WorkspaceId};
use crew_tests::{TestEnv, render_output};

#[test]
fn nested_worktree_resolves_to_the_leader() {
    let env = TestEnv::new();
    let root = env.repo("project");
    std::fs::create_dir_all(root.join(".worktrees/run1")).unwrap();
    env.git(
        &root,
        [
            "worktree",
            "add",
            "-q",
            "-b",
            "crew/run1-api",
            ".worktrees/run1/api",
        ],
    );
    let task_dir = root.join(".worktrees/run1/api/src");
    // The worktree has its own checked-out `.crew/` (committed config): still the leader.
    std::fs::create_dir_all(root.join(".worktrees/run1/api/.crew")).unwrap();

    let workspace = Workspace::discover(task_dir.as_std_path()).unwrap();
    assert_eq!(workspace.root(), root);
    assert_eq!(workspace.invoked_from(), root.join("src"));
    assert_eq!(workspace.relative_invocation_dir(), "src");

    // A directory the leader does not have maps to its nearest existing ancestor.
    std::fs::create_dir_all(root.join(".worktrees/run1/api/new/deeper")).unwrap();
    let workspace =
        Workspace::discover(root.join(".worktrees/run1/api/new/deeper").as_std_path()).unwrap();
    assert_eq!(workspace.root(), root);
    assert_eq!(workspace.invoked_from(), root);
}

#[test]
fn worktree_outside_the_leader_is_its_own_workspace() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let outside = env.root().join("elsewhere");
    env.git(
        &root,
        ["worktree", "add", "-q", "-b", "side", outside.as_str()],
    );
    let workspace = Workspace::discover(outside.as_std_path()).unwrap();
    assert_eq!(workspace.root(), outside);
}

#[test]
fn symlinked_and_dotdot_spellings_give_one_workspace_id() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let link = env.root().join("link-to-project");
    std::os::unix::fs::symlink(&root, &link).unwrap();
    let direct = Workspace::discover(root.as_std_path()).unwrap();
    for spelling in [
        link.to_string(),
        format!("{root}/src/.."),
        format!("{root}/"),
        format!("{link}/src/../"),
    ] {
        let other = Workspace::discover(std::path::Path::new(&spelling)).unwrap();
        assert_eq!(other.id(), direct.id(), "{spelling}");
        assert_eq!(
            &WorkspaceId::from_path(std::path::Path::new(&spelling)).unwrap(),
            direct.id()
        );
    }
}

#[test]
fn subdirectory_runs_remember_where_they_started() {
    let env = TestEnv::new();
    let root = env.repo("project");
    std::fs::create_dir_all(root.join("a/b")).unwrap();
    let workspace = Workspace::discover(root.join("a/b").as_std_path()).unwrap();
    assert_eq!(workspace.root(), root);
    assert_eq!(workspace.relative_invocation_dir(), "a/b");
}

#[test]
fn non_utf8_paths_get_a_clear_error() {
    let env = TestEnv::new();
    let name = std::ffi::OsStr::from_bytes(b"caf\xe9");
    let dir = env.root().as_std_path().join(name);
    std::fs::create_dir(&dir).unwrap();
    let error = Workspace::discover(&dir).unwrap_err();
    assert!(matches!(error, DiscoverWorkspaceError::Path { .. }));
    let text = env.redact(&crew_tests::error_chain(&error));
    insta::assert_snapshot!(text, @"
    error: failed to find the workspace for $TEST_ENV/caf�
    caused by: path $TEST_ENV/caf� is not valid UTF-8; crew needs UTF-8 paths to record and compare workspaces
    ");
}

#[test]
fn crew_inside_a_running_task_s_worktree_acts_on_the_leader() {
    // The project as `crew init` leaves it: `.crew/` committed, so each worktree checks it out.
    let env = TestEnv::new();
    let repo = crate::common::runs::repo_with_config(&env, "");
    let mut host = env.spawn_crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "echo ready; sleep 600",
        ],
    );
    crate::common::runs::wait_for_agents_saying(&env, &repo, "ready", 1);
    let run = crate::common::runs::run_ids(&env, &repo).remove(0);
    let worktree = repo.join(format!(".worktrees/{run}/shell"));
    assert!(worktree.join(".crew/config.toml").is_file());

    // While the agent runs, its worktree's `.git` leads to the agent's own git directory.
    let listed = env.crew(&worktree.join("src"), ["runs", "list", "--json"]);
    assert!(listed.status.success(), "{}", render_output(&listed));
    let runs: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(runs[0]["run_id"], run.as_str(), "{runs:#}");
    let agents = env.agents_json(&worktree).expect("the leader's agents");
    assert_eq!(agents.as_array().map(Vec::len), Some(1), "{agents:#}");
    assert_eq!(agents[0]["agent_id"], format!("{run}:shell"), "{agents:#}");

    // A run started there is the leader's, and leaves nothing of crew's in the worktree.
    let nested = env.crew(&worktree, ["run", "--agent", "shell", "true"]);
    assert!(nested.status.success(), "{}", render_output(&nested));
    assert!(!worktree.join(".crew/state").exists());
    assert!(!worktree.join(".worktrees").exists());
    assert_eq!(crate::common::runs::run_ids(&env, &repo).len(), 2);

    let stop = env.crew(&worktree, ["agents", "stop", &format!("{run}:shell")]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    host.wait().unwrap();
    let record = crate::common::runs::manifest(&env, &repo, &run);
    let task = crate::common::runs::task(&record, "shell");
    assert_eq!(task["status"], "stopped", "{record:#}");
    assert!(
        task["teardown"]["branch"].is_null() || task["teardown"]["branch_deleted"] == true,
        "nothing of crew's counted as the agent's work: {record:#}"
    );
}
