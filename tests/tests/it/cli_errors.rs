//! Every mistake a user can make at the command line gets a message that names what was wrong
//! and what to do — and changes nothing. Also `crew demo`, `crew init` and the help.

use crew_tests::{Redactor, TestEnv, render_output, tree_fingerprint, write};

/// Runs `crew args…` in `dir` and returns the redacted output, checking nothing changed.
fn refused(env: &TestEnv, dir: &camino::Utf8Path, args: &[&str]) -> String {
    let before = tree_fingerprint(dir.as_std_path());
    let output = env.crew(dir, args);
    assert_eq!(output.status.code(), Some(2), "{}", render_output(&output));
    let after: Vec<_> = tree_fingerprint(dir.as_std_path())
        .into_iter()
        .filter(|(path, _)| !path.starts_with(".git/info"))
        .collect();
    let before: Vec<_> = before
        .into_iter()
        .filter(|(path, _)| !path.starts_with(".git/info"))
        .collect();
    let created: Vec<_> = after
        .iter()
        .filter(|entry| !before.contains(entry))
        .collect();
    assert!(
        created
            .iter()
            .all(|(path, _)| path.starts_with(".crew/state")),
        "a refused command changed the project: {created:?}"
    );
    Redactor::new(env).redact(&render_output(&output))
}

#[test]
fn unknown_team() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/teams/review.toml"),
        "[[tasks]]\nid = \"a\"\nagent = \"shell\"\nprompt = \"true\"\n",
    );
    insta::assert_snapshot!(refused(&env, &repo, &["run", "reveiw"]), @"
    ----- stderr -----
    error: unknown team `reveiw`
    hint: teams in $TEST_ENV/project/.crew/teams: review
    [exit status: 2]
    ");
}

#[test]
fn bad_task_id() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/teams/bad.toml"),
        "[[tasks]]\nid = \"../escape\"\nagent = \"shell\"\nprompt = \"true\"\n",
    );
    insta::assert_snapshot!(refused(&env, &repo, &["run", "bad"]), @r#"
    ----- stderr -----
    error: $TEST_ENV/project/.crew/teams/bad.toml:2:6: key `tasks[0].id`: invalid task id "../escape": must start with a letter or a digit
    [exit status: 2]
    "#);
    insta::assert_snapshot!(refused(&env, &repo, &["run", "--agent", "shell", "--task", "a/b=true"]), @r#"
    ----- stderr -----
    error: --task: invalid task id "a/b": may only contain letters, digits, `.`, `_` and `-` (no `/`, spaces or control characters)
    [exit status: 2]
    "#);
}

#[test]
fn dependency_cycle() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/teams/loop.toml"),
        "[[tasks]]\nid = \"a\"\nagent = \"shell\"\nprompt = \"true\"\ndepends_on = [\"b\"]\n\n[[tasks]]\nid = \"b\"\nagent = \"shell\"\nprompt = \"true\"\ndepends_on = [\"a\"]\n",
    );
    insta::assert_snapshot!(refused(&env, &repo, &["run", "loop"]), @"
    ----- stderr -----
    error: $TEST_ENV/project/.crew/teams/loop.toml:5:15: key `tasks[0].depends_on[0]`: dependency cycle: a -> b -> a
    [exit status: 2]
    ");
}

#[test]
fn dirty_leader() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(&repo.join("README.md"), "edited but not committed\n");
    insta::assert_snapshot!(refused(&env, &repo, &["run", "--agent", "shell", "--workspace-mode", "worktree", "true"]), @"
    ----- stderr -----
    error: the run cannot start
    caused by: the leader checkout $TEST_ENV/project has uncommitted changes to tracked files:
      README.md
    hint: commit or stash these changes (`git stash`) so that every task starts from what you see; untracked files do not block. To start from a commit instead, pass `--base <ref>`; `[worktree] require_clean_leader = false` in .crew/config.toml turns this check off
    [exit status: 2]
    ");
    assert_eq!(
        env.git(&repo, ["branch", "--list", "crew/*"]),
        "",
        "no branch was made"
    );
    // A named base does not depend on the checkout: the same run starts from it, and the
    // user's edit stays where it is.
    let output = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "--base",
            "HEAD",
            "echo work > work.txt",
        ],
    );
    assert!(output.status.success(), "{}", render_output(&output));
    assert_eq!(
        std::fs::read_to_string(repo.join("README.md")).unwrap(),
        "edited but not committed\n"
    );
}

