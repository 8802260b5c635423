//! The rest of what the `crew` command promises: fail-fast, agent-authored plans, unanswered
//! questions and `runs clean`, logs, listings, colors and neutralized escapes.

use camino::Utf8Path;
use crew_tests::{Redactor, TestEnv, render_output, tree_fingerprint, wait_until, write};

use crate::common::runs::{finished_run, manifest, repo_with_config, run_ids, task};

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

#[test]
fn runs_of_a_newer_crew_are_never_cleaned_or_pruned() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let run = finished_run(
        &env,
        &repo,
        &[
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "dedicated",
            "echo work > work.txt",
        ],
    );
    let path = repo.join(format!(".crew/state/runs/{run}/manifest.json"));
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json["schema_version"] = 99.into();
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    let work = repo.join(format!(".crew/state/ws/{run}/shell/work.txt"));

    let clean = env.crew(&repo, ["runs", "clean", &run]);
    let redactor = Redactor::new(&env).literal(run.clone(), "[RUN_ID]");
    insta::assert_snapshot!(redactor.redact(&render_output(&clean)), @"
    ----- stderr -----
    error: run [RUN_ID] was written by a newer crew (schema version 99); this crew leaves it as it is
    hint: clean it with the crew that made it
    [exit status: 2]
    ");
    write(
        &repo.join(".crew/config.toml"),
        "[retention]\nmax_kept_runs = 0\nautomatic = false\n",
    );
    let prune = env.crew(&repo, ["runs", "prune"]);
    assert!(prune.status.success(), "{}", render_output(&prune));
    assert!(work.exists(), "the newer run's workspace is still there");
    assert_eq!(run_ids(&env, &repo), [run]);
}

#[test]
fn agents_find_the_crew_that_hosts_them_even_off_the_users_path() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // crew started by its full path, with a PATH that does not hold it (as `cargo run` does).
    let output = env
        .crew_command(&repo)
        .env("PATH", "/usr/bin:/bin")
        .args(["run", "--agent", "shell", "command -v crew"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let log = std::fs::read_to_string(
        repo.join(format!(".crew/state/runs/{run}/tasks/shell/output.log")),
    )
    .unwrap();
    assert_eq!(log.trim(), crew_tests::crew_bin().as_str());
    // A finished agent's newest line is listed too.
    let listed = env.crew(&repo, ["agents", "list", "--all-runs", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed[0]["last_line"], crew_tests::crew_bin().as_str());
}

#[test]
fn an_agent_is_told_that_listing_agents_is_the_users() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let output = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "crew agents list; echo \"exit $?\"",
        ],
    );
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let log = std::fs::read_to_string(
        repo.join(format!(".crew/state/runs/{run}/tasks/shell/output.log")),
    )
    .unwrap();
    assert!(
        log.contains(&format!(
            "`crew agents list` runs inside agent {run}:shell: listing agents takes the user's own `crew`"
        )),
        "{log}"
    );
    assert!(log.contains("exit 2"), "{log}");
    assert!(!log.contains("AGENT "), "{log}");
}

#[test]
fn the_first_run_of_a_fresh_project_publishes_its_listing() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    assert!(!repo.join(".crew").exists());
    let mut child = env.spawn_crew(
        &repo,
        ["run", "--agent", "shell", "echo started; sleep 600"],
    );
    let live = repo.join(".crew/state/live");
    crew_tests::wait_until(20, "the host's published listing", || {
        std::fs::read_dir(&live)
            .ok()?
            .flatten()
            .any(|entry| entry.file_name().to_string_lossy().ends_with(".json"))
            .then_some(())
    });
    child.kill().unwrap();
    child.wait().unwrap();
}

