//! The real agent programs, as `crew init` defines them, in a fresh home with the sandbox on:
//! Claude Code, Codex and Gemini CLI from npm (pinned in `tests/agent-programs`), talking to a stand-in of their model
//! API (`crew_tests::model_api`). Only the model is a stand-in: the tools that write files and
//! run commands, the session files, the resume and the errors are the program's own.

use std::process::{Command, Output, Stdio};

use camino::Utf8PathBuf;
use crew_tests::model_api::{ModelApi, Reply};
use crew_tests::{TestEnv, render_output, wait_until};
use serde_json::json;

use crate::common::runs::{manifest, run_ids, task, try_manifest};

/// A project with the definitions `crew init` writes, in a fresh home, and the real programs.
struct Project {
    env: TestEnv,
    repo: Utf8PathBuf,
    programs: Utf8PathBuf,
}

impl Project {
    fn new(program: &str, test: &str) -> Option<Self> {
        let programs = crew_tests::agent_programs(program, test)?;
        let env = TestEnv::new();
        let repo = env.repo("app");
        let init = env.crew(&repo, ["init"]);
        assert!(init.status.success(), "{}", render_output(&init));
        Some(Project {
            env,
            repo,
            programs,
        })
    }

    /// `crew args…` with the programs on PATH and the variables a user of Claude Code behind a
    /// gateway sets: its key, the gateway's URL, no traffic besides the model's.
    fn command(&self, model: &ModelApi, args: &[&str]) -> Command {
        self.allow_model(model);
        let mut command = self.env.crew_command(&self.repo);
        let inherited = command
            .get_envs()
            .find(|(name, _)| *name == "PATH")
            .and_then(|(_, value)| value.map(ToOwned::to_owned))
            .unwrap_or_default();
        let path = std::env::join_paths(
            std::iter::once(self.programs.as_std_path().to_path_buf())
                .chain(std::env::split_paths(&inherited)),
        )
        .unwrap();
        command
            .env("PATH", path)
            .env("ANTHROPIC_API_KEY", "sk-ant-stand-in")
            .env("ANTHROPIC_BASE_URL", model.url())
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("OPENAI_API_KEY", "sk-stand-in")
            .env("GEMINI_API_KEY", "stand-in")
            .env("GOOGLE_GEMINI_BASE_URL", model.url())
            .args(args);
        command
    }

    /// The shipped definitions reach their vendor's hosts only, through crew's proxy: the
    /// stand-in's address is added to each list, as a user adds a gateway's. Every program
    /// then talks to the model through the proxy, or not at all.
    fn allow_model(&self, model: &ModelApi) {
        let host = model.url().trim_start_matches("http://").to_owned();
        let entry = format!("\"{host}\"");
        let Ok(dir) = std::fs::read_dir(self.repo.join(".crew/agents")) else {
            return;
        };
        let mut changed = false;
        for file in dir.flatten() {
            let path = file.path();
            let text = std::fs::read_to_string(&path).unwrap();
            if text.contains("allow_hosts = [") && !text.contains(&entry) {
                std::fs::write(
                    &path,
                    text.replace("allow_hosts = [", &format!("allow_hosts = [{entry}, ")),
                )
                .unwrap();
                changed = true;
            }
        }
        // A changed definition needs allowing again (its `write` paths loosen the sandbox).
        if changed {
            let allowed = self.env.crew(&self.repo, ["sandbox", "allow"]);
            assert!(allowed.status.success(), "{}", render_output(&allowed));
        }
    }

    fn crew(&self, model: &ModelApi, args: &[&str]) -> Output {
        self.command(model, args).output().unwrap()
    }

    /// Points Codex at `model` as a user of a gateway does: a model provider of their own in
    /// `~/.codex/config.toml` (Codex 0.171 reads no `OPENAI_BASE_URL`).
    fn codex_gateway(&self, model: &ModelApi) {
        crew_tests::write(
            &self.env.home().join(".codex/config.toml"),
            &format!(
                "model_provider = \"gateway\"\n[model_providers.gateway]\nname = \"gateway\"\nbase_url = \"{}/v1\"\nenv_key = \"OPENAI_API_KEY\"\nwire_api = \"responses\"\nsupports_websockets = false\n",
                model.url()
            ),
        );
    }

