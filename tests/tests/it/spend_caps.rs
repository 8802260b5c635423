//! Spend caps (DESIGN §8c): a task, a run or a day at its cap pauses before its next turn and
//! asks; `crew agents resume` goes on with another cap's worth, `crew agents stop` ends it; a
//! cap that cannot be measured says so. Against the stand-ins of Claude Code's stream-json
//! (which reports $0.0125 a turn) and of Codex (tokens, priced by the definition).

use camino::{Utf8Path, Utf8PathBuf};
use crew_tests::{TestEnv, render_output, write};

use crate::common::runs::{manifest, run_ids, task, task_once};

/// A project whose `claude` agent is the stream-json stand-in, with `config` as its
/// `config.toml`.
fn project_with_claude(env: &TestEnv, config: &str) -> Utf8PathBuf {
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
    write(&repo.join(".crew/config.toml"), config);
    repo
}

/// A project whose `codex` agent is the Codex stand-in, `prices` its definition's `[prices]`.
fn project_with_codex(env: &TestEnv, prices: &str) -> Utf8PathBuf {
    let repo = env.repo("project");
    let fake = crew_tests::helper_bin("fake-codex");
    write(
        &repo.join(".crew/agents/codex.toml"),
        &format!(
            "command = [\"{fake}\", \"exec\", \"--json\", \"{{prompt}}\"]\nresume = [\"{fake}\", \"exec\", \"--json\", \"resume\", \"{{session_id}}\", \"{{message}}\"]\nprotocol = \"codex-json\"\n{prices}"
        ),
    );
    repo
}

fn crew_ok(env: &TestEnv, repo: &Utf8Path, args: &[&str]) -> String {
    let output = env.crew(repo, args);
    assert!(output.status.success(), "{}", render_output(&output));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn a_task_at_its_cap_pauses_before_its_next_turn_asks_and_goes_on_when_resumed() {
    let env = TestEnv::new();
    let repo = project_with_claude(&env, "[run]\ntask_max_cost_usd = 0.01\n");
    let mut host = env.spawn_crew(
        &repo,
        [
            "run",
            "--agent",
            "claude",
            "--workspace-mode",
            "worktree",
            "write first.txt wait for steer",
        ],
    );
    let (run, _) = task_once(&env, &repo, "claude", "the task to run", |record| {
        record["status"] == "running"
    });
    let agent = format!("{run}:claude");
    // A follow-up waits for the turn's end; the steer ends the turn, which costs $0.0125.
    crew_ok(
        &env,
        &repo,
        &["agents", "follow-up", &agent, "write second.txt"],
    );
    crew_ok(&env, &repo, &["agents", "steer", &agent, "go on"]);
    let (_, paused) = task_once(&env, &repo, "claude", "the task to pause at its cap", |r| {
        r["status"] != "running"
    });
    assert_eq!(paused["status"], "paused", "{paused:#}");
    assert_eq!(paused["capped"], "task", "{paused:#}");
    let reason = paused["reason"].as_str().unwrap();
    assert!(
        reason.contains("it spent $0.0125 and its spend cap is $0.01")
            && reason.contains(&format!("crew agents resume {agent}"))
            && reason.contains(&format!("crew agents stop {agent}")),
        "{reason}"
    );
    // The follow-up was not delivered: the second file is nowhere yet.
    assert_eq!(
        paused["follow_ups"],
        serde_json::json!(["write second.txt"])
    );
    // The board and the listing ask.
    let list = crew_ok(&env, &repo, &["runs", "show", &run]);
    assert!(list.contains("paused"), "{list}");

    // Going on: the follow-up is its next turn, in its session.
    crew_ok(&env, &repo, &["agents", "resume", &agent]);
    let status = host.wait().unwrap();
    assert!(status.success(), "the run ends well");
    let record = task(&manifest(&env, &repo, &run), "claude").clone();
    assert_eq!(record["status"], "succeeded", "{record:#}");
    assert_eq!(record.get("capped"), None, "{record:#}");
    // Another cap's worth past what it had spent: $0.0225, which its second turn reached.
    let allowed = record["max_cost"]["allowed_usd"].as_f64().unwrap();
    assert!((allowed - 0.0225).abs() < 1e-9, "{record:#}");
    assert!(
        record["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|warning| warning
                .as_str()
                .unwrap()
                .starts_with("spend: its last turn reached a cap: it spent $0.025 ")),
        "{record:#}"
    );
    for file in ["first.txt", "second.txt"] {
        assert_eq!(
            env.git(&repo, ["show", &format!("crew/{run}-claude:{file}")]),
            "written by the stand-in\n"
        );
    }
}

#[test]
fn a_task_paused_at_its_cap_is_ended_by_a_stop_with_its_work_kept() {
    let env = TestEnv::new();
    let repo = project_with_claude(&env, "");
    write(
        &repo.join(".crew/teams/capped.toml"),
        "workspace_mode = \"worktree\"\n[[tasks]]\nid = \"api\"\nagent = \"claude\"\nprompt = \"write api.txt wait for steer\"\nmax_cost_usd = 0.01\n",
    );
    let mut host = env.spawn_crew(&repo, ["run", "capped"]);
    let (run, _) = task_once(&env, &repo, "api", "the task to run", |record| {
        record["status"] == "running"
    });
    let agent = format!("{run}:api");
    crew_ok(
        &env,
        &repo,
        &["agents", "follow-up", &agent, "write more.txt"],
    );
    crew_ok(&env, &repo, &["agents", "steer", &agent, "go on"]);
    task_once(
        &env,
        &repo,
        "api",
        "the task to pause at its cap",
        |record| record["status"] == "paused",
    );
    let stopped = crew_ok(&env, &repo, &["agents", "stop", &agent]);
    assert!(stopped.contains("its task ends, stopped"), "{stopped}");
    let status = host.wait().unwrap();
    assert!(
        !status.success(),
        "a stopped task does not complete its run"
    );
    let record = task(&manifest(&env, &repo, &run), "api").clone();
    assert_eq!(record["status"], "stopped", "{record:#}");
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-api:api.txt")]),
        "written by the stand-in\n"
    );
}

