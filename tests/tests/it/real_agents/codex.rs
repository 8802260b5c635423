//! Codex, the real program, against the stand-in of OpenAI's API.

use super::*;

#[test]
fn codex_patches_a_file_and_runs_a_command_in_a_worktree_and_its_thread_is_kept() {
    let Some(project) = Project::new("codex", "codex_patches_a_file") else {
        return;
    };
    // Codex's tools are called from JavaScript through its `exec` tool.
    let model = ModelApi::start(vec![
        Reply::tool(
            "exec",
            json!(
                "await tools.apply_patch(\"*** Begin Patch\\n*** Add File: notes.txt\\n+written by codex\\n*** End Patch\\n\");\ntext(\"patched\");"
            ),
        ),
        Reply::tool(
            "exec",
            json!(
                "const r = await tools.exec_command({cmd: \"echo ran by codex in $CREW_SANDBOX > ran.txt\"});\ntext(r.output);"
            ),
        ),
        Reply::say("Both done."),
    ]);
    let run = project.crew(
        &model,
        &[
            "run",
            "--agent",
            "codex",
            "--workspace-mode",
            "worktree",
            "Add an idempotency key to the refund endpoint",
        ],
    );
    assert!(
        run.status.success(),
        "{}\n{}",
        render_output(&run),
        project.output_log_of("codex")
    );
    let (run_id, task) = project.only_task_of("codex");
    through_the_proxy(&task, &model);
    // The shipped definition turns off what Codex would fetch besides its model (its
    // plugins' repository on GitHub, its analytics): no request refused, no warning each run.
    assert_eq!(task["requests"]["refused"], 0, "{task:#}");
    let branch = format!("crew/{run_id}-codex");
    let env = &project.env;
    assert_eq!(
        env.git(&project.repo, ["show", &format!("{branch}:notes.txt")]),
        "written by codex\n",
        "{}",
        project.output_log_of("codex")
    );
    assert_eq!(
        env.git(&project.repo, ["show", &format!("{branch}:ran.txt")]),
        "ran by codex in enforced\n"
    );
    assert_eq!(task["status"], "succeeded", "{task:#}");
    assert_eq!(
        task["sandbox"]["stood_down"],
        json!(["--dangerously-bypass-approvals-and-sandbox"]),
        "{task:#}"
    );
    assert!(
        task["session_id"].as_str().is_some(),
        "a thread id: {task:#}"
    );
}

#[test]
fn codex_stopped_mid_command_resumes_its_own_thread_and_finishes() {
    let Some(project) = Project::new("codex", "codex_resumes") else {
        return;
    };
    let model = ModelApi::start(vec![
        Reply::tool(
            "exec",
            json!(
                "const r = await tools.exec_command({cmd: \"echo started > started.txt; sleep 600\", yield_time_ms: 30000});\ntext(r.output);"
            ),
        ),
        Reply::tool(
            "exec",
            json!(
                "await tools.apply_patch(\"*** Begin Patch\\n*** Add File: after.txt\\n+after the resume\\n*** End Patch\\n\");"
            ),
        ),
        Reply::say("Finished after the resume."),
    ]);
    project.stop_mid_command_then_resume(&model, "codex");
    let texts = model.user_texts();
    assert!(texts.contains("build it"), "{texts}");
    assert!(texts.contains("Continue where you left off."), "{texts}");
}

#[test]
fn a_follow_up_of_codex_s_finished_task_goes_on_in_its_thread() {
    let Some(project) = Project::new("codex", "a_follow_up_of_codex") else {
        return;
    };
    let model = ModelApi::start(vec![
        Reply::tool(
            "exec",
            json!(
                "await tools.apply_patch(\"*** Begin Patch\\n*** Add File: notes.txt\\n+first\\n*** End Patch\\n\");"
            ),
        ),
        Reply::say("Written."),
        Reply::tool(
            "exec",
            json!(
                "await tools.apply_patch(\"*** Begin Patch\\n*** Add File: more.txt\\n+asked for later\\n*** End Patch\\n\");"
            ),
        ),
        Reply::say("Also written."),
    ]);
    let run = project.crew(
        &model,
        &[
            "run",
            "--agent",
            "codex",
            "--workspace-mode",
            "worktree",
            "write the notes",
        ],
    );
    assert!(run.status.success(), "{}", render_output(&run));
    let (_, first) = project.only_task_of("codex");
    let thread = first["session_id"].as_str().unwrap().to_owned();
    let branch = first["teardown"]["branch"].as_str().unwrap().to_owned();
    let follow = project.crew(
        &model,
        &["agents", "follow-up", "codex", "now also write more.txt"],
    );
    assert!(
        follow.status.success(),
        "{}\n{}",
        render_output(&follow),
        project.output_log_of("codex")
    );
    assert!(model.user_texts().contains("now also write more.txt"));
    let (_, again) = project.only_task_of("codex");
    assert_eq!(again["status"], "succeeded", "{again:#}");
    assert_eq!(
        again["session_id"],
        thread.as_str(),
        "its own thread: {again:#}"
    );
    let files = project
        .env
        .git(&project.repo, ["ls-tree", "-r", "--name-only", &branch]);
    assert!(
        files.lines().any(|file| file == "notes.txt")
            && files.lines().any(|file| file == "more.txt"),
        "{files}"
    );
}

