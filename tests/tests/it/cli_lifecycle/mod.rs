//! Interruptions and recoveries through the real binary: Ctrl-C once and twice, a host killed
//! mid-run and resumed, questions answered later, detached runs.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use camino::Utf8Path;
use crew_tests::{Redactor, TestEnv, render_output, wait_until, write};

use crate::common::runs::{manifest, run_ids};

mod cleaning;
mod questions;
mod resume;
mod signals;

fn signal(child: &Child, signal: rustix::process::Signal) {
    rustix::process::kill_process(rustix::process::Pid::from_child(child), signal).unwrap();
}

/// Starts `crew args…` in `dir` and waits until `count` agents print `ready`.
fn start_run(env: &TestEnv, dir: &Utf8Path, args: &[&str], count: usize) -> Child {
    let mut child = env
        .crew_command(dir)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    crate::common::runs::wait_for_agents_saying(env, dir, "ready", count);
    // Drain stderr so the host never blocks on it.
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || for _ in BufReader::new(stderr).lines() {});
    child
}

fn dirty_team(repo: &Utf8Path, trap_term: bool) {
    let trap = if trap_term { "trap '' TERM; " } else { "" };
    write(
        &repo.join(".crew/teams/busy.toml"),
        &format!(
            r#"workspace_mode = "worktree"
[[tasks]]
id = "one"
agent = "shell"
prompt = "{trap}echo 'unsaved one' > work-one.txt; echo ready; while true; do sleep 1; done"

[[tasks]]
id = "two"
agent = "shell"
prompt = "{trap}echo 'unsaved two' > work-two.txt; echo ready; while true; do sleep 1; done"
"#
        ),
    );
    write(
        &repo.join(".crew/config.toml"),
        "[run]\nstop_grace = \"30s\"\n",
    );
}

fn assert_work_saved(env: &TestEnv, repo: &Utf8Path, run: &str) {
    for task in ["one", "two"] {
        let saved = env.git(
            repo,
            ["show", &format!("crew/{run}-{task}:work-{task}.txt")],
        );
        assert_eq!(saved, format!("unsaved {task}\n"));
    }
    assert_eq!(env.task_worktrees(repo), Vec::<String>::new());
}

/// A run whose host is killed while it prepares the task's worktree, at a moment when the
/// worktree lacks files of the task's commit (as in the middle of its checkout): the project's
/// `setup` stands in for that moment, the first time only, by removing a committed file,
/// saying it is there, and waiting for its host to be killed. Returns the run.
fn kill_host_mid_preparation(env: &TestEnv, repo: &Utf8Path) -> String {
    let once = env.root().join("setup-ran");
    let there = env.root().join("setup-there");
    write(
        &repo.join(".crew/config.toml"),
        &format!(
            "[worktree]\nsetup = [\"sh\", \"-c\", \"if [ ! -e {once} ]; then touch {once}; rm src/lib.txt; touch {there}; while kill -0 $PPID 2>/dev/null; do sleep 0.05; done; fi\"]\n"
        ),
    );
    let mut child = env
        .crew_command(repo)
        .args([
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "echo done > agent.txt",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(30, "the preparation to reach its setup", || {
        there.exists().then_some(())
    });
    signal(&child, rustix::process::Signal::KILL);
    child.wait().unwrap();
    let listed = env.crew(repo, ["worktrees", "list"]);
    let shown = render_output(&listed);
    assert!(shown.contains("unfinished"), "{shown}");
    run_ids(env, repo).remove(0)
}

/// Runs `crew <args>` in `repo` as `nobody`, for whom file permissions hold.
fn crew_as_nobody(env: &TestEnv, repo: &Utf8Path, args: &[&str]) -> std::process::Output {
    let mut command = env.crew_command_for_others(repo);
    command
        .args(args)
        .uid(crew_tests::NOBODY)
        .gid(crew_tests::NOBODY);
    command.output().unwrap()
}
