//! A real lead agent fanning work out through crew mcp.

use super::*;

/// A Claude Code lead, running as a crew task in a worktree of a project whose `.crew/` is
/// committed, fans three sub-tasks out through `crew mcp` (its MCP server, as `claude mcp add
/// crew -- crew mcp` records it), waits for them and reads a diff: its task succeeds, the
/// sub-tasks are its children in its own run, and the diff reached the model.
#[test]
fn a_claude_code_lead_fans_out_through_crew_mcp_waits_and_reads_a_diff() {
    let Some(project) = Project::new("claude", "a_claude_code_lead_fans_out") else {
        return;
    };
    let env = &project.env;
    crew_tests::write(
        &env.home().join(".claude.json"),
        r#"{"mcpServers":{"crew":{"type":"stdio","command":"crew","args":["mcp"],"env":{}}}}"#,
    );
    let sub =
        |id: &str| json!({"id": id, "prompt": format!("echo {id} > {id}.txt"), "agent": "shell"});
    let model = ModelApi::start(vec![
        Reply::tool(
            "mcp__crew__run_tasks",
            json!({"tasks": [sub("one"), sub("two"), sub("three")], "wait": true}),
        ),
        Reply::tool("mcp__crew__diff", json!({"run": "lead", "task": "two"})),
        Reply::say("All three are done."),
    ]);
    // `.crew/` committed, as `crew init` asks (with the stand-in's host allowed first).
    project.allow_model(&model);
    env.git(&project.repo, ["add", ".crew"]);
    env.git(&project.repo, ["commit", "-q", "-m", "crew init"]);
    let run = project.crew(
        &model,
        &[
            "run",
            "--name",
            "lead",
            "--agent",
            "claude",
            "--workspace-mode",
            "worktree",
            "Split the work in three",
        ],
    );
    let log = std::fs::read_to_string(
        project
            .repo
            .join(".crew/state/runs/lead/tasks/claude/output.log"),
    )
    .unwrap_or_default();
    assert!(run.status.success(), "{}\n{log}", render_output(&run));
    let recorded = manifest(env, &project.repo, "lead");
    assert_eq!(
        task(&recorded, "claude")["status"],
        "succeeded",
        "{recorded:#}"
    );
    for id in ["one", "two", "three"] {
        let sub = task(&recorded, id);
        assert_eq!(sub["status"], "succeeded", "{recorded:#}");
        assert_eq!(sub["parent"], "claude", "{recorded:#}");
    }
    assert!(
        model.user_texts().contains("+two"),
        "the diff came back to the model: {}",
        model.user_texts()
    );
}
