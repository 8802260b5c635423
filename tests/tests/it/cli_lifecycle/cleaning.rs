//! Cleaning and pruning what a killed host left.

use super::*;

#[test]
fn prune_removes_the_worktree_a_killed_host_left_unfinished() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let run = kill_host_mid_preparation(&env, &repo);
    let worktree = repo.join(".worktrees").join(&run).join("shell");
    assert!(worktree.exists());

    let pruned = env.crew(&repo, ["worktrees", "prune"]);
    let shown = render_output(&pruned);
    assert!(pruned.status.success(), "{shown}");
    assert!(
        shown.contains(&format!("removed worktree {worktree}")),
        "{shown}"
    );
    assert!(!worktree.exists());
    assert_eq!(env.task_worktrees(&repo), Vec::<String>::new());
}

#[test]
fn cleaning_a_run_whose_host_died_mid_preparation_removes_its_unfinished_worktree() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let run = kill_host_mid_preparation(&env, &repo);
    let worktree = repo.join(".worktrees").join(&run).join("shell");
    assert!(worktree.exists());

    let cleaned = env.crew(&repo, ["runs", "clean", &run]);
    let shown = render_output(&cleaned);
    assert!(cleaned.status.success(), "{shown}");
    assert!(
        shown.contains("shell: its worktree, which its host's death left unfinished"),
        "{shown}"
    );
    assert!(!worktree.exists(), "{shown}");
    assert_eq!(env.task_worktrees(&repo), Vec::<String>::new());
    assert!(run_ids(&env, &repo).is_empty());
}

#[test]
fn resuming_one_agent_of_an_ended_run_runs_no_other_task_again() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let run = env.crew(
        &repo,
        crate::common::runs::shell_worktree_args(&[
            "deploy=echo deployed; exit 1",
            "fix=echo fixing; if [ -n \"$CREW_MESSAGE\" ]; then exit 0; fi; exit 1",
        ]),
    );
    assert!(!run.status.success(), "{}", render_output(&run));
    let run = run_ids(&env, &repo).remove(0);
    let resume = env.crew(&repo, ["agents", "resume", "fix", "fixed"]);
    let shown = render_output(&resume);
    let recorded = manifest(&env, &repo, &run);
    let task = |id| crate::common::runs::task(&recorded, id).clone();
    assert_eq!(task("fix")["status"], "succeeded", "{shown}");
    assert_eq!(task("deploy")["status"], "failed", "{recorded:#}");
    let log = |id: &str| {
        std::fs::read_to_string(repo.join(format!(".crew/state/runs/{run}/tasks/{id}/output.log")))
            .unwrap()
    };
    assert_eq!(
        log("deploy").matches("deployed").count(),
        1,
        "{}",
        log("deploy")
    );
    assert!(log("fix").contains("started again"), "{}", log("fix"));
}

#[test]
fn an_agent_resumed_right_after_its_stop_ended_its_run_goes_on() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut args = crate::common::runs::shell_worktree_args(&[
        "sc=if [ -n \"$CREW_MESSAGE\" ]; then echo \"$CREW_MESSAGE\" > said.txt; exit 0; fi; echo ready; while true; do sleep 0.1; done",
    ]);
    args.insert(1, "--quiet".to_owned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut host = start_run(&env, &repo, &args, 1);
    let run = run_ids(&env, &repo).remove(0);
    let stop = env.crew(&repo, ["agents", "stop", "sc"]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    // At once: its run is still ending (its only agent was stopped).
    let resume = env.crew(&repo, ["agents", "resume", "sc", "go on"]);
    let shown = render_output(&resume);
    assert!(resume.status.success(), "{shown}");
    host.wait().unwrap();
    // Where its run had ended before the resume reached it, a host of its own takes it up in
    // the background: its record is read once that host is done with it.
    let recorded = crew_tests::wait_until(60, "the resumed agent to end", || {
        let recorded = manifest(&env, &repo, &run);
        let status = crate::common::runs::task(&recorded, "sc")["status"].clone();
        (status != "running" && status != "stopped" && status != "preparing").then_some(recorded)
    });
    assert_eq!(
        crate::common::runs::task(&recorded, "sc")["status"],
        "succeeded",
        "{shown}\n{recorded:#}"
    );
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-sc:said.txt")]),
        "go on\n"
    );
}

