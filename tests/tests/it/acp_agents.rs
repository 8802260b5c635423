//! Agents that speak the Agent Client Protocol, with crew as their client: a stand-in built with
//! the protocol's Rust SDK (`fake-acp`), and an agent built with the official TypeScript SDK
//! (`tests/acp-client/agent.mjs`). Neither knows anything of crew.

use camino::{Utf8Path, Utf8PathBuf};
use crew_tests::{TestEnv, render_output, wait_until, write};

use crate::common::agents::define_fake_acp;
use crate::common::runs::{manifest, run_ids, task};

/// A project whose `acp` agent is the Rust stand-in.
fn project_with_acp(env: &TestEnv, args: &str) -> Utf8PathBuf {
    let repo = env.repo("project");
    define_fake_acp(env, &repo, args);
    repo
}

/// `crew run --agent acp --workspace-mode worktree args…` in `repo`, to its end.
fn run_acp(env: &TestEnv, repo: &Utf8Path, args: &[&str]) -> std::process::Output {
    env.crew(repo, acp_run_args(args))
}

/// The same, in the background: the host, to wait for.
fn spawn_acp(env: &TestEnv, repo: &Utf8Path, args: &[&str]) -> std::process::Child {
    env.spawn_crew(repo, acp_run_args(args))
}

fn acp_run_args<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["run", "--agent", "acp", "--workspace-mode", "worktree"];
    all.extend(args);
    all
}

fn log(repo: &Utf8Path, run: &str, task: &str) -> String {
    std::fs::read_to_string(repo.join(format!(".crew/state/runs/{run}/tasks/{task}/output.log")))
        .unwrap()
}

/// Whether `branch` exists and holds `file` (a task that changed nothing leaves no branch).
fn branch_has(env: &TestEnv, repo: &Utf8Path, branch: &str, file: &str) -> bool {
    let files = env.git_output(repo, ["ls-tree", "-r", "--name-only", branch]);
    String::from_utf8_lossy(&files.stdout)
        .lines()
        .any(|line| line == file)
}