#[test]
fn a_run_at_its_cap_starts_no_task_the_next_pauses_before_it_begins_and_a_resume_lets_it() {
    let env = TestEnv::new();
    // $0.021 a turn: 400 tokens in at $10, 2000 cached at $1, 150 out at $100 a million.
    let repo = project_with_codex(
        &env,
        "[prices]\ninput = 10\ncached_input = 1\noutput = 100\n",
    );
    write(
        &repo.join(".crew/teams/two.toml"),
        "workspace_mode = \"worktree\"\nmax_cost_usd = 0.02\n[[tasks]]\nid = \"a\"\nagent = \"codex\"\nprompt = \"write a.txt\"\n[[tasks]]\nid = \"b\"\nagent = \"codex\"\nprompt = \"write b.txt\"\ndepends_on = [\"a\"]\n",
    );
    let mut host = env.spawn_crew(&repo, ["run", "two"]);
    let (run, b) = task_once(&env, &repo, "b", "b to pause before it began", |record| {
        record["status"] == "paused"
    });
    assert_eq!(b["capped"], "run", "{b:#}");
    let reason = b["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(
            "paused before it began: its run spent $0.021 and the run's spend cap is $0.02"
        ),
        "{reason}"
    );
    let a = task(&manifest(&env, &repo, &run), "a").clone();
    assert_eq!(a["status"], "succeeded", "{a:#}");
    assert_eq!(a["usage"]["cost_usd"], 0.021, "{a:#}");
    crew_ok(&env, &repo, &["agents", "resume", &format!("{run}:b")]);
    assert!(host.wait().unwrap().success());
    let recorded = manifest(&env, &repo, &run);
    assert_eq!(task(&recorded, "b")["status"], "succeeded");
    let allowed = recorded["max_cost"]["allowed_usd"].as_f64().unwrap();
    assert!((allowed - 0.041).abs() < 1e-9, "{recorded:#}");
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-b:b.txt")]),
        "written by the codex stand-in\n"
    );
}

#[test]
fn a_day_s_cap_counts_every_run_of_the_user_and_holds_the_next() {
    let env = TestEnv::new();
    let repo = project_with_claude(&env, "");
    write(
        &env.home().join(".config/crew/config.toml"),
        "max_cost_usd_per_day = 0.02\n",
    );
    let args = ["run", "--agent", "claude", "write one.txt"];
    let first = env.crew(&repo, args);
    assert!(first.status.success(), "{}", render_output(&first));
    let mut second = env.spawn_crew(&repo, ["run", "--agent", "claude", "write two.txt"]);
    // $0.0125 and $0.0125 reach $0.02 at the second's end; a third is held before it begins.
    assert!(second.wait().unwrap().success());
    let mut third = env.spawn_crew(&repo, ["run", "--agent", "claude", "write three.txt"]);
    let (run, paused) = task_once(&env, &repo, "claude", "the third to pause", |record| {
        record["status"] == "paused"
    });
    assert_eq!(paused["capped"], "day", "{paused:#}");
    let reason = paused["reason"].as_str().unwrap();
    assert!(
        reason.contains(
            "every run of the day spent $0.025 together and the day's spend cap is $0.02"
        ),
        "{reason}"
    );
    crew_ok(&env, &repo, &["agents", "stop", &format!("{run}:claude")]);
    third.wait().unwrap();
    // A settings file that cannot be read refuses a run and names it; nothing starts.
    write(
        &env.home().join(".config/crew/config.toml"),
        "max_cost_usd_per_day = -1\n",
    );
    let refused = env.crew(&repo, args);
    let shown = render_output(&refused);
    assert!(!refused.status.success(), "{shown}");
    assert!(
        shown.contains(".config/crew/config.toml") && shown.contains("above 0"),
        "{shown}"
    );
}

#[test]
fn a_cap_that_cannot_be_measured_says_so_at_the_start() {
    let env = TestEnv::new();
    let repo = project_with_codex(&env, "");
    let output = env.crew(
        &repo,
        [
            "run",
            "--max-cost-usd",
            "1",
            "--agent",
            "codex",
            "write a.txt",
        ],
    );
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let record = task(&manifest(&env, &repo, &run), "codex").clone();
    let warning = "spend: its program reports tokens and no cost, so no spend cap can be measured on it: give `[prices]`";
    assert!(
        record["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().starts_with(warning)),
        "{record:#}"
    );
    let events = crew_ok(&env, &repo, &["events", "--run", &run]);
    assert!(events.contains(warning), "{events}");
    let shell = env.crew(
        &repo,
        ["run", "--max-cost-usd", "1", "--agent", "shell", "true"],
    );
    assert!(shell.status.success(), "{}", render_output(&shell));
    let run = run_ids(&env, &repo).remove(0);
    let record = task(&manifest(&env, &repo, &run), "shell").clone();
    assert!(
        record["warnings"][0]
            .as_str()
            .unwrap()
            .starts_with("spend: its program reports no cost"),
        "{record:#}"
    );
    // A cap that is no amount is refused before anything starts.
    let bad = env.crew(
        &repo,
        ["run", "--max-cost-usd", "free", "--agent", "shell", "true"],
    );
    assert!(!bad.status.success());
    assert!(
        render_output(&bad).contains("`free` is not an amount"),
        "{}",
        render_output(&bad)
    );
}
