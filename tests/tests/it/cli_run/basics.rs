//! crew run as a newcomer meets it: agents, branches, output, named runs, diffs.

use super::*;

#[test]
fn newcomer_flow_three_agents_three_branches_leader_untouched() {
    let env = TestEnv::new();
    let repo = trio_repo(&env);
    let leader_head = env.git(&repo, ["rev-parse", "HEAD"]);
    let leader_status = env.git(&repo, ["status", "--porcelain", "--untracked-files=all"]);
    let output = env.crew(&repo, ["run", "trio", "--workspace-mode", "worktree"]);
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);

    for task in ["alpha", "beta", "gamma"] {
        let branch = format!("crew/{run}-{task}");
        let diff = env.git(&repo, ["diff", leader_head.trim(), &branch]);
        assert!(diff.contains(&format!("+from {task}")), "{diff}");
        let others: Vec<&str> = ["alpha", "beta", "gamma"]
            .into_iter()
            .filter(|other| *other != task)
            .collect();
        for other in others {
            assert!(
                !diff.contains(&format!("from {other}")),
                "{branch} holds only its own change"
            );
        }
    }
    assert_eq!(
        std::fs::read_to_string(repo.join("notes.txt")).unwrap(),
        "first line\n"
    );
    assert_eq!(env.git(&repo, ["rev-parse", "HEAD"]), leader_head);
    assert_eq!(
        env.git(&repo, ["status", "--porcelain", "--untracked-files=all"]),
        leader_status
    );
    assert_eq!(env.task_worktrees(&repo), Vec::<String>::new());

    let redactor = Redactor::new(&env).literal(run.clone(), "[RUN_ID]");
    let show = env.crew(&repo, ["runs", "show", &run[..6]]);
    insta::assert_snapshot!(redactor.redact(&render_output(&show)), @"
    run [RUN_ID]  team trio  worktree mode  created [TIMESTAMP]

    run [RUN_ID] completed
    TASK   STATUS     DURATION  EXIT  BRANCH                         +/-    WORK
    alpha  succeeded  [DURATION]      0     crew/[RUN_ID]-alpha  +1 -0  on its branch
    beta   succeeded  [DURATION]      0     crew/[RUN_ID]-beta   +1 -0  on its branch
    gamma  succeeded  [DURATION]      0     crew/[RUN_ID]-gamma  +1 -0  on its branch

      git diff [HASH]..crew/[RUN_ID]-alpha   # alpha
      git merge crew/[RUN_ID]-alpha
      git diff [HASH]..crew/[RUN_ID]-beta   # beta
      git merge crew/[RUN_ID]-beta
      git diff [HASH]..crew/[RUN_ID]-gamma   # gamma
      git merge crew/[RUN_ID]-gamma
      # conflict: alpha ↔ beta in notes.txt   (`crew conflicts [RUN_ID]`)
      # conflict: alpha ↔ gamma in notes.txt   (`crew conflicts [RUN_ID]`)
      # conflict: beta ↔ gamma in notes.txt   (`crew conflicts [RUN_ID]`)
    [exit status: 0]
    ");
}

