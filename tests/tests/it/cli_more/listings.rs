//! Runs as the command line shows them: fail-fast, sub-tasks, questions, logs, listings, worktrees, dry runs.

use super::*;

#[test]
fn fail_fast_cancels_the_rest_and_keep_going_skips_only_dependents() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/teams/mixed.toml"),
        r#"[[tasks]]
id = "broken"
agent = "shell"
prompt = "exit 3"

[[tasks]]
id = "after"
agent = "shell"
prompt = "true"
depends_on = ["broken"]

[[tasks]]
id = "slow"
agent = "shell"
prompt = "sleep 2; echo done"
"#,
    );
    let output = env.crew(&repo, ["run", "mixed", "--keep-going"]);
    assert_eq!(output.status.code(), Some(1));
    let run = run_ids(&env, &repo).remove(0);
    let kept_going = manifest(&env, &repo, &run);
    assert_eq!(
        task(&kept_going, "broken")["reason"],
        "the agent exited with code 3"
    );
    assert_eq!(task(&kept_going, "after")["status"], "skipped");
    assert_eq!(
        task(&kept_going, "after")["reason"],
        "upstream task broken did not succeed (failed)"
    );
    assert_eq!(task(&kept_going, "slow")["status"], "succeeded");

    let output = env.crew(&repo, ["run", "mixed", "--fail-fast"]);
    assert_eq!(output.status.code(), Some(1));
    let run = run_ids(&env, &repo).remove(0);
    let failed_fast = manifest(&env, &repo, &run);
    assert_eq!(failed_fast["status"], "failed");
    assert_eq!(task(&failed_fast, "slow")["status"], "cancelled");
    assert_eq!(failed_fast["cancelled_by"]["cause"], "fail_fast");
    assert_eq!(failed_fast["cancelled_by"]["task"], "broken");
    assert!(
        String::from_utf8(output.stdout)
            .unwrap()
            .contains("\ncancelled because task broken failed (fail_fast) at "),
        "the summary says why the rest was cancelled"
    );
}

#[test]
fn agents_add_tasks_to_their_run_but_never_choose_modes_or_paths() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/teams/planner.toml"),
        r#"workspace_mode = "worktree"
[[tasks]]
id = "plan"
agent = "shell"
prompt = """
echo '[{"id": "sneaky", "prompt": "true", "workspace_mode": "single"}]' | crew submit --json - && exit 9
crew submit --task 'build=echo built > build.txt' --task 'check=echo checked > check.txt'
"""
"#,
    );
    let output = env.crew(&repo, ["run", "planner"]);
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let manifest = manifest(&env, &repo, &run);
    let ids: Vec<&str> = manifest["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|task| task["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["plan", "build", "check"],
        "the sneaky plan was refused"
    );
    for (id, text) in [("build", "built\n"), ("check", "checked\n")] {
        assert_eq!(task(&manifest, id)["status"], "succeeded");
        assert_eq!(
            task(&manifest, id)["workspace_mode"],
            "worktree",
            "the run's mode, not the agent's"
        );
        let saved = env.git(&repo, ["show", &format!("crew/{run}-{id}:{id}.txt")]);
        assert_eq!(saved, text);
    }
    let log = env.crew(&repo, ["agents", "logs", &format!("{run}:plan")]);
    let log = String::from_utf8(log.stdout).unwrap();
    assert!(log.contains("unknown field `workspace_mode`"), "{log}");
}