/// Everything the agent said in its log, its message chunks joined.
fn said(log: &str) -> String {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|message| {
            message["params"]["update"]["content"]["text"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

#[test]
fn an_acp_agent_works_in_its_session_its_file_requests_stay_in_its_workspace_and_a_follow_up_loads_that_session()
 {
    let env = TestEnv::new();
    let repo = project_with_acp(&env, "");
    let outside = env.root().join("outside.txt");
    let prompt = format!(
        "touch own.txt\nwrite sub/client.txt from the client\nread sub/client.txt\nwrite ../escape.txt no\nwrite {outside} no\nread {}/.git/config\nfail at the end",
        repo
    );
    let output = run_acp(&env, &repo, &[&prompt]);
    let shown = render_output(&output);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    let run = run_ids(&env, &repo).remove(0);
    let recorded = manifest(&env, &repo, &run);
    let record = task(&recorded, "acp").clone();
    assert_eq!(record["status"], "failed", "{record:#}");
    let session = record["session_id"].as_str().unwrap().to_owned();
    assert!(session.starts_with("acp-"), "{record:#}");
    assert_eq!(
        record["usage"],
        serde_json::json!({
            "input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 50,
            "cache_creation_input_tokens": 0, "cost_usd": 0.01, "turns": 1
        }),
        "{record:#}"
    );
    assert!(
        shown.contains("# acp: 150 tokens in, 20 out, $0.0100, 1 turn(s)"),
        "{shown}"
    );
    let said_first = said(&log(&repo, &run, "acp"));
    for line in [
        "wrote sub/client.txt",
        "read sub/client.txt: from the client",
        "refused ../escape.txt: ",
        &format!("refused {outside}: "),
        "outside the task's workspace",
        &format!("refused {repo}/.git/config: "),
    ] {
        assert!(said_first.contains(line), "no {line:?} in {said_first}");
    }
    let branch = format!("crew/{run}-acp");
    assert_eq!(
        env.git(&repo, ["show", &format!("{branch}:sub/client.txt")]),
        "from the client"
    );
    assert_eq!(
        env.git(&repo, ["show", &format!("{branch}:own.txt")]),
        "touched by the agent\n"
    );
    // Nothing was written outside the workspace, and the project's own files were not read.
    assert!(!outside.exists());
    assert!(!repo.join("escape.txt").exists());

    // A follow-up to the failed task starts it again in the same session, loaded: it knows
    // its history.
    let follow = env.crew(
        &repo,
        ["agents", "follow-up", &format!("{run}:acp"), "history"],
    );
    assert!(follow.status.success(), "{}", render_output(&follow));
    let resumed = wait_until(30, "the resumed task to end", || {
        let recorded = manifest(&env, &repo, &run);
        let record = task(&recorded, "acp").clone();
        (record["status"] == "succeeded" && record["attempts"] == 2).then_some(record)
    });
    assert_eq!(resumed["session_id"], session.as_str(), "{resumed:#}");
    assert_eq!(resumed["usage"]["turns"], 2, "{resumed:#}");
    let cost = resumed["usage"]["cost_usd"].as_f64().unwrap();
    assert!((cost - 0.02).abs() < 1e-9, "{resumed:#}");
    let said_all = said(&log(&repo, &run, "acp"));
    assert!(
        said_all.contains("history: touch own.txt / write sub/client.txt from the client / "),
        "{said_all}"
    );
    assert!(said_all.contains("| history"), "{said_all}");
}

#[test]
fn an_acp_agents_terminals_run_in_its_workspace_confined_like_the_agent() {
    let env = TestEnv::new();
    let repo = project_with_acp(&env, "");
    let outside = env.root().join("outside.txt");
    let prompt = format!(
        "run echo made > made.txt && echo \"$FAKE_ACP_TERMINAL $CREW_TASK_ID\" && pwd\nrun echo no > {outside}\nrun-in sub pwd\nrun-in {} pwd\nrun kill -9 $$",
        env.root()
    );
    std::fs::create_dir_all(repo.join("sub")).unwrap();
    write(&repo.join("sub/keep.txt"), "a directory the worktree has\n");
    env.git(&repo, ["add", "sub"]);
    env.git(&repo, ["commit", "-qm", "sub"]);
    let output = run_acp(&env, &repo, &[&prompt]);
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let recorded = manifest(&env, &repo, &run);
    let dir = task(&recorded, "acp")["workspace"]["dir"]
        .as_str()
        .unwrap()
        .to_owned();
    let told = said(&log(&repo, &run, "acp"));
    // In its workspace, with the variables it asked for besides the agent's own.
    assert!(told.contains(&format!("exit 0: yes acp / {dir}")), "{told}");
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-acp:made.txt")]),
        "made\n"
    );
    // Confined by the agent's sandbox: a write outside its workspace fails.
    assert!(!outside.exists());
    assert!(
        told.contains(&format!("ran `echo no > {outside}`: exit ")),
        "{told}"
    );
    assert!(
        !told.contains(&format!("ran `echo no > {outside}`: exit 0")),
        "{told}"
    );
    // A working directory beneath the workspace is fine; one outside it is refused.
    assert!(
        told.contains(&format!("ran `pwd`: exit 0: {dir}/sub")),
        "{told}"
    );
    assert!(
        told.contains(&format!(
            "ran `pwd`: refused: {}: outside the task's workspace",
            env.root()
        )),
        "{told}"
    );
    // A command killed by a signal says which.
    assert!(told.contains("ran `kill -9 $$`: SIGKILL"), "{told}");

    // An agent that opens terminals without end is held to a few, and what they run ends
    // with the agent.
    let output = run_acp(&env, &repo, &["hoard 40"]);
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo)
        .into_iter()
        .find(|id| *id != run)
        .unwrap();
    let hoarded = said(&log(&repo, &run, "acp"));
    assert!(
        hoarded.contains("hoarded: ")
            && hoarded.contains("16 terminals are open: release one first"),
        "{hoarded}"
    );
    let sleepers = std::process::Command::new("pgrep")
        .args(["-f", "^sleep 600.4242$"])
        .output()
        .unwrap();
    assert!(
        sleepers.stdout.is_empty(),
        "left running: {}",
        String::from_utf8_lossy(&sleepers.stdout)
    );
}

#[test]
fn a_usage_limit_pauses_an_acp_task_that_asks_to_and_fails_one_that_does_not() {
    let env = TestEnv::new();
    let repo = project_with_acp(&env, "");
    write(
        &repo.join(".crew/teams/limits.toml"),
        "workspace_mode = \"worktree\"\n\n[[tasks]]\nid = \"patient\"\nagent = \"acp\"\nprompt = \"touch patient.txt\\nlimit 2\"\non_limit = \"pause\"\n\n[[tasks]]\nid = \"hasty\"\nagent = \"acp\"\nprompt = \"touch hasty.txt\\nlimit 3600\"\n",
    );
    let output = env.crew(&repo, ["run", "limits"]);
    let shown = render_output(&output);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    let run = run_ids(&env, &repo).remove(0);
    let recorded = manifest(&env, &repo, &run);
    // The agent exited 0 after its limit; the task fails all the same, naming the limit.
    let hasty = task(&recorded, "hasty");
    assert_eq!(hasty["status"], "failed", "{hasty:#}");
    assert_eq!(hasty["exit"]["code"], 0, "{hasty:#}");
    let resets = hasty["limit"]["resets_at"].as_str().unwrap();
    assert_eq!(
        hasty["reason"],
        format!(
            "the agent stopped when it hit a usage limit, which lifts at {resets}: the prompt failed: Internal error: Usage limit reached"
        ),
        "{hasty:#}"
    );
    // The patient one went on in its session once the limit lifted, and finished.
    let patient = task(&recorded, "patient");
    assert_eq!(patient["status"], "succeeded", "{patient:#}");
    assert_eq!(patient["attempts"], 2, "{patient:#}");
    let said = said(&log(&repo, &run, "patient"));
    assert!(
        said.contains("(replayed) touch patient.txt / limit 2"),
        "{said}"
    );
    assert!(
        said.contains("working on: Continue where you left off."),
        "{said}"
    );
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-patient:patient.txt")]),
        "touched by the agent\n"
    );
}