#[test]
fn no_git_repository() {
    let env = TestEnv::new();
    let dir = env.dir("plain");
    insta::assert_snapshot!(refused(&env, &dir, &["run", "--agent", "shell", "--workspace-mode", "worktree", "true"]), @r#"
    ----- stderr -----
    error: the run cannot start
    caused by: $TEST_ENV/plain is not inside a git work tree
    hint: run crew inside a git repository, choose another --workspace-mode, or set [isolation] fallback = "temp"
    [exit status: 2]
    "#);
}

#[test]
fn unknown_agent_and_bad_arguments() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    insta::assert_snapshot!(refused(&env, &repo, &["run", "--agent", "claud", "hello"]), @"
    ----- stderr -----
    error: unknown agent `claud`
    hint: define it in $TEST_ENV/project/.crew/agents/<name>.toml; known agents: shell
    [exit status: 2]
    ");
    insta::assert_snapshot!(refused(&env, &repo, &["run", "--agent", "shell", "--max-parallel", "1000000", "true"]), @"
    ----- stderr -----
    error: --max-parallel must be from 1 to 1000, not 1000000
    [exit status: 2]
    ");
    insta::assert_snapshot!(refused(&env, &repo, &["run", "--workspace-mode", "sandbox", "x"]), @"
    ----- stderr -----
    error: invalid value 'sandbox' for '--workspace-mode <MODE>': unknown workspace mode `sandbox`; use single, worktree, temp or dedicated

    For more information, try '--help'.
    [exit status: 2]
    ");
    insta::assert_snapshot!(refused(&env, &repo, &["run"]), @r#"
    ----- stderr -----
    error: which team? `crew run TEAM`, or `crew run --agent NAME "prompt"`
    hint: `crew init` writes example teams; or run ad hoc: crew run --agent shell "echo hello"
    [exit status: 2]
    "#);
    insta::assert_snapshot!(refused(&env, &repo, &["runs", "show", "nope"]), @"
    ----- stderr -----
    error: no run matches `nope` in workspace $TEST_ENV/project
    hint: `crew runs list` shows the runs of this workspace
    [exit status: 2]
    ");
}

#[test]
fn broken_config_file() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(&repo.join(".crew/config.toml"), "[run]\nmax_paralel = 3\n");
    insta::assert_snapshot!(refused(&env, &repo, &["run", "--agent", "shell", "true"]), @"
    ----- stderr -----
    error: $TEST_ENV/project/.crew/config.toml:2:1: key `run.max_paralel`: unknown field `max_paralel`, expected one of `max_parallel`, `stop_grace`, `task_timeout`, `max_cost_usd`, `task_max_cost_usd`, `unreachable_timeout`, `fail_fast`, `max_output_log`, `base_moved`, `default_agent`
    [exit status: 2]
    ");
}

#[test]
fn ask_outside_an_agent() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    insta::assert_snapshot!(refused(&env, &repo, &["ask", "anyone there?"]), @"
    ----- stderr -----
    error: CREW_AGENT_ID is not set: `crew ask` runs inside an agent started by crew
    hint: crew sets CREW_AGENT_ID, CREW_SOCKET and CREW_PROJECT_ROOT for every agent it runs
    [exit status: 2]
    ");
}

#[test]
fn demo_needs_no_git_identity_and_no_config() {
    let env = TestEnv::new();
    let home_config = env.home().join(".gitconfig");
    assert!(
        !home_config.exists(),
        "the hermetic environment has no git identity"
    );
    let dir = env.root().join("demo");
    let output = env.crew(env.root(), ["demo", "--dir", dir.as_str()]);
    assert!(output.status.success(), "{}", render_output(&output));
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        text.contains("the leader's greeting.txt is untouched"),
        "{text}"
    );
    let branches = env.git(&dir, ["branch", "--list", "crew/*"]);
    assert_eq!(branches.lines().count(), 3, "{branches}");
    for (task, change) in [
        ("shout", "+HELLO FROM THE LEADER."),
        ("french", "+Bonjour from the leader."),
        ("sign", "+-- signed by the sign agent"),
    ] {
        let branch = branches
            .lines()
            .map(str::trim)
            .find(|branch| branch.ends_with(task))
            .unwrap();
        let diff = env.git(&dir, ["diff", "main", branch]);
        assert!(diff.contains(change), "{diff}");
    }
    // What it says to try next works as said.
    assert!(
        text.contains("`crew diff sign`") && text.contains("`crew land sign`"),
        "{text}"
    );
    let diff = env.crew(&dir, ["diff", "sign"]);
    assert!(diff.status.success(), "{}", render_output(&diff));
    assert!(String::from_utf8_lossy(&diff.stdout).contains("+-- signed by the sign agent"));
    let land = env.crew(&dir, ["land", "sign"]);
    assert!(land.status.success(), "{}", render_output(&land));
    assert!(
        env.git(&dir, ["show", "main:greeting.txt"])
            .contains("-- signed by the sign agent"),
        "landed on main"
    );
}

#[test]
fn init_writes_the_example_set_and_its_hello_team_runs() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let output = env.crew(&repo, ["init"]);
    assert!(output.status.success(), "{}", render_output(&output));
    let example = camino::Utf8Path::new(env!("CARGO_MANIFEST_DIR")).join("../.crew.example");
    for file in ["config.toml", "agents/claude.toml", "teams/hello.toml"] {
        assert_eq!(
            std::fs::read_to_string(repo.join(".crew").join(file)).unwrap(),
            std::fs::read_to_string(example.join(file)).unwrap()
        );
    }
    // Idempotent: nothing is overwritten.
    write(
        &repo.join(".crew/teams/hello.toml"),
        "# mine\n[[tasks]]\nid = \"mine\"\nagent = \"shell\"\nprompt = \"echo mine > mine.txt\"\n",
    );
    let again = env.crew(&repo, ["init"]);
    assert!(String::from_utf8(again.stdout).unwrap().contains("kept"));
    assert!(
        std::fs::read_to_string(repo.join(".crew/teams/hello.toml"))
            .unwrap()
            .starts_with("# mine")
    );
    env.git(&repo, ["add", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "crew config"]);
    let run = env.crew(&repo, ["run", "hello"]);
    assert!(run.status.success(), "{}", render_output(&run));
}

#[test]
fn init_keeps_a_cargo_repository_s_build_output_warm_and_a_linked_target_is_refused() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join("Cargo.toml"),
        "[package]\nname = \"app\"\nversion = \"0.1.0\"\n",
    );
    write(&repo.join(".gitignore"), "target/\n");
    env.git(&repo, ["add", "."]);
    env.git(&repo, ["commit", "-q", "-m", "app"]);
    let output = env.crew(&repo, ["init"]);
    assert!(output.status.success(), "{}", render_output(&output));
    let config = std::fs::read_to_string(repo.join(".crew/config.toml")).unwrap();
    assert!(
        config.contains("builds with Cargo") && config.contains("keep_ignored = [\"target\"]"),
        "{config}"
    );
    env.git(&repo, ["add", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "crew"]);
    // The first task's build output is there when the next task takes its recycled worktree.
    let built = env.crew(
        &repo,
        [
            "run",
            "--quiet",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "mkdir -p target/debug && echo built > target/debug/app",
        ],
    );
    assert!(built.status.success(), "{}", render_output(&built));
    let warm = env.crew(
        &repo,
        [
            "run",
            "--quiet",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "--name",
            "warm",
            "cat target/debug/app || echo cold",
        ],
    );
    assert!(warm.status.success(), "{}", render_output(&warm));
    let log =
        std::fs::read_to_string(repo.join(".crew/state/runs/warm/tasks/shell/output.log")).unwrap();
    assert!(log.contains("built") && !log.contains("cold"), "{log}");
    // Linking it instead would share one target/ among tasks on different branches.
    write(
        &repo.join(".crew/config.toml"),
        "[worktree]\nlink = [\"target\"]\n",
    );
    let refused = env.crew(&repo, ["run", "--agent", "shell", "touch ran"]);
    assert_eq!(
        refused.status.code(),
        Some(2),
        "{}",
        render_output(&refused)
    );
    let said = render_output(&refused);
    assert!(
        said.contains("worktree.link") && said.contains("keep_ignored = [\"target\"]"),
        "{said}"
    );
    assert!(!repo.join("ran").exists());
}

#[test]
fn help_lists_the_commands() {
    let env = TestEnv::new();
    let output = env.crew(env.root(), ["--help"]);
    insta::assert_snapshot!(render_output(&output), @r"
    crew runs a team of coding agents in parallel, each task in its own isolated workspace

    Usage: crew [OPTIONS] <COMMAND>

    Commands:
      run          Run a team of agents, each task in its own workspace
      watch        One terminal board of every agent of this project, waiting ones first
      agents       List and control the live agents of this workspace
      runs         Inspect and manage the runs of this workspace
      conflicts    Which task branches of a run would conflict, and in which files
      diff         A task's work against its base, as git diff prints it (a run: each of its tasks)
      land         Land tasks' work on a branch, in dependency order: all of them, or none
      compare      A task's attempts side by side: status, files, lines, check, cost
      pick         Keep one attempt as the task's result; delete the other attempts' branches
      events       What happened in a run, in order (`--follow` as it happens, `--json` for scripts)
      worktrees    crew's worktrees and task branches in this repository
      sandbox      What the kernel lets agents write, and whether this machine can confine them
      ask          Ask the user a question from inside an agent, and stop for the answer
      submit       Add tasks to your own run, from inside an agent (an agent-authored plan)
      mcp          Serve the Model Context Protocol on stdio, for lead agents
      serve        Serve the Agent Client Protocol on stdio, for editors
      init         Write `.crew/` with a commented example of each configuration file
      demo         See crew at work in ten seconds: three agents, three worktrees, one file
      shim         The other side of a placement: run tasks here for a crew host elsewhere
      completions  Print shell completions for crew
      help         Print this message or the help of the given subcommand(s)

    Options:
          --color <COLOR>
              When to color output (NO_COLOR turns `auto` off)

              Possible values:
              - auto:   Color when stdout is a terminal and `NO_COLOR` is not set
              - always
              - never
              
              [default: auto]

      -v, --verbose...
              Say more about what crew does (repeat for debug output)

      -q, --quiet
              Print only errors and what was asked for

      -h, --help
              Print help (see a summary with '-h')

      -V, --version
              Print version

    Exit codes: 0 ok, 1 a task failed, 2 usage or configuration error, 130 interrupted, 141 (in a shell)
    a listing whose reader stopped reading.
    [exit status: 0]
    ");
    let completions = env.crew(env.root(), ["completions", "bash"]);
    assert!(
        String::from_utf8(completions.stdout)
            .unwrap()
            .contains("_crew()")
    );
}

#[test]
fn a_deleted_current_directory_is_named() {
    let env = TestEnv::new();
    let dir = env.dir("doomed");
    // The shell removes its own current directory, then starts crew there.
    let output = std::process::Command::new("sh")
        .current_dir(&dir)
        .env("CREW", crew_tests::crew_bin().as_str())
        .args(["-c", "rmdir \"$PWD\" && exec \"$CREW\" agents list"])
        .output()
        .unwrap();
    insta::assert_snapshot!(render_output(&output), @"
    ----- stderr -----
    error: cannot read the current directory: No such file or directory (os error 2)
    hint: it may have been deleted (a removed worktree?): cd into your project and run crew again
    [exit status: 2]
    ");
}

#[test]
fn every_problem_of_a_team_file_is_reported_at_once() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/teams/messy.toml"),
        r#"[[tasks]]
id = "x"
agent = "shell"
prompt = "true"

[[tasks]]
id = "X"
agent = "robot"
prompt = "true"
depends_on = ["nope"]
"#,
    );
    insta::assert_snapshot!(refused(&env, &repo, &["run", "messy"]), @"
    ----- stderr -----
    error: $TEST_ENV/project/.crew/teams/messy.toml:7:6: key `tasks[1].id`: duplicate task id `X`: task `x` already uses it (task ids must be unique ignoring case)
    error: $TEST_ENV/project/.crew/teams/messy.toml:8:9: key `tasks[1].agent`: unknown agent `robot`; define it in $TEST_ENV/project/.crew/agents/robot.toml or use one of: shell
    error: $TEST_ENV/project/.crew/teams/messy.toml:10:15: key `tasks[1].depends_on[0]`: task `X` depends on `nope`, which is not a task of this team
    [exit status: 2]
    ");
}

#[test]
fn mcp_help_names_every_tool_the_server_offers() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let help = env.crew(&repo, ["mcp", "--help"]);
    let help = String::from_utf8(help.stdout).unwrap();
    let line: String = help
        .split("Tools:")
        .nth(1)
        .unwrap_or_else(|| panic!("no tool list in the help:\n{help}"))
        .split('—')
        .next()
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let mut in_help: Vec<&str> = line.split(", ").collect();
    in_help.sort_unstable();

    // What the server itself lists, asked over its own protocol.
    let mut server = env.crew_command(&repo);
    server
        .arg("mcp")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut server = server.spawn().unwrap();
    let mut stdin = server.stdin.take().unwrap();
    let requests = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"test","version":"0"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    ];
    for request in requests {
        std::io::Write::write_all(&mut stdin, format!("{request}\n").as_bytes()).unwrap();
    }
    let stdout = std::io::BufReader::new(server.stdout.take().unwrap());
    let listed = std::io::BufRead::lines(stdout)
        .map(|line| serde_json::from_str::<serde_json::Value>(&line.unwrap()).unwrap())
        .find(|message| message["id"] == 2)
        .expect("the server answers tools/list");
    drop(stdin);
    server.wait().unwrap();
    let mut offered: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect();
    offered.sort_unstable();
    assert_eq!(in_help, offered, "{help}");
}

