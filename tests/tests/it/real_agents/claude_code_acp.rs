//! claude-code-acp, Claude Code over the Agent Client Protocol.

use super::*;

#[test]
fn claude_code_acp_asks_its_permission_as_the_task_s_question_and_takes_the_answer() {
    let Some(project) = Project::new("claude-code-acp", "claude_code_acp_asks") else {
        return;
    };
    // The ACP adapter for Claude Code, as a user defines it: its permission requests are the
    // task's questions. It keeps its settings file beside its state (CLAUDE_CONFIG_DIR): in the
    // home itself (~/.claude.json and its backups) the sandbox grants nothing, and without it
    // the adapter's session/new fails.
    let state = project.env.home().join(".claude");
    crew_tests::write(
        &project.repo.join(".crew/agents/cc.toml"),
        &format!(
            "command = [\"claude-code-acp\"]\nprotocol = \"acp\"\npass_env = [\"ANTHROPIC_*\", \"CLAUDE_CODE_*\"]\nenv = {{ CLAUDE_CONFIG_DIR = \"{state}\" }}\n[sandbox]\nallow_hosts = [\"api.anthropic.com\"]\nwrite = [\"~/.claude/\"]\n"
        ),
    );
    project.env.allow_settings(&project.repo);
    let model = ModelApi::start(vec![
        Reply::tool(
            "Bash",
            // The adapter's own Bash (served through crew's terminals) requires a timeout.
            json!({"command": "echo ran by the adapter > ran.txt", "description": "write ran.txt", "timeout": 60000}),
        ),
        Reply::say("Done."),
    ]);
    let mut host = project
        .command(
            &model,
            &["run", "--quiet", "--agent", "cc", "write ran.txt"],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let asked = wait_until(60, "the adapter to ask (or end)", || {
        let run = run_ids(&project.env, &project.repo).into_iter().next()?;
        let recorded = try_manifest(&project.env, &project.repo, &run)?;
        let task = task(&recorded, "cc").clone();
        (!matches!(
            task["status"].as_str(),
            Some("pending" | "preparing" | "running")
        ))
        .then_some(task)
    });
    assert_eq!(
        asked["status"],
        "waiting",
        "{asked:#}\n{}",
        project.output_log_of("cc")
    );
    let question = asked["question"].as_str().unwrap_or_default().to_owned();
    assert!(
        question.contains("ran.txt") || question.contains("Bash"),
        "{question}"
    );
    assert!(
        !project.repo.join("ran.txt").exists(),
        "not before the answer"
    );
    let answered = project.crew(&model, &["agents", "follow-up", "cc", "yes"]);
    assert!(answered.status.success(), "{}", render_output(&answered));
    let ended = wait_until(60, "the run's end", || host.try_wait().unwrap());
    assert!(ended.success(), "{}", project.output_log_of("cc"));
    assert_eq!(
        std::fs::read_to_string(project.repo.join("ran.txt")).unwrap_or_default(),
        "ran by the adapter\n",
        "{}",
        project.output_log_of("cc")
    );
    let (_, task) = project.only_task_of("cc");
    assert_eq!(task["status"], "succeeded", "{task:#}");
}

#[test]
fn claude_code_acp_whose_session_cannot_start_fails_its_task_and_is_ended() {
    let Some(project) = Project::new("claude-code-acp", "claude_code_acp_whose_session") else {
        return;
    };
    // Its settings file in the home itself, which the sandbox does not grant: the adapter's
    // session/new fails, and the adapter stays (it ignores the end of its input).
    crew_tests::write(
        &project.repo.join(".crew/agents/cc.toml"),
        "command = [\"claude-code-acp\"]\nprotocol = \"acp\"\npass_env = [\"ANTHROPIC_*\", \"CLAUDE_CODE_*\"]\n[sandbox]\nallow_hosts = [\"api.anthropic.com\"]\nwrite = [\"~/.claude/\"]\n",
    );
    project.env.allow_settings(&project.repo);
    let model = ModelApi::start(vec![Reply::say("Hello.")]);
    let mut host = project
        .command(&model, &["run", "--quiet", "--agent", "cc", "say hello"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Without crew ending it, the run would wait for it for ever.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let ended = loop {
        if let Some(status) = host.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = host.kill();
            panic!("the run did not end: {}", project.output_log_of("cc"));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(ended.code(), Some(1));
    let (_, task) = project.only_task_of("cc");
    assert_eq!(task["status"], "failed", "{task:#}");
    let reason = task["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("crew ended the agent once its session was over")
            && reason.contains("Query closed before response received"),
        "{task:#}"
    );
}