#[test]
fn a_permission_request_is_the_tasks_question_and_the_answer_goes_to_the_running_agent() {
    let env = TestEnv::new();
    let repo = project_with_acp(&env, "");
    let mut host = spawn_acp(
        &env,
        &repo,
        &["--task", "deploy=ask deploy", "--task", "delete=ask delete"],
    );
    let run = wait_until(30, "both tasks to ask", || {
        let run = run_ids(&env, &repo).into_iter().next()?;
        let recorded = manifest(&env, &repo, &run);
        ["deploy", "delete"]
            .iter()
            .all(|id| task(&recorded, id)["status"] == "waiting")
            .then_some(run)
    });
    let recorded = manifest(&env, &repo, &run);
    let question = task(&recorded, "deploy")["question"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        question.contains("deploy") && question.contains("allow (Allow once)"),
        "{question}"
    );
    // The agents wait alive, and listings say who needs the user (the host publishes its
    // listing after it records the manifest, at most every 20 ms).
    let agents = wait_until(30, "both agents listed as waiting", || {
        let listed = env.crew(&repo, ["agents", "list", "--json"]);
        let agents: serde_json::Value = serde_json::from_slice(&listed.stdout).ok()?;
        let agents = agents.as_array()?.clone();
        (agents.len() == 2
            && agents
                .iter()
                .all(|agent| agent["activity"] == "waiting_for_input"))
        .then_some(agents)
    });
    for agent in &agents {
        assert_eq!(agent["activity"], "waiting_for_input", "{agent:#}");
        assert_eq!(agent["state"], "running", "{agent:#}");
        // What it said came in pieces; a person sees it as one line.
        let what = agent["task_id"].as_str().unwrap();
        assert_eq!(agent["last_line"], format!("about to {what}"), "{agent:#}");
    }

    for (id, answer) in [("deploy", "yes"), ("delete", "no")] {
        let answered = env.crew(
            &repo,
            ["agents", "follow-up", &format!("{run}:{id}"), answer],
        );
        assert!(answered.status.success(), "{}", render_output(&answered));
        assert!(
            String::from_utf8_lossy(&answered.stdout).contains("answered"),
            "{}",
            render_output(&answered)
        );
    }
    let ended = wait_until(30, "the run's end", || host.try_wait().unwrap());
    assert!(ended.success());
    let recorded = manifest(&env, &repo, &run);
    for id in ["deploy", "delete"] {
        let record = task(&recorded, id);
        assert_eq!(record["status"], "succeeded", "{record:#}");
        // One process: the answer went to it, it was not restarted.
        assert_eq!(record["attempts"], 1, "{record:#}");
        assert!(record["question"].is_null(), "{record:#}");
    }
    assert_eq!(
        env.git(
            &repo,
            ["show", &format!("crew/{run}-deploy:deploy.allowed")]
        ),
        "allow\n"
    );
    assert!(!branch_has(
        &env,
        &repo,
        &format!("crew/{run}-delete"),
        "delete.allowed"
    ));
    assert!(
        said(&log(&repo, &run, "delete")).contains("permission for delete: reject"),
        "{}",
        log(&repo, &run, "delete")
    );
}

