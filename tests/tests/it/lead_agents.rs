//! `crew mcp` driven by a Model Context Protocol client crew did not write: the official
//! TypeScript SDK (`tests/mcp-client/drive.mjs`), as a lead agent's client would drive it.

use std::io::BufRead;

use camino::Utf8PathBuf;
use crew_tests::{TestEnv, render_output, wait_until};

use crate::common::runs::{manifest, task};

fn mcp_client(test: &str) -> Option<Utf8PathBuf> {
    crew_tests::node_client("mcp-client", "@modelcontextprotocol/sdk", test)
}

#[test]
fn a_lead_agent_fans_out_waits_answers_stops_and_sees_only_its_folder() {
    let Some(script) =
        mcp_client("a_lead_agent_fans_out_waits_answers_stops_and_sees_only_its_folder")
    else {
        return;
    };
    let env = TestEnv::new();
    let a = env.repo("lead-a");
    let b = env.repo("lead-b");
    // An agent that reports tokens and cost (the stream-json stand-in).
    let fake = crew_tests::helper_bin("fake-claude");
    crew_tests::write(
        &a.join(".crew/agents/claude.toml"),
        &format!(
            "command = [\"{fake}\", \"-p\", \"--input-format\", \"stream-json\", \"--output-format\", \"stream-json\", \"--verbose\"]\nprotocol = \"claude-stream-json\"\n"
        ),
    );
    let output = env
        .hermetic(&mut std::process::Command::new("node"))
        .arg(&script)
        .args([
            "flows",
            crew_tests::crew_bin().as_str(),
            a.as_str(),
            b.as_str(),
        ])
        .current_dir(script.parent().unwrap())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", render_output(&output));
    let seen: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    // The runs are ordinary runs of the folder: listed, recorded, their work on branches.
    let runs: Vec<String> = seen["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| run.as_str().unwrap().to_owned())
        .collect();
    let listed = String::from_utf8(env.crew(&a, ["runs", "list"]).stdout).unwrap();
    for run in &runs {
        assert!(listed.contains(run.as_str()), "{run} not in {listed}");
    }
    let fanned = manifest(&env, &a, &runs[0]);
    for (id, file) in [("a", "a.txt"), ("b", "b.txt"), ("c", "c.txt")] {
        let branch = task(&fanned, id)["teardown"]["branch"]
            .as_str()
            .unwrap()
            .to_owned();
        let files = env.git(&a, ["ls-tree", "-r", "--name-only", &branch]);
        assert!(files.lines().any(|line| line == file), "{id}: {files}");
        assert_eq!(task(&fanned, id)["workspace_mode"], "worktree");
        // The lead agent landed them: on main, and in the user's clean checkout of it.
        let on_main = env.git(&a, ["ls-tree", "-r", "--name-only", "main"]);
        assert!(on_main.lines().any(|line| line == file), "{id}: {on_main}");
        assert!(a.join(file).exists(), "{file} in the checkout");
    }
    assert!(
        String::from_utf8(env.crew(&b, ["runs", "list", "--json"]).stdout)
            .unwrap()
            .trim()
            == "[]",
        "folder B holds none of A's runs"
    );
}

#[test]
fn a_lead_agent_killed_mid_run_loses_no_sub_agents_work() {
    let Some(script) = mcp_client("a_lead_agent_killed_mid_run_loses_no_sub_agents_work") else {
        return;
    };
    let env = TestEnv::new();
    let a = env.repo("orphaned");
    let mut client = env
        .hermetic(&mut std::process::Command::new("node"))
        .arg(&script)
        .args(["orphan", crew_tests::crew_bin().as_str(), a.as_str()])
        .current_dir(script.parent().unwrap())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(client.stdout.take().unwrap()).lines();
    let run = lines.next().expect("the run id").unwrap();
    // The lead agent's client dies at once; the server it started keeps hosting the run.
    client.kill().unwrap();
    client.wait().unwrap();
    let finished = wait_until(30, "the orphaned run to end", || {
        let record = manifest(&env, &a, &run);
        (record["status"] != "running").then_some(record)
    });
    assert_eq!(finished["status"], "completed", "{finished:#}");
    let branch = task(&finished, "orphan")["teardown"]["branch"]
        .as_str()
        .unwrap()
        .to_owned();
    let files = env.git(&a, ["ls-tree", "-r", "--name-only", &branch]);
    assert!(files.lines().any(|line| line == "kept.txt"), "{files}");
}

#[test]
fn a_lead_agent_s_session_ending_as_the_sdk_ends_it_leaves_its_runs_going() {
    let Some(script) =
        mcp_client("a_lead_agent_s_session_ending_as_the_sdk_ends_it_leaves_its_runs_going")
    else {
        return;
    };
    let env = TestEnv::new();
    let a = env.repo("closed");
    let out = env
        .hermetic(&mut std::process::Command::new("node"))
        .arg(&script)
        .args(["closes", crew_tests::crew_bin().as_str(), a.as_str()])
        .current_dir(script.parent().unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    // The server is gone by now (closed, TERMed, KILLed); the task sleeps on, then writes.
    let record = manifest(&env, &a, &run);
    assert_eq!(record["status"], "running", "{record:#}");
    let finished = wait_until(30, "the run to end", || {
        let record = manifest(&env, &a, &run);
        (record["status"] != "running").then_some(record)
    });
    assert_eq!(finished["status"], "completed", "{finished:#}");
    assert_eq!(
        task(&finished, "late")["status"],
        "succeeded",
        "{finished:#}"
    );
    let branch = task(&finished, "late")["teardown"]["branch"]
        .as_str()
        .unwrap()
        .to_owned();
    let files = env.git(&a, ["ls-tree", "-r", "--name-only", &branch]);
    assert!(files.lines().any(|line| line == "late.txt"), "{files}");
}

#[test]
fn a_lead_agent_inside_a_crew_run_adds_its_sub_tasks_to_its_own_run() {
    let Some(script) =
        mcp_client("a_lead_agent_inside_a_crew_run_adds_its_sub_tasks_to_its_own_run")
    else {
        return;
    };
    let env = TestEnv::new();
    let repo = env.repo("nested");
    // `.crew/` committed, as `crew init` asks: the lead's worktree checks it out, and its
    // `crew mcp` still acts on the leader.
    crew_tests::write(&repo.join(".crew/config.toml"), "");
    env.git(&repo, ["add", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "crew config"]);
    // The lead's client lies outside the project: its definition names it to read, as a
    // user's would.
    crew_tests::write(
        &repo.join(".crew/agents/lead.toml"),
        &format!(
            "command = [\"sh\", \"-c\", \"{{prompt}}\"]\n[sandbox]\nread = [\"{}\"]\n",
            script.parent().unwrap()
        ),
    );
    env.git(&repo, ["add", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "the lead's definition"]);
    env.allow_settings(&repo);
    let lead = format!("node {script} nested {} .", crew_tests::crew_bin());
    crate::common::runs::finished_run(
        &env,
        &repo,
        &[
            "run",
            "--agent",
            "lead",
            "--workspace-mode",
            "worktree",
            "--task",
            &format!("lead={lead}"),
        ],
    );
    let runs = crate::common::runs::run_ids(&env, &repo);
    assert_eq!(runs.len(), 1, "no run inside the run: {runs:?}");
    let record = manifest(&env, &repo, &runs[0]);
    for id in ["lead", "sub1", "sub2"] {
        assert_eq!(task(&record, id)["status"], "succeeded", "{record:#}");
    }
    let branch = task(&record, "sub2")["teardown"]["branch"]
        .as_str()
        .unwrap()
        .to_owned();
    let files = env.git(&repo, ["ls-tree", "-r", "--name-only", &branch]);
    assert!(files.lines().any(|line| line == "two.txt"), "{files}");
    // The sub-tasks are the lead's children: in the record, the summary and the listing.
    for id in ["sub1", "sub2"] {
        assert_eq!(task(&record, id)["parent"], "lead", "{record:#}");
    }
    assert_eq!(task(&record, "lead").get("parent"), None);
    let show = String::from_utf8(env.crew(&repo, ["runs", "show", &runs[0]]).stdout).unwrap();
    let table: Vec<&str> = show
        .lines()
        .filter(|line| line.starts_with("lead ") || line.starts_with("└ "))
        .collect();
    assert!(
        table.len() == 3 && table[1].starts_with("└ sub1") && table[2].starts_with("└ sub2"),
        "{show}"
    );
    let listed =
        String::from_utf8(env.crew(&repo, ["agents", "list", "--all-runs"]).stdout).unwrap();
    assert!(listed.contains(&format!("└ {}:sub1", runs[0])), "{listed}");
}
