//! What a run records beyond the agent's work: setup output, git identity, who cancelled, how
//! far the base moved.

use camino::Utf8Path;
use crew_tests::{Redactor, TestEnv, render_output, wait_until, write};

use crate::common::runs::{manifest, run_ids, shell_worktree_run, task};

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

#[test]
fn a_worktree_kept_because_git_was_interrupted_is_a_warning_in_the_summary() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // An agent whose git command died holding the worktree's index lock.
    let output = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "--task",
            "t=echo work > work.txt && touch \"$(git rev-parse --git-dir)/index.lock\"",
        ],
    );
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let stdout = String::from_utf8(output.stdout).unwrap();
    let redactor = Redactor::new(&env).literal(run.clone(), "[RUN_ID]");
    let summary = stdout[stdout.find("\nrun ").unwrap() + 1..].to_owned();
    insta::assert_snapshot!(redactor.redact(&summary), @"
    run [RUN_ID] completed — 1 worktree(s) kept with work not on a branch
    TASK  STATUS     DURATION  EXIT  BRANCH  +/-  WORK
    t     succeeded  [DURATION]      0     -       -    kept at .worktrees/[RUN_ID]/t

      # t: WORK NOT ON ITS BRANCH, kept in its worktree at .worktrees/[RUN_ID]/t: failed to stage the work in $TEST_ENV/project/.worktrees/[RUN_ID]/t: the index is locked; this might be due to a concurrent or crashed process
      crew runs clean [RUN_ID]   # once that is fixed: saves t's work on its branch, then removes the run
    ");
    assert!(
        stdout.ends_with('\n'),
        "the summary ends its last line: {stdout:?}"
    );

    // The kept worktree is handed over with the repository's own git (the lock was the
    // agent's, in its own git directory, and went with it): `runs clean` saves the work on the
    // branch.
    let record = task(&manifest(&env, &repo, &run), "t").clone();
    let kept = record["teardown"]["preserved"].as_str().unwrap();
    let git_dir = env.git(&repo.join(kept), ["rev-parse", "--absolute-git-dir"]);
    assert!(
        git_dir
            .trim()
            .ends_with(&format!(".git/worktrees/crew-{run}-t")),
        "{git_dir}"
    );
    assert!(!Utf8Path::new(git_dir.trim()).join("index.lock").exists());
    let clean = env.crew(&repo, ["runs", "clean", &run]);
    assert!(clean.status.success(), "{}", render_output(&clean));
    let files = env.git(
        &repo,
        ["ls-tree", "-r", "--name-only", &format!("crew/{run}-t")],
    );
    assert!(files.lines().any(|line| line == "work.txt"), "{files}");
}

