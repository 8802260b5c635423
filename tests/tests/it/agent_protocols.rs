//! Agents that speak a protocol of their own: Claude Code's stream-json, spoken by a stand-in
//! that replays the documented message shapes (`tests/fixtures/claude-stream-json/`).

use camino::Utf8Path;
use crew_tests::{TestEnv, render_output, wait_until, write};

use crate::common::runs::{manifest, run_ids, task};

/// A project whose `claude` agent is the stand-in, with the flags Claude Code documents.
fn project_with_claude(env: &TestEnv) -> camino::Utf8PathBuf {
    let repo = env.repo("project");
    let fake = crew_tests::helper_bin("fake-claude");
    let flags =
        r#""-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose""#;
    write(
        &repo.join(".crew/agents/claude.toml"),
        &format!(
            "command = [\"{fake}\", {flags}]\nresume = [\"{fake}\", \"--resume\", \"{{session_id}}\", {flags}]\nprotocol = \"claude-stream-json\"\n"
        ),
    );
    repo
}

/// `crew run --agent claude --workspace-mode worktree args…` in `repo`, to its end.
fn run_claude(env: &TestEnv, repo: &Utf8Path, args: &[&str]) -> std::process::Output {
    let mut all = vec!["run", "--agent", "claude", "--workspace-mode", "worktree"];
    all.extend(args);
    env.crew(repo, all)
}

/// The same, in the background: the host, to wait for.
fn spawn_claude(env: &TestEnv, repo: &Utf8Path, args: &[&str]) -> std::process::Child {
    let mut all = vec!["run", "--agent", "claude", "--workspace-mode", "worktree"];
    all.extend(args);
    env.spawn_crew(repo, all)
}

/// The run whose `claude` task is `status`, once it is.
fn run_once_claude_is(env: &TestEnv, repo: &Utf8Path, status: &str) -> String {
    wait_until(30, &format!("the task to be {status}"), || {
        let run = run_ids(env, repo).into_iter().next()?;
        (task(&manifest(env, repo, &run), "claude")["status"] == status).then_some(run)
    })
}

fn log(repo: &Utf8Path, run: &str, task: &str) -> String {
    std::fs::read_to_string(repo.join(format!(".crew/state/runs/{run}/tasks/{task}/output.log")))
        .unwrap()
}