#[test]
fn a_fifo_where_a_config_file_belongs_is_refused_not_waited_on() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    for (file, args) in [
        (
            ".crew/config.toml",
            &["run", "--agent", "shell", "true"][..],
        ),
        (
            ".crew/agents/robot.toml",
            &["run", "--agent", "robot", "true"][..],
        ),
        (".crew/teams/loop.toml", &["run", "loop"][..]),
    ] {
        let path = repo.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path.as_std_path(),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        // A crew that waits on the FIFO would never end: it is given 30 s, then killed.
        let mut crew = env
            .crew_command(&repo)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        crew_tests::wait_until(30, "crew to refuse the FIFO", || {
            crew.try_wait().unwrap().map(|_| ())
        });
        let output = crew.wait_with_output().unwrap();
        let said = render_output(&output);
        assert_eq!(output.status.code(), Some(2), "{file}: {said}");
        assert!(
            said.contains(path.as_str()) && said.contains("not a regular file"),
            "{file}: {said}"
        );
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn a_prompt_too_long_for_its_agents_argument_is_refused_before_the_run_is_made() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let prompt = "x".repeat(200 * 1024);
    write(
        &repo.join(".crew/teams/long.toml"),
        &format!("[[tasks]]\nid = \"long\"\nagent = \"shell\"\nprompt = \"{prompt}\"\n"),
    );
    let said = refused(&env, &repo, &["run", "long"]);
    assert!(
        said.contains("task `long`'s prompt is 204800 bytes")
            && said.contains("an argument can hold at most 131071"),
        "{said}"
    );
    assert!(!repo.join(".crew/state/runs").exists() || run_dirs(&repo).is_empty());
}

