//! Interruptions and recoveries through the real binary: Ctrl-C once and twice, a host killed
//! mid-run and resumed, questions answered later, detached runs.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use camino::Utf8Path;
use crew_tests::{Redactor, TestEnv, render_output, wait_until, write};

use crate::common::runs::{manifest, run_ids};

fn signal(child: &Child, signal: rustix::process::Signal) {
    rustix::process::kill_process(rustix::process::Pid::from_child(child), signal).unwrap();
}

/// Starts `crew args…` in `dir` and waits until `count` agents print `ready`.
fn start_run(env: &TestEnv, dir: &Utf8Path, args: &[&str], count: usize) -> Child {
    let mut child = env
        .crew_command(dir)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    crate::common::runs::wait_for_agents_saying(env, dir, "ready", count);
    // Drain stderr so the host never blocks on it.
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || for _ in BufReader::new(stderr).lines() {});
    child
}

fn dirty_team(repo: &Utf8Path, trap_term: bool) {
    let trap = if trap_term { "trap '' TERM; " } else { "" };
    write(
        &repo.join(".crew/teams/busy.toml"),
        &format!(
            r#"workspace_mode = "worktree"
[[tasks]]
id = "one"
agent = "shell"
prompt = "{trap}echo 'unsaved one' > work-one.txt; echo ready; while true; do sleep 1; done"

[[tasks]]
id = "two"
agent = "shell"
prompt = "{trap}echo 'unsaved two' > work-two.txt; echo ready; while true; do sleep 1; done"
"#
        ),
    );
    write(
        &repo.join(".crew/config.toml"),
        "[run]\nstop_grace = \"30s\"\n",
    );
}

fn assert_work_saved(env: &TestEnv, repo: &Utf8Path, run: &str) {
    for task in ["one", "two"] {
        let saved = env.git(
            repo,
            ["show", &format!("crew/{run}-{task}:work-{task}.txt")],
        );
        assert_eq!(saved, format!("unsaved {task}\n"));
    }
    assert_eq!(env.task_worktrees(repo), Vec::<String>::new());
}

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
    let marker = env.root().join("go-on");
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
    let marker = env.root().join("never");
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

#[test]
fn a_question_waits_with_its_workspace_and_a_follow_up_answers_it() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/teams/curious.toml"),
        r#"workspace_mode = "worktree"
[[tasks]]
id = "painter"
agent = "shell"
prompt = "if [ -z \"$CREW_MESSAGE\" ]; then echo draft > canvas.txt; crew ask 'which color?'; exit 0; fi; echo \"$CREW_MESSAGE\" >> canvas.txt"
"#,
    );
    let mut child = env.spawn_crew(&repo, ["run", "curious"]);
    // The question shows as soon as it is asked; the agent's process ends just after.
    let agents = wait_until(30, "the question, and the agent to stop for it", || {
        let agents = env.agents_json(&repo)?;
        (agents[0]["question"] == "which color?" && agents[0]["state"] == "exited")
            .then_some(agents)
    });
    let worktree = agents[0]["dir"].as_str().unwrap().to_owned();
    assert_eq!(
        std::fs::read_to_string(format!("{worktree}/canvas.txt")).unwrap(),
        "draft\n",
        "the workspace is kept"
    );
    let list = env.crew(&repo, ["agents", "list"]);
    let run = run_ids(&env, &repo).remove(0);
    let redactor = Redactor::new(&env).literal(run.clone(), "[RUN_ID]");
    insta::assert_snapshot!(redactor.redact(&render_output(&list)), @"
    AGENT                       STATUS   PID  AGE   CMD    LAST
    [RUN_ID]:painter  waiting  -    [DURATION]  shell  asks: which color?
    [exit status: 0]
    ");

    let answer = env.crew(&repo, ["agents", "follow-up", "painter", "blue"]);
    assert!(answer.status.success(), "{}", render_output(&answer));
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let canvas = env.git(&repo, ["show", &format!("crew/{run}-painter:canvas.txt")]);
    assert_eq!(canvas, "draft\nblue\n");
}

