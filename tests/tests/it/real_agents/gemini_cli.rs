//! Gemini CLI, the real program over ACP, against the stand-in of Google's API.

use super::*;

#[test]
fn gemini_cli_rate_limited_without_a_reset_backs_off_by_itself() {
    let Some(project) = Project::new("gemini", "gemini_cli_rate_limited_without_a_reset") else {
        return;
    };
    let model = ModelApi::start(vec![
        Reply::tool(
            "run_shell_command",
            json!({"command": "echo after the limit > notes.txt", "description": "the notes"}),
        ),
        Reply::say("Done."),
    ]);
    model.fail_next(1, 429, None);
    let run = project.crew(&model, &["run", "--agent", "gemini", "write the notes"]);
    assert!(
        run.status.success(),
        "{}\n{}",
        render_output(&run),
        project.output_log_of("gemini")
    );
    assert_eq!(
        std::fs::read_to_string(project.repo.join("notes.txt")).unwrap_or_default(),
        "after the limit\n"
    );
    let (_, task) = project.only_task_of("gemini");
    assert_eq!(task["status"], "succeeded", "{task:#}");
}

#[test]
fn gemini_cli_refused_by_the_api_fails_its_task_with_the_api_s_words() {
    let Some(project) = Project::new("gemini", "gemini_cli_refused_by_the_api") else {
        return;
    };
    let model = ModelApi::start(vec![Reply::Fail {
        status: 401,
        message: "API key not valid (stand-in)".to_owned(),
        retry_after: None,
    }]);
    let run = project.crew(&model, &["run", "--agent", "gemini", "do it"]);
    assert_eq!(run.status.code(), Some(1), "{}", render_output(&run));
    let (_, task) = project.only_task_of("gemini");
    assert_eq!(task["status"], "failed", "{task:#}");
    let reason = task["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("API key not valid (stand-in)") && reason.contains("failed"),
        "the program's own words: {task:#}\n{}",
        project.output_log_of("gemini")
    );
}

#[test]
fn gemini_cli_rate_limited_with_a_reset_retries_by_itself() {
    let Some(project) = Project::new("gemini", "gemini_cli_rate_limited") else {
        return;
    };
    let model = ModelApi::start(vec![
        Reply::tool(
            "run_shell_command",
            json!({"command": "echo after the limit > notes.txt", "description": "the notes"}),
        ),
        Reply::say("Done."),
    ]);
    model.fail_next(1, 429, Some(1));
    let run = project.crew(&model, &["run", "--agent", "gemini", "write the notes"]);
    assert!(
        run.status.success(),
        "{}\n{}",
        render_output(&run),
        project.output_log_of("gemini")
    );
    assert_eq!(
        std::fs::read_to_string(project.repo.join("notes.txt")).unwrap_or_default(),
        "after the limit\n"
    );
    let (_, task) = project.only_task_of("gemini");
    assert_eq!(task["status"], "succeeded", "{task:#}");
    assert!(task["limit"].is_null(), "{task:#}");
}

#[test]
fn gemini_cli_writes_a_file_and_runs_a_command_over_acp() {
    let Some(project) = Project::new("gemini", "gemini_cli_writes_a_file") else {
        return;
    };
    // Gemini CLI runs its commands in a terminal of its own (node-pty), as it does by default:
    // a private instance of the terminal devices, in the agent's own namespace.
    // A new file: Gemini CLI reads it first, itself (crew offers no reads, whose "not found"
    // Gemini CLI 0.61 took for a refusal), then writes it through crew's `fs/write_text_file`.
    assert!(!project.repo.join("notes.txt").exists());
    let model = ModelApi::start(vec![
        Reply::tool(
            "write_file",
            json!({"file_path": project.repo.join("notes.txt").as_str(), "content": "written by gemini\n"}),
        ),
        Reply::tool(
            "run_shell_command",
            json!({"command": "echo ran by gemini in $CREW_SANDBOX > ran.txt", "description": "write ran.txt"}),
        ),
        Reply::say("Both done."),
    ]);
    let run = project.crew(&model, &["run", "--agent", "gemini", "write the notes"]);
    assert!(
        run.status.success(),
        "{}\n{}",
        render_output(&run),
        project.output_log_of("gemini")
    );
    assert_eq!(
        std::fs::read_to_string(project.repo.join("notes.txt")).unwrap_or_default(),
        "written by gemini\n",
        "{}",
        project.output_log_of("gemini")
    );
    assert_eq!(
        std::fs::read_to_string(project.repo.join("ran.txt")).unwrap_or_default(),
        "ran by gemini in enforced\n"
    );
    let log = project.output_log_of("gemini");
    assert!(
        log.contains("fs/write_text_file"),
        "written through crew: {log}"
    );
    assert!(!log.contains("fs/read_text_file"), "read by itself: {log}");
    let (_, task) = project.only_task_of("gemini");
    through_the_proxy(&task, &model);
    assert_eq!(task["status"], "succeeded", "{task:#}");
    assert_eq!(
        task["sandbox"]["stood_down"],
        json!(["--approval-mode", "yolo", "GEMINI_CLI_TRUST_WORKSPACE=true"]),
        "{task:#}"
    );
    assert!(task["session_id"].as_str().is_some(), "a session: {task:#}");
    assert!(model.user_texts().contains("write the notes"));
}