#[test]
fn sessions_usage_and_cost_are_recorded_and_a_follow_up_resumes_that_session() {
    let env = TestEnv::new();
    let repo = project_with_claude(&env);
    let output = run_claude(
        &env,
        &repo,
        &[
            "--task",
            "api=write api.txt then fail",
            "--task",
            "docs=write docs.txt",
        ],
    );
    let shown = render_output(&output);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    let run = run_ids(&env, &repo).remove(0);
    let recorded = manifest(&env, &repo, &run);
    // The agent's own account of its failed turn is part of the reason.
    assert_eq!(
        task(&recorded, "api")["reason"],
        "the agent exited with code 1 (its last turn: error_during_execution: working on: write api.txt then fail)"
    );
    assert_eq!(task(&recorded, "docs")["status"], "succeeded");
    for id in ["api", "docs"] {
        let record = task(&recorded, id);
        assert!(
            record["session_id"]
                .as_str()
                .is_some_and(|session| session.starts_with("sess-")),
            "{record:#}"
        );
        assert_eq!(
            record["usage"],
            serde_json::json!({
                "input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 50,
                "cache_creation_input_tokens": 5, "cost_usd": 0.0125, "turns": 2
            }),
            "{record:#}"
        );
        assert_eq!(
            env.git(&repo, ["show", &format!("crew/{run}-{id}:{id}.txt")]),
            "written by the stand-in\n"
        );
        // A person sees what the agent said and did, not its JSON; the log keeps the JSON.
        let log = log(&repo, &run, id);
        assert!(log.contains(r#""type":"result""#), "{log}");
    }
    assert!(
        shown.contains("# api: 155 tokens in, 20 out, $0.0125, 2 turn(s)"),
        "{shown}"
    );
    assert!(
        shown.contains(
            "# the run: 310 tokens in, 40 out, $0.0250, 4 turn(s) (2 of 2 tasks report usage)"
        ),
        "{shown}"
    );
    let events = env.crew(&repo, ["events", "--run", &run, "--json"]);
    let usage_events = String::from_utf8_lossy(&events.stdout)
        .lines()
        .filter(|line| line.contains(r#""usage""#))
        .count();
    assert_eq!(usage_events, 2, "{}", render_output(&events));

    // A follow-up to the failed task takes up exactly its session.
    let session = task(&recorded, "api")["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let follow = env.crew(
        &repo,
        [
            "agents",
            "follow-up",
            &format!("{run}:api"),
            "write more.txt",
        ],
    );
    assert!(follow.status.success(), "{}", render_output(&follow));
    let resumed = wait_until(30, "the resumed task to end", || {
        let recorded = manifest(&env, &repo, &run);
        let record = task(&recorded, "api").clone();
        (record["status"] == "succeeded" && record["attempts"] == 2).then_some(record)
    });
    assert_eq!(resumed["session_id"], session.as_str());
    let cost = resumed["usage"]["cost_usd"].as_f64().unwrap();
    assert!((cost - 0.025).abs() < 1e-9, "{resumed:#}");
    assert_eq!(resumed["usage"]["turns"], 4, "{resumed:#}");
    let log = log(&repo, &run, "api");
    assert!(
        log.contains(&format!("resumed session {session}: write more.txt")),
        "{log}"
    );
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-api:more.txt")]),
        "written by the stand-in\n"
    );
}

#[test]
fn a_stream_json_agent_that_stays_after_its_result_is_ended_and_its_task_succeeds() {
    let env = TestEnv::new();
    let repo = project_with_claude(&env);
    // Left to itself it would run until this timeout, and fail by it.
    write(
        &repo.join(".crew/config.toml"),
        "[run]\ntask_timeout = \"40s\"\n",
    );
    let output = run_claude(&env, &repo, &["write stays.txt then stay"]);
    let shown = render_output(&output);
    assert!(output.status.success(), "{shown}");
    let run = run_ids(&env, &repo).remove(0);
    let recorded = manifest(&env, &repo, &run);
    let record = task(&recorded, "claude");
    assert_eq!(record["status"], "succeeded", "{record:#}");
    assert_eq!(record["exit"]["ended_after_session"], true, "{record:#}");
    assert!(record["exit"]["stopped_by"].is_null(), "{record:#}");
    assert_eq!(record["exit"]["timed_out"], false, "{record:#}");
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-claude:stays.txt")]),
        "written by the stand-in\n"
    );
}

#[test]
fn a_usage_limit_fails_the_task_with_the_limit_named_and_when_it_lifts() {
    let env = TestEnv::new();
    let repo = project_with_claude(&env);
    let output = run_claude(&env, &repo, &["write half.txt then hit the limit"]);
    let shown = render_output(&output);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    let run = run_ids(&env, &repo).remove(0);
    let recorded = manifest(&env, &repo, &run);
    let record = task(&recorded, "claude");
    assert_eq!(record["status"], "failed", "{record:#}");
    assert_eq!(
        record["limit"]["message"], "Claude AI usage limit reached",
        "{record:#}"
    );
    let resets = record["limit"]["resets_at"].as_str().unwrap();
    let reason = record["reason"].as_str().unwrap();
    assert_eq!(
        reason,
        format!(
            "the agent exited with code 1 after it hit a usage limit, which lifts at {resets}: Claude AI usage limit reached"
        )
    );
    assert!(shown.contains(reason), "{shown}");
    // The work done before the limit is on the task's branch.
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-claude:half.txt")]),
        "written by the stand-in\n"
    );
}

#[test]
fn a_limit_met_again_after_its_reset_waits_crew_s_backoff_not_the_reset_it_said() {
    let env = TestEnv::new();
    let repo = project_with_claude(&env);
    let mut host = spawn_claude(
        &env,
        &repo,
        &[
            "--on-limit",
            "pause",
            "then hit the limit for 1 seconds at every start",
        ],
    );
    let events = |run: &str| {
        std::fs::read_to_string(repo.join(format!(".crew/state/runs/{run}/events.jsonl")))
            .unwrap_or_default()
    };
    let paused = |run: &str| -> Vec<serde_json::Value> {
        events(run)
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|event| event["status"] == "paused")
            .collect()
    };
    // A busy machine may take a while to start the agent twice, and to save what it said.
    // The first pause has no time of crew's to try again (the limit said when it lifts); the
    // second has, and it is measured from when that second limit said it lifts, which the
    // agent said before crew decided: a slow save only makes the wait look longer. What was
    // seen is shown if the second pause never reaches the record.
    let timestamp = |value: &serde_json::Value| {
        serde_json::from_value::<crew_core::model::Timestamp>(value.clone()).ok()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    let (run, resets, retry, record) = loop {
        if let Some(run) = run_ids(&env, &repo).into_iter().next()
            && paused(&run).len() >= 2
        {
            let record = task(&manifest(&env, &repo, &run), "claude").clone();
            if let Some(retry) = timestamp(&record["limit"]["retry_at"])
                && let Some(resets) = timestamp(&record["limit"]["resets_at"])
            {
                break (run, resets, retry, record);
            }
        }
        if std::time::Instant::now() > deadline {
            let run = run_ids(&env, &repo).into_iter().next().unwrap_or_default();
            panic!(
                "the task did not pause a second time with a time to try again; its events:\n{}\nits record: {:#}",
                events(&run),
                if run.is_empty() {
                    serde_json::Value::Null
                } else {
                    task(&manifest(&env, &repo, &run), "claude").clone()
                }
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let wait = retry.0.duration_since(resets.0).unwrap_or_default();
    assert!(
        wait > std::time::Duration::from_secs(45),
        "the second try waits crew's backoff (a minute), not the second the limit said: {wait:?}: {record:#}\nits events:\n{}",
        events(&run)
    );
    // `--force`: in a container's job (CI) the test's session and its host's have leaders
    // outside the pid namespace and no terminal, so crew cannot tell them apart and refuses
    // without it (`cli_lifecycle::questions` tests that refusal).
    let cancel = env.crew(&repo, ["runs", "cancel", "--force", &run]);
    assert!(cancel.status.success(), "{}", render_output(&cancel));
    host.wait().unwrap();
}

#[test]
fn a_task_that_pauses_on_a_limit_goes_on_in_its_session_when_the_limit_lifts() {
    let env = TestEnv::new();
    let repo = project_with_claude(&env);
    let output = run_claude(
        &env,
        &repo,
        &[
            "--on-limit",
            "pause",
            "write half.txt then hit the limit for 2 seconds",
        ],
    );
    let shown = render_output(&output);
    assert!(output.status.success(), "{shown}");
    assert!(
        shown.contains("paused: it hit a usage limit, which lifts at"),
        "{shown}"
    );
    let run = run_ids(&env, &repo).remove(0);
    let recorded = manifest(&env, &repo, &run);
    let record = task(&recorded, "claude");
    assert_eq!(record["status"], "succeeded", "{record:#}");
    // Two starts of one session: the limit's, and the one after it lifted.
    assert_eq!(record["attempts"], 2, "{record:#}");
    assert_eq!(record["on_limit"], "pause", "{record:#}");
    assert!(record["limit"].is_null(), "{record:#}");
    // Woken once: no second start was tried while the first ran.
    assert!(
        !record["warnings"].to_string().contains("could not start"),
        "{record:#}"
    );
    let session = record["session_id"].as_str().unwrap();
    assert!(
        log(&repo, &run, "claude").contains(&format!(
            "resumed session {session}: Continue where you left off."
        )),
        "{}",
        log(&repo, &run, "claude")
    );
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-claude:half.txt")]),
        "written by the stand-in\n"
    );
}

#[test]
fn a_paused_task_holds_the_run_shows_when_it_goes_on_and_a_resume_takes_it_up_early() {
    let env = TestEnv::new();
    let repo = project_with_claude(&env);
    write(
        &repo.join(".crew/teams/limited.toml"),
        "workspace_mode = \"worktree\"\non_limit = \"pause\"\nmax_parallel = 1\n\n[[tasks]]\nid = \"long\"\nagent = \"claude\"\nprompt = \"write long.txt then hit the limit for 3600 seconds\"\n\n[[tasks]]\nid = \"next\"\nagent = \"other\"\nprompt = \"write next.txt\"\n",
    );
    // Of another provider (a definition of its own): a limited provider's tasks wait for it
    // (`rate_limits`), another's take the slot.
    std::fs::copy(
        repo.join(".crew/agents/claude.toml"),
        repo.join(".crew/agents/other.toml"),
    )
    .unwrap();
    let mut host = env.spawn_crew(&repo, ["run", "limited"]);
    let run = wait_until(
        30,
        "the first task to pause and the second to finish",
        || {
            let run = run_ids(&env, &repo).into_iter().next()?;
            let recorded = manifest(&env, &repo, &run);
            (task(&recorded, "long")["status"] == "paused"
                && task(&recorded, "next")["status"] == "succeeded")
                .then_some(run)
        },
    );
    // The paused task gave its slot to the next one, and the run waits for it.
    assert!(host.try_wait().unwrap().is_none());
    let recorded = manifest(&env, &repo, &run);
    let long = task(&recorded, "long");
    let resets = long["limit"]["resets_at"].as_str().unwrap().to_owned();
    let listed = env.crew(&repo, ["runs", "list", "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(rows[0]["continues_at"], resets.as_str(), "{rows:#}");
    assert_eq!(rows[0]["tasks"]["paused"], 1, "{rows:#}");
    let table = env.crew(&repo, ["runs", "list"]);
    assert!(
        String::from_utf8_lossy(&table.stdout).contains(&format!(
            "1 paused, 1 succeeded (goes on at {})",
            resets[..19].replace('T', " ")
        )),
        "{}",
        render_output(&table)
    );
    // A person need not wait for the limit to lift.
    let resumed = env.crew(&repo, ["agents", "resume", &format!("{run}:long")]);
    assert!(resumed.status.success(), "{}", render_output(&resumed));
    let ended = wait_until(30, "the run's end", || host.try_wait().unwrap());
    assert!(ended.success());
    let recorded = manifest(&env, &repo, &run);
    let long = task(&recorded, "long");
    assert_eq!(long["status"], "succeeded", "{long:#}");
    assert_eq!(long["attempts"], 2, "{long:#}");
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-long:long.txt")]),
        "written by the stand-in\n"
    );
}

#[test]
fn a_follow_up_of_a_task_that_succeeded_in_a_live_run_goes_on_in_its_session_on_its_branch() {
    let env = TestEnv::new();
    let repo = project_with_claude(&env);
    write(
        &repo.join(".crew/teams/pair.toml"),
        "workspace_mode = \"worktree\"\n\n[[tasks]]\nid = \"long\"\nagent = \"shell\"\nprompt = \"sleep 600\"\n\n[[tasks]]\nid = \"notes\"\nagent = \"claude\"\nprompt = \"write first.txt\"\n",
    );
    let started = env.crew(&repo, ["run", "pair", "--detach"]);
    assert!(started.status.success(), "{}", render_output(&started));
    let run = String::from_utf8(started.stdout).unwrap().trim().to_owned();
    let first = wait_until(30, "the notes task to succeed", || {
        let record = task(&manifest(&env, &repo, &run), "notes").clone();
        (record["status"] == "succeeded").then_some(record)
    });
    let session = first["session_id"].as_str().unwrap().to_owned();
    let follow = env.crew(
        &repo,
        [
            "agents",
            "follow-up",
            &format!("{run}:notes"),
            "write second.txt",
        ],
    );
    assert!(follow.status.success(), "{}", render_output(&follow));
    let again = wait_until(30, "the follow-up's turn to end", || {
        let record = task(&manifest(&env, &repo, &run), "notes").clone();
        (record["status"] == "succeeded" && record["attempts"].as_u64() >= Some(2))
            .then_some(record)
    });
    assert_eq!(again["session_id"], session.as_str(), "{again:#}");
    let branch = format!("crew/{run}-notes");
    assert_eq!(again["teardown"]["branch"], branch.as_str(), "{again:#}");
    let files = env.git(&repo, ["ls-tree", "-r", "--name-only", &branch]);
    assert!(
        files.lines().any(|file| file == "first.txt")
            && files.lines().any(|file| file == "second.txt"),
        "{files}"
    );
    assert!(
        log(&repo, &run, "notes").contains(&format!("resumed session {session}: write second.txt")),
        "{}",
        log(&repo, &run, "notes")
    );
    let cancelled = env.crew(&repo, ["runs", "cancel", &run]);
    assert!(cancelled.status.success(), "{}", render_output(&cancelled));
}

#[test]
fn a_limit_that_says_no_reset_is_tried_again_by_crew_s_backoff() {
    let env = TestEnv::new();
    let repo = project_with_claude(&env);
    let started = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "claude",
            "--detach",
            "--on-limit",
            "pause",
            "write half.txt then hit a limit that says no reset",
        ],
    );
    assert!(started.status.success(), "{}", render_output(&started));
    let run = String::from_utf8(started.stdout).unwrap().trim().to_owned();
    let record = wait_until(30, "the task to be paused", || {
        let record = task(&manifest(&env, &repo, &run), "claude").clone();
        (record["status"] == "paused").then_some(record)
    });
    // Not a pause until a person comes: crew tries again in a minute by itself.
    assert!(record["limit"]["resets_at"].is_null(), "{record:#}");
    let retry: crew_core::model::Timestamp =
        serde_json::from_value(record["limit"]["retry_at"].clone())
            .unwrap_or_else(|error| panic!("{error}: {record:#}"));
    let wait = retry
        .0
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default()
        .as_secs();
    assert!((30..=61).contains(&wait), "{wait} s: {record:#}");
    let reason = record["reason"].as_str().unwrap();
    assert!(reason.contains("crew tries again at"), "{reason}");
    let listed = env.crew(&repo, ["runs", "list", "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(
        rows[0]["continues_at"], record["limit"]["retry_at"],
        "{rows:#}"
    );
    // A person may still take it up sooner.
    let resumed = env.crew(&repo, ["agents", "resume", &format!("{run}:claude")]);
    assert!(resumed.status.success(), "{}", render_output(&resumed));
    let finished = wait_until(30, "the run's end", || {
        let recorded = manifest(&env, &repo, &run);
        (recorded["status"] != "running").then_some(recorded)
    });
    assert_eq!(
        task(&finished, "claude")["status"],
        "succeeded",
        "{finished:#}"
    );
}

#[test]
fn a_paused_task_outlives_its_cancelled_run_and_a_follow_up_takes_up_its_session() {
    let env = TestEnv::new();
    let repo = project_with_claude(&env);
    // Detached, so the run is this test's own to cancel wherever it runs: a foreground run's
    // session cannot be told from another's where both sessions began outside the pid
    // namespace (some CI containers), and a cancel there asks for --force.
    let started = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "claude",
            "--workspace-mode",
            "worktree",
            "--detach",
            "--on-limit",
            "pause",
            "write first.txt then hit the limit for 3600 seconds",
        ],
    );
    assert!(started.status.success(), "{}", render_output(&started));
    let run = String::from_utf8(started.stdout).unwrap().trim().to_owned();
    wait_until(30, "the task to be paused", || {
        (task(&manifest(&env, &repo, &run), "claude")["status"] == "paused").then_some(())
    });
    let cancelled = env.crew(&repo, ["runs", "cancel", &run]);
    assert!(cancelled.status.success(), "{}", render_output(&cancelled));
    let host = manifest(&env, &repo, &run)["host"]["pid"].as_u64().unwrap();
    wait_until(30, "the host to end", || {
        let stat = std::fs::read_to_string(format!("/proc/{host}/stat")).unwrap_or_default();
        // Gone, or a zombie its new parent has not reaped yet.
        let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
        (state.is_none_or(|rest| rest.starts_with('Z'))).then_some(())
    });
    assert_ne!(manifest(&env, &repo, &run)["status"], "running");
    let recorded = manifest(&env, &repo, &run);
    let record = task(&recorded, "claude");
    // Still paused, its workspace kept with the work in it.
    assert_eq!(record["status"], "paused", "{record:#}");
    let dir = record["workspace"]["dir"].as_str().unwrap();
    assert!(
        std::path::Path::new(dir).join("first.txt").exists(),
        "{record:#}"
    );
    let session = record["session_id"].as_str().unwrap().to_owned();
    // A follow-up hosts the run again and takes the session up at once.
    let follow = env.crew(
        &repo,
        [
            "agents",
            "follow-up",
            &format!("{run}:claude"),
            "write second.txt",
        ],
    );
    assert!(follow.status.success(), "{}", render_output(&follow));
    let done = wait_until(30, "the task to finish", || {
        let recorded = manifest(&env, &repo, &run);
        let record = task(&recorded, "claude").clone();
        (record["status"] == "succeeded").then_some(record)
    });
    assert_eq!(done["session_id"], session.as_str(), "{done:#}");
    for file in ["first.txt", "second.txt"] {
        assert_eq!(
            env.git(&repo, ["show", &format!("crew/{run}-claude:{file}")]),
            "written by the stand-in\n"
        );
    }
}

#[test]
fn a_steer_reaches_the_running_session_mid_turn() {
    let env = TestEnv::new();
    let repo = project_with_claude(&env);
    let mut host = spawn_claude(&env, &repo, &["wait for steer"]);
    // The stand-in reads the steer before it prints anything of its turn.
    let run = run_once_claude_is(&env, &repo, "running");
    let steer = env.crew(
        &repo,
        ["agents", "steer", &format!("{run}:claude"), "go left"],
    );
    assert!(steer.status.success(), "{}", render_output(&steer));
    // A message that never reached the agent would leave it waiting: bounded, not a hang.
    let ended = wait_until(30, "the run's end", || host.try_wait().unwrap());
    assert!(ended.success());
    let recorded = manifest(&env, &repo, &run);
    assert_eq!(
        task(&recorded, "claude")["status"],
        "succeeded",
        "{recorded:#}"
    );
    let log = log(&repo, &run, "claude");
    assert!(log.contains("steered: go left"), "{log}");
}

#[test]
fn output_that_is_not_the_protocol_is_shown_as_lines_with_a_warning() {
    let env = TestEnv::new();
    let repo = project_with_claude(&env);
    let output = run_claude(&env, &repo, &["emit garbage"]);
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let recorded = manifest(&env, &repo, &run);
    let record = task(&recorded, "claude");
    assert_eq!(record["status"], "succeeded");
    let warnings = record["warnings"].to_string();
    assert!(
        warnings.contains("not claude-stream-json messages")
            && warnings.contains("this line is not stream-json"),
        "{record:#}"
    );
    // Nothing is lost: the log has the line, and the turn after it was read.
    assert!(log(&repo, &run, "claude").contains("this line is not stream-json\n"));
    assert_eq!(record["usage"]["turns"], 2, "{record:#}");
}

#[test]
fn a_stream_json_agent_steers_with_json_or_its_file_is_refused() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/agents/claude.toml"),
        "command = [\"claude\"]\nprotocol = \"claude-stream-json\"\nsteer = \"stdin-lines\"\n",
    );
    let refused = env.crew(&repo, ["run", "--agent", "claude", "hello"]);
    let shown = render_output(&refused);
    assert_eq!(refused.status.code(), Some(2), "{shown}");
    assert!(
        shown.contains("steers with stream-json messages") && shown.contains("agents/claude.toml"),
        "{shown}"
    );
    // An ACP agent steers through its protocol, and says so just as plainly.
    write(
        &repo.join(".crew/agents/claude.toml"),
        "command = [\"gemini\", \"--acp\"]\nprotocol = \"acp\"\nsteer = \"stdin-json\"\n",
    );
    let refused = env.crew(&repo, ["run", "--agent", "claude", "hello"]);
    let shown = render_output(&refused);
    assert_eq!(refused.status.code(), Some(2), "{shown}");
    assert!(
        shown.contains("steers with the protocol's own prompts")
            && shown.contains("agents/claude.toml:3"),
        "{shown}"
    );
    assert!(run_ids(&env, &repo).is_empty());
}