#[test]
fn run_output_is_plain_when_piped_and_ends_with_a_summary() {
    let env = TestEnv::new();
    let repo = trio_repo(&env);
    let output = env.crew(
        &repo,
        [
            "run",
            "trio",
            "--workspace-mode",
            "worktree",
            "--max-parallel",
            "1",
        ],
    );
    let run = run_ids(&env, &repo).remove(0);
    let text = render_output(&output);
    assert!(!text.contains('\u{1b}'), "no escape codes when piped");
    let redactor = Redactor::new(&env).literal(run, "[RUN_ID]");
    insta::assert_snapshot!(redactor.redact(&text), @"
    crew: run [RUN_ID] — 3 task(s), worktree mode, up to 1 at once
      alpha          preparing
      alpha          running  pid [PID]  .worktrees/[RUN_ID]/alpha
      alpha          succeeded  [DURATION]  crew/[RUN_ID]-alpha (+1 -0)
      beta           preparing
      beta           running  pid [PID]  .worktrees/[RUN_ID]/beta
      beta           succeeded  [DURATION]  crew/[RUN_ID]-beta (+1 -0)
      gamma          preparing
      gamma          running  pid [PID]  .worktrees/[RUN_ID]/gamma
      gamma          succeeded  [DURATION]  crew/[RUN_ID]-gamma (+1 -0)

    run [RUN_ID] completed
    TASK   STATUS     DURATION  EXIT  BRANCH                         +/-    WORK
    alpha  succeeded  [DURATION]      0     crew/[RUN_ID]-alpha  +1 -0  on its branch
    beta   succeeded  [DURATION]      0     crew/[RUN_ID]-beta   +1 -0  on its branch
    gamma  succeeded  [DURATION]      0     crew/[RUN_ID]-gamma  +1 -0  on its branch

      git diff [HASH]..crew/[RUN_ID]-alpha   # alpha
      git merge crew/[RUN_ID]-alpha
      git diff [HASH]..crew/[RUN_ID]-beta   # beta
      git merge crew/[RUN_ID]-beta
      git diff [HASH]..crew/[RUN_ID]-gamma   # gamma
      git merge crew/[RUN_ID]-gamma
    [exit status: 0]
    ");
}

#[test]
fn dependent_task_sees_its_upstream_and_a_conflict_fails_clearly() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/teams/chain.toml"),
        r#"workspace_mode = "worktree"
[[tasks]]
id = "write"
agent = "shell"
prompt = "echo upstream > shared.txt"

[[tasks]]
id = "read"
agent = "shell"
prompt = "cat shared.txt > copy.txt"
depends_on = ["write"]

[[tasks]]
id = "left"
agent = "shell"
prompt = "echo left > clash.txt"

[[tasks]]
id = "right"
agent = "shell"
prompt = "echo right > clash.txt"

[[tasks]]
id = "both"
agent = "shell"
prompt = "true"
depends_on = ["left", "right"]
"#,
    );
    let output = env.crew(&repo, ["run", "chain"]);
    assert_eq!(output.status.code(), Some(1), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let copy = env.git(&repo, ["show", &format!("crew/{run}-read:copy.txt")]);
    assert_eq!(copy, "upstream\n");
    let manifest = manifest(&env, &repo, &run);
    let both = task(&manifest, "both");
    assert_eq!(both["status"], "failed");
    // The summary shows the reason's lines as lines, never as `�`.
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(
        shown.contains(
            "# both: the work of upstream tasks left, right conflicts in:\n  #     clash.txt\n"
        ),
        "{shown}"
    );
    assert!(!shown.contains('\u{fffd}'), "{shown}");
    insta::assert_snapshot!(both["reason"].as_str().unwrap(), @"
    the work of upstream tasks left, right conflicts in:
      clash.txt
    hint: merge the upstream branches yourself, or make the task depend on one of them
    ");
}

#[test]
fn agents_are_listed_from_a_second_process_and_from_inside_a_worktree_only() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let other = env.repo("other");
    let mut run = env.spawn_crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "echo started; sleep 600",
        ],
    );
    let list = |dir: &Utf8Path| -> serde_json::Value {
        let output = env.crew(dir, ["agents", "list", "--json"]);
        assert!(output.status.success(), "{}", render_output(&output));
        serde_json::from_slice(&output.stdout).unwrap()
    };
    let agents = wait_until(20, "the agent to be listed", || {
        let agents = list(&repo);
        (agents.as_array().unwrap().len() == 1 && agents[0]["state"] == "running").then_some(agents)
    });
    let agent_id = agents[0]["agent_id"].as_str().unwrap().to_owned();
    let worktree = Utf8PathBuf::from(agents[0]["dir"].as_str().unwrap());
    assert!(worktree.starts_with(repo.join(".worktrees")));

    // From inside the task's worktree, crew acts on the leader's workspace.
    assert_eq!(list(&worktree)[0]["agent_id"], agent_id.as_str());
    // From another repository: nothing, and control is refused.
    assert_eq!(list(&other), serde_json::json!([]));
    let redactor = Redactor::new(&env).literal(agent_id.clone(), "[AGENT_ID]");
    let steer = env.crew(&other, ["agents", "steer", &agent_id, "hijack"]);
    insta::assert_snapshot!(redactor.redact(&render_output(&steer)), @"
    ----- stderr -----
    error: no live agent '[AGENT_ID]' in workspace $TEST_ENV/other
    hint: `crew agents list --all-runs` shows the agents of this workspace, live or not
    [exit status: 2]
    ");
    let stop = env.crew(&other, ["agents", "stop", "shell"]);
    assert_eq!(stop.status.code(), Some(2));
    assert_eq!(
        list(&repo)[0]["state"],
        "running",
        "the agent is unaffected"
    );

    let stop = env.crew(&repo, ["agents", "stop", "shell"]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    let status = run.wait().unwrap();
    assert_eq!(status.code(), Some(1), "a stopped task fails the run");
}

#[test]
fn runs_started_moments_apart_are_told_apart_by_a_short_prefix() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    for word in ["first", "second", "third"] {
        let output = env.crew(&repo, ["run", "--agent", "shell", &format!("echo {word}")]);
        assert!(output.status.success(), "{}", render_output(&output));
    }
    let runs = run_ids(&env, &repo);
    assert_eq!(runs.len(), 3);
    // Newest first, though the leading characters are random.
    for (run, word) in runs.iter().zip(["third", "second", "first"]) {
        let logs = env.crew(&repo, ["agents", "logs", &format!("{}:shell", &run[..4])]);
        assert!(logs.status.success(), "{}", render_output(&logs));
        assert_eq!(String::from_utf8(logs.stdout).unwrap(), format!("{word}\n"));
    }
}