#[test]
fn detach_returns_the_run_id_at_once_and_the_run_goes_on() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let started = Instant::now();
    let output = env.crew(
        &repo,
        [
            "run",
            "--detach",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "sleep 1; echo later > later.txt",
        ],
    );
    assert!(output.status.success(), "{}", render_output(&output));
    assert!(started.elapsed() < Duration::from_secs(10));
    let run = String::from_utf8(output.stdout).unwrap().trim().to_owned();
    assert_eq!(run_ids(&env, &repo), std::slice::from_ref(&run));
    wait_until(30, "the detached run to complete", || {
        (manifest(&env, &repo, &run)["status"] == "completed").then_some(())
    });
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-shell:later.txt")]),
        "later\n"
    );
}

#[test]
fn cancel_of_another_sessions_run_needs_force_but_a_detached_run_is_yours() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // A run in the foreground of another terminal session (setsid: a session of its own).
    let mut other = env.crew_command(&repo);
    other
        .args(["run", "--agent", "shell", "echo ready; sleep 600"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: setsid is async-signal-safe and only affects the child.
    #[allow(unsafe_code)]
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut other, || {
            rustix::process::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let mut other = other.spawn().unwrap();
    let run = wait_until(30, "the other session's run", || {
        let run = run_ids(&env, &repo).into_iter().next()?;
        (manifest(&env, &repo, &run)["tasks"][0]["status"] == "running").then_some(run)
    });
    let redactor = Redactor::new(&env).literal(run.clone(), "[RUN_ID]");
    let refused = env.crew(&repo, ["runs", "cancel", &run]);
    insta::assert_snapshot!(redactor.redact(&render_output(&refused)), @"
    ----- stderr -----
    error: run [RUN_ID] is hosted by another session (crew run, pid [PID])
    hint: cancel it anyway with `crew runs cancel [RUN_ID] --force`
    [exit status: 2]
    ");
    let forced = env.crew(&repo, ["runs", "cancel", &run, "--force"]);
    assert!(forced.status.success(), "{}", render_output(&forced));
    wait_until(30, "the run to be cancelled", || {
        (manifest(&env, &repo, &run)["status"] == "cancelled").then_some(())
    });
    other.wait().unwrap();
    // Who cancelled it, from where, and how: in the manifest, the events and `runs show`.
    let by = manifest(&env, &repo, &run)["cancelled_by"].clone();
    assert_eq!(by["cause"], "runs_cancel", "{by:#}");
    assert_eq!(by["forced"], true, "{by:#}");
    assert_eq!(by["other_session"], true, "{by:#}");
    assert_eq!(by["uid"], rustix::process::getuid().as_raw(), "{by:#}");
    assert!(by["pid"].as_u64().is_some_and(|pid| pid > 0), "{by:#}");
    let events =
        std::fs::read_to_string(repo.join(format!(".crew/state/runs/{run}/events.jsonl"))).unwrap();
    assert!(
        events
            .lines()
            .any(|line| line.contains("\"cancel_requested\"") && line.contains("\"forced\":true")),
        "{events}"
    );
    let show = env.crew(&repo, ["runs", "show", &run]);
    let show = String::from_utf8(show.stdout).unwrap();
    let line = show
        .lines()
        .find(|line| line.starts_with("cancelled "))
        .unwrap_or_default();
    let uid = format!("uid {}", rustix::process::getuid().as_raw());
    insta::assert_snapshot!(redactor.redact(&line.replace(&uid, "uid [UID]")), @"cancelled by `crew runs cancel --force` (pid [PID], uid [UID], from another session) at [TIMESTAMP]");

    // A detached run is the user's own: no --force needed.
    let output = env.crew(
        &repo,
        [
            "run",
            "--detach",
            "--agent",
            "shell",
            "echo ready; sleep 600",
        ],
    );
    assert!(output.status.success(), "{}", render_output(&output));
    let detached = String::from_utf8(output.stdout).unwrap().trim().to_owned();
    let cancelled = env.crew(&repo, ["runs", "cancel", &detached]);
    assert!(cancelled.status.success(), "{}", render_output(&cancelled));
    wait_until(30, "the detached run to be cancelled", || {
        (manifest(&env, &repo, &detached)["status"] == "cancelled").then_some(())
    });
    let by = manifest(&env, &repo, &detached)["cancelled_by"].clone();
    assert_eq!(by["forced"], false, "{by:#}");
    assert_eq!(
        by["other_session"], true,
        "a detached host has a session of its own: {by:#}"
    );
}

#[test]
fn a_state_directory_turned_read_only_mid_run_is_reported_and_loses_no_work() {
    // File permissions do not hold root back: crew runs as `nobody` here.
    if !crew_tests::can_drop_to_nobody() {
        return;
    }
    const NOBODY: u32 = crew_tests::NOBODY;
    let env = TestEnv::reachable_by_others();
    let repo = env.repo("project");
    env.hand_to_nobody();
    let go = env.root().join("go");
    let script = format!(
        "echo first > work.txt; echo ready; while [ ! -e {go} ]; do sleep 0.05; done; echo second >> work.txt"
    );
    let mut command = env.crew_command_for_others(&repo);
    command
        .args([
            "run",
            "--workspace-mode",
            "worktree",
            "--agent",
            "shell",
            &script,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command.uid(NOBODY);
    command.gid(NOBODY);
    let mut crew = command.spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let run = loop {
        let running = run_ids(&env, &repo).into_iter().next().filter(|run| {
            crate::common::runs::try_manifest(&env, &repo, run)
                .is_some_and(|record| record["tasks"][0]["status"] == "running")
        });
        if let Some(run) = running {
            break run;
        }
        // A crew that ended, or never got its agent going: what it said is the failure.
        if crew.try_wait().unwrap().is_some() || std::time::Instant::now() > deadline {
            let _ = crew.kill();
            let output = crew.wait_with_output().unwrap();
            panic!("the agent never ran: {}", render_output(&output));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    // The run's directory turns read-only under the running agent.
    let run_dir = repo.join(format!(".crew/state/runs/{run}"));
    let mode = |mode| std::fs::Permissions::from_mode(mode);
    std::fs::set_permissions(&run_dir, mode(0o555)).unwrap();
    write(&go, "");
    let output = crew.wait_with_output().unwrap();
    std::fs::set_permissions(&run_dir, mode(0o755)).unwrap();

    // The user is told what was not recorded, and where the work is.
    let rendered = render_output(&output);
    assert!(!output.status.success(), "{rendered}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("error: run {run} ended, but "))
            && stderr.contains("could not be recorded in .crew/state"),
        "{rendered}"
    );
    assert!(
        stderr.contains(&format!(
            "the agents' work is saved: shell in crew/{run}-shell"
        )),
        "{rendered}"
    );
    // No work is lost: all of it is on the task's branch.
    let show = std::process::Command::new("git")
        .args(["show", &format!("crew/{run}-shell:work.txt")])
        .current_dir(&repo)
        .uid(NOBODY)
        .gid(NOBODY)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("HOME", env.home())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&show.stdout),
        "first\nsecond\n",
        "{}",
        String::from_utf8_lossy(&show.stderr)
    );
}

#[test]
fn a_bare_task_name_means_the_same_agent_to_stop_and_to_resume() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // An earlier run has a task of the same name.
    let first = env.crew(
        &repo,
        crate::common::runs::shell_worktree_args(&["sc=true"]),
    );
    assert!(first.status.success(), "{}", render_output(&first));
    let mut args = crate::common::runs::shell_worktree_args(&[
        "sc=if [ -n \"$CREW_MESSAGE\" ]; then echo \"$CREW_MESSAGE\" > said.txt; exit 0; fi; echo ready; while true; do sleep 0.1; done",
    ]);
    args.insert(1, "--quiet".to_owned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut host = start_run(&env, &repo, &args, 1);
    let second = run_ids(&env, &repo).remove(0);

    let stop = env.crew(&repo, ["agents", "stop", "sc"]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    // Its only task stopped by a person: the run is cancelled, not failed; the command says
    // a task was stopped (1), not that it was interrupted (130).
    assert_eq!(host.wait().unwrap().code(), Some(1));
    assert_eq!(manifest(&env, &repo, &second)["status"], "cancelled");
    // Whoever follows the run learns last that the run no longer keeps it for a resume.
    let events =
        std::fs::read_to_string(repo.join(format!(".crew/state/runs/{second}/events.jsonl")))
            .unwrap();
    let last = events
        .lines()
        .rev()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|event| event["event"] == "task_status" && event["task"] == "sc")
        .unwrap();
    assert_eq!(last["reason"], "stopped by request", "{events}");
    let resume = env.crew(&repo, ["agents", "resume", "sc", "go on"]);
    assert!(resume.status.success(), "{}", render_output(&resume));
    let recorded = manifest(&env, &repo, &second);
    assert_eq!(
        crate::common::runs::task(&recorded, "sc")["status"],
        "succeeded",
        "{recorded:#}"
    );
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{second}-sc:said.txt")]),
        "go on\n"
    );
}

#[test]
fn a_dedicated_task_reads_as_done_and_a_plain_clean_keeps_its_only_copy() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let output = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "dedicated",
            "echo result > result.txt",
        ],
    );
    let said = render_output(&output);
    assert!(output.status.success(), "{said}");
    assert!(
        !said.contains("NOT ON ITS BRANCH") && !said.contains("kept with work not on a branch"),
        "{said}"
    );
    assert!(
        said.contains("its work is in its dedicated workspace"),
        "{said}"
    );
    assert!(!said.contains("crew runs clean"), "{said}");
    let run = run_ids(&env, &repo).remove(0);
    let result = repo.join(format!(".crew/state/ws/{run}/shell/result.txt"));
    assert!(result.is_file());

    let clean = env.crew(&repo, ["runs", "clean", &run]);
    let said = render_output(&clean);
    assert_eq!(clean.status.code(), Some(2), "{said}");
    assert!(
        said.contains("only copy") && said.contains("--force"),
        "{said}"
    );
    assert!(result.is_file(), "a plain clean keeps the work");
    let forced = env.crew(&repo, ["runs", "clean", &run, "--force"]);
    assert!(forced.status.success(), "{}", render_output(&forced));
    assert!(!result.exists());
}

#[test]
fn a_follow_up_queued_before_a_stop_reaches_the_agent_when_a_later_host_resumes_it() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut args = crate::common::runs::shell_worktree_args(&[
        "sc=if [ -n \"$CREW_MESSAGE\" ]; then echo \"$CREW_MESSAGE\" >> said.txt; exit 0; fi; echo ready; while true; do sleep 0.1; done",
    ]);
    args.insert(1, "--quiet".to_owned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut host = start_run(&env, &repo, &args, 1);
    let run = run_ids(&env, &repo).remove(0);
    let queued = env.crew(&repo, ["agents", "follow-up", "sc", "then the docs"]);
    assert!(queued.status.success(), "{}", render_output(&queued));
    let stop = env.crew(&repo, ["agents", "stop", "sc"]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    host.wait().unwrap();
    // The host is gone: the follow-up waits on the task's record.
    let recorded = manifest(&env, &repo, &run);
    assert_eq!(
        crate::common::runs::task(&recorded, "sc")["follow_ups"],
        serde_json::json!(["then the docs"]),
        "{recorded:#}"
    );
    let resume = env.crew(&repo, ["agents", "resume", "sc"]);
    assert!(resume.status.success(), "{}", render_output(&resume));
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-sc:said.txt")]),
        "then the docs\n"
    );
    let recorded = manifest(&env, &repo, &run);
    let task = crate::common::runs::task(&recorded, "sc");
    assert_eq!(task["status"], "succeeded", "{recorded:#}");
    assert!(task["follow_ups"].is_null(), "delivered once: {recorded:#}");
}

#[test]
fn a_resume_does_not_run_again_an_agent_that_had_finished_when_its_host_died() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // The agent appends: run twice, its work would say so. The host is killed while the
    // task's check runs, after the agent's exit was recorded and before the teardown.
    let mut host = env
        .crew_command(&repo)
        .args([
            "run",
            "--quiet",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "--check",
            "test -f checked.flag || { touch checked.flag; sleep 600; }",
            "echo once >> work.txt",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(30, "the check to run", || {
        let agents = env.agents_json(&repo)?;
        (agents[0]["state"] == "checking").then_some(())
    });
    signal(&host, rustix::process::Signal::KILL);
    host.wait().unwrap();
    let run = run_ids(&env, &repo).remove(0);

    let resumed = env.crew(&repo, ["runs", "resume", &run]);
    assert!(resumed.status.success(), "{}", render_output(&resumed));
    let recorded = manifest(&env, &repo, &run);
    let task = crate::common::runs::task(&recorded, "shell");
    assert_eq!(task["status"], "succeeded", "{recorded:#}");
    assert_eq!(task["attempts"], 1, "not started again: {recorded:#}");
    assert_eq!(task["check"]["passed"], true, "{recorded:#}");
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-shell:work.txt")]),
        "once\n"
    );
}

#[test]
fn a_run_whose_creation_was_interrupted_before_its_manifest_is_named_and_cleaned() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let first = env.crew(&repo, ["run", "--agent", "shell", "true"]);
    assert!(first.status.success(), "{}", render_output(&first));
    let runs = repo.join(".crew/state/runs");
    let (old, new) = ("abcdefgh-0mx5aaaaa", "abcdefgh-0mx5bbbbb");
    for run in [old, new] {
        std::fs::create_dir(runs.join(run)).unwrap();
    }
    let aged = std::process::Command::new("touch")
        .args(["-d", "1 minute ago", runs.join(old).as_str()])
        .status()
        .unwrap();
    assert!(aged.success());
    let list = render_output(&env.crew(&repo, ["runs", "list"]));
    assert!(
        list.contains("never written (its creation was interrupted)"),
        "{list}"
    );
    let fresh = env.crew(&repo, ["runs", "clean", new]);
    assert_eq!(fresh.status.code(), Some(2), "{}", render_output(&fresh));
    assert!(runs.join(new).exists(), "one being made is left alone");
    let clean = env.crew(&repo, ["runs", "clean", old]);
    assert!(clean.status.success(), "{}", render_output(&clean));
    assert!(!runs.join(old).exists());
}