#[test]
fn a_steer_cancels_the_turn_under_way_and_goes_in_as_the_next_prompt() {
    let env = TestEnv::new();
    let repo = project_with_acp(&env, "");
    let mut host = spawn_acp(&env, &repo, &["wait"]);
    let run = wait_until(30, "the agent to wait for a steer", || {
        let run = run_ids(&env, &repo).into_iter().next()?;
        let log = std::fs::read_to_string(
            repo.join(format!(".crew/state/runs/{run}/tasks/acp/output.log")),
        )
        .ok()?;
        said(&log).contains("waiting for a steer").then_some(run)
    });
    let steer = env.crew(
        &repo,
        [
            "agents",
            "steer",
            &format!("{run}:acp"),
            "touch steered.txt",
        ],
    );
    assert!(steer.status.success(), "{}", render_output(&steer));
    let ended = wait_until(30, "the run's end", || host.try_wait().unwrap());
    assert!(ended.success());
    let recorded = manifest(&env, &repo, &run);
    let record = task(&recorded, "acp");
    assert_eq!(record["status"], "succeeded", "{record:#}");
    // The cancelled turn and the steered one, both counted.
    assert_eq!(record["usage"]["turns"], 2, "{record:#}");
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-acp:steered.txt")]),
        "touched by the agent\n"
    );
    // The first turn ended as the agent acknowledged the cancel.
    let log = log(&repo, &run, "acp");
    assert!(log.contains(r#""stopReason":"cancelled""#), "{log}");
    // Listed once it is over, its last line is what a person saw, not the protocol's JSON.
    let listed = env.crew(&repo, ["agents", "list", "--all-runs", "--json"]);
    let agents: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(
        agents[0]["last_line"], "[turn over: end_turn]",
        "{agents:#}"
    );
}

#[test]
fn an_acp_agent_that_does_not_exit_when_its_session_is_over_is_ended_and_its_task_succeeds() {
    let env = TestEnv::new();
    let repo = project_with_acp(&env, ", \"--linger\"");
    // Left to itself it would run until this timeout, and fail by it.
    write(
        &repo.join(".crew/config.toml"),
        "[run]\ntask_timeout = \"40s\"\n",
    );
    let output = run_acp(&env, &repo, &["--task", "stays=touch stays.txt"]);
    let shown = render_output(&output);
    assert!(output.status.success(), "{shown}");
    let run = run_ids(&env, &repo).remove(0);
    let recorded = manifest(&env, &repo, &run);
    let stays = task(&recorded, "stays");
    assert_eq!(stays["status"], "succeeded", "{stays:#}");
    assert_eq!(stays["exit"]["ended_after_session"], true, "{stays:#}");
    assert!(stays["exit"]["stopped_by"].is_null(), "{stays:#}");
    assert_eq!(stays["exit"]["timed_out"], false, "{stays:#}");
    assert!(branch_has(
        &env,
        &repo,
        &format!("crew/{run}-stays"),
        "stays.txt"
    ));
}

#[test]
fn an_acp_agent_whose_session_fails_fails_its_task_though_it_exits_0() {
    let env = TestEnv::new();
    let repo = project_with_acp(&env, ", \"--no-sessions\"");
    let output = run_acp(&env, &repo, &["--task", "keyless=touch keyless.txt"]);
    let shown = render_output(&output);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    let run = run_ids(&env, &repo).remove(0);
    let recorded = manifest(&env, &repo, &run);
    let keyless = task(&recorded, "keyless");
    assert_eq!(keyless["exit"]["code"], 0, "{keyless:#}");
    assert_eq!(keyless["status"], "failed", "{keyless:#}");
    let reason = keyless["reason"].as_str().unwrap();
    assert!(
        reason.contains("exited 0, but its protocol said it failed")
            && reason.contains("uthenticat"),
        "{keyless:#}"
    );
}

#[test]
fn output_that_is_not_the_protocol_is_shown_with_a_warning_and_a_truncated_session_fails_plainly() {
    let env = TestEnv::new();
    let repo = project_with_acp(&env, ", \"--garbage\"");
    let output = run_acp(
        &env,
        &repo,
        &[
            "--task",
            "noisy=touch noisy.txt",
            "--task",
            "cut=touch cut.txt\nexit 3",
        ],
    );
    let shown = render_output(&output);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    let run = run_ids(&env, &repo).remove(0);
    let recorded = manifest(&env, &repo, &run);
    let noisy = task(&recorded, "noisy");
    assert_eq!(noisy["status"], "succeeded", "{noisy:#}");
    let warnings = noisy["warnings"].to_string();
    assert!(
        warnings.contains("not acp messages") && warnings.contains("this line is not JSON-RPC"),
        "{noisy:#}"
    );
    assert!(shown.contains("this line is not JSON-RPC"), "{shown}");
    assert!(log(&repo, &run, "noisy").contains("this line is not JSON-RPC\n"));
    // An agent that dies mid-turn fails with its exit; its work so far is on its branch.
    let cut = task(&recorded, "cut");
    assert_eq!(cut["status"], "failed", "{cut:#}");
    assert!(
        cut["reason"]
            .as_str()
            .unwrap()
            .starts_with("the agent exited with code 3"),
        "{cut:#}"
    );
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-cut:cut.txt")]),
        "touched by the agent\n"
    );
}

