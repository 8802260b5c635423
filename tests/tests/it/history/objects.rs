//! Objects that exist nowhere, kept worktrees, spare views planted as links, commits after a killed host.

use super::*;

/// An agent's commit whose objects exist nowhere (`git mktree --missing`, `commit-tree`): no
/// path that takes an agent's work into the repository — its teardown, `crew runs clean` after
/// its host was killed, done twice — writes any part of it or moves a branch onto it.
#[test]
fn an_agent_s_commit_whose_objects_exist_nowhere_never_reaches_the_repository() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let ghost = GHOST_COMMIT;
    let objects = |env: &TestEnv| -> String {
        env.git(&repo, ["cat-file", "--batch-all-objects", "--batch-check"])
    };
    let before = objects(&env);

    // Worktree mode, its host killed, then `crew runs clean`, twice.
    let script = format!("{ghost}\nsleep 600");
    let mut host = env.spawn_crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            &script,
        ],
    );
    let run = wait_until(30, "the agent's ghost commit", || {
        let run = run_ids(&env, &repo).into_iter().next()?;
        repo.join(format!(".worktrees/{run}/shell/ghost.id"))
            .exists()
            .then_some(run)
    });
    let branch = format!("crew/{run}-shell");
    let base = env.git(&repo, ["rev-parse", &branch]);
    host.kill().unwrap();
    host.wait().unwrap();
    for _ in 0..2 {
        let clean = env.crew(&repo, ["runs", "clean", &run]);
        assert!(
            !render_output(&clean).contains("removed run"),
            "{}",
            render_output(&clean)
        );
        assert_eq!(env.git(&repo, ["rev-parse", &branch]), base, "not moved");
        assert_eq!(objects(&env), before, "no part of it written");
    }
    env.git(&repo, ["fsck", "--full", "--no-progress"]);

    // Single mode, its teardown.
    let single = env.crew(&repo, ["run", "--agent", "shell", ghost]);
    let _ = render_output(&single);
    assert_eq!(objects(&env), before, "no part of it written");
    env.git(&repo, ["fsck", "--full", "--no-progress"]);
    assert!(
        env.git(&repo, ["log", "--all", "--format=%s"])
            .lines()
            .all(|subject| subject != "ghost")
    );
}

/// A worktree kept because its work could not be taken (here, a commit whose objects exist
/// nowhere) is safe to step into: it uses the repository's own git again, so the
/// `core.fsmonitor` the agent set in its `config.worktree` never runs on the user's `git
/// status`, and the summary names where the agent's git directory was kept.
#[test]
fn a_kept_worktree_uses_the_repository_s_git_and_never_the_agent_s_config() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    env.git(&repo, ["config", "extensions.worktreeConfig", "true"]);
    let marker = env.root().join("fsmonitor-ran");
    let script = format!(
        "git config --worktree core.fsmonitor \"touch {marker}; false\"\necho work > work.txt\n{GHOST_COMMIT}"
    );
    let output = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            &script,
        ],
    );
    let shown = render_output(&output);
    let run = run_ids(&env, &repo).remove(0);
    let kept = repo.join(format!(".worktrees/{run}/shell"));
    assert!(kept.join("work.txt").is_file(), "kept: {shown}");
    let dot_git = std::fs::read_to_string(kept.join(".git")).unwrap();
    assert!(!dot_git.trim_end().ends_with("/agent"), "{dot_git}");
    assert!(
        shown.contains("the agent's git directory is kept at"),
        "{shown}"
    );
    let _ = std::fs::remove_file(&marker);
    let status = env.git_output(&kept, ["status", "--porcelain"]);
    assert!(status.status.success(), "{}", render_output(&status));
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("work.txt"),
        "{}",
        render_output(&status)
    );
    assert!(
        !marker.exists(),
        "the agent's fsmonitor ran on the user's git status"
    );
}

/// `.crew/state/views` planted as a link to a directory laid out as spare views are: no task
/// takes a view from it, and none is put there.
#[test]
fn a_spare_views_directory_planted_as_a_link_is_never_followed() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let first = env.crew(&repo, ["run", "--agent", "shell", "true"]);
    assert!(first.status.success(), "{}", render_output(&first));
    let views = repo.join(".crew/state/views");
    std::fs::remove_dir_all(&views).unwrap();
    let decoy = env.root().join("decoy");
    for name in ["planted/upper", "planted/work"] {
        std::fs::create_dir_all(decoy.join(name)).unwrap();
    }
    write(&decoy.join("planted/start.spare"), "{}");
    std::os::unix::fs::symlink(&decoy, &views).unwrap();
    let before = crew_tests::tree_fingerprint(decoy.as_std_path());
    for _ in 0..2 {
        let next = env.crew(&repo, ["run", "--agent", "shell", "true"]);
        assert!(next.status.success(), "{}", render_output(&next));
    }
    assert!(views.is_symlink(), "the link is left as it is");
    assert_eq!(
        crew_tests::tree_fingerprint(decoy.as_std_path()),
        before,
        "nothing taken from or put in the link's target"
    );
}

/// An agent committed, its host was killed, and the user deleted its worktree: the commit is
/// not lost with the worktree's entry when the run is taken up again; it is on the task's
/// branch.
#[test]
fn an_agent_s_commit_survives_its_killed_host_and_its_deleted_worktree() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let go = crew_tests::signal(&repo, "go");
    let script = format!(
        r#"export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.com GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.com
if [ -e committed.txt ]; then echo again; exit 0; fi
echo first > committed.txt && git add committed.txt && git commit -q -m "the agent's" && echo ready
while [ ! -e {go} ]; do sleep 0.05; done"#
    );
    let mut host = env.spawn_crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            &script,
        ],
    );
    crate::common::runs::wait_for_agents_saying(&env, &repo, "ready", 1);
    let run = run_ids(&env, &repo).remove(0);
    host.kill().unwrap();
    host.wait().unwrap();
    std::fs::remove_dir_all(repo.join(format!(".worktrees/{run}/shell"))).unwrap();
    write(&go, "");
    let resumed = env.crew(&repo, ["runs", "resume", &run]);
    let shown = render_output(&resumed);
    let log = env.git(&repo, ["log", "--format=%s", &format!("crew/{run}-shell")]);
    assert!(
        log.lines().any(|subject| subject == "the agent's"),
        "{shown}\n{log}"
    );
    env.git(&repo, ["fsck", "--full", "--no-progress"]);
}