#[test]
fn a_base_branch_that_moved_on_during_the_run_is_reported_with_how_far() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let started = |marker: &str| {
        let marker = crew_tests::signal(&repo, marker);
        env.crew_command(&repo)
            .args([
                "run",
                "--agent",
                "shell",
                "--workspace-mode",
                "worktree",
                "--task",
                &format!("t=while [ ! -e {marker} ]; do sleep 0.05; done; echo work > work.txt"),
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let child = started("go");
    // The newest run, once its agent runs.
    let running = |after: Option<&String>| {
        wait_until(30, "the run to start its agent", || {
            let run = run_ids(&env, &repo).into_iter().next()?;
            (Some(&run) != after && task(&manifest(&env, &repo, &run), "t")["status"] == "running")
                .then_some(run)
        })
    };
    let run = running(None);
    let commit = |message: &str| env.git(&repo, ["commit", "-q", "--allow-empty", "-m", message]);
    commit("someone else's first");
    commit("someone else's second");
    write(&crew_tests::signal(&repo, "go"), "");
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", render_output(&output));
    let base = manifest(&env, &repo, &run)["base"]
        .as_str()
        .unwrap()
        .to_owned();
    let redactor = Redactor::new(&env)
        .literal(run.clone(), "[RUN_ID]")
        .literal(base[..12].to_owned(), "[BASE]");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let tail: Vec<&str> = stdout.lines().rev().take(2).collect();
    insta::assert_snapshot!(redactor.redact(&format!("{}\n{}", tail[1], tail[0])), @"
    # main gained 2 commit(s) since this run started from [BASE]: its task branches are 2 behind
    git rebase main crew/[RUN_ID]-t   # brings t up to date
    ");
    let show = env.crew(&repo, ["runs", "show", &run]);
    assert!(
        String::from_utf8(show.stdout)
            .unwrap()
            .contains("# main gained 2 commit(s) since this run started from"),
        "runs show says it too"
    );

    // As a gate: the run's command fails.
    write(
        &repo.join(".crew/config.toml"),
        "[run]\nbase_moved = \"fail\"\n",
    );
    env.git(&repo, ["add", ".crew/config.toml"]);
    env.git(&repo, ["commit", "-q", "-m", "gate on a moved base"]);
    let first = run.clone();
    let child = started("go-again");
    let second = running(Some(&first));
    commit("one more");
    write(&crew_tests::signal(&repo, "go-again"), "");
    let output = child.wait_with_output().unwrap();
    let redactor = Redactor::new(&env)
        .literal(second, "[RUN_ID]")
        .literal(first, "[FIRST_RUN_ID]");
    insta::assert_snapshot!(redactor.redact(&String::from_utf8(output.stderr).unwrap()), @r#"
    error: main gained 1 commit(s) while run [RUN_ID] went on ([run] base_moved = "fail")
    hint: bring the task branches up to date (`git rebase main <branch>`, listed above) before merging them
    "#);
    // The run made its branches: a failed run (1), not a refused request (2).
    assert_eq!(output.status.code(), Some(1));
}

#[test]
fn what_setup_made_is_never_the_agents_work_unless_the_agent_changes_it() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(&repo.join(".gitignore"), "build/\n");
    write(
        &repo.join(".crew/config.toml"),
        "[worktree]\nsetup = [\"sh\", \"-c\", \"echo generated > generated.txt && echo setup >> README.md && mkdir -p build && echo out > build/out.o\"]\n",
    );
    env.git(&repo, ["add", ".gitignore", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "a setup"]);
    let run = shell_worktree_run(
        &env,
        &repo,
        &[
            "idle=true",
            "edits=echo more >> generated.txt",
            "writes=echo work > work.txt",
        ],
    );
    let finished = manifest(&env, &repo, &run);
    let files_of = |task_id: &str| -> Vec<String> {
        let record = task(&finished, task_id);
        let Some(branch) = record["teardown"]["branch"].as_str() else {
            return Vec::new();
        };
        let base = record["workspace"]["base_commit"].as_str().unwrap();
        env.git(&repo, ["diff", "--name-only", &format!("{base}..{branch}")])
            .lines()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(files_of("idle"), Vec::<String>::new(), "{finished:#}");
    assert!(
        task(&finished, "idle")["teardown"]["branch"].is_null(),
        "no work, no branch: {:#}",
        task(&finished, "idle")
    );
    assert_eq!(files_of("edits"), ["generated.txt"]);
    assert_eq!(files_of("writes"), ["work.txt"]);
    let idle = &task(&finished, "idle")["teardown"];
    assert_eq!(
        idle["setup_paths"],
        serde_json::json!(["README.md", "generated.txt"])
    );
    assert!(
        idle["ignored_paths"].is_null(),
        "build/ is setup's: {idle:#}"
    );
    let show = String::from_utf8(env.crew(&repo, ["runs", "show", &run]).stdout).unwrap();
    assert!(
        show.contains("# writes: left out of its work, as the worktree's setup made them: README.md, generated.txt"),
        "{show}"
    );
    // Nothing of setup's counts as unmerged work.
    let listing = env.crew(&repo, ["worktrees", "list", "--json"]);
    let listing: serde_json::Value = serde_json::from_slice(&listing.stdout).unwrap();
    let branches: Vec<&str> = listing["branches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|branch| branch["task_id"].as_str().unwrap())
        .collect();
    assert_eq!(branches, ["edits", "writes"], "{listing:#}");
}

#[test]
fn events_follow_a_run_as_it_happens_every_change_in_order() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let marker = crew_tests::signal(&repo, "go");
    let mut run = env.spawn_crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--task",
            "quick=echo quick",
            "--task",
            &format!("slow=while [ ! -e {marker} ]; do sleep 0.05; done; echo slow"),
        ],
    );
    let run_id = wait_until(30, "the run to start", || {
        run_ids(&env, &repo).into_iter().next()
    });
    let follower = env
        .crew_command(&repo)
        .args(["events", "--follow", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The follower has started reading before the slow task goes on.
    std::thread::sleep(std::time::Duration::from_millis(300));
    write(&marker, "");
    run.wait().unwrap();
    let output = follower.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", render_output(&output));
    let events: Vec<serde_json::Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert!(
        events
            .iter()
            .all(|event| event["run_id"] == run_id.as_str())
    );
    let of = |task: &str| -> Vec<String> {
        events
            .iter()
            .filter(|event| event["task"] == task && event["event"] == "task_status")
            .map(|event| event["status"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(of("quick"), ["preparing", "running", "succeeded"]);
    assert_eq!(of("slow"), ["preparing", "running", "succeeded"]);
    assert_eq!(events.first().unwrap()["event"], "run_created");
    let last = events.last().unwrap();
    assert_eq!(
        (&last["event"], &last["status"]),
        (
            &serde_json::json!("run_status"),
            &serde_json::json!("completed")
        )
    );
    // Exactly what the run recorded, in the same order.
    let recorded =
        std::fs::read_to_string(repo.join(format!(".crew/state/runs/{run_id}/events.jsonl")))
            .unwrap();
    assert_eq!(recorded.lines().count(), events.len());
}

#[test]
fn a_run_record_crew_will_not_act_on_is_refused_alike_by_every_command() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let run = crate::common::runs::finished_run(&env, &repo, &["run", "--agent", "shell", "true"]);
    let path = repo.join(format!(".crew/state/runs/{run}/manifest.json"));
    let good = std::fs::read_to_string(&path).unwrap();
    let mut schema_zero: serde_json::Value = serde_json::from_str(&good).unwrap();
    schema_zero["schema_version"] = 0.into();
    for (what, text) in [
        ("corrupt", "{\"schema_version\": 1, \"tasks\": ".to_owned()),
        ("schema 0", schema_zero.to_string()),
    ] {
        std::fs::write(&path, &text).unwrap();
        for command in [&["runs", "show", &run][..], &["runs", "resume", &run][..]] {
            let output = env.crew(&repo, command);
            let said = render_output(&output);
            assert_eq!(output.status.code(), Some(2), "{what}, {command:?}: {said}");
            assert!(said.contains(path.as_str()), "{what}, {command:?}: {said}");
            assert_eq!(
                std::fs::read_to_string(&path).unwrap(),
                text,
                "{what}: left as it is"
            );
        }
    }
}

#[test]
fn a_run_written_by_a_newer_crew_is_marked_where_it_is_listed_and_shown() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let run = crate::common::runs::finished_run(&env, &repo, &["run", "--agent", "shell", "true"]);
    let path = repo.join(format!(".crew/state/runs/{run}/manifest.json"));
    let mut newer: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    newer["schema_version"] = 99.into();
    std::fs::write(&path, newer.to_string()).unwrap();

    let listed = env.crew(&repo, ["runs", "list"]);
    let table = render_output(&listed);
    assert!(table.contains("completed (newer crew)"), "{table}");
    let listed = env.crew(&repo, ["runs", "list", "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(rows[0]["newer_schema"], true, "{rows:#}");
    let shown = env.crew(&repo, ["runs", "show", &run]);
    let said = render_output(&shown);
    assert!(
        said.contains("written by a newer crew (schema version 99"),
        "{said}"
    );
}

/// A defect of crew's in one task (a panic, here at a fail point of debug builds) fails that
/// task alone: its agent is stopped, its reason says what happened, its work stays for `crew
/// runs clean`, and the host and the run's other task go on.
#[test]
fn a_task_crew_panics_in_fails_alone_and_the_host_goes_on() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let marker = format!("marker-{}", std::process::id());
    write(
        &repo.join(".crew/teams/t.toml"),
        &format!(
            "[[tasks]]\nid = \"boom\"\nagent = \"shell\"\nprompt = \"echo kept > kept.txt; echo written; sleep 600; : {marker}\"\nworkspace_mode = \"worktree\"\n\n[[tasks]]\nid = \"fine\"\nagent = \"shell\"\nprompt = \"sleep 1; echo fine > fine.txt\"\nworkspace_mode = \"worktree\"\n"
        ),
    );
    env.git(&repo, ["add", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "a team"]);
    let output = env
        .crew_command(&repo)
        .args(["run", "--quiet", "t"])
        .env("CREW_TEST_PANIC_TASK", "boom")
        .output()
        .unwrap();
    let shown = render_output(&output);
    assert_eq!(output.status.code(), Some(1), "a task failed: {shown}");
    let run_id = run_ids(&env, &repo).remove(0);
    let recorded = manifest(&env, &repo, &run_id);
    let boom = task(&recorded, "boom");
    assert_eq!(boom["status"], "failed", "{boom:#}");
    let reason = boom["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("crew panicked while running it")
            && reason.contains("the fail point of task boom")
            && reason.contains("crew runs clean"),
        "{reason}"
    );
    assert_eq!(
        task(&recorded, "fine")["status"],
        "succeeded",
        "{recorded:#}"
    );
    let left = std::process::Command::new("pgrep")
        .args(["-f", &marker])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "the panicked task's agent goes on: {}",
        String::from_utf8_lossy(&left.stdout)
    );
    // Its work was kept, and `crew runs clean` saves it to its branch.
    let branch = boom["workspace"]["branch"]
        .as_str()
        .map(ToOwned::to_owned)
        .unwrap_or_else(|| panic!("no branch: {boom:#}"));
    let clean = env.crew(&repo, ["runs", "clean", &run_id]);
    assert!(clean.status.success(), "{}", render_output(&clean));
    let files = env.git(&repo, ["ls-tree", "-r", "--name-only", &branch]);
    assert!(files.contains("kept.txt"), "{files}");
}

#[test]
fn a_run_whose_tasks_use_different_modes_is_listed_and_shown_as_mixed() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/teams/both.toml"),
        "[[tasks]]\nid = \"here\"\nagent = \"shell\"\nprompt = \"true\"\n\n[[tasks]]\nid = \"apart\"\nagent = \"shell\"\nprompt = \"true\"\nworkspace_mode = \"temp\"\n",
    );
    let run = crate::common::runs::finished_run(&env, &repo, &["run", "both"]);
    let listed = env.crew(&repo, ["runs", "list"]);
    let listed = String::from_utf8(listed.stdout).unwrap();
    let row = listed.lines().find(|line| line.starts_with(&run)).unwrap();
    assert!(row.contains("mixed (single, temp)"), "{listed}");
    let shown = env.crew(&repo, ["runs", "show", &run]);
    let shown = String::from_utf8(shown.stdout).unwrap();
    assert!(shown.contains("mixed (single, temp) mode"), "{shown}");
}

#[test]
fn a_run_whose_check_failed_says_so_where_runs_are_listed() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let output = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "--check",
            "exit 3",
            "echo work > work.txt",
        ],
    );
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let listed = env.crew(&repo, ["runs", "list"]);
    let listed = String::from_utf8(listed.stdout).unwrap();
    let row = listed.lines().find(|line| line.starts_with(&run)).unwrap();
    assert!(row.contains("1 check(s) failed"), "{listed}");
    let json = env.crew(&repo, ["runs", "list", "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(rows[0]["checks_failed"], 1, "{rows:#}");
}
