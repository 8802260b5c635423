//! Runs through the real binary: making them, and reading what they recorded.

use camino::{Utf8Path, Utf8PathBuf};
use crew_tests::{TestEnv, render_output, write};

/// A repository with a team of three shell agents appending different lines to one file.
pub fn trio_repo(env: &TestEnv) -> Utf8PathBuf {
    let repo = env.dir("project");
    env.git(&repo, ["init", "-q", "-b", "main"]);
    write(&repo.join("notes.txt"), "first line\n");
    env.git(&repo, ["add", "-A"]);
    env.git(&repo, ["commit", "-q", "-m", "initial"]);
    write(
        &repo.join(".crew/teams/trio.toml"),
        r#"description = "three agents, one file"
[[tasks]]
id = "alpha"
agent = "shell"
prompt = "echo 'from alpha' >> notes.txt"

[[tasks]]
id = "beta"
agent = "shell"
prompt = "echo 'from beta' >> notes.txt"

[[tasks]]
id = "gamma"
agent = "shell"
prompt = "echo 'from gamma' >> notes.txt"
"#,
    );
    repo
}

/// Runs `crew args…` in `dir` to its end, which must be a success, and returns the new run's id.
pub fn finished_run(env: &TestEnv, dir: &Utf8Path, args: &[&str]) -> String {
    let output = env.crew(dir, args);
    assert!(output.status.success(), "{}", render_output(&output));
    run_ids(env, dir).remove(0)
}

/// `crew run --agent shell --workspace-mode worktree --task <task>…` in `dir`, to its end (it
/// must succeed); the run's id.
pub fn shell_worktree_run(env: &TestEnv, dir: &Utf8Path, tasks: &[&str]) -> String {
    let args = shell_worktree_args(tasks);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    finished_run(env, dir, &args)
}

/// The arguments of `crew run --agent shell --workspace-mode worktree --task <task>…`.
pub fn shell_worktree_args(tasks: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["run", "--agent", "shell", "--workspace-mode", "worktree"]
        .map(str::to_owned)
        .to_vec();
    for task in tasks {
        args.extend(["--task".to_owned(), (*task).to_owned()]);
    }
    args
}

/// The ids of the runs of the workspace at `dir` whose manifest can be read, newest first (a
/// run being made has its directory a moment before its manifest).
pub fn run_ids(env: &TestEnv, dir: &Utf8Path) -> Vec<String> {
    let output = env.crew(dir, ["runs", "list", "--json"]);
    assert!(output.status.success(), "{}", render_output(&output));
    let runs: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    runs.as_array()
        .unwrap()
        .iter()
        .filter(|run| run["error"].is_null())
        .map(|run| run["run_id"].as_str().unwrap().to_owned())
        .collect()
}

/// The record of task `id` in a run's manifest.
pub fn task<'a>(manifest: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    manifest["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|task| task["id"] == id)
        .unwrap()
}

/// The manifest of `run` once it can be read (`None` while the run is still being made).
pub fn try_manifest(env: &TestEnv, dir: &Utf8Path, run: &str) -> Option<serde_json::Value> {
    let output = env.crew(dir, ["runs", "show", run, "--json"]);
    output
        .status
        .success()
        .then(|| serde_json::from_slice(&output.stdout).ok())
        .flatten()
}

/// The manifest of `run`, as `crew runs show --json` prints it.
pub fn manifest(env: &TestEnv, dir: &Utf8Path, run: &str) -> serde_json::Value {
    let output = env.crew(dir, ["runs", "show", run, "--json"]);
    assert!(output.status.success(), "{}", render_output(&output));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// A repository `project` whose committed `.crew/config.toml` is `config`: the leader stays
/// clean for worktree runs.
pub fn repo_with_config(env: &TestEnv, config: &str) -> Utf8PathBuf {
    let repo = env.repo("project");
    write(&repo.join(".crew/config.toml"), config);
    env.git(&repo, ["add", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "crew config"]);
    repo
}

/// Waits (30 s at most) until `count` live agents of the workspace at `dir` last printed
/// `line`.
pub fn wait_for_agents_saying(env: &TestEnv, dir: &Utf8Path, line: &str, count: usize) {
    crew_tests::wait_until(30, &format!("{count} agent(s) to say {line:?}"), || {
        let agents = env.agents_json(dir)?;
        let saying = agents
            .as_array()?
            .iter()
            .filter(|agent| agent["last_line"] == line)
            .count();
        (saying == count).then_some(())
    });
}

/// `crew` in `dir` as on a kernel that refuses unprivileged user namespaces: started in a
/// user namespace of its own (root there) with `user.max_user_namespaces` at 0. Its arguments
/// follow.
pub fn crew_without_namespaces(env: &TestEnv, dir: &Utf8Path) -> std::process::Command {
    let crew = env.crew_command(dir);
    let mut command = std::process::Command::new("unshare");
    command.env_clear();
    for (name, value) in crew.get_envs() {
        if let Some(value) = value {
            command.env(name, value);
        }
    }
    command.current_dir(dir).args([
        "--user",
        "--map-root-user",
        "sh",
        "-c",
        "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$0\" \"$@\"",
        crew_tests::crew_bin().as_str(),
    ]);
    command
}

/// Whether `output` says the test machine could not make the user namespace
/// [`crew_without_namespaces`] starts crew in (then the test says it skipped).
pub fn namespace_refused_to_the_test(output: &std::process::Output) -> bool {
    let shown = render_output(output);
    let refused = shown.contains("unshare failed") || shown.contains("Operation not permitted");
    if refused {
        eprintln!("SKIPPED: this machine cannot make a user namespace for the test: {shown}");
    }
    refused
}

/// The record of task `id` of the newest run of `repo`, once `done` says so of it (two minutes
/// at most); with the run's id.
pub fn task_once(
    env: &TestEnv,
    repo: &Utf8Path,
    id: &str,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> (String, serde_json::Value) {
    crew_tests::wait_until(120, what, || {
        let run = run_ids(env, repo).into_iter().next()?;
        let record = task(&manifest(env, repo, &run), id).clone();
        done(&record).then_some((run, record))
    })
}