fn run_dirs(repo: &camino::Utf8Path) -> Vec<std::fs::DirEntry> {
    std::fs::read_dir(repo.join(".crew/state/runs"))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn an_unclosed_placeholder_in_an_agent_file_is_named() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/agents/robot.toml"),
        "command = [\"echo\", \"{prompt\"]\n",
    );
    insta::assert_snapshot!(refused(&env, &repo, &["run", "--agent", "robot", "hi"]), @r#"
    ----- stderr -----
    error: $TEST_ENV/project/.crew/agents/robot.toml:1:11: key `command`: argument "{prompt" opens the placeholder `{prompt` and never closes it: write `{prompt}`
    [exit status: 2]
    "#);
}

#[test]
fn a_config_file_that_is_not_utf8_is_named_with_its_line_and_column() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let path = repo.join(".crew/teams/latin.toml");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(
        &path,
        b"[[tasks]]\nid = \"caf\xe9\"\nagent = \"shell\"\nprompt = \"true\"\n",
    )
    .unwrap();
    insta::assert_snapshot!(refused(&env, &repo, &["run", "latin"]), @"
    ----- stderr -----
    error: $TEST_ENV/project/.crew/teams/latin.toml:2:10: not valid UTF-8 (byte 0xe9): save the file as UTF-8
    [exit status: 2]
    ");
}