/// `crew agents list` reads the listings hosts publish, before its command line is even
/// parsed (`crew_cli::quick`); a live host whose listing cannot be read is asked over its
/// socket instead, and its agents are listed all the same.
#[test]
fn a_live_host_whose_listing_cannot_be_read_is_asked_for_its_agents() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut child = env.spawn_crew(
        &repo,
        ["run", "--agent", "shell", "echo started; sleep 600"],
    );
    let listed = || {
        let output = env.crew(&repo, ["agents", "list", "--json"]);
        assert!(output.status.success(), "{}", render_output(&output));
        let agents: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        agents
            .as_array()
            .unwrap()
            .iter()
            .map(|agent| agent["task_id"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    // Published once its agent has said something (and nothing is written after that).
    wait_until(20, "the agent in the published listing", || {
        let listing = std::fs::read_dir(repo.join(".crew/state/live"))
            .ok()?
            .flatten()
            .find(|entry| entry.file_name().to_string_lossy().ends_with(".json"))?;
        std::fs::read_to_string(listing.path())
            .ok()?
            .contains("started")
            .then_some(())
    });
    assert_eq!(listed(), ["shell"]);
    // The listing names the host that wrote it, so no manifest is read to trust it: with the
    // run's manifest unreadable for a moment, its agent is listed all the same.
    let run = run_ids(&env, &repo).remove(0);
    let manifest_path = repo.join(format!(".crew/state/runs/{run}/manifest.json"));
    let kept = std::fs::read(&manifest_path).unwrap();
    std::fs::write(&manifest_path, "{ not a manifest").unwrap();
    let without_manifest = listed();
    std::fs::write(&manifest_path, &kept).unwrap();
    assert_eq!(without_manifest, ["shell"]);
    // The listing, spoiled: the host is alive and only its socket can tell.
    let listings: Vec<_> = std::fs::read_dir(repo.join(".crew/state/live"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    let published: Vec<Vec<u8>> = listings
        .iter()
        .map(|path| std::fs::read(path).unwrap())
        .collect();
    for path in &listings {
        std::fs::write(path, "{ not a listing").unwrap();
    }
    assert_eq!(listed(), ["shell"]);
    let table = env.crew(&repo, ["agents", "list"]);
    assert!(
        String::from_utf8_lossy(&table.stdout).contains("shell"),
        "{}",
        render_output(&table)
    );
    // Put back, then left by a host that died: its writer is not alive, so it is not
    // trusted, and nothing is listed.
    for (path, bytes) in listings.iter().zip(&published) {
        std::fs::write(path, bytes).unwrap();
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(listings.iter().any(|path| path.exists()));
    assert_eq!(listed(), Vec::<String>::new());
}

#[test]
fn an_agents_log_keeps_its_newest_output_within_its_limit() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/config.toml"),
        "[run]\nmax_output_log = \"64KiB\"\n",
    );
    // 3,000 numbered lines of 100 bytes: about 300 KB.
    let run = finished_run(
        &env,
        &repo,
        &[
            "run",
            "--agent",
            "shell",
            "i=0; while [ $i -lt 3000 ]; do printf 'line %05d %090d\\n' $i 0; i=$((i+1)); done",
        ],
    );
    let log = repo.join(format!(".crew/state/runs/{run}/tasks/shell/output.log"));
    let current = std::fs::read_to_string(&log).unwrap();
    let before = std::fs::read_to_string(format!("{log}.1")).unwrap();
    assert!(current.len() <= 64 * 1024 && before.len() <= 64 * 1024);
    assert!(
        current.starts_with("[crew: the log reached its limit of 64KiB;"),
        "{}",
        &current[..200]
    );
    assert!(current.ends_with(&format!("line 02999 {:090}\n", 0)));
    // `crew agents logs` shows both parts, in order, ending with the newest line.
    let logs = env.crew(&repo, ["agents", "logs", "shell"]);
    let shown = String::from_utf8(logs.stdout).unwrap();
    assert_eq!(shown, format!("{before}{current}"));
}

#[test]
fn an_agents_ignored_files_are_named_and_kept_and_never_reach_the_next_task() {
    let env = TestEnv::new();
    // One pooled worktree, the one the first task gives back: the next task must get it.
    let repo = crate::common::runs::repo_with_config(&env, "[worktree]\npool_size = 1\n");
    write(&repo.join(".gitignore"), ".env\nbuild/\n");
    env.git(&repo, ["add", ".gitignore"]);
    env.git(&repo, ["commit", "-q", "-m", "ignores"]);
    // The user's own global excludes hide notes.md from git too.
    write(&env.home().join("global-ignore"), "notes.md\n");
    write(
        &env.home().join(".gitconfig"),
        &format!(
            "[core]\n\texcludesFile = {}\n",
            env.home().join("global-ignore")
        ),
    );
    let run = finished_run(
        &env,
        &repo,
        &[
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "echo SECRET=1 > .env; mkdir build; echo o > build/out.o; echo n > notes.md; echo work > work.txt",
        ],
    );
    let record = task(&manifest(&env, &repo, &run), "shell").clone();
    let mut named: Vec<&str> = record["teardown"]["ignored_paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|path| path.as_str().unwrap())
        .collect();
    named.sort();
    assert_eq!(named, [".env", "build/", "notes.md"]);
    assert_eq!(record["teardown"]["ignored_files"], 3);
    assert_eq!(record["teardown"]["recycled"], true, "{record:#}");
    let kept = repo.join(format!(".crew/state/runs/{run}/tasks/shell/ignored"));
    assert_eq!(
        std::fs::read_to_string(kept.join("notes.md")).unwrap(),
        "n\n",
        "the file the global excludes hid is kept"
    );
    assert!(kept.join(".env").is_file() && kept.join("build/out.o").is_file());
    let shown = env.crew(&repo, ["runs", "show", &run]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains("3 ignored file(s) the agent wrote") && shown.contains("notes.md"),
        "{shown}"
    );

    // The next task gets the recycled worktree: none of it is there.
    let output = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "ls -A",
        ],
    );
    assert!(output.status.success(), "{}", render_output(&output));
    let next = run_ids(&env, &repo).remove(0);
    let pool = repo.join(".worktrees/.pool");
    assert_eq!(
        std::fs::read_dir(&pool).map_or(0, |entries| entries.count()),
        1,
        "the first worktree was taken from the pool and given back"
    );
    let listing = std::fs::read_to_string(
        repo.join(format!(".crew/state/runs/{next}/tasks/shell/output.log")),
    )
    .unwrap();
    for leftover in [".env", "build", "notes.md", "work.txt"] {
        assert!(
            !listing.lines().any(|line| line == leftover),
            "{leftover} reached the next task: {listing}"
        );
    }
}

#[test]
fn resuming_an_agent_of_a_completed_run_is_refused_before_anything_is_said() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let output = env.crew(&repo, ["run", "--agent", "shell", "echo done"]);
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let resumed = env.crew(&repo, ["agents", "resume", "shell", "go on"]);
    let redactor = Redactor::new(&env).literal(run.clone(), "[RUN_ID]");
    insta::assert_snapshot!(redactor.redact(&render_output(&resumed)), @"
    ----- stderr -----
    error: task shell of run [RUN_ID] already succeeded, and its agent keeps no session to go on with; for more work, start a new run (its branch is where the work is)
    [exit status: 2]
    ");
}

#[test]
fn node_modules_copied_is_the_worktrees_own_and_never_the_agents_work() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(&repo.join(".gitignore"), "node_modules/\n");
    for index in 0..20 {
        write(
            &repo.join(format!("node_modules/pkg{index}/index.js")),
            &format!("module {index}\n"),
        );
    }
    std::os::unix::fs::symlink("../pkg1/index.js", repo.join("node_modules/pkg0/bin")).unwrap();
    write(
        &repo.join(".crew/config.toml"),
        "[worktree]\nlink_mode = \"copy\"\n",
    );
    env.git(&repo, ["add", ".gitignore", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "ignore node_modules"]);
    let leader = tree_fingerprint(repo.join("node_modules").as_std_path());
    // A sandboxed agent installs into its own node_modules, then does its work.
    let run = finished_run(
        &env,
        &repo,
        &[
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "test ! -L node_modules && test -L node_modules/pkg0/bin && echo patched > node_modules/pkg1/index.js && echo app > app.js",
        ],
    );
    let record = task(&manifest(&env, &repo, &run), "shell").clone();
    assert_eq!(record["status"], "succeeded", "{record:#}");
    assert_eq!(
        tree_fingerprint(repo.join("node_modules").as_std_path()),
        leader,
        "the leader's node_modules is untouched"
    );
    let branch = record["teardown"]["branch"].as_str().unwrap();
    let files = env.git(&repo, ["ls-tree", "-r", "--name-only", branch]);
    assert!(!files.contains("node_modules"), "{files}");
    assert!(files.lines().any(|line| line == "app.js"));
    assert!(
        record["teardown"]["ignored_paths"].is_null(),
        "the copy is crew's, not the agent's ignored files: {record:#}"
    );
}

#[test]
fn resuming_an_agent_of_a_finished_run_uses_its_resume_template_and_the_message() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/agents/retry.toml"),
        "command = [\"sh\", \"-c\", \"echo first try; exit 1\"]\nresume = [\"sh\", \"-c\", \"echo resumed with: {message} / $CREW_MESSAGE\"]\n",
    );
    let output = env.crew(&repo, ["run", "--agent", "retry", "do it"]);
    assert_eq!(output.status.code(), Some(1), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let resumed = env.crew(&repo, ["agents", "resume", "retry", "try again"]);
    assert!(resumed.status.success(), "{}", render_output(&resumed));
    let record = task(&manifest(&env, &repo, &run), "retry").clone();
    assert_eq!(record["status"], "succeeded", "{record:#}");
    let log = std::fs::read_to_string(
        repo.join(format!(".crew/state/runs/{run}/tasks/retry/output.log")),
    )
    .unwrap();
    assert!(log.starts_with("first try\n"), "{log}");
    assert!(
        log.ends_with("resumed with: try again / try again\n"),
        "{log}"
    );
}

