//! Ctrl-C, a killed host, and what is kept.

use super::*;

#[test]
fn ctrl_c_once_stops_gracefully_and_keeps_the_work() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    dirty_team(&repo, false);
    let mut child = start_run(&env, &repo, &["run", "busy"], 2);
    signal(&child, rustix::process::Signal::INT);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let run = run_ids(&env, &repo).remove(0);
    let manifest = manifest(&env, &repo, &run);
    assert_eq!(manifest["status"], "cancelled");
    assert_eq!(manifest["cancelled_by"]["cause"], "interrupt");
    assert_eq!(manifest["cancelled_by"]["pid"], child.id());
    for task in manifest["tasks"].as_array().unwrap() {
        assert_eq!(task["status"], "cancelled");
        assert_eq!(task["exit"]["stopped_by"], "term");
    }
    assert_work_saved(&env, &repo, &run);
}

#[test]
fn ctrl_c_twice_kills_at_once_and_still_keeps_the_work() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    dirty_team(&repo, true);
    let mut child = start_run(&env, &repo, &["run", "busy"], 2);
    let started = Instant::now();
    signal(&child, rustix::process::Signal::INT);
    std::thread::sleep(Duration::from_millis(300));
    signal(&child, rustix::process::Signal::INT);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the 30 s grace was cut short"
    );
    let run = run_ids(&env, &repo).remove(0);
    let manifest = manifest(&env, &repo, &run);
    for task in manifest["tasks"].as_array().unwrap() {
        assert_eq!(task["exit"]["stopped_by"], "kill");
    }
    assert_work_saved(&env, &repo, &run);
}

#[test]
fn cleaning_a_run_whose_host_was_killed_saves_each_tasks_work_on_its_branch_first() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    dirty_team(&repo, false);
    let mut child = start_run(&env, &repo, &["run", "busy"], 2);
    let run = run_ids(&env, &repo).remove(0);
    signal(&child, rustix::process::Signal::KILL);
    child.wait().unwrap();
    let clean = env.crew(&repo, ["runs", "clean", &run]);
    let shown = render_output(&clean);
    assert!(clean.status.success(), "{shown}");
    for task in ["one", "two"] {
        assert!(
            shown.contains(&format!("{task}: work saved on crew/{run}-{task}")),
            "{shown}"
        );
    }
    assert_work_saved(&env, &repo, &run);
    assert!(run_ids(&env, &repo).is_empty());
}