#[test]
fn a_codex_thread_and_its_tokens_are_recorded_and_a_follow_up_resumes_that_thread() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let fake = crew_tests::helper_bin("fake-codex");
    write(
        &repo.join(".crew/agents/codex.toml"),
        &format!(
            "command = [\"{fake}\", \"exec\", \"--json\", \"{{prompt}}\"]\nresume = [\"{fake}\", \"exec\", \"--json\", \"resume\", \"{{session_id}}\", \"{{message}}\"]\nprotocol = \"codex-json\"\n"
        ),
    );
    let output = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "codex",
            "--workspace-mode",
            "worktree",
            "write api.txt then fail",
        ],
    );
    let shown = render_output(&output);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    let run = run_ids(&env, &repo).remove(0);
    let record = task(&manifest(&env, &repo, &run), "codex").clone();
    assert_eq!(
        record["reason"],
        "the agent exited with code 1 (its last turn: the stand-in was told to fail)"
    );
    let thread = record["session_id"].as_str().unwrap().to_owned();
    assert!(thread.starts_with("th-"), "{record:#}");
    // A failed turn that reports no tokens leaves them unknown: no usage, not zeros.
    assert_eq!(record.get("usage"), None, "{record:#}");

    let follow = env.crew(
        &repo,
        [
            "agents",
            "follow-up",
            &format!("{run}:codex"),
            "write fix.txt",
        ],
    );
    assert!(follow.status.success(), "{}", render_output(&follow));
    let resumed = task(&manifest(&env, &repo, &run), "codex").clone();
    assert_eq!(resumed["status"], "succeeded", "{resumed:#}");
    assert_eq!(resumed["session_id"], thread.as_str());
    // Codex reports tokens, never a cost: the cost stays unknown, not 0.
    assert_eq!(
        resumed["usage"],
        serde_json::json!({
            "input_tokens": 400, "output_tokens": 150, "cache_read_input_tokens": 2000,
            "cache_creation_input_tokens": 0, "cost_usd": null, "turns": 1
        }),
        "{resumed:#}"
    );
    let show = env.crew(&repo, ["runs", "show", &run]);
    let shown = String::from_utf8_lossy(&show.stdout);
    assert!(
        shown.contains("# codex: 2.4k tokens in, 150 out, 1 turn(s)"),
        "{shown}"
    );
    let list = env.crew(&repo, ["agents", "list", "--all-runs"]);
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(
        listed.contains("COST") && listed.contains("[turn over]"),
        "{listed}"
    );
    assert!(
        log(&repo, &run, "codex").contains(&format!("resumed thread {thread}: write fix.txt")),
        "the follow-up took up the same thread"
    );
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-codex:fix.txt")]),
        "written by the codex stand-in\n"
    );
}