#[test]
fn codex_refused_by_the_api_fails_its_task_with_the_api_s_words() {
    let Some(project) = Project::new("codex", "codex_refused_by_the_api") else {
        return;
    };
    let model = ModelApi::start(vec![Reply::Fail {
        status: 401,
        message: "invalid api key (stand-in)".to_owned(),
        retry_after: None,
    }]);
    let run = project.crew(&model, &["run", "--agent", "codex", "do it"]);
    assert_eq!(run.status.code(), Some(1), "{}", render_output(&run));
    let (_, task) = project.only_task_of("codex");
    assert_eq!(task["status"], "failed", "{task:#}");
    let reason = task["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("401 Unauthorized: invalid api key (stand-in)"),
        "the program's own words: {task:#}\n{}",
        project.output_log_of("codex")
    );
}

#[test]
fn codex_rate_limited_with_a_reset_retries_by_itself() {
    let Some(project) = Project::new("codex", "codex_rate_limited") else {
        return;
    };
    let model = ModelApi::start(vec![
        Reply::tool(
            "exec",
            json!(
                "const r = await tools.exec_command({cmd: \"echo after the limit > notes.txt\"});\ntext(r.output);"
            ),
        ),
        Reply::say("Done."),
    ]);
    model.fail_next(1, 429, Some(1));
    let run = project.crew(&model, &["run", "--agent", "codex", "write the notes"]);
    assert!(
        run.status.success(),
        "{}\n{}",
        render_output(&run),
        project.output_log_of("codex")
    );
    assert_eq!(
        std::fs::read_to_string(project.repo.join("notes.txt")).unwrap_or_default(),
        "after the limit\n"
    );
    let (_, task) = project.only_task_of("codex");
    assert_eq!(task["status"], "succeeded", "{task:#}");
    assert!(task["limit"].is_null(), "{task:#}");
}

#[test]
fn codex_giving_up_on_a_429_without_a_reset_is_a_limit() {
    let Some(project) = Project::new("codex", "codex_rate_limited_without_a_reset") else {
        return;
    };
    let model = ModelApi::start(vec![
        Reply::tool(
            "exec",
            json!(
                "const r = await tools.exec_command({cmd: \"echo after the limit > notes.txt\"});\ntext(r.output);"
            ),
        ),
        Reply::say("Done."),
    ]);
    // No `retry-after`: Codex 0.171 gives up on it at once ("exceeded retry limit, last
    // status: 429"). That is a limit: its task names it (and with `on_limit = "pause"` crew
    // would try again by its own backoff, a minute first).
    model.fail_next(1, 429, None);
    let run = project.crew(&model, &["run", "--agent", "codex", "write the notes"]);
    assert_eq!(run.status.code(), Some(1), "{}", render_output(&run));
    let (_, task) = project.only_task_of("codex");
    assert_eq!(task["status"], "failed", "{task:#}");
    assert!(
        task["limit"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("429 Too Many Requests")),
        "the 429 is a limit: {task:#}"
    );
}

#[test]
fn codex_whose_own_sandbox_cannot_start_fails_its_task_with_what_failed() {
    let Some(project) = Project::new("codex", "codex_whose_own_sandbox_cannot_start") else {
        return;
    };
    // A definition of before: Codex's own sandbox (bubblewrap) inside crew's, where it cannot
    // start, so every change and command it tries fails, and it still ends its turn.
    let definition = project.repo.join(".crew/agents/codex.toml");
    let text = std::fs::read_to_string(&definition).unwrap();
    let stands_down = "args = [\"--dangerously-bypass-approvals-and-sandbox\"]\n";
    assert!(text.contains(stands_down), "{text}");
    crew_tests::write(&definition, &text.replace(stands_down, ""));
    project.env.allow_settings(&project.repo);
    let model = ModelApi::start(vec![
        Reply::tool(
            "exec",
            json!(
                "await tools.apply_patch(\"*** Begin Patch\\n*** Add File: notes.txt\\n+written by codex\\n*** End Patch\\n\");"
            ),
        ),
        Reply::tool(
            "exec",
            json!(
                "const r = await tools.exec_command({cmd: \"echo ran > ran.txt\"});\ntext(r.output);"
            ),
        ),
        Reply::say("Both done."),
    ]);
    let run = project.crew(&model, &["run", "--agent", "codex", "do it"]);
    assert_eq!(run.status.code(), Some(1), "{}", render_output(&run));
    let (_, task) = project.only_task_of("codex");
    assert_eq!(task["status"], "failed", "{task:#}");
    let reason = task["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("every tool call of its last turn failed"),
        "{task:#}\n{}",
        project.output_log_of("codex")
    );
    assert!(!project.repo.join("notes.txt").exists());
}