#[test]
fn an_unanswered_question_keeps_its_worktree_until_the_run_is_cleaned() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut child = env.spawn_crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "echo draft > idea.txt; crew ask 'go on?'",
        ],
    );
    wait_until(30, "the question, and the agent to stop for it", || {
        let agents = env.agents_json(&repo)?;
        (agents[0]["question"] == "go on?" && agents[0]["state"] == "exited").then_some(())
    });
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::INT,
    )
    .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(130));
    let run = run_ids(&env, &repo).remove(0);
    let waiting = manifest(&env, &repo, &run);
    assert_eq!(waiting["status"], "cancelled");
    assert_eq!(task(&waiting, "shell")["status"], "waiting");
    let worktree = repo.join(".worktrees").join(&run).join("shell");
    assert!(worktree.join("idea.txt").is_file(), "kept for the answer");

    let redactor = Redactor::new(&env).literal(run.clone(), "[RUN_ID]");
    // Not stranded: crew says what waits, and what can be done with it.
    let stop = env.crew(&repo, ["agents", "stop", "shell"]);
    insta::assert_snapshot!(redactor.redact(&render_output(&stop)), @r#"
    ----- stderr -----
    error: agent [RUN_ID]:shell is not running: it waits for an answer in run [RUN_ID], which no process hosts any more
    hint: answer it with `crew agents follow-up shell "<answer>"` (crew hosts the run again), or `crew runs clean [RUN_ID]` to save its work and remove its workspace
    [exit status: 2]
    "#);
    let show = env.crew(&repo, ["runs", "show", &run]);
    assert!(
        String::from_utf8_lossy(&show.stdout).contains(&format!("crew runs clean {run}")),
        "{}",
        render_output(&show)
    );
    let list = env.crew(&repo, ["runs", "list"]);
    insta::assert_snapshot!(redactor.redact(&String::from_utf8_lossy(&list.stderr)), @"warning: 1 kept worktree(s) ([RUN_ID]:shell) — see `crew worktrees list`");
    assert_eq!(env.crew(&repo, ["runs", "prune"]).status.code(), Some(0));
    assert_eq!(
        run_ids(&env, &repo),
        std::slice::from_ref(&run),
        "prune never removes a waiting run"
    );

    let clean = env.crew(&repo, ["runs", "clean", &run]);
    insta::assert_snapshot!(redactor.redact(&render_output(&clean)), @"
    shell: work saved on crew/[RUN_ID]-shell; workspace removed
    removed run [RUN_ID]
    [exit status: 0]
    ");
    assert!(!worktree.exists());
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-shell:idea.txt")]),
        "draft\n"
    );
    assert!(run_ids(&env, &repo).is_empty());
}

#[test]
fn logs_follow_an_agent_to_its_end() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut run = env.spawn_crew(
        &repo,
        ["run", "--agent", "shell", "echo one; sleep 1; echo two"],
    );
    wait_until(20, "the run to exist", || {
        (!run_ids(&env, &repo).is_empty()).then_some(())
    });
    let logs = env.crew(&repo, ["agents", "logs", "shell", "--follow"]);
    assert_eq!(String::from_utf8(logs.stdout).unwrap(), "one\ntwo\n");
    assert!(run.wait().unwrap().success());
}

#[test]
fn listings_neutralize_terminal_escapes_and_color_follows_the_settings() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut child = env.spawn_crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "printf 'evil \\033[2J\\033]0;title\\007 done\\n'; sleep 600",
        ],
    );
    let listed = wait_until(20, "the agent's output", || {
        let output = env.crew(&repo, ["agents", "list"]);
        let text = String::from_utf8(output.stdout).unwrap();
        text.contains("done").then_some(text)
    });
    assert!(
        !listed.contains('\u{1b}') && !listed.contains('\u{7}'),
        "{listed:?}"
    );
    assert!(
        listed.contains("evil \u{fffd}[2J\u{fffd}]0;title\u{fffd} done"),
        "{listed:?}"
    );

    let colored = env.crew(&repo, ["agents", "list", "--color", "always"]);
    assert!(
        String::from_utf8(colored.stdout)
            .unwrap()
            .contains("\u{1b}[1m"),
        "headers are bold"
    );
    let plain = env
        .crew_command(&repo)
        .args(["agents", "list", "--color", "auto"])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert!(!String::from_utf8(plain.stdout).unwrap().contains('\u{1b}'));
    let stop = env.crew(&repo, ["agents", "stop", "shell"]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    child.wait().unwrap();
}

#[test]
fn an_exited_agent_is_listed_with_its_tasks_status_beside_a_running_one() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut child = env.spawn_crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--task",
            "quick=echo done",
            "--task",
            "slow=echo waiting; sleep 600",
        ],
    );
    // The slow agent's task becomes `running` in the manifest a moment after its process
    // starts: wait for both tasks to settle.
    wait_until(
        20,
        "the quick task to succeed while the slow one runs",
        || {
            let agents = env.agents_json(&repo)?;
            let task = |id: &str| {
                agents
                    .as_array()?
                    .iter()
                    .find(|agent| agent["task_id"] == id)
                    .cloned()
            };
            let (quick, slow) = (task("quick")?, task("slow")?);
            (quick["task_status"] == "succeeded"
                && quick["state"] == "exited"
                && slow["task_status"] == "running"
                && slow["state"] == "running")
                .then_some(())
        },
    );
    let listed = String::from_utf8(env.crew(&repo, ["agents", "list"]).stdout).unwrap();
    let line = |task: &str| {
        listed
            .lines()
            .find(|line| line.contains(&format!(":{task} ")))
            .unwrap_or_else(|| panic!("no line for {task} in {listed}"))
            .split_whitespace()
            .nth(1)
            .unwrap()
            .to_owned()
    };
    assert_eq!(line("quick"), "succeeded", "{listed}");
    assert_eq!(line("slow"), "running", "{listed}");
    let stop = env.crew(&repo, ["agents", "stop", "slow"]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    child.wait().unwrap();
}