#[test]
fn a_killed_host_leaves_an_interrupted_run_that_resume_finishes() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let marker = crew_tests::signal(&repo, "go-on");
    write(
        &repo.join(".crew/teams/long.toml"),
        &format!(
            r#"workspace_mode = "worktree"
[[tasks]]
id = "quick"
agent = "shell"
prompt = "echo done > quick.txt"

[[tasks]]
id = "slow"
agent = "shell"
prompt = "echo ready; echo partial > slow.txt; while [ ! -f {marker} ]; do sleep 0.1; done; echo finished >> slow.txt"
"#
        ),
    );
    let mut child = start_run(&env, &repo, &["run", "long"], 1);
    let run = run_ids(&env, &repo).remove(0);
    wait_until(20, "the quick task to finish", || {
        let manifest = manifest(&env, &repo, &run);
        (manifest["tasks"][0]["status"] == "succeeded").then_some(())
    });
    // The first run of a fresh project publishes its listing too.
    let listings = |repo: &camino::Utf8Path| -> Vec<String> {
        std::fs::read_dir(repo.join(".crew/state/live"))
            .map(|entries| {
                entries
                    .flatten()
                    .map(|entry| entry.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    wait_until(20, "the host's published listing", || {
        (!listings(&repo).is_empty()).then_some(())
    });
    let socket = manifest(&env, &repo, &run)["host"]["socket"]
        .as_str()
        .unwrap()
        .to_owned();
    // The slow agent's private temp dir, which its host removes when it is done with it.
    let agent_temp_dirs = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(env.tmp())
            .unwrap()
            .flatten()
            .filter(|entry| {
                entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with("crew-tmp-slow-")
            })
            .map(|entry| entry.path())
            .collect()
    };
    let temp_dirs = agent_temp_dirs();
    assert_eq!(temp_dirs.len(), 1, "{temp_dirs:?}");
    signal(&child, rustix::process::Signal::KILL);
    child.wait().unwrap();
    assert!(
        std::path::Path::new(&socket).exists(),
        "a killed host leaves its socket"
    );
    assert!(
        temp_dirs[0].exists(),
        "a killed host leaves its agent's temp dir"
    );
    // Left two minutes ago, as far as the next host can tell.
    std::fs::File::open(&temp_dirs[0])
        .unwrap()
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(120))
        .unwrap();

    let list = env.crew(&repo, ["runs", "list"]);
    assert!(
        !std::path::Path::new(&socket).exists(),
        "reconciliation removes the dead host's socket"
    );
    assert_eq!(listings(&repo), Vec::<String>::new(), "and its listing");
    // The interrupted task's worktree no longer claims to be in use by the dead host.
    let worktrees = env.git(&repo, ["worktree", "list", "--porcelain"]);
    assert!(
        worktrees.contains(&format!(
            "locked crew: kept after run {run} was interrupted (its host died)"
        )),
        "{worktrees}"
    );
    assert!(!worktrees.contains("in use by run"), "{worktrees}");
    let redactor = Redactor::new(&env).literal(run.clone(), "[RUN_ID]");
    insta::assert_snapshot!(redactor.redact(&render_output(&list)), @"
    RUN                 STATUS       TEAM  MODE      CREATED              TASKS
    [RUN_ID]  interrupted  long  worktree  [TIMESTAMP]  1 failed, 1 succeeded
    ----- stderr -----
    warning: 1 kept worktree(s) ([RUN_ID]:slow) and 1 unmerged task branch(es) (crew/[RUN_ID]-quick) — see `crew worktrees list`
    [exit status: 0]
    ");
    // The interrupted task's branch and worktree are shown where the user reviews the run.
    let shown = String::from_utf8(env.crew(&repo, ["runs", "show", &run]).stdout).unwrap();
    let slow_row = shown
        .lines()
        .find(|line| line.starts_with("slow "))
        .map(str::to_owned)
        .unwrap_or_default();
    // Its branch holds nothing yet (the work is in its worktree's files): no merge is hinted.
    assert!(
        !shown.contains(&format!("git merge crew/{run}-slow")),
        "{shown}"
    );
    assert!(
        slow_row.contains(&format!("crew/{run}-slow"))
            && slow_row.contains(&format!("in its worktree at .worktrees/{run}/slow")),
        "{slow_row}"
    );
    std::fs::write(&marker, "").unwrap();

    let resumed = env.crew(&repo, ["runs", "resume", &run]);
    assert!(resumed.status.success(), "{}", render_output(&resumed));
    // The next host swept what the dead one left; the resumed agent's own dir went with its end.
    wait_until(20, "the dead host's temp dir to be swept", || {
        (!temp_dirs[0].exists()).then_some(())
    });
    assert_eq!(agent_temp_dirs(), Vec::<std::path::PathBuf>::new());
    let manifest = manifest(&env, &repo, &run);
    assert_eq!(manifest["status"], "completed");
    assert_eq!(
        manifest["tasks"][0]["attempts"], 1,
        "finished tasks are not run again"
    );
    assert_eq!(manifest["tasks"][1]["status"], "succeeded");
    // The interrupted task started again from its branch: the worktree left by the killed host
    // was taken up with the partial work in it.
    let slow = env.git(&repo, ["show", &format!("crew/{run}-slow:slow.txt")]);
    assert!(slow.ends_with("finished\n"), "{slow}");
    assert_eq!(env.task_worktrees(&repo), Vec::<String>::new());

    // The run's history holds the host's death and the resume, in order.
    let events = env.crew(&repo, ["events", "--run", &run, "--json"]);
    let runs: Vec<(String, String)> = String::from_utf8(events.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|event| event["event"] == "run_status")
        .map(|event| {
            (
                event["status"].as_str().unwrap_or_default().to_owned(),
                event["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let at = |status: &str, says: &str| {
        runs.iter()
            .position(|(found, reason)| found == status && reason.contains(says))
            .unwrap_or_else(|| panic!("no {status} ({says}) in {runs:?}"))
    };
    let died = at(
        "interrupted",
        &format!("host process {} is gone", child.id()),
    );
    let resumed = at("running", "resumed by pid");
    let finished = at("completed", "");
    assert!(died < resumed && resumed < finished, "{runs:?}");
}

/// A host that dies leaves no record of when: its run may be looked at a second or a day later.
/// The interrupted task's end (and its DURATION) is when it was last seen going on — its last
/// output, the run's last write — never the moment the death was noticed.
#[test]
fn an_interrupted_task_ends_when_it_was_last_seen_not_when_its_host_s_death_was_noticed() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let marker = crew_tests::signal(&repo, "never");
    let mut child = start_run(
        &env,
        &repo,
        &[
            "run",
            "--agent",
            "shell",
            &format!("echo ready; while [ ! -f {marker} ]; do sleep 0.1; done"),
        ],
        1,
    );
    let run = run_ids(&env, &repo).remove(0);
    // The agent prints nothing more, and its host goes on for a while: it ran that while.
    std::thread::sleep(Duration::from_secs(6));
    let killed_at = std::time::SystemTime::now();
    signal(&child, rustix::process::Signal::KILL);
    child.wait().unwrap();
    // Noticed later, as by a user who comes back to it.
    std::thread::sleep(Duration::from_secs(2));

    // Shown as `crew runs list` shows it: interrupted, not running.
    let manifest = manifest(&env, &repo, &run);
    assert_eq!(manifest["status"], "interrupted");
    let time = |value: &serde_json::Value| {
        serde_json::from_value::<crew_core::model::Timestamp>(value.clone())
            .unwrap_or_else(|_| panic!("a timestamp: {value}"))
            .0
    };
    let task = &manifest["tasks"][0];
    assert_eq!(task["status"], "failed");
    let (started, finished) = (time(&task["started_at"]), time(&task["finished_at"]));
    assert!(
        started + Duration::from_secs(3) <= finished && finished <= killed_at,
        "the task ended at {finished:?}, its host was killed at {killed_at:?} (started at {started:?}, its host alive until then)"
    );
    let run_finished = time(&manifest["finished_at"]);
    assert!(
        finished <= run_finished && run_finished <= killed_at,
        "the run ended at {run_finished:?}, its host was killed at {killed_at:?}"
    );
}