#[test]
fn an_agent_stopped_while_its_run_goes_on_resumes_in_the_workspace_it_left() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut child = start_twice(
        &env,
        &repo,
        &[
            "--task",
            "keep=echo keeping; sleep 600",
            "--task",
            "victim=echo draft > draft.txt; echo started; sleep 600",
        ],
    );
    let agent_state = |id: &str| listed_agent(&env, &repo, id);
    wait_until(20, "both agents to run", || {
        let running = |id| agent_state(id) == Some(("running".into(), "running".into()));
        let log = std::fs::read_to_string(
            repo.join(".crew/state/runs")
                .join(run_ids(&env, &repo).first()?.as_str())
                .join("tasks/victim/output.log"),
        )
        .ok()?;
        (running("keep") && running("victim") && log.contains("started")).then_some(())
    });
    let run = run_ids(&env, &repo).remove(0);

    let stop = env.crew(&repo, ["agents", "stop", "victim"]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    wait_until(20, "the stopped task to be recorded", || {
        (agent_state("victim")?.0 == "stopped").then_some(())
    });
    let stopped = task(&manifest(&env, &repo, &run), "victim").clone();
    assert!(
        stopped["teardown"].is_null(),
        "the workspace is held: {stopped:#}"
    );
    assert!(
        stopped["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("crew agents resume {run}:victim")),
        "{stopped:#}"
    );

    let resumed = env.crew(&repo, ["agents", "resume", "victim", "go on"]);
    assert!(resumed.status.success(), "{}", render_output(&resumed));
    wait_until(20, "the resumed task to succeed", || {
        (agent_state("victim")?.0 == "succeeded").then_some(())
    });
    let log = std::fs::read_to_string(
        repo.join(format!(".crew/state/runs/{run}/tasks/victim/output.log")),
    )
    .unwrap();
    assert!(
        log.ends_with("resumed with draft: go on\n"),
        "the resume ran in the workspace the agent left: {log}"
    );
    assert_eq!(
        agent_state("keep"),
        Some(("running".into(), "running".into())),
        "the other agent never noticed"
    );

    // Once nothing but stopped tasks is left, the run ends.
    let stop = env.crew(&repo, ["agents", "stop", "keep"]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    child.wait().unwrap();
    let finished = manifest(&env, &repo, &run);
    assert_eq!(task(&finished, "keep")["status"], "stopped", "{finished:#}");
    assert_eq!(task(&finished, "keep")["reason"], "stopped by request");
    assert!(
        !task(&finished, "keep")["teardown"].is_null(),
        "{finished:#}"
    );
    let victim = task(&finished, "victim");
    let branch = victim["teardown"]["branch"].as_str().unwrap();
    let files = env.git(&repo, ["ls-tree", "-r", "--name-only", branch]);
    assert!(files.lines().any(|line| line == "draft.txt"), "{files}");
}

#[test]
fn a_finished_task_of_a_live_run_is_resumed_on_its_branch_while_the_run_goes_on() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut child = start_twice(
        &env,
        &repo,
        &[
            "--keep-going",
            "--task",
            "keep=sleep 600",
            "--task",
            "broken=echo draft > draft.txt; exit 3",
            "--task",
            "fine=true",
        ],
    );
    let status = |id: &str| listed_agent(&env, &repo, id).map(|(status, _)| status);
    wait_until(20, "the broken task to fail while the run goes on", || {
        (status("broken")? == "failed" && status("fine")? == "succeeded").then_some(())
    });
    let run = run_ids(&env, &repo).remove(0);

    let done = env.crew(&repo, ["agents", "resume", "fine"]);
    let redactor = Redactor::new(&env).literal(run.clone(), "[RUN_ID]");
    insta::assert_snapshot!(redactor.redact(&render_output(&done)), @"
    ----- stderr -----
    error: task fine of run [RUN_ID] already succeeded, and its agent keeps no session to go on with; for more work, start a new run (its branch is where the work is)
    [exit status: 2]
    ");

    let resumed = env.crew(&repo, ["agents", "resume", "broken", "fix it"]);
    insta::assert_snapshot!(redactor.redact(&render_output(&resumed)), @"
    resuming [RUN_ID]:broken: its task starts again in a new workspace on its branch
    [exit status: 0]
    ");
    wait_until(20, "the resumed task to succeed", || {
        (status("broken")? == "succeeded").then_some(())
    });
    let log = std::fs::read_to_string(
        repo.join(format!(".crew/state/runs/{run}/tasks/broken/output.log")),
    )
    .unwrap();
    assert!(
        log.ends_with("resumed with draft: fix it\n"),
        "the resume took up the branch the failed attempt left: {log}"
    );
    let stop = env.crew(&repo, ["agents", "stop", "keep"]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    child.wait().unwrap();
    let finished = manifest(&env, &repo, &run);
    assert_eq!(
        task(&finished, "broken")["status"],
        "succeeded",
        "{finished:#}"
    );
    assert_eq!(task(&finished, "broken")["attempts"], 2, "{finished:#}");
}

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

#[test]
fn runs_list_shows_the_newest_runs_and_says_how_many_more_there_are() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // Retention would prune beyond 20 by itself.
    write(
        &repo.join(".crew/config.toml"),
        "[retention]\nmax_kept_runs = 100\n",
    );
    for index in 0..22 {
        let output = env.crew(&repo, ["run", "--agent", "shell", &format!("echo {index}")]);
        assert!(output.status.success(), "{}", render_output(&output));
    }
    let ids = |args: &[&str]| -> Vec<String> {
        let output = env.crew(&repo, args);
        assert!(output.status.success(), "{}", render_output(&output));
        serde_json::from_slice::<serde_json::Value>(&output.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|run| run["run_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let all = ids(&["runs", "list", "--all", "--json"]);
    assert_eq!(all.len(), 22);
    assert_eq!(ids(&["runs", "list", "--json"]), all[..20]);
    assert_eq!(ids(&["runs", "list", "--limit", "2", "--json"]), all[..2]);
    let table = env.crew(&repo, ["runs", "list"]);
    let stdout = String::from_utf8(table.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 21, "a header and 20 runs: {stdout}");
    assert!(
        stdout.lines().nth(1).unwrap().starts_with(all[0].as_str()),
        "newest first"
    );
    assert_eq!(
        String::from_utf8(table.stderr).unwrap(),
        "(the 20 newest of 22 runs; `--all` lists every one, `--limit N` the N newest)\n"
    );
}

#[test]
fn a_reader_that_stops_reading_ends_a_listing_quietly_and_never_a_run() {
    use std::os::unix::process::ExitStatusExt;
    let env = TestEnv::new();
    let repo = env.repo("project");
    let with_closed_stdout = |args: &[&str]| {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        env.crew_command(&repo)
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap()
    };
    // A command that only prints ends as `git log | head` does: by SIGPIPE, saying nothing.
    let listing = with_closed_stdout(&["completions", "bash"]);
    assert_eq!(
        listing.status.signal(),
        Some(libc::SIGPIPE),
        "{}",
        render_output(&listing)
    );
    assert_eq!(String::from_utf8_lossy(&listing.stderr), "");
    // A command hosting agents stops printing, and its run goes on to its end.
    let run = with_closed_stdout(&[
        "run",
        "--agent",
        "shell",
        "--workspace-mode",
        "worktree",
        "echo done > done.txt",
    ]);
    assert!(run.status.success(), "{}", render_output(&run));
    assert!(
        !String::from_utf8_lossy(&run.stderr).contains("panicked"),
        "{}",
        render_output(&run)
    );
    let run_id = run_ids(&env, &repo).remove(0);
    assert_eq!(manifest(&env, &repo, &run_id)["status"], "completed");
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run_id}-shell:done.txt")]),
        "done\n"
    );
}

#[test]
fn a_standard_output_that_takes_no_writes_ends_a_command_with_an_error_that_says_so() {
    // `println!` panics when its write fails: exit 101 and a message about crew's source.
    let env = TestEnv::new();
    let repo = env.repo("project");
    for args in [
        &["agents", "list"][..],
        &["agents", "list", "--json"],
        &["runs", "list"],
        &["completions", "bash"],
    ] {
        let full = std::fs::File::options()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let output = env
            .crew_command(&repo)
            .args(args)
            .stdout(full)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with(
                "error: crew could not write to its standard output: No space left on device"
            ),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

#[test]
fn a_standard_error_that_takes_no_writes_loses_the_message_never_the_exit_code() {
    // `eprint!` panics when its write fails: exit 101, whatever the command's own outcome.
    let env = TestEnv::new();
    let repo = env.repo("project");
    let full = || {
        std::fs::File::options()
            .write(true)
            .open("/dev/full")
            .unwrap()
    };
    // An error of the user's (exit 2), an error of the output's (exit 1), as they end with
    // standard error writable.
    for (args, stdout_full, code) in [
        (&["runs", "show", "no-such-run"][..], false, 2),
        (&["agents", "list"], true, 1),
    ] {
        let mut command = env.crew_command(&repo);
        command.args(args).stderr(full());
        if stdout_full {
            command.stdout(full());
        }
        let output = command.output().unwrap();
        assert_eq!(
            output.status.code(),
            Some(code),
            "{args:?}: {}",
            render_output(&output)
        );
        let mut writable = env.crew_command(&repo);
        writable.args(args);
        if stdout_full {
            writable.stdout(full());
        }
        assert_eq!(
            writable.output().unwrap().status.code(),
            Some(code),
            "{args:?}"
        );
    }
}

#[test]
fn a_crew_started_with_its_standard_descriptors_closed_prints_into_none_of_its_own_files() {
    // Without its standard descriptors, the first descriptors crew makes (its runtime's) would
    // be numbered 0 and 1, and its table printed into them: it fails, or writes where it must
    // not. Closed ones are opened on /dev/null before anything else.
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut shell = std::process::Command::new("sh");
    let shell = env
        .hermetic(&mut shell)
        .args(["-c", "exec \"$0\" agents list <&- >&-"])
        .arg(crew_tests::crew_bin().as_str())
        .current_dir(&repo)
        .output()
        .unwrap();
    assert!(shell.status.success(), "{}", render_output(&shell));
    assert_eq!(String::from_utf8_lossy(&shell.stderr), "");
    // And the /dev/null it opens stays open in the programs it starts (they too would take
    // the descriptor for a file of their own): not closed on exec.
    let crew = crew_tests::crew_bin();
    let mut shell = std::process::Command::new("sh");
    let mut running = env
        .hermetic(&mut shell)
        .args(["-c", "exec \"$0\" run -q --agent shell \"sleep 3\" <&-"])
        .arg(crew.as_str())
        .current_dir(&repo)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = running.id();
    let flags = wait_until(10, "crew's /dev/null on descriptor 0", || {
        // The shell's own descriptor 0 is the test's: only once it is crew.
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
        (exe == crew.as_std_path()).then_some(())?;
        let target = std::fs::read_link(format!("/proc/{pid}/fd/0")).ok()?;
        (target == std::path::Path::new("/dev/null")).then_some(())?;
        let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/0")).ok()?;
        let flags = info.lines().find_map(|line| line.strip_prefix("flags:"))?;
        u32::from_str_radix(flags.trim(), 8).ok()
    });
    assert_eq!(
        flags & libc::O_CLOEXEC as u32,
        0,
        "descriptor 0 is closed on exec (flags {flags:o})"
    );
    assert!(running.wait().unwrap().success());
}

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