#[test]
fn worktree_listing_and_pruning_from_the_command_line() {
    let env = TestEnv::new();
    // The two worktrees the run gives back fill the pool: no refill adds to them.
    let repo = crate::common::runs::repo_with_config(&env, "[worktree]\npool_size = 2\n");
    let run = finished_run(
        &env,
        &repo,
        &[
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "--fan-out",
            "2",
            "echo work > \"$CREW_TASK_ID.txt\"",
        ],
    );
    let listing = env.crew(&repo, ["worktrees", "list", "--json"]);
    let listing: serde_json::Value = serde_json::from_slice(&listing.stdout).unwrap();
    assert_eq!(listing["worktrees"], serde_json::json!([]));
    assert_eq!(listing["branches"].as_array().unwrap().len(), 2);
    assert!(
        listing["branches"]
            .as_array()
            .unwrap()
            .iter()
            .all(|branch| branch["merged"] == false)
    );

    // Merge one; prune deletes exactly that one.
    env.git(
        &repo,
        ["merge", "-q", "--no-edit", &format!("crew/{run}-shell-1")],
    );
    let dry = env.crew(&repo, ["worktrees", "prune", "--dry-run"]);
    let redactor = Redactor::new(&env).literal(run.clone(), "[RUN_ID]");
    insta::assert_snapshot!(redactor.redact(&render_output(&dry)), @"
    would delete merged branch crew/[RUN_ID]-shell-1
    would remove 2 recycled worktree(s) from crew's pool
    kept crew/[RUN_ID]-shell-2: unmerged work: `git merge crew/[RUN_ID]-shell-2` or `git branch -D crew/[RUN_ID]-shell-2`
    [exit status: 0]
    ");
    assert_eq!(
        env.git(&repo, ["branch", "--list", "crew/*"])
            .lines()
            .count(),
        2,
        "a dry run changes nothing"
    );
    let pruned = env.crew(&repo, ["worktrees", "prune"]);
    assert!(pruned.status.success());
    assert_eq!(
        env.git(&repo, ["branch", "--list", "crew/*"]).trim(),
        format!("crew/{run}-shell-2")
    );
}

#[test]
fn warnings_and_dry_runs_stay_short_and_say_what_would_happen() {
    let env = TestEnv::new();
    let repo = repo_with_config(&env, "[retention]\nmax_kept_runs = 0\nautomatic = false\n");
    let tasks: Vec<String> = (1..=5)
        .flat_map(|index| {
            [
                "--task".to_owned(),
                format!("t{index}=echo {index} > f{index}.txt"),
            ]
        })
        .collect();
    let mut args = vec!["run", "--agent", "shell", "--workspace-mode", "worktree"];
    args.extend(tasks.iter().map(String::as_str));
    let output = env.crew(&repo, &args);
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);

    let list = env.crew(&repo, ["runs", "list"]);
    insta::assert_snapshot!(String::from_utf8_lossy(&list.stderr), @"warning: 5 unmerged task branch(es) — see `crew worktrees list`");
    let dry = env.crew(&repo, ["runs", "prune", "--dry-run"]);
    let redactor = Redactor::new(&env).literal(run.clone(), "[RUN_ID]");
    insta::assert_snapshot!(redactor.redact(&render_output(&dry)), @"
    would remove run [RUN_ID]
    1 run(s) would be removed, 0 kept
    [exit status: 0]
    ");
    assert_eq!(run_ids(&env, &repo), [run], "a dry run removes nothing");

    // The branches of the runs shown are counted, not the whole history's.
    let newer = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "echo 6 > f6.txt",
        ],
    );
    assert!(newer.status.success(), "{}", render_output(&newer));
    let newest = run_ids(&env, &repo).remove(0);
    let list = env.crew(&repo, ["runs", "list", "--limit", "1"]);
    let redactor = Redactor::new(&env).literal(newest, "[RUN_ID]");
    insta::assert_snapshot!(redactor.redact(&String::from_utf8_lossy(&list.stderr)), @"
    warning: 1 unmerged task branch(es) (crew/[RUN_ID]-shell) — see `crew worktrees list`
    (the 1 newest of 2 runs; `--all` lists every one, `--limit N` the N newest)
    ");
}