#[test]
fn a_steer_reaches_gemini_cli_s_running_session_mid_turn() {
    let Some(project) = Project::new("gemini", "a_steer_reaches_gemini_cli") else {
        return;
    };
    let model = ModelApi::start(vec![
        Reply::tool(
            "run_shell_command",
            json!({"command": "echo started > started.txt; sleep 6", "description": "the build"}),
        ),
        Reply::say("Done, steered."),
        Reply::say("Done, steered."),
    ]);
    let mut host = project
        .command(&model, &["run", "--quiet", "--agent", "gemini", "build it"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(60, "the command to start", || {
        project.repo.join("started.txt").exists().then_some(())
    });
    // Over ACP a steer is the session's next prompt: the turn under way is cancelled, and the
    // model reads the steer in the same session.
    let steer = project.crew(&model, &["agents", "steer", "gemini", "use the Money type"]);
    assert!(steer.status.success(), "{}", render_output(&steer));
    assert!(
        host.wait().unwrap().success(),
        "{}",
        project.output_log_of("gemini")
    );
    assert!(
        model.user_texts().contains("use the Money type"),
        "{}",
        model.user_texts()
    );
    let (_, task) = project.only_task_of("gemini");
    assert_eq!(task["status"], "succeeded", "{task:#}");
    // One process, one session: the steer went in, not through a restart.
    assert_eq!(task["attempts"], 1, "{task:#}");
    through_the_proxy(&task, &model);
}

#[test]
fn a_follow_up_of_gemini_cli_s_finished_task_goes_on_on_its_branch() {
    let Some(project) = Project::new("gemini", "a_follow_up_of_gemini_cli") else {
        return;
    };
    // The stand-in answers by the place in the conversation: a new session starts its script
    // over, so the command does what is not done yet.
    let step = json!({"command": "if test -e notes.txt; then echo asked for later > more.txt; else echo first > notes.txt; fi", "description": "the notes"});
    let model = ModelApi::start(vec![
        Reply::tool("run_shell_command", step.clone()),
        Reply::say("Written."),
        Reply::tool("run_shell_command", step),
        Reply::say("Also written."),
    ]);
    let run = project.crew(
        &model,
        &[
            "run",
            "--agent",
            "gemini",
            "--workspace-mode",
            "worktree",
            "write the notes",
        ],
    );
    assert!(
        run.status.success(),
        "{}\n{}",
        render_output(&run),
        project.output_log_of("gemini")
    );
    let (_, first) = project.only_task_of("gemini");
    assert_eq!(first["status"], "succeeded", "{first:#}");
    let branch = first["teardown"]["branch"].as_str().unwrap().to_owned();
    // The conversation goes on in a workspace on the same branch: in its session when Gemini
    // CLI loads it, else in a new one the task's warnings name.
    let follow = project.crew(
        &model,
        &["agents", "follow-up", "gemini", "now also write more.txt"],
    );
    assert!(
        follow.status.success(),
        "{}\n{}",
        render_output(&follow),
        project.output_log_of("gemini")
    );
    assert!(
        model.user_texts().contains("now also write more.txt"),
        "{}",
        model.user_texts()
    );
    let (_, again) = project.only_task_of("gemini");
    assert_eq!(again["status"], "succeeded", "{again:#}");
    assert_eq!(again["teardown"]["branch"], branch.as_str(), "{again:#}");
    let warnings = again["warnings"].to_string();
    let loaded = again["warnings"].as_array().is_none_or(Vec::is_empty);
    assert!(
        loaded || warnings.contains("new session"),
        "the task says how it went on: {again:#}"
    );
    let files = project
        .env
        .git(&project.repo, ["ls-tree", "-r", "--name-only", &branch]);
    assert!(
        files.lines().any(|file| file == "notes.txt")
            && files.lines().any(|file| file == "more.txt"),
        "both turns' work on the one branch: {files}"
    );
}

#[test]
fn gemini_cli_stopped_mid_command_goes_on_after_a_resume() {
    let Some(project) = Project::new("gemini", "gemini_cli_resumes") else {
        return;
    };
    // Gemini CLI 0.61 mostly finds no session to load (`session/load`: "No previous sessions
    // found for this project"): crew goes on in a new session, given the task's prompt again,
    // and the work in the workspace is what the agent finds. When it saved the session before
    // the stop, the session loads and goes on. Either way the command does the rest of the
    // job when it runs again.
    let model = ModelApi::start(vec![
        Reply::tool(
            "run_shell_command",
            json!({"command": "if test -e started.txt; then echo after the resume > after.txt; else echo started > started.txt; sleep 600; fi", "description": "the build"}),
        ),
        Reply::say("Finished after the resume."),
    ]);
    let mut host = project
        .command(&model, &["run", "--quiet", "--agent", "gemini", "build it"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(60, "the long command to start", || {
        project.repo.join("started.txt").exists().then_some(())
    });
    let stop = project.crew(&model, &["agents", "stop", "gemini"]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    host.wait().unwrap();
    let resume = project.crew(&model, &["agents", "resume", "gemini"]);
    assert!(
        resume.status.success(),
        "{}\n{}",
        render_output(&resume),
        project.output_log_of("gemini")
    );
    assert_eq!(
        std::fs::read_to_string(project.repo.join("after.txt")).unwrap_or_default(),
        "after the resume\n"
    );
    let (_, task) = project.only_task_of("gemini");
    assert_eq!(task["status"], "succeeded", "{task:#}");
    let warnings = task["warnings"].to_string();
    let loaded = task["warnings"].as_array().is_none_or(Vec::is_empty);
    assert!(
        loaded || (warnings.contains("could not be loaded") && warnings.contains("new session")),
        "the task says how it went on: {task:#}"
    );
    assert!(
        model.user_texts().contains("build it"),
        "{}",
        model.user_texts()
    );
}
