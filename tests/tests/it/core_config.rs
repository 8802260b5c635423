//! Configuration loading: the example set, the built-in defaults, and the messages a user sees
//! for every kind of mistake.

use camino::Utf8PathBuf;
use crew_core::config::{ConfigDir, ProjectConfig, SteerMode, WorkspaceMode};
use crew_tests::{TestEnv, error_chain, write};

fn example_dir() -> Utf8PathBuf {
    Utf8PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.crew.example")
}

#[test]
fn example_config_loads_through_the_run_code_path() {
    let config = ConfigDir::new(example_dir());
    let project = config.load_project_config().unwrap();
    assert_eq!(
        project,
        ProjectConfig::default(),
        "the example documents the defaults"
    );
    assert_eq!(
        config.agent_names().unwrap(),
        ["aider", "claude", "codex", "gemini", "shell"]
    );
    for name in config.agent_names().unwrap() {
        config.load_agent(&name).unwrap();
    }
    let teams = config.team_names().unwrap();
    assert_eq!(teams, ["feature", "hello"]);
    for name in &teams {
        config.load_team(name).unwrap();
    }
    let feature = config.load_team("feature").unwrap();
    assert_eq!(feature.def.workspace_mode, Some(WorkspaceMode::Worktree));
    let review = feature
        .def
        .tasks
        .iter()
        .find(|task| task.id.as_str() == "review")
        .unwrap();
    assert_eq!(review.depends_on.len(), 2);
    assert_eq!(review.workspace_mode, Some(WorkspaceMode::Dedicated));
    assert_eq!(feature.agents.len(), 3);
}

#[test]
fn no_config_at_all_still_works() {
    let env = TestEnv::new();
    let config = ConfigDir::new(env.dir("project").join(".crew"));
    assert_eq!(
        config.load_project_config().unwrap(),
        ProjectConfig::default()
    );
    let shell = config.load_agent("shell").unwrap();
    assert!(shell.builtin);
    assert_eq!(shell.command, ["sh", "-c", "{prompt}"]);
    assert_eq!(shell.steer, SteerMode::StdinLines);
    assert!(config.team_names().unwrap().is_empty());
}

/// Writes `file` under a fresh `.crew/` and returns the message of loading it.
fn load_error(file: &str, contents: &str) -> String {
    let env = TestEnv::new();
    let crew_dir = env.dir("project").join(".crew");
    write(&crew_dir.join(file), contents);
    let config = ConfigDir::new(&crew_dir);
    let error = match file.split_once('/') {
        Some(("teams", name)) => config
            .load_team(name.trim_end_matches(".toml"))
            .unwrap_err(),
        Some(("agents", name)) => config
            .load_agent(name.trim_end_matches(".toml"))
            .unwrap_err(),
        _ => config.load_project_config().unwrap_err(),
    };
    let mut text = error_chain(&error);
    if let Some(hint) = error.hint() {
        text.push_str(&format!("\nhint: {hint}"));
    }
    env.redact(&text)
}

const TASK: &str = "agent = \"shell\"\nprompt = \"true\"\n";

#[test]
fn unknown_key_names_file_line_column_and_key() {
    insta::assert_snapshot!(load_error("teams/t.toml", &format!("[[tasks]]\nid = \"a\"\n{TASK}promt = \"typo\"\n")), @"error: $TEST_ENV/project/.crew/teams/t.toml:5:1: key `tasks[0].promt`: unknown field `promt`, expected one of `id`, `agent`, `prompt`, `depends_on`, `timeout`, `workspace_mode`, `attempts`, `check`, `on_limit`, `placement`, `network`, `resources`, `max_cost_usd`");
}