#[test]
fn an_agent_built_with_the_official_typescript_sdk_is_driven_with_no_crew_code_in_it() {
    let Some(script) = crew_tests::node_client(
        "acp-client",
        "@agentclientprotocol/sdk",
        "an_agent_built_with_the_official_typescript_sdk_is_driven_with_no_crew_code_in_it",
    ) else {
        return;
    };
    let agent = script.with_file_name("agent.mjs");
    let env = TestEnv::new();
    let repo = env.repo("project");
    // The script and its packages lie outside the project, where a confined agent reads
    // only what its definition names, as a user's would.
    let packages = script.parent().unwrap();
    write(
        &repo.join(".crew/agents/ts.toml"),
        &format!(
            "command = [\"node\", \"{agent}\"]\nprotocol = \"acp\"\n[sandbox]\nread = [\"{packages}\"]\n"
        ),
    );
    env.allow_settings(&repo);
    let mut host = env.spawn_crew(
        &repo,
        [
            "run",
            "--agent",
            "ts",
            "--workspace-mode",
            "worktree",
            "--task",
            "yes=make the change",
            "--task",
            "no=make another change",
        ],
    );
    let run = wait_until(60, "both tasks to ask", || {
        let run = run_ids(&env, &repo).into_iter().next()?;
        let recorded = manifest(&env, &repo, &run);
        ["yes", "no"]
            .iter()
            .all(|id| task(&recorded, id)["status"] == "waiting")
            .then_some(run)
    });
    for (id, answer) in [("yes", "allow"), ("no", "reject")] {
        let answered = env.crew(
            &repo,
            ["agents", "follow-up", &format!("{run}:{id}"), answer],
        );
        assert!(answered.status.success(), "{}", render_output(&answered));
    }
    let ended = wait_until(60, "the run's end", || host.try_wait().unwrap());
    assert!(ended.success());
    let recorded = manifest(&env, &repo, &run);
    let yes = task(&recorded, "yes");
    assert_eq!(yes["status"], "succeeded", "{yes:#}");
    assert!(yes["session_id"].as_str().unwrap().starts_with("ts-"));
    // The agent reports a cost and no tokens: the cost is known, the turn counted, and the
    // tokens unknown (not zero).
    assert_eq!(yes["usage"]["cost_usd"], 0.5, "{yes:#}");
    assert_eq!(yes["usage"]["turns"], 1, "{yes:#}");
    assert_eq!(yes["usage"]["tokens_unknown"], true, "{yes:#}");
    let shown = env.crew(&repo, ["runs", "show", &run]);
    let review = render_output(&shown);
    assert!(
        review.contains("# yes: tokens not reported, $0.5000, 1 turn(s)"),
        "{review}"
    );
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-yes:ts-agent.txt")]),
        "make the change\n"
    );
    assert!(
        said(&log(&repo, &run, "yes")).contains("wrote and read back: make the change"),
        "{}",
        log(&repo, &run, "yes")
    );
    let no = task(&recorded, "no");
    assert_eq!(no["status"], "succeeded", "{no:#}");
    assert!(!branch_has(
        &env,
        &repo,
        &format!("crew/{run}-no"),
        "ts-agent.txt"
    ));
}

#[test]
fn an_acp_task_whose_timeout_ends_it_while_it_asks_fails_by_its_timeout() {
    let env = TestEnv::new();
    let repo = project_with_acp(&env, "");
    write(
        &repo.join(".crew/config.toml"),
        "[run]\ntask_timeout = \"2s\"\n",
    );
    let mut host = spawn_acp(&env, &repo, &["--task", "deploy=ask deploy"]);
    let run = wait_until(30, "the task to fail by its timeout", || {
        let run = run_ids(&env, &repo).into_iter().next()?;
        let recorded = manifest(&env, &repo, &run);
        (task(&recorded, "deploy")["status"] == "failed").then_some(run)
    });
    assert!(!host.wait().unwrap().success());
    let recorded = manifest(&env, &repo, &run);
    let deploy = task(&recorded, "deploy");
    assert_eq!(deploy["exit"]["timed_out"], true, "{deploy:#}");
    assert!(deploy["question"].is_null(), "{deploy:#}");
}