#[test]
fn a_clean_after_a_killed_host_names_the_ignored_files_that_go_with_the_run() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(&repo.join(".gitignore"), "out.log\nbuild/\n");
    env.git(&repo, ["add", ".gitignore"]);
    env.git(&repo, ["commit", "-q", "-m", "ignores"]);
    let args = crate::common::runs::shell_worktree_args(&[
        "t=echo changed >> README.md; echo log > out.log; mkdir build; echo o > build/x.o; echo ready; sleep 600",
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut host = start_run(&env, &repo, &args, 1);
    let run = run_ids(&env, &repo).remove(0);
    host.kill().unwrap();
    host.wait().unwrap();
    let clean = env.crew(&repo, ["runs", "clean", &run]);
    let shown = render_output(&clean);
    assert!(clean.status.success(), "{shown}");
    assert!(
        shown.contains("2 ignored file(s) the agent wrote")
            && shown.contains("build/")
            && shown.contains("out.log"),
        "{shown}"
    );
    assert!(
        env.git(&repo, ["show", &format!("crew/{run}-t:README.md")])
            .contains("changed"),
        "the tracked work is on its branch"
    );
}

#[test]
fn an_agent_s_read_only_directories_are_saved_removed_and_never_reach_the_next_task() {
    // File permissions do not hold root back: crew runs as `nobody` here.
    if !crew_tests::can_drop_to_nobody() {
        return;
    }
    let env = TestEnv::reachable_by_others();
    let repo = env.repo("project");
    write(&repo.join(".gitignore"), "build/\n");
    // One worktree in the pool: the next task takes the one the first left.
    write(
        &repo.join(".crew/config.toml"),
        "[worktree]\npool_size = 1\n",
    );
    env.git(&repo, ["add", ".gitignore", ".crew/config.toml"]);
    env.git(&repo, ["commit", "-q", "-m", "ignore build"]);
    env.hand_to_nobody();
    // The agent leaves its work, its build output and its worktree's own directory read-only.
    let script = "mkdir -p ro/sub build/out; echo kept > ro/sub/work.txt; echo top > top.txt; \
                  echo built > build/out/bin; chmod 555 ro/sub ro build/out build .";
    let first = crew_as_nobody(
        &env,
        &repo,
        &[
            "run",
            "--workspace-mode",
            "worktree",
            "--agent",
            "shell",
            script,
        ],
    );
    let shown = render_output(&first);
    assert!(first.status.success(), "{shown}");
    let run = run_ids(&env, &repo).remove(0);
    assert!(!shown.contains("NOT ON ITS BRANCH"), "{shown}");
    let record = manifest(&env, &repo, &run);
    let teardown = &record["tasks"][0]["teardown"];
    assert!(teardown["preserved"].is_null(), "{record:#}");
    assert!(!repo.join(format!(".worktrees/{run}")).exists(), "{shown}");
    let branch = format!("crew/{run}-shell");
    let show = |spec: &str| {
        let output = std::process::Command::new("git")
            .args(["show", spec])
            .current_dir(&repo)
            .uid(crew_tests::NOBODY)
            .gid(crew_tests::NOBODY)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("HOME", env.home())
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    assert_eq!(show(&format!("{branch}:ro/sub/work.txt")), "kept\n");
    assert_eq!(show(&format!("{branch}:top.txt")), "top\n");

    // The next tasks take the recycled worktrees, which hold nothing of the first.
    for round in 0..2 {
        let next = crew_as_nobody(
            &env,
            &repo,
            &[
                "run",
                "--workspace-mode",
                "worktree",
                "--agent",
                "shell",
                "ls -A > seen.txt",
            ],
        );
        let shown = render_output(&next);
        assert!(next.status.success(), "round {round}: {shown}");
        let run = run_ids(&env, &repo).remove(0);
        let seen = show(&format!("crew/{run}-shell:seen.txt"));
        assert_eq!(
            seen, ".crew\n.git\n.gitignore\nREADME.md\nseen.txt\nsrc\n",
            "round {round}: {shown}"
        );
    }
}
