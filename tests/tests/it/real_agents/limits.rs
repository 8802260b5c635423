//! A provider's limit met by the real Claude Code: what it refused before the task began is
//! queued again, never failed (DESIGN §8c).

use super::*;

#[test]
fn claude_code_refused_at_its_first_request_is_queued_again_and_starts_afresh_when_it_lifts() {
    let Some(project) = Project::new("claude", "claude_code_refused_at_first") else {
        return;
    };
    let model = ModelApi::start(vec![
        Reply::tool(
            "Write",
            json!({"file_path": "notes.txt", "content": "after the refusal\n"}),
        ),
        Reply::say("Done."),
    ]);
    // The API refuses the first request twice, asking for two seconds; Claude Code waits once
    // and, its retries spent, gives up before any answer.
    model.fail_next(2, 429, Some(2));
    let run = project
        .command(&model, &["run", "--agent", "claude", "write the notes"])
        .env("CLAUDE_CODE_MAX_RETRIES", "1")
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", render_output(&run));
    assert_eq!(
        std::fs::read_to_string(project.repo.join("notes.txt")).unwrap(),
        "after the refusal\n"
    );
    let (run_id, task) = project.only_task();
    assert_eq!(task["status"], "succeeded", "{task:#}");
    let events: Vec<serde_json::Value> = std::fs::read_to_string(
        project
            .repo
            .join(format!(".crew/state/runs/{run_id}/events.jsonl")),
    )
    .unwrap()
    .lines()
    .filter_map(|line| serde_json::from_str(line).ok())
    .collect();
    let statuses: Vec<&str> = events
        .iter()
        .filter(|event| event["event"] == "task_status")
        .filter_map(|event| event["status"].as_str())
        .collect();
    // Queued again once, then started afresh: never paused (waiting on the limit) or failed.
    assert!(
        statuses
            .windows(2)
            .any(|pair| pair == ["running", "pending"]),
        "{statuses:?}"
    );
    assert!(!statuses.contains(&"paused"), "{statuses:?}");
    assert!(!statuses.contains(&"failed"), "{statuses:?}");
    let queued = events
        .iter()
        .find(|event| event["status"] == "pending" && event["reason"].is_string())
        .unwrap_or_else(|| panic!("{events:#?}"));
    let reason = queued["reason"].as_str().unwrap();
    assert!(
        reason.contains("queued again: anthropic refused it before it began"),
        "{reason}"
    );
    assert!(reason.contains("which lifts at"), "{reason}");
}

#[test]
fn six_claude_code_tasks_against_two_requests_at_once_all_succeed_and_at_most_two_wait() {
    let Some(project) = Project::new("claude", "six_against_two_at_once") else {
        return;
    };
    let model = ModelApi::start(vec![
        Reply::tool(
            "Write",
            json!({"file_path": "notes.txt", "content": "written\n"}),
        ),
        Reply::tool(
            "Write",
            json!({"file_path": "more.txt", "content": "more\n"}),
        ),
        Reply::say("Done."),
    ]);
    // The provider answers two requests at once, each taking a while, and refuses the rest
    // (429, try again in two seconds). Claude Code tries once more, then gives up.
    model.limit_concurrency(2, std::time::Duration::from_millis(1500), 2);
    let tasks: String = (1..=6)
        .map(|n| {
            format!(
                "\n[[tasks]]\nid = \"t{n}\"\nagent = \"claude\"\nprompt = \"write the notes\"\n"
            )
        })
        .collect();
    crew_tests::write(
        &project.repo.join(".crew/teams/six.toml"),
        &format!("workspace_mode = \"worktree\"\non_limit = \"pause\"\nmax_parallel = 6\n{tasks}"),
    );
    let run = project
        .command(&model, &["run", "six"])
        .env("CLAUDE_CODE_MAX_RETRIES", "1")
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", render_output(&run));
    assert!(model.refused_at_once() > 0, "the limit was never met");
    let run_id = run_ids(&project.env, &project.repo).remove(0);
    let recorded = manifest(&project.env, &project.repo, &run_id);
    for n in 1..=6 {
        assert_eq!(
            task(&recorded, &format!("t{n}"))["status"],
            "succeeded",
            "{recorded:#}"
        );
    }
    // At no moment were more than two of them waiting on the limit (paused).
    let events = std::fs::read_to_string(
        project
            .repo
            .join(format!(".crew/state/runs/{run_id}/events.jsonl")),
    )
    .unwrap();
    let mut paused = std::collections::HashSet::new();
    let mut most = 0;
    for event in events
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| event["event"] == "task_status")
    {
        let task = event["task"].as_str().unwrap_or_default().to_owned();
        match event["status"] == "paused" {
            true => paused.insert(task),
            false => paused.remove(&task),
        };
        most = most.max(paused.len());
    }
    assert!(
        most <= 2,
        "{most} tasks waited on the limit at once:\n{events}"
    );
}
