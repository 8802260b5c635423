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

mod aider;
mod claude_code;
mod claude_code_acp;
mod codex;
mod gemini_cli;
mod lead;
mod limits;
mod secrets;

/// The key the test's user has for every provider: the model stand-in must receive it, and the
/// agent never hold it.
const USERS_KEY: &str = "sk-the-users-own-key-0123456789";

/// The model received the user's key, and only it: the agent's stand-in never reached it.
fn key_by_reference(model: &ModelApi) {
    let keys = model.keys();
    assert!(!keys.is_empty(), "the model received no key");
    assert!(
        keys.iter().all(|key| key == USERS_KEY),
        "the model received another key than the user's: {keys:?}"
    );
}

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
            .env("ANTHROPIC_API_KEY", USERS_KEY)
            .env("ANTHROPIC_BASE_URL", model.url())
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("OPENAI_API_KEY", USERS_KEY)
            .env("OPENAI_BASE_URL", format!("{}/v1", model.url()))
            .env("GEMINI_API_KEY", USERS_KEY)
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

/// Every file beneath `dir`.
/// The task's agent reached the model through crew's proxy only, its key held there (its shipped definition's
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
    // Its key by reference: the agent held a stand-in, the model got the user's key.
    assert!(
        task["sandbox"]["by_reference"]
            .as_array()
            .is_some_and(|held| !held.is_empty()),
        "{task:#}"
    );
    key_by_reference(model);
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