#[test]
fn wrong_type_is_located() {
    insta::assert_snapshot!(load_error("teams/t.toml", "max_parallel = \"four\"\n[[tasks]]\nid = \"a\"\nagent = \"shell\"\nprompt = \"true\"\n"), @r#"error: $TEST_ENV/project/.crew/teams/t.toml:1:16: key `max_parallel`: invalid type: string "four", expected i64"#);
}

#[test]
fn an_unknown_on_limit_is_refused_with_what_it_may_be() {
    insta::assert_snapshot!(load_error("teams/t.toml", &format!("on_limit = \"wait\"\n[[tasks]]\nid = \"a\"\n{TASK}")), @"error: $TEST_ENV/project/.crew/teams/t.toml:1:12: key `on_limit`: unknown variant `wait`, expected `fail` or `pause`");
}

#[test]
fn zero_parallelism_is_refused() {
    insta::assert_snapshot!(load_error("teams/t.toml", &format!("max_parallel = 0\n[[tasks]]\nid = \"a\"\n{TASK}")), @"error: $TEST_ENV/project/.crew/teams/t.toml:1:16: key `max_parallel`: parallelism must be a whole number from 1 to 1000, not 0");
    insta::assert_snapshot!(load_error("config.toml", "[run]\nmax_parallel = 0\n"), @"error: $TEST_ENV/project/.crew/config.toml:2:16: key `run.max_parallel`: parallelism must be a whole number from 1 to 1000, not 0");
}

#[test]
fn invalid_task_id_names_the_rule() {
    insta::assert_snapshot!(load_error("teams/t.toml", &format!("[[tasks]]\nid = \"a/b\"\n{TASK}")), @r#"error: $TEST_ENV/project/.crew/teams/t.toml:2:6: key `tasks[0].id`: invalid task id "a/b": may only contain letters, digits, `.`, `_` and `-` (no `/`, spaces or control characters)"#);
}

#[test]
fn unknown_agent_points_at_the_task() {
    insta::assert_snapshot!(load_error("teams/t.toml", "[[tasks]]\nid = \"a\"\nagent = \"claud\"\nprompt = \"x\"\n"), @"error: $TEST_ENV/project/.crew/teams/t.toml:3:9: key `tasks[0].agent`: unknown agent `claud`; define it in $TEST_ENV/project/.crew/agents/claud.toml or use one of: shell");
}

#[test]
fn dependency_cycle_shows_the_cycle() {
    insta::assert_snapshot!(load_error("teams/t.toml", &format!(
        "[[tasks]]\nid = \"a\"\n{TASK}depends_on = [\"c\"]\n\n[[tasks]]\nid = \"b\"\n{TASK}depends_on = [\"a\"]\n\n[[tasks]]\nid = \"c\"\n{TASK}depends_on = [\"b\"]\n"
    )), @"error: $TEST_ENV/project/.crew/teams/t.toml:5:15: key `tasks[0].depends_on[0]`: dependency cycle: a -> c -> b -> a");
}

#[test]
fn unknown_dependency_is_located() {
    insta::assert_snapshot!(load_error("teams/t.toml", &format!("[[tasks]]\nid = \"a\"\n{TASK}depends_on = [\"nope\"]\n")), @"error: $TEST_ENV/project/.crew/teams/t.toml:5:15: key `tasks[0].depends_on[0]`: task `a` depends on `nope`, which is not a task of this team");
}

#[test]
fn bad_duration_is_explained() {
    insta::assert_snapshot!(load_error("teams/t.toml", &format!("[[tasks]]\nid = \"a\"\n{TASK}timeout = \"soon\"\n")), @r#"error: $TEST_ENV/project/.crew/teams/t.toml:5:11: key `tasks[0].timeout`: invalid duration `soon` (expected number at 0); write it like "90s", "30m" or "1h 30m""#);
}

#[test]
fn absurd_values_are_refused_with_the_allowed_range() {
    insta::assert_snapshot!(load_error("teams/t.toml", &format!("[[tasks]]\nid = \"a\"\n{TASK}timeout = \"0s\"\n")), @"error: $TEST_ENV/project/.crew/teams/t.toml:5:11: key `tasks[0].timeout`: duration `0s` is out of range: it must be longer than 0s and at most 365 days");
    insta::assert_snapshot!(load_error("config.toml", "[run]\nstop_grace = \"1000000years\"\n"), @"error: $TEST_ENV/project/.crew/config.toml:2:14: key `run.stop_grace`: duration `1000000years` is out of range: it must be longer than 0s and at most 365 days");
    insta::assert_snapshot!(load_error("config.toml", "[run]\nstop_grace = \"2h\"\n"), @"error: $TEST_ENV/project/.crew/config.toml:2:1: key `run.stop_grace`: a stop grace of 2h is too long: it must be at most 1h (an agent that ignores TERM is killed only after it)");
    insta::assert_snapshot!(load_error("config.toml", "[run]\nstop_grace = 0\n"), @"error: $TEST_ENV/project/.crew/config.toml:2:14: key `run.stop_grace`: duration 0 is out of range: it must be longer than 0s and at most 365 days");
    insta::assert_snapshot!(load_error("config.toml", "[run]\nmax_parallel = 1000000\n"), @"error: $TEST_ENV/project/.crew/config.toml:2:16: key `run.max_parallel`: parallelism must be a whole number from 1 to 1000, not 1000000");
    insta::assert_snapshot!(load_error("config.toml", "[worktree]\nbranch_prefix = \"HEAD\"\n"), @"error: $TEST_ENV/project/.crew/config.toml:2:1: key `worktree.branch_prefix`: `HEAD` must not start with `HEAD` or `refs`: branches would read like git's own names");
    insta::assert_snapshot!(load_error("config.toml", "[worktree]\nbranch_prefix = \"refs/tags/x\"\n"), @"error: $TEST_ENV/project/.crew/config.toml:2:1: key `worktree.branch_prefix`: `refs/tags/x` must not start with `HEAD` or `refs`: branches would read like git's own names");
    insta::assert_snapshot!(load_error("agents/a.toml", "command = [\"x\"]\nenv = { MODE = \"a\\u0000b\" }\n"), @"error: $TEST_ENV/project/.crew/agents/a.toml:2:9: key `env`: the value of `MODE` holds a NUL byte, which no environment can carry");
    // An output log's range is the log's: a memory cap is not held to it.
    insta::assert_snapshot!(load_error("config.toml", "[run]\nmax_output_log = \"1KiB\"\n"), @"error: $TEST_ENV/project/.crew/config.toml:2:1: key `run.max_output_log`: size 1KiB is out of range: it must be from 64KiB to 64GiB");
    // A checked-in definition cannot point the user's key at a gateway of its own choosing.
    insta::assert_snapshot!(load_error("agents/a.toml", "command = [\"x\"]\nenv = { MODEL_BASE_URL = \"https://elsewhere.example\" }\n[[sandbox.credentials]]\nname = \"model\"\nupstream = \"https://api.example.com\"\nbase_url_env = \"MODEL_BASE_URL\"\nkeys = [\"MODEL_KEY\"]\n"), @"error: $TEST_ENV/project/.crew/agents/a.toml:2:9: key `env`: `MODEL_BASE_URL` is read from your environment by the credential `model`: it cannot be set in the definition (set it in your environment)");
    insta::assert_snapshot!(load_error("agents/a.toml", "command = [\"x\"]\n[[sandbox.credentials]]\nname = \"model\"\nupstream = \"api.example.com\"\nbase_url_env = \"MODEL_BASE_URL\"\nkeys = [\"MODEL_KEY\"]\n"), @r#"error: $TEST_ENV/project/.crew/agents/a.toml:2:1: key `sandbox.credentials`: `api.example.com` is not an upstream: write an http:// or https:// URL, as "https://api.anthropic.com""#);
    insta::assert_snapshot!(load_error("agents/a.toml", "command = [\"x\", \"a\\u0000b\"]\n"), @"error: $TEST_ENV/project/.crew/agents/a.toml:1:11: key `command`: argument \"a\\0b\" holds a NUL byte, which no program argument can carry");
}

#[test]
fn team_without_tasks_is_refused() {
    insta::assert_snapshot!(load_error("teams/t.toml", "description = \"empty\"\ntasks = []\n"), @"error: $TEST_ENV/project/.crew/teams/t.toml:2:9: key `tasks`: a team needs at least one task");
}

#[test]
fn unknown_team_lists_the_known_ones() {
    let env = TestEnv::new();
    let crew_dir = env.dir("project").join(".crew");
    write(
        &crew_dir.join("teams/review.toml"),
        &format!("[[tasks]]\nid = \"a\"\n{TASK}"),
    );
    let error = ConfigDir::new(&crew_dir).load_team("reveiw").unwrap_err();
    let text = format!("{}\nhint: {}", error_chain(&error), error.hint().unwrap());
    insta::assert_snapshot!(env.redact(&text), @"
    error: unknown team `reveiw`
    hint: teams in $TEST_ENV/project/.crew/teams: review
    ");
}

#[test]
fn agent_mistakes_are_located() {
    insta::assert_snapshot!(load_error("agents/a.toml", "command = []\n"), @r#"error: $TEST_ENV/project/.crew/agents/a.toml:1:11: key `command`: needs a program as its first element, e.g. ["claude", "-p", "{prompt}"]"#);
    insta::assert_snapshot!(load_error("agents/a.toml", "command = [\"x\", \"{promt}\"]\n"), @"error: $TEST_ENV/project/.crew/agents/a.toml:1:11: key `command`: unknown placeholder `{promt}`; available: {prompt}, {workspace}, {run_id}, {task_id}");
    insta::assert_snapshot!(load_error("agents/a.toml", "command = [\"x\"]\npass_env = [\"GIT_DIR\"]\n"), @"error: $TEST_ENV/project/.crew/agents/a.toml:2:13: key `pass_env`: `GIT_DIR`: git's own variables never reach an agent, so each agent works on the repository of its workspace (only its identity may: GIT_AUTHOR_NAME, GIT_AUTHOR_EMAIL, GIT_COMMITTER_NAME, … or GIT_AUTHOR_*, GIT_COMMITTER_*)");
    insta::assert_snapshot!(load_error("agents/a.toml", "command = [\"x\"]\n[sandbox]\nwrite = [\"~/.claude\", \"build/cache\"]\n"), @"error: $TEST_ENV/project/.crew/agents/a.toml:3:23: key `sandbox.write`: `build/cache` must be an absolute path or start with `~/` (the agent's home directory)");
    insta::assert_snapshot!(load_error("agents/a.toml", "command = [\"x\"]\n[sandbox]\nmode = \"loose\"\n"), @"error: $TEST_ENV/project/.crew/agents/a.toml:3:8: key `sandbox.mode`: unknown variant `loose`, expected `enforce` or `off`");
    insta::assert_snapshot!(load_error("agents/a.toml", "command = [\"x\"]\n[sandbox.confined]\nargs = [\"--id={task_id}\"]\n"), @"error: $TEST_ENV/project/.crew/agents/a.toml:3:9: key `sandbox.confined.args`: these arguments take no placeholders (`{task_id}`): they are the same at every start");
    insta::assert_snapshot!(load_error("agents/a.toml", "command = [\"x\"]\n[sandbox.confined]\nenv = { \"GIT_DIR\" = \"/x\" }\n"), @"error: $TEST_ENV/project/.crew/agents/a.toml:3:9: key `sandbox.confined.env`: `GIT_DIR`: git's own variables never reach an agent, so each agent works on the repository of its workspace (only its identity may: GIT_AUTHOR_NAME, GIT_AUTHOR_EMAIL, GIT_COMMITTER_NAME, … or GIT_AUTHOR_*, GIT_COMMITTER_*)");
    insta::assert_snapshot!(load_error("config.toml", "[sandbox]\nwrite = [\"/tmp\"]\n"), @"error: $TEST_ENV/project/.crew/config.toml:2:1: key `sandbox.write`: unknown field `write`, expected one of `mode`, `network`, `allow_hosts`");
    insta::assert_snapshot!(load_error("agents/a.toml", "command = [\"x\"]\nsteer = \"telepathy\"\n"), @"error: $TEST_ENV/project/.crew/agents/a.toml:2:9: key `steer`: unknown variant `telepathy`, expected one of `stdin-lines`, `stdin-json`, `none`, `protocol`");
    insta::assert_snapshot!(load_error("agents/a.toml", "command = [\"x\"]\nenv = { \"BAD NAME\" = \"1\" }\n"), @"error: $TEST_ENV/project/.crew/agents/a.toml:2:9: key `env`: `BAD NAME` is not a valid environment variable name (letters, digits and `_`, not starting with a digit)");
}

#[test]
fn git_identity_variables_may_reach_an_agent_and_no_other_of_gits() {
    let env = TestEnv::new();
    let crew_dir = env.dir("project").join(".crew");
    write(
        &crew_dir.join("agents/a.toml"),
        "command = [\"x\"]\npass_env = [\"GIT_AUTHOR_*\", \"GIT_COMMITTER_EMAIL\"]\nenv = { GIT_COMMITTER_NAME = \"Bot\" }\n",
    );
    let agent = ConfigDir::new(&crew_dir).load_agent("a").unwrap();
    assert_eq!(agent.pass_env, ["GIT_AUTHOR_*", "GIT_COMMITTER_EMAIL"]);
    for refused in [
        "GIT_*",
        "GIT_A*",
        "GIT_CONFIG_GLOBAL",
        "GIT_SSH_COMMAND",
        "GIT_COMMITTER",
    ] {
        let error = load_error(
            "agents/a.toml",
            &format!("command = [\"x\"]\npass_env = [\"{refused}\"]\n"),
        );
        assert!(error.contains("git's own variables"), "{refused}: {error}");
    }
}

#[test]
fn project_config_mistakes_are_located() {
    insta::assert_snapshot!(load_error("config.toml", "[worktree]\ndir = \"/tmp/elsewhere\"\n"), @"error: $TEST_ENV/project/.crew/config.toml:2:1: key `worktree.dir`: `/tmp/elsewhere` must be relative to the repository root");
    insta::assert_snapshot!(load_error("config.toml", "[worktree]\nlink = [\"../outside\"]\n"), @"error: $TEST_ENV/project/.crew/config.toml:2:1: key `worktree.link`: `../outside` must not contain `..`");
    insta::assert_snapshot!(load_error("config.toml", "[worktree]\nbranch_prefix = \"a..b\"\n"), @"error: $TEST_ENV/project/.crew/config.toml:2:1: key `worktree.branch_prefix`: `a..b` must not contain `..`");
    insta::assert_snapshot!(load_error("config.toml", "[isolation]\nfallback = \"clone\"\n"), @"error: $TEST_ENV/project/.crew/config.toml:2:12: key `isolation.fallback`: unknown variant `clone`, expected `none` or `temp`");
    insta::assert_snapshot!(load_error("config.toml", "[retention]\nmax_kept_runs = -1\n"), @"error: $TEST_ENV/project/.crew/config.toml:2:17: key `retention.max_kept_runs`: invalid value: integer `-1`, expected usize");
    insta::assert_snapshot!(load_error("config.toml", "[run\nmax_parallel = 2\n"), @"error: $TEST_ENV/project/.crew/config.toml:1:5: unclosed table, expected `]`");
}

#[test]
fn every_problem_of_a_file_is_reported_at_once() {
    insta::assert_snapshot!(load_error("config.toml", "[run]\nmax_parallel = 1000000\nstop_grace = \"0s\"\ntask_timeout = \"soon\"\n\n[worktree]\nbranch_prefix = \"HEAD\"\nlink_mode = \"hardlink\"\n"), @r#"
    error: $TEST_ENV/project/.crew/config.toml:2:16: key `run.max_parallel`: parallelism must be a whole number from 1 to 1000, not 1000000
    $TEST_ENV/project/.crew/config.toml:3:1: key `run.stop_grace`: duration `0s` is out of range: it must be longer than 0s and at most 365 days
    $TEST_ENV/project/.crew/config.toml:4:1: key `run.task_timeout`: invalid duration `soon` (expected number at 0); write it like "90s", "30m" or "1h 30m"
    $TEST_ENV/project/.crew/config.toml:7:1: key `worktree.branch_prefix`: `HEAD` must not start with `HEAD` or `refs`: branches would read like git's own names
    $TEST_ENV/project/.crew/config.toml:8:1: key `worktree.link_mode`: unknown variant `hardlink`, expected `symlink` or `copy`
    "#);
    insta::assert_snapshot!(load_error("config.toml", "[run]\nstop_grace = \"2h\"\n\n[worktree]\ndir = \".git/wt\"\nbranch_prefix = \"refs/x\"\nlink = [\"../up\"]\n"), @"
    error: $TEST_ENV/project/.crew/config.toml:2:1: key `run.stop_grace`: a stop grace of 2h is too long: it must be at most 1h (an agent that ignores TERM is killed only after it)
    $TEST_ENV/project/.crew/config.toml:5:1: key `worktree.dir`: worktrees cannot live inside `.git`
    $TEST_ENV/project/.crew/config.toml:6:1: key `worktree.branch_prefix`: `refs/x` must not start with `HEAD` or `refs`: branches would read like git's own names
    $TEST_ENV/project/.crew/config.toml:7:1: key `worktree.link`: `../up` must not contain `..`
    ");
    insta::assert_snapshot!(load_error("agents/a.toml", "command = [\"x\", \"{promt}\"]\nresume = [\"x\", \"{mesage}\"]\npass_env = [\"GIT_DIR\"]\nenv = { \"BAD NAME\" = \"1\" }\n[sandbox]\nwrite = [\"relative\"]\n"), @"
    error: $TEST_ENV/project/.crew/agents/a.toml:1:11: key `command`: unknown placeholder `{promt}`; available: {prompt}, {workspace}, {run_id}, {task_id}
    $TEST_ENV/project/.crew/agents/a.toml:2:10: key `resume`: unknown placeholder `{mesage}`; available: {prompt}, {workspace}, {run_id}, {task_id}, {message}, {session_id}
    $TEST_ENV/project/.crew/agents/a.toml:3:13: key `pass_env`: `GIT_DIR`: git's own variables never reach an agent, so each agent works on the repository of its workspace (only its identity may: GIT_AUTHOR_NAME, GIT_AUTHOR_EMAIL, GIT_COMMITTER_NAME, … or GIT_AUTHOR_*, GIT_COMMITTER_*)
    $TEST_ENV/project/.crew/agents/a.toml:4:9: key `env`: `BAD NAME` is not a valid environment variable name (letters, digits and `_`, not starting with a digit)
    $TEST_ENV/project/.crew/agents/a.toml:6:10: key `sandbox.write`: `relative` must be an absolute path or start with `~/` (the agent's home directory)
    ");
    insta::assert_snapshot!(load_error("agents/a.toml", "command = \"x\"\nsteer = \"telepathy\"\n[sandbox]\nmode = \"loose\"\n"), @r#"
    error: $TEST_ENV/project/.crew/agents/a.toml:1:11: key `command`: invalid type: string "x", expected a sequence
    $TEST_ENV/project/.crew/agents/a.toml:2:1: key `steer`: unknown variant `telepathy`, expected one of `stdin-lines`, `stdin-json`, `none`, `protocol`
    $TEST_ENV/project/.crew/agents/a.toml:4:1: key `sandbox.mode`: unknown variant `loose`, expected `enforce` or `off`
    "#);
}

#[test]
fn an_allow_hosts_entry_that_is_neither_a_host_nor_an_address_is_located() {
    for (entry, said) in [
        ("999.1.1.1", "not an IP address"),
        ("1.2.3", "not an IP address"),
        ("1.2.3.4.5", "not an IP address"),
        ("-bad.com", "neither starts nor ends with `-`"),
    ] {
        let error = load_error(
            "config.toml",
            &format!("[sandbox]\nnetwork = \"proxy\"\nallow_hosts = [\"{entry}\"]\n"),
        );
        assert!(
            error.contains("config.toml:3:") && error.contains(said),
            "{entry}: {error}"
        );
    }
}

/// The definitions `crew init` writes give their programs what they need to work, and nothing
/// of the user's that a prompt-injected agent could carry off: no cloud credential passes, no
/// host but the model's API and its login's (never a public ingestion service), no write to the
/// user's own caches.
#[test]
fn the_shipped_definitions_pass_no_cloud_credential_and_list_only_their_api() {
    let config = ConfigDir::new(example_dir());
    let credentials = [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "CLOUD_ML_REGION",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "AZURE_CLIENT_SECRET",
        "GITHUB_TOKEN",
        "GH_TOKEN",
        "NPM_TOKEN",
    ];
    let ingestion = [
        "sentry.io",
        "statsig.anthropic.com",
        "statsig.com",
        "datadoghq.com",
    ];
    for name in config.agent_names().unwrap() {
        let agent = config.load_agent(&name).unwrap();
        for variable in credentials {
            let passed = agent
                .pass_env
                .iter()
                .any(|pattern| match pattern.strip_suffix('*') {
                    Some(prefix) => variable.starts_with(prefix),
                    None => variable == pattern,
                });
            assert!(!passed, "{name} passes {variable}: {:?}", agent.pass_env);
        }
        let hosts: Vec<String> = agent
            .sandbox
            .allow_hosts
            .iter()
            .flatten()
            .map(ToString::to_string)
            .collect();
        for service in ingestion {
            assert!(
                !hosts
                    .iter()
                    .any(|host| host.trim_start_matches("*.") == service
                        || service.ends_with(host.trim_start_matches('*'))),
                "{name} lists {service}: {hosts:?}"
            );
        }
        assert!(
            !agent
                .sandbox
                .write
                .iter()
                .any(|path| path.starts_with("~/.cache")),
            "{name} writes the user's caches: {:?}",
            agent.sandbox.write
        );
    }
}