#[test]
fn listings_tell_a_working_agent_from_one_idle_between_turns() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // Steered with stream-json messages, read as plain lines: the result line ends its turn,
    // and it reads on.
    write(
        &repo.join(".crew/agents/turns.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\nsteer = \"stdin-json\"\n",
    );
    let mut host = env.spawn_crew(
        &repo,
        [
            "run",
            "--agent",
            "turns",
            "echo working; read first; echo '{\"type\":\"result\"}'; read second; echo done",
        ],
    );
    let activity = |env: &TestEnv| {
        let agents = env.agents_json(&repo)?;
        let agent = agents.as_array()?.first()?.clone();
        Some((
            agent["activity"].as_str().unwrap_or("-").to_owned(),
            String::from_utf8(env.crew(&repo, ["agents", "list"]).stdout).ok()?,
        ))
    };
    let (working, _) = wait_until(30, "the agent at work", || {
        activity(&env).filter(|(activity, _)| activity == "working")
    });
    assert_eq!(working, "working");
    let steer = env.crew(&repo, ["agents", "steer", "turns", "go on"]);
    assert!(steer.status.success(), "{}", render_output(&steer));
    let (_, table) = wait_until(30, "the agent idle after its turn", || {
        activity(&env).filter(|(activity, _)| activity == "idle")
    });
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|line| line.contains(" idle ")),
        "{table}"
    );
    let steer = env.crew(&repo, ["agents", "steer", "turns", "finish"]);
    assert!(steer.status.success(), "{}", render_output(&steer));
    // A message that never reached the agent would leave it waiting: bounded, not a hang.
    let ended = wait_until(30, "the run's end", || host.try_wait().unwrap());
    assert!(ended.success());
}
