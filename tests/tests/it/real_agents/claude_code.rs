//! Claude Code, the real program, against the stand-in of Anthropic's API.

use super::*;

#[test]
fn claude_code_writes_a_file_and_runs_a_command_in_a_worktree_and_its_session_is_kept() {
    let Some(project) = Project::new("claude", "claude_code_writes_a_file") else {
        return;
    };
    let model = ModelApi::start(vec![
        Reply::tool(
            "Write",
            json!({"file_path": "notes.txt", "content": "written by claude\n"}),
        ),
        Reply::tool(
            "Bash",
            json!({"command": "echo \"ran by bash in $CREW_SANDBOX\" > ran.txt", "description": "write ran.txt"}),
        ),
        Reply::say("Both done."),
    ]);
    // The README's example, with the stand-in's model behind it.
    let run = project.crew(
        &model,
        &[
            "run",
            "--agent",
            "claude",
            "--workspace-mode",
            "worktree",
            "Add an idempotency key to the refund endpoint",
        ],
    );
    assert!(run.status.success(), "{}", render_output(&run));
    assert!(
        model
            .user_texts()
            .contains("Add an idempotency key to the refund endpoint"),
        "the task's prompt reached the model: {}",
        model.user_texts()
    );
    let (run_id, task) = project.only_task();
    through_the_proxy(&task, &model);
    let branch = format!("crew/{run_id}-claude");
    let env = &project.env;
    // Its own Write tool and its own shell, inside crew's sandbox, on the task's branch.
    assert_eq!(
        env.git(&project.repo, ["show", &format!("{branch}:notes.txt")]),
        "written by claude\n"
    );
    assert_eq!(
        env.git(&project.repo, ["show", &format!("{branch}:ran.txt")]),
        "ran by bash in enforced\n"
    );
    assert!(
        !project.repo.join("notes.txt").exists(),
        "not in the leader"
    );
    assert_eq!(task["status"], "succeeded", "{task:#}");
    assert_eq!(task["sandbox"]["state"], "enforced", "{task:#}");
    assert_eq!(
        task["sandbox"]["stood_down"],
        json!(["--permission-mode", "bypassPermissions", "IS_SANDBOX=1"]),
        "the record says Claude Code's own checks stood down: {task:#}"
    );
    // The session it reported is recorded, and its transcript was kept in the fresh home.
    let session = task["session_id"].as_str().expect("a session id");
    let transcripts = project.env.home().join(".claude/projects");
    let kept = walk(&transcripts)
        .iter()
        .any(|path| path.file_name() == Some(&format!("{session}.jsonl")));
    assert!(kept, "no transcript {session}.jsonl under {transcripts}");
    assert_eq!(task["usage"]["turns"], 3, "{task:#}");
}

#[test]
fn a_follow_up_of_claude_code_s_finished_task_goes_on_in_its_session_on_its_branch() {
    let Some(project) = Project::new("claude", "a_follow_up_of_a_finished_task") else {
        return;
    };
    let model = ModelApi::start(vec![
        Reply::tool(
            "Write",
            json!({"file_path": "notes.txt", "content": "first\n"}),
        ),
        Reply::say("Written."),
        Reply::tool(
            "Write",
            json!({"file_path": "more.txt", "content": "asked for later\n"}),
        ),
        Reply::say("Also written."),
    ]);
    let run = project.crew(
        &model,
        &[
            "run",
            "--agent",
            "claude",
            "--workspace-mode",
            "worktree",
            "write the notes",
        ],
    );
    assert!(run.status.success(), "{}", render_output(&run));
    let (run_id, first) = project.only_task();
    assert_eq!(first["status"], "succeeded", "{first:#}");
    let session = first["session_id"].as_str().unwrap().to_owned();
    let branch = first["teardown"]["branch"].as_str().unwrap().to_owned();
    // The conversation goes on: the same session, in a workspace on the same branch.
    let follow = project.crew(
        &model,
        &["agents", "follow-up", "claude", "now also write more.txt"],
    );
    assert!(follow.status.success(), "{}", render_output(&follow));
    assert!(
        model.user_texts().contains("now also write more.txt"),
        "{}",
        model.user_texts()
    );
    let (_, again) = project.only_task();
    assert_eq!(again["status"], "succeeded", "{again:#}");
    assert_eq!(again["session_id"], session.as_str(), "{again:#}");
    assert_eq!(again["teardown"]["branch"], branch.as_str(), "{again:#}");
    let env = &project.env;
    let files = env.git(&project.repo, ["ls-tree", "-r", "--name-only", &branch]);
    assert!(
        files.lines().any(|file| file == "notes.txt")
            && files.lines().any(|file| file == "more.txt"),
        "both turns' work on the one branch: {files}"
    );
    // The first turn's commit is kept under the second's.
    let log = env.git(&project.repo, ["log", "--format=%s", &branch]);
    assert!(log.lines().count() >= 3, "{log}");
    // A resume with no message has nothing to do for it, and says how to give it more.
    let resume = project.crew(&model, &["agents", "resume", &format!("{run_id}:claude")]);
    assert_eq!(resume.status.code(), Some(2), "{}", render_output(&resume));
    assert!(
        String::from_utf8_lossy(&resume.stderr).contains("crew agents follow-up"),
        "{}",
        render_output(&resume)
    );
}

