//! The conflict radar and landing.

use super::*;

#[test]
fn the_conflict_radar_names_exactly_the_pairs_that_would_conflict_and_moves_nothing() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let run = red_blue_docs(&env, &repo);
    // The radar ran as the branches appeared: each side of the pair records the other, and
    // the run's events say it was found, once.
    let recorded = crate::common::runs::manifest(&env, &repo, &run);
    let overlaps = |id: &str| crate::common::runs::task(&recorded, id)["overlaps"].clone();
    assert_eq!(
        overlaps("red"),
        serde_json::json!([{ "with": "blue", "files": ["src/lib.txt"] }])
    );
    assert_eq!(
        overlaps("blue"),
        serde_json::json!([{ "with": "red", "files": ["src/lib.txt"] }])
    );
    assert!(overlaps("docs").is_null(), "{recorded:#}");
    let events = env.crew(&repo, ["events", "--run", &run]);
    let found: Vec<String> = String::from_utf8_lossy(&events.stdout)
        .lines()
        .filter(|line| line.contains("would conflict"))
        .map(|line| {
            line.split_whitespace()
                .skip(1)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    assert_eq!(found.len(), 1, "{}", render_output(&events));
    assert!(
        found[0] == "red would conflict with blue in src/lib.txt"
            || found[0] == "blue would conflict with red in src/lib.txt",
        "{found:?}"
    );
    // `crew agents list` has a column for it.
    let listed = env.crew(&repo, ["agents", "list", "--all-runs"]);
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    let conflicts_of = |task: &str| {
        listed
            .lines()
            .find(|line| line.starts_with(&format!("{run}:{task} ")))
            .map(|line| line.split_whitespace().nth(5).unwrap_or("").to_owned())
    };
    assert!(
        listed.lines().next().unwrap().contains("CONFLICTS"),
        "{listed}"
    );
    assert_eq!(conflicts_of("red").as_deref(), Some("blue"), "{listed}");
    assert_eq!(conflicts_of("blue").as_deref(), Some("red"), "{listed}");
    assert_eq!(conflicts_of("docs").as_deref(), Some("-"), "{listed}");
    let refs_before = env.git(&repo, ["show-ref"]);
    let status_before = env.git(&repo, ["status", "--porcelain"]);
    let shown = String::from_utf8(env.crew(&repo, ["runs", "show", &run]).stdout).unwrap();
    assert!(
        shown.contains(&format!(
            "# conflict: red ↔ blue in src/lib.txt   (`crew conflicts {run}`)"
        )),
        "{shown}"
    );
    let listed = env.crew(&repo, ["conflicts", &run]);
    insta::assert_snapshot!(render_output(&listed), @"
    red ↔ blue: src/lib.txt
    [exit status: 0]
    ");
    // main gains a change to the README line the docs task also appends after.
    write(&repo.join("README.md"), "# test repository\nfrom main\n");
    env.git(&repo, ["commit", "-q", "-am", "main moves on"]);
    let json: serde_json::Value =
        serde_json::from_slice(&env.crew(&repo, ["conflicts", &run, "--json"]).stdout).unwrap();
    let pairs: Vec<(String, String)> = json["overlaps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|overlap| {
            (
                overlap["left"].as_str().unwrap().to_owned(),
                overlap["right"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        pairs,
        [
            ("red".to_owned(), "blue".to_owned()),
            ("docs".to_owned(), "main".to_owned())
        ],
        "{json:#}"
    );
    // Nothing was checked out, no branch moved (but main's own commit).
    let refs_after = env.git(&repo, ["show-ref"]);
    let moved: Vec<&str> = refs_after
        .lines()
        .filter(|line| !refs_before.lines().any(|before| before == *line))
        .collect();
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert!(moved[0].ends_with("refs/heads/main"));
    assert_eq!(env.git(&repo, ["status", "--porcelain"]), status_before);
}

#[test]
fn land_is_all_or_nothing_and_never_touches_a_dirty_checkout() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let run = red_blue_docs(&env, &repo);
    let snapshot = || {
        (
            env.git(&repo, ["rev-parse", "main"]),
            env.git(&repo, ["status", "--porcelain"]),
            std::fs::read_to_string(repo.join("src/lib.txt")).unwrap(),
        )
    };

    // The whole run: red would land, blue conflicts with it — nothing moves.
    let before = snapshot();
    let refused = env.crew(&repo, ["land", &run]);
    let redactor = Redactor::new(&env).literal(run.clone(), "[RUN_ID]");
    insta::assert_snapshot!(redactor.redact(&render_output(&refused)), @r#"
    ----- stderr -----
    error: blue conflicts with what lands before it on main, in: src/lib.txt
    hint: both sides are on crew/conflict/[RUN_ID]-blue, with conflict markers in src/lib.txt: resolve them there (`git switch crew/conflict/[RUN_ID]-blue`, edit, commit), then `git merge crew/conflict/[RUN_ID]-blue` into main in place of blue; or land the others without blue
    [exit status: 2]
    "#);
    assert_eq!(snapshot(), before, "main and the checkout are as they were");

    // The clean ones land, in order; the checkout of main follows.
    let landed = env.crew(&repo, ["land", "red", "docs"]);
    assert!(landed.status.success(), "{}", render_output(&landed));
    assert_eq!(
        std::fs::read_to_string(repo.join("src/lib.txt")).unwrap(),
        "one\nred\nthree\n"
    );
    assert!(
        std::fs::read_to_string(repo.join("README.md"))
            .unwrap()
            .ends_with("more\n")
    );
    assert_eq!(env.git(&repo, ["status", "--porcelain"]), "");
    let parents = env.git(&repo, ["log", "--format=%p", "-2", "main"]);
    assert!(
        parents.lines().all(|line| line.split(' ').count() == 2),
        "merge commits: {parents}"
    );

    // Blue alone now conflicts with red on main: nothing else was landing with it.
    let alone = env.crew(&repo, ["land", "blue"]);
    let said = render_output(&alone);
    assert_eq!(alone.status.code(), Some(2), "{said}");
    assert!(
        said.contains("conflicts") && !said.contains("the others"),
        "{said}"
    );
    env.git(
        &repo,
        ["branch", "-D", &format!("crew/conflict/{run}-blue")],
    );

    // A dirty checkout of the target: refused, the user's edit untouched.
    write(&repo.join("src/lib.txt"), "my own edit\n");
    let main = env.git(&repo, ["rev-parse", "main"]);
    let dirty = env.crew(&repo, ["land", "blue", "--squash"]);
    assert_eq!(dirty.status.code(), Some(2), "{}", render_output(&dirty));
    assert!(String::from_utf8_lossy(&dirty.stderr).contains("uncommitted changes"));
    assert_eq!(
        std::fs::read_to_string(repo.join("src/lib.txt")).unwrap(),
        "my own edit\n"
    );
    assert_eq!(env.git(&repo, ["rev-parse", "main"]), main);

    // Into another branch, squashed: one commit with the task's change.
    env.git(&repo, ["branch", "integration", "main"]);
    let squashed = env.crew(&repo, ["land", "docs", "--into", "integration", "--squash"]);
    assert!(squashed.status.success(), "{}", render_output(&squashed));
    assert_eq!(
        env.git(&repo, ["rev-parse", "integration"]),
        main,
        "docs was already there"
    );
}

#[test]
fn a_conflict_goes_to_an_agent_on_a_branch_that_holds_both_sides() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let run = red_blue_docs(&env, &repo);
    let main = env.git(&repo, ["rev-parse", "main"]);
    let refused = env.crew(&repo, ["land", &run]);
    assert_eq!(
        refused.status.code(),
        Some(2),
        "{}",
        render_output(&refused)
    );
    assert_eq!(
        env.git(&repo, ["rev-parse", "main"]),
        main,
        "main did not move"
    );
    // Both sides: the result so far (main with red) and blue, with git's conflict markers.
    let both = format!("crew/conflict/{run}-blue");
    let marked = env.git(&repo, ["show", &format!("{both}:src/lib.txt")]);
    assert!(
        marked.contains("<<<<<<< the result so far\nred\n=======\nblue\n>>>>>>> crew/"),
        "{marked}"
    );
    let parents = env.git(&repo, ["log", "--format=%p", "-1", &both]);
    assert_eq!(parents.split(' ').count(), 2, "{parents}");
    // Landing again makes the same branch again; it does not fail on it.
    let again = env.crew(&repo, ["land", &run]);
    assert!(String::from_utf8_lossy(&again.stderr).contains(&both));

    // The hint's command, with a shell agent that resolves it.
    let mut args =
        shell_worktree_args(&["resolve=printf 'one\\nred and blue\\nthree\\n' > src/lib.txt"]);
    args.extend(["--base".to_owned(), both.clone()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let resolved = finished_run(&env, &repo, &args);
    let landed = env.crew(
        &repo,
        ["land", &resolved, &format!("{run}:docs"), "--into", "main"],
    );
    assert!(landed.status.success(), "{}", render_output(&landed));
    assert_eq!(
        std::fs::read_to_string(repo.join("src/lib.txt")).unwrap(),
        "one\nred and blue\nthree\n"
    );
    assert!(
        std::fs::read_to_string(repo.join("README.md"))
            .unwrap()
            .ends_with("more\n")
    );
}

#[test]
fn a_team_of_several_modes_is_announced_with_each() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/teams/mixed.toml"),
        r#"workspace_mode = "worktree"
[[tasks]]
id = "one"
agent = "shell"
prompt = "echo one > one.txt"

[[tasks]]
id = "two"
agent = "shell"
prompt = "echo two > two.txt"

[[tasks]]
id = "scratch"
agent = "shell"
prompt = "echo scratch > scratch.txt"
workspace_mode = "temp"
"#,
    );
    env.git(&repo, ["add", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "a mixed team"]);
    let output = env.crew(&repo, ["run", "mixed"]);
    let text = render_output(&output);
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains("— 3 task(s), 2 in worktree mode, 1 in temp mode, up to"),
        "{text}"
    );
}

#[test]
fn a_task_lands_squashed_or_rebased_with_the_task_it_was_built_on() {
    for mode in ["--squash", "--rebase"] {
        let env = TestEnv::new();
        let repo = env.repo("project");
        write(
            &repo.join(".crew/teams/chain.toml"),
            r#"workspace_mode = "worktree"
[[tasks]]
id = "first"
agent = "shell"
prompt = "printf 'one\n' > notes.txt"

[[tasks]]
id = "second"
agent = "shell"
depends_on = ["first"]
prompt = "printf 'one, then two\n' > notes.txt"
"#,
        );
        env.git(&repo, ["add", ".crew"]);
        env.git(&repo, ["commit", "-q", "-m", "a chain"]);
        let run = finished_run(&env, &repo, &["run", "chain"]);
        let main = env.git(&repo, ["rev-parse", "main"]);
        let landed = env.crew(&repo, ["land", &run, mode]);
        assert!(
            landed.status.success(),
            "{mode}: {}",
            render_output(&landed)
        );
        assert_eq!(
            std::fs::read_to_string(repo.join("notes.txt")).unwrap(),
            "one, then two\n",
            "{mode}"
        );
        // One commit for each task's own work, none empty, none twice.
        let range = format!("{}..main", main.trim());
        let log = env.git(&repo, ["log", "--format=%s", "--stat", &range]);
        let commits = env.git(&repo, ["rev-list", "--count", &range]);
        assert_eq!(commits.trim(), "2", "{mode}: {log}");
        for commit in env.git(&repo, ["rev-list", &range]).lines() {
            let changed = env.git(
                &repo,
                ["diff-tree", "--no-commit-id", "--name-only", "-r", commit],
            );
            assert_eq!(changed.trim(), "notes.txt", "{mode}: {log}");
        }
    }
}

#[test]
fn the_conflict_radar_sees_what_running_agents_committed() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let go = crew_tests::signal(&repo, "go");
    let task = |id: &str| {
        format!(
            "[[tasks]]\nid = \"{id}\"\nagent = \"shell\"\nprompt = '''printf '{id}\\n' > src/lib.txt && git -c user.name=a -c user.email=a@example.com commit -qam {id} && echo committed; while [ ! -e {go} ]; do sleep 0.05; done'''\n"
        )
    };
    write(
        &repo.join(".crew/teams/rb.toml"),
        &format!(
            "workspace_mode = \"worktree\"\n{}{}",
            task("red"),
            task("blue")
        ),
    );
    let mut child = env
        .crew_command(&repo)
        .args(["run", "rb"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    crate::common::runs::wait_for_agents_saying(&env, &repo, "committed", 2);
    let run = run_ids(&env, &repo).remove(0);
    let listed = env.crew(&repo, ["conflicts", &run]);
    let shown = render_output(&listed);
    write(&go, "");
    child.wait().unwrap();
    assert!(
        shown.contains("red ↔ blue: src/lib.txt") || shown.contains("blue ↔ red: src/lib.txt"),
        "{shown}"
    );
}

/// An agent whose home is its own (not the user's, where the user's git identity is) still
/// commits as the user: crew gives its git the identity the repository resolves.
#[test]
fn an_agent_with_a_home_of_its_own_commits_with_the_users_git_identity() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &env.home().join(".gitconfig"),
        "[user]\n\tname = Ada Lovelace\n\temail = ada@example.com\n",
    );
    write(
        &repo.join(".crew/agents/homeless.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\nenv = { HOME = \"/nonexistent\" }\n",
    );
    let output = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "homeless",
            "--workspace-mode",
            "worktree",
            "echo x > x.txt && git add x.txt && git commit -q -m mine && echo COMMITTED",
        ],
    );
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let log = std::fs::read_to_string(
        repo.join(format!(".crew/state/runs/{run}/tasks/homeless/output.log")),
    )
    .unwrap();
    assert!(log.contains("COMMITTED"), "{log}");
    let branch = format!("crew/{run}-homeless");
    assert_eq!(
        env.git(&repo, ["log", "-1", "--format=%an <%ae>|%s", &branch])
            .trim(),
        "Ada Lovelace <ada@example.com>|mine"
    );
}

