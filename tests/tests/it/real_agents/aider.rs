//! aider, the real program from PyPI.

use super::*;

#[test]
fn aider_writes_a_file_and_runs_a_command_in_a_worktree() {
    let Some(project) = Project::new("aider", "aider_writes_a_file") else {
        return;
    };
    // aider's edits are in the model's words (a search/replace block that makes a file), and
    // the command it runs itself is its test command, after the edit (`--auto-test`): a
    // command the model suggests is never run with `--yes-always`, by aider's own rule. Its
    // user has a git identity: without one, aider writes one into the repository's config,
    // which is read-only to an agent.
    crew_tests::write(
        &project.env.home().join(".gitconfig"),
        "[user]\n\tname = A User\n\temail = user@example.com\n",
    );
    let model = ModelApi::start(vec![
        Reply::say(
            "notes.txt\n```\n<<<<<<< SEARCH\n=======\nwritten by aider\n>>>>>>> REPLACE\n```\n",
        ),
        Reply::say("Done."),
    ]);
    let run = project
        .command(
            &model,
            &[
                "run",
                "--agent",
                "aider",
                "--workspace-mode",
                "worktree",
                "write the notes",
            ],
        )
        .env("OPENAI_API_BASE", format!("{}/v1", model.url()))
        .env("AIDER_MODEL", "openai/stand-in")
        .env("AIDER_EDIT_FORMAT", "diff")
        .env("AIDER_AUTO_TEST", "true")
        .env(
            "AIDER_TEST_CMD",
            "echo ran by aider in $CREW_SANDBOX > ran.txt",
        )
        .env("AIDER_SHOW_MODEL_WARNINGS", "false")
        .env("AIDER_ANALYTICS", "false")
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}\n{}",
        render_output(&run),
        project.output_log_of("aider")
    );
    assert!(
        model.user_texts().contains("write the notes"),
        "{}",
        model.user_texts()
    );
    let (run_id, task) = project.only_task_of("aider");
    through_the_proxy(&task, &model);
    assert_eq!(task["status"], "succeeded", "{task:#}");
    assert_eq!(task["sandbox"]["state"], "enforced", "{task:#}");
    let branch = format!("crew/{run_id}-aider");
    let env = &project.env;
    assert_eq!(
        env.git(&project.repo, ["show", &format!("{branch}:notes.txt")]),
        "written by aider\n",
        "{}",
        project.output_log_of("aider")
    );
    assert_eq!(
        env.git(&project.repo, ["show", &format!("{branch}:ran.txt")]),
        "ran by aider in enforced\n",
        "{}",
        project.output_log_of("aider")
    );
}