#[test]
fn claude_code_stopped_mid_command_resumes_its_own_session_and_finishes() {
    let Some(project) = Project::new("claude", "claude_code_resumes") else {
        return;
    };
    let model = ModelApi::start(vec![
        Reply::tool(
            "Bash",
            json!({"command": "echo started > started.txt; sleep 600", "description": "a long build"}),
        ),
        Reply::tool(
            "Write",
            json!({"file_path": "after.txt", "content": "after the resume\n"}),
        ),
        Reply::say("Finished after the resume."),
    ]);
    project.stop_mid_command_then_resume(&model, "claude");
    // The resumed conversation is the first one's: the model saw the task's prompt again.
    let last = model.requests().pop().unwrap();
    assert!(last.to_string().contains("build it"), "{last:#}");
    // Resumed with nothing to add, it was told to go on.
    assert!(
        model.user_texts().contains("Continue where you left off."),
        "{}\n{}",
        model.user_texts(),
        project.output_log()
    );
}

#[test]
fn a_steer_reaches_claude_code_s_running_session_mid_turn() {
    let Some(project) = Project::new("claude", "a_steer_reaches_claude_code") else {
        return;
    };
    let model = ModelApi::start(vec![
        Reply::tool(
            "Bash",
            json!({"command": "echo started > started.txt; sleep 4", "description": "a build"}),
        ),
        Reply::say("Done, steered."),
    ]);
    let mut host = project
        .command(&model, &["run", "--quiet", "--agent", "claude", "build it"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(60, "the command to start", || {
        project.repo.join("started.txt").exists().then_some(())
    });
    // Into the session under way, while its tool runs: the model reads it with the result.
    let steer = project.crew(&model, &["agents", "steer", "claude", "use the Money type"]);
    assert!(steer.status.success(), "{}", render_output(&steer));
    assert!(host.wait().unwrap().success(), "{}", project.output_log());
    assert!(
        model.user_texts().contains("use the Money type"),
        "{}",
        model.user_texts()
    );
    let (_, task) = project.only_task();
    assert_eq!(task["status"], "succeeded", "{task:#}");
    // One process, one session: the steer went in, not through a restart.
    assert_eq!(task["attempts"], 1, "{task:#}");
}

#[test]
fn claude_code_rate_limited_with_a_reset_retries_by_itself_and_crew_shows_it() {
    let Some(project) = Project::new("claude", "claude_code_rate_limited") else {
        return;
    };
    let model = ModelApi::start(vec![
        Reply::tool(
            "Write",
            json!({"file_path": "notes.txt", "content": "after the limit\n"}),
        ),
        Reply::say("Done."),
    ]);
    // The API says 429 twice, with the second to wait; Claude Code waits and tries again.
    model.fail_next(2, 429, Some(1));
    let run = project.crew(&model, &["run", "--agent", "claude", "write the notes"]);
    assert!(run.status.success(), "{}", render_output(&run));
    assert_eq!(
        std::fs::read_to_string(project.repo.join("notes.txt")).unwrap(),
        "after the limit\n"
    );
    let shown = crew_live::agent::protocol::shown_log(project.output_log().lines()).join("\n");
    assert!(
        shown.contains("[the model's API failed (HTTP 429"),
        "the waits showed: {shown}"
    );
    let (_, task) = project.only_task();
    assert_eq!(task["status"], "succeeded", "{task:#}");
    assert!(
        task["limit"].is_null(),
        "a limit it got over is no limit: {task:#}"
    );
}

#[test]
fn claude_code_giving_up_on_a_429_pauses_its_task_until_the_api_said_then_goes_on() {
    let Some(project) = Project::new("claude", "claude_code_giving_up_on_a_429") else {
        return;
    };
    let model = ModelApi::start(vec![
        Reply::tool(
            "Write",
            json!({"file_path": "notes.txt", "content": "after the pause\n"}),
        ),
        Reply::say("Done."),
    ]);
    // In the middle of its work (the file's write answered, its next request refused), Claude
    // Code tries once more after the `retry-after`, then gives up: its turn ends on the 429.
    // crew pauses the task until then, by the wait the API asked for, and goes on. (Refused
    // before it began, a task is queued again instead: `real_agents::limits`.)
    model.fail_at(1, 2, 429, Some(2));
    let run = project
        .command(
            &model,
            &[
                "run",
                "--agent",
                "claude",
                "--on-limit",
                "pause",
                "write the notes",
            ],
        )
        .env("CLAUDE_CODE_MAX_RETRIES", "1")
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", render_output(&run));
    assert_eq!(
        std::fs::read_to_string(project.repo.join("notes.txt")).unwrap(),
        "after the pause\n"
    );
    let (run_id, task) = project.only_task();
    assert_eq!(task["status"], "succeeded", "{task:#}");
    // It went through a pause whose reset was read from the 429, then its session went on.
    let events = std::fs::read_to_string(
        project
            .repo
            .join(format!(".crew/state/runs/{run_id}/events.jsonl")),
    )
    .unwrap();
    let paused: serde_json::Value = events
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .find(|event| event["event"] == "task_status" && event["status"] == "paused")
        .unwrap_or_else(|| panic!("no pause: {events}"));
    let reason = paused["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("Request rejected (429)"), "{reason}");
    assert!(reason.contains("which lifts at"), "{reason}");
    assert!(task["attempts"].as_u64().unwrap_or(0) >= 1, "{task:#}");
    assert!(
        model.user_texts().contains("Continue where you left off."),
        "its own session went on: {}",
        model.user_texts()
    );
}

#[test]
fn claude_code_refused_by_the_api_fails_its_task_with_the_api_s_words() {
    let Some(project) = Project::new("claude", "claude_code_refused_by_the_api") else {
        return;
    };
    let model = ModelApi::start(vec![Reply::Fail {
        status: 401,
        message: "invalid x-api-key (stand-in)".to_owned(),
        retry_after: None,
    }]);
    // Claude Code retries a refusal by itself, ten times over minutes unless told fewer.
    let run = project
        .command(&model, &["run", "--agent", "claude", "do it"])
        .env("CLAUDE_CODE_MAX_RETRIES", "2")
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(1), "{}", render_output(&run));
    let (_, task) = project.only_task();
    assert_eq!(task["status"], "failed", "{task:#}");
    // The program's own words, not a "success" whose result was an error.
    let reason = task["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("Invalid API key"), "{task:#}");
    assert!(!reason.contains("success"), "{task:#}");
    // Its retries showed while they went on: the task was not silent.
    let log = project.output_log();
    let shown = crew_live::agent::protocol::shown_log(log.lines()).join("\n");
    assert!(
        shown.contains("[the model's API failed (HTTP 401 authentication_failed): retry 1 of 2"),
        "{shown}"
    );
}