/// A host holds about six descriptors for each live agent, and most systems give a process
/// 1,024 (`ulimit -n`): crew raises its own limit, so a run of more agents at once than the
/// user's limit allows starts every one of them, and each agent's program gets the user's
/// limit back.
#[test]
fn more_agents_at_once_than_the_user_s_open_files_allow_all_start_with_the_user_s_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    const AGENTS: usize = 40;
    const LIMIT: u64 = 100;
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut command = env.crew_command(&repo);
    command.args([
        "run",
        "--agent",
        "shell",
        "--workspace-mode",
        "single",
        "--fan-out",
        &AGENTS.to_string(),
        "--max-parallel",
        &AGENTS.to_string(),
        "sleep 2; ulimit -Sn",
    ]);
    // SAFETY: getrlimit and setrlimit are async-signal-safe and only affect the child.
    #[allow(unsafe_code)]
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            let maximum = getrlimit(Resource::Nofile).maximum;
            setrlimit(
                Resource::Nofile,
                Rlimit {
                    current: Some(LIMIT),
                    maximum,
                },
            )
            .map_err(std::io::Error::from)
        });
    }
    let output = command.output().unwrap();
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    for index in 1..=AGENTS {
        let log = repo.join(format!(
            ".crew/state/runs/{run}/tasks/shell-{index}/output.log"
        ));
        let said = std::fs::read_to_string(&log).unwrap();
        assert_eq!(said.trim(), LIMIT.to_string(), "shell-{index}'s limit");
    }
}

#[test]
fn the_radar_names_two_running_tasks_that_wrote_the_same_file_before_either_committed() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut args = crate::common::runs::shell_worktree_args(&[
        "red=echo red > src/lib.txt; echo ready; sleep 600",
        "blue=echo blue > src/lib.txt; echo ready; sleep 600",
        "docs=echo docs > docs.txt; echo ready; sleep 600",
    ]);
    args.push("--detach".to_owned());
    let started = env.crew(&repo, &args);
    assert!(started.status.success(), "{}", render_output(&started));
    crate::common::runs::wait_for_agents_saying(&env, &repo, "ready", 3);
    let run = run_ids(&env, &repo).remove(0);
    let listed = env.crew(&repo, ["conflicts", &run]);
    let shown = render_output(&listed);
    assert!(shown.contains("red ↔ blue: src/lib.txt"), "{shown}");
    assert!(!shown.contains("docs"), "{shown}");
    // Read, not written: nothing of it reached the repository or the worktrees' git.
    assert!(
        env.git(&repo, ["fsck", "--no-progress", "--unreachable"])
            .is_empty()
    );
    let cancel = env.crew(&repo, ["runs", "cancel", &run]);
    assert!(cancel.status.success(), "{}", render_output(&cancel));
}