    /// Runs `agent` on "build it" with `model`'s script, whose first call starts a long
    /// command writing `started.txt`; stops the task during it, resumes it, and checks that
    /// it resumed its own session and finished, its next call writing `after.txt`.
    fn stop_mid_command_then_resume(&self, model: &ModelApi, agent: &str) {
        let mut host = self
            .command(model, &["run", "--quiet", "--agent", agent, "build it"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_until(60, "the long command to start", || {
            self.repo.join("started.txt").exists().then_some(())
        });
        let stop = self.crew(model, &["agents", "stop", agent]);
        assert!(stop.status.success(), "{}", render_output(&stop));
        host.wait().unwrap();
        let (_, stopped) = self.only_task_of(agent);
        let session = stopped["session_id"]
            .as_str()
            .expect("a session id")
            .to_owned();

        let resume = self.crew(model, &["agents", "resume", agent]);
        assert!(resume.status.success(), "{}", render_output(&resume));
        assert_eq!(
            std::fs::read_to_string(self.repo.join("after.txt")).unwrap_or_default(),
            "after the resume\n",
            "{}",
            self.output_log_of(agent)
        );
        let (_, resumed) = self.only_task_of(agent);
        assert_eq!(resumed["status"], "succeeded", "{resumed:#}");
        assert_eq!(resumed["session_id"], session.as_str(), "the same session");
    }

    /// The agent's output log, for a failure's message.
    fn output_log(&self) -> String {
        self.output_log_of("claude")
    }

    fn output_log_of(&self, task: &str) -> String {
        let run = run_ids(&self.env, &self.repo).remove(0);
        let log = self
            .repo
            .join(format!(".crew/state/runs/{run}/tasks/{task}/output.log"));
        std::fs::read_to_string(&log).unwrap_or_else(|error| format!("{log}: {error}"))
    }

    /// The only run's manifest and its one task.
    fn only_task(&self) -> (String, serde_json::Value) {
        self.only_task_of("claude")
    }

    fn only_task_of(&self, id: &str) -> (String, serde_json::Value) {
        let run = run_ids(&self.env, &self.repo).remove(0);
        let recorded = manifest(&self.env, &self.repo, &run);
        let task = task(&recorded, id).clone();
        (run, task)
    }
}

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
    // Claude Code tries once more after the `retry-after`, then gives up: its turn ends on the
    // 429. crew pauses the task until then, by the wait the API asked for, and goes on.
    model.fail_next(2, 429, Some(2));
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
    project.codex_gateway(&model);
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
    project.codex_gateway(&model);
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
    project.codex_gateway(&model);
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
    project.codex_gateway(&model);
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
    project.codex_gateway(&model);
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
    project.codex_gateway(&model);
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
fn codex_whose_own_sandbox_cannot_start_fails_its_task_with_what_failed() {
    let Some(project) = Project::new("codex", "codex_whose_own_sandbox_cannot_start") else {
        return;
    };
    // A definition of before: Codex's own sandbox (bubblewrap) inside crew's, where it cannot
    // start, so every change and command it tries fails, and it still ends its turn.
    let definition = project.repo.join(".crew/agents/codex.toml");
    let text = std::fs::read_to_string(&definition).unwrap();
    let (before, _) = text.split_once("[sandbox.confined]").unwrap();
    crew_tests::write(&definition, before);
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
    project.codex_gateway(&model);
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
            "command = [\"claude-code-acp\"]\nprotocol = \"acp\"\npass_env = [\"ANTHROPIC_*\", \"CLAUDE_CODE_*\"]\nenv = {{ CLAUDE_CONFIG_DIR = \"{state}\" }}\n[sandbox]\nwrite = [\"~/.claude/\"]\n"
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
        "command = [\"claude-code-acp\"]\nprotocol = \"acp\"\npass_env = [\"ANTHROPIC_*\", \"CLAUDE_CODE_*\"]\n[sandbox]\nwrite = [\"~/.claude/\"]\n",
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

/// Every file beneath `dir`.
/// The task's agent reached the model through crew's proxy only (its shipped definition's
/// `network = "proxy"`, which leaves it no other route): its calls are counted there. What the
/// proxy refused (a program's update check, its feature flags) is named in the warnings, and
/// the model's address never among it.
fn through_the_proxy(task: &serde_json::Value, model: &ModelApi) {
    assert_eq!(task["sandbox"]["network"], "proxy", "{task:#}");
    let allowed = task["requests"]["allowed"].as_u64().unwrap_or(0);
    assert!(allowed >= 1, "no call went through the proxy: {task:#}");
    let host = model.url().trim_start_matches("http://");
    assert!(
        !task["warnings"].to_string().contains(host),
        "the model's address was refused: {task:#}"
    );
}

fn walk(dir: &camino::Utf8Path) -> Vec<Utf8PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in dir.read_dir_utf8().into_iter().flatten().flatten() {
            let path = entry.path().to_path_buf();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files
}

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