/// A run whose host is killed while it prepares the task's worktree, at a moment when the
/// worktree lacks files of the task's commit (as in the middle of its checkout): the project's
/// `setup` stands in for that moment, the first time only, by removing a committed file,
/// saying it is there, and waiting for its host to be killed. Returns the run.
fn kill_host_mid_preparation(env: &TestEnv, repo: &Utf8Path) -> String {
    let once = env.root().join("setup-ran");
    let there = env.root().join("setup-there");
    write(
        &repo.join(".crew/config.toml"),
        &format!(
            "[worktree]\nsetup = [\"sh\", \"-c\", \"if [ ! -e {once} ]; then touch {once}; rm src/lib.txt; touch {there}; while kill -0 $PPID 2>/dev/null; do sleep 0.05; done; fi\"]\n"
        ),
    );
    let mut child = env
        .crew_command(repo)
        .args([
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "echo done > agent.txt",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(30, "the preparation to reach its setup", || {
        there.exists().then_some(())
    });
    signal(&child, rustix::process::Signal::KILL);
    child.wait().unwrap();
    let listed = env.crew(repo, ["worktrees", "list"]);
    let shown = render_output(&listed);
    assert!(shown.contains("unfinished"), "{shown}");
    run_ids(env, repo).remove(0)
}

#[test]
fn a_run_resumed_after_its_host_died_mid_checkout_never_hands_the_agent_the_half_made_worktree() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let run = kill_host_mid_preparation(&env, &repo);
    let base = env.git(&repo, ["rev-parse", "HEAD"]);

    let resumed = env.crew(&repo, ["runs", "resume", &run]);
    let shown = render_output(&resumed);
    assert!(resumed.status.success(), "{shown}");
    // The task's work is the agent's file alone: nothing the checkout had not reached yet is
    // committed as deleted.
    let branch = format!("crew/{run}-shell");
    let changed = env.git(&repo, ["diff", "--name-status", base.trim(), &branch]);
    assert_eq!(changed.trim(), "A\tagent.txt", "{shown}");
    assert_eq!(
        env.git(&repo, ["show", &format!("{branch}:src/lib.txt")]),
        "one\ntwo\nthree\n"
    );
    assert!(shown.contains("it was made again from"), "{shown}");
}

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
    assert!(resume.status.success(), "{}", render_output(&resume));
    host.wait().unwrap();
    let recorded = manifest(&env, &repo, &run);
    assert_eq!(
        crate::common::runs::task(&recorded, "sc")["status"],
        "succeeded",
        "{recorded:#}"
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

/// Runs `crew <args>` in `repo` as `nobody`, for whom file permissions hold.
fn crew_as_nobody(env: &TestEnv, repo: &Utf8Path, args: &[&str]) -> std::process::Output {
    let mut command = env.crew_command_for_others(repo);
    command
        .args(args)
        .uid(crew_tests::NOBODY)
        .gid(crew_tests::NOBODY);
    command.output().unwrap()
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