#[test]
fn a_named_run_reads_by_its_name_and_the_name_is_never_shared() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let named = |name: &str, prompt: &str| {
        env.crew(
            &repo,
            [
                "run",
                "--name",
                name,
                "--agent",
                "shell",
                "--workspace-mode",
                "worktree",
                "--task",
                &format!("api={prompt}"),
            ],
        )
    };
    let output = named("refund-fix", "echo fixed > fix.txt");
    assert!(output.status.success(), "{}", render_output(&output));
    assert_eq!(run_ids(&env, &repo), ["refund-fix"]);
    let files = env.git(
        &repo,
        ["ls-tree", "-r", "--name-only", "crew/refund-fix-api"],
    );
    assert!(files.lines().any(|line| line == "fix.txt"), "{files}");
    let logs = env.crew(&repo, ["agents", "logs", "refund-fix:api"]);
    assert!(logs.status.success(), "{}", render_output(&logs));
    let listing = env.crew(&repo, ["worktrees", "list", "--json"]);
    let listing: serde_json::Value = serde_json::from_slice(&listing.stdout).unwrap();
    assert_eq!(
        listing["branches"][0]["run_id"], "refund-fix",
        "{listing:#}"
    );
    assert_eq!(listing["branches"][0]["task_id"], "api", "{listing:#}");

    // Taken, overlapping (`refund` + `-fix-api` would be the same branch), or malformed: each
    // refused before anything starts.
    let again = named("refund-fix", "echo again > again.txt");
    let overlapping = named("refund", "true");
    let malformed = named("Refund_Fix", "true");
    let redactor = Redactor::new(&env);
    insta::assert_snapshot!(redactor.redact(&render_output(&again)), @"
    ----- stderr -----
    error: the run cannot start
    caused by: the run name `refund-fix` is taken: branch crew/refund-fix-api exists from an earlier run
    hint: pick another name, or merge or delete the branch first (`crew worktrees list` shows crew's branches)
    [exit status: 2]
    ");
    insta::assert_snapshot!(redactor.redact(&render_output(&overlapping)), @"
    ----- stderr -----
    error: the run name `refund` is taken: its branches could be those of run refund-fix
    hint: pick another name (`crew runs list` shows the runs of this project)
    [exit status: 2]
    ");
    insta::assert_snapshot!(redactor.redact(&render_output(&malformed)), @r#"
    ----- stderr -----
    error: invalid value 'Refund_Fix' for '--name <NAME>': invalid run name "Refund_Fix": may only contain lowercase letters, digits and `-`

    For more information, try '--help'.
    [exit status: 2]
    "#);
    assert_eq!(run_ids(&env, &repo), ["refund-fix"]);

    // The run is pruned, its unmerged branch stays: the name still cannot take it over.
    std::fs::remove_dir_all(repo.join(".crew/state/runs/refund-fix")).unwrap();
    let over_branch = named("refund-fix", "true");
    insta::assert_snapshot!(redactor.redact(&render_output(&over_branch)), @"
    ----- stderr -----
    error: the run cannot start
    caused by: the run name `refund-fix` is taken: branch crew/refund-fix-api exists from an earlier run
    hint: pick another name, or merge or delete the branch first (`crew worktrees list` shows crew's branches)
    [exit status: 2]
    ");
    assert!(run_ids(&env, &repo).is_empty());
    let later = named("refund-fix-2", "true");
    assert!(later.status.success(), "{}", render_output(&later));
}

#[test]
fn diff_prints_what_git_diff_prints_for_a_task_and_each_task_of_a_run() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let run = shell_worktree_run(
        &env,
        &repo,
        &[
            "edit=printf 'one\\n2\\nthree\\nfour\\n' > src/lib.txt && echo new > new.txt",
            "idle=true",
        ],
    );
    let record = task(&manifest(&env, &repo, &run), "edit").clone();
    let base = record["workspace"]["base_commit"]
        .as_str()
        .unwrap()
        .to_owned();
    let branch = record["teardown"]["branch"].as_str().unwrap().to_owned();
    let range = format!("{base}..{branch}");
    for (crew_args, git_args) in [
        (vec!["diff", "edit"], vec!["diff", range.as_str()]),
        (
            vec!["diff", "edit", "--stat"],
            vec!["diff", "--stat", range.as_str()],
        ),
    ] {
        let ours = env.crew(&repo, &crew_args);
        assert!(ours.status.success(), "{}", render_output(&ours));
        assert_eq!(
            String::from_utf8(ours.stdout).unwrap(),
            env.git(&repo, &git_args),
            "crew {crew_args:?} ≠ git {git_args:?}"
        );
    }
    // A run: each task with work, under a line naming it; the idle task has none.
    let whole = String::from_utf8(env.crew(&repo, ["diff", &run]).stdout).unwrap();
    assert_eq!(
        whole,
        format!(
            "# {run}:edit  {range}\n{}",
            env.git(&repo, ["diff", &range])
        )
    );
    let json: serde_json::Value =
        serde_json::from_slice(&env.crew(&repo, ["diff", &run, "--json"]).stdout).unwrap();
    assert_eq!(json["tasks"][0]["files_changed"], 2, "{json:#}");
    assert_eq!(json["tasks"][0]["insertions"], 3, "{json:#}");
    assert_eq!(json["tasks"][0]["deletions"], 1, "{json:#}");
    let idle = env.crew(&repo, ["diff", &format!("{run}:idle")]);
    assert_eq!(idle.status.code(), Some(2), "{}", render_output(&idle));
}
