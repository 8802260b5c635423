//! Questions, detached runs, other sessions' runs, a state directory turned read-only.

use super::*;

#[test]
fn a_question_waits_with_its_workspace_and_a_follow_up_answers_it() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/teams/curious.toml"),
        r#"workspace_mode = "worktree"
[[tasks]]
id = "painter"
agent = "shell"
prompt = "if [ -z \"$CREW_MESSAGE\" ]; then echo draft > canvas.txt; crew ask 'which color?'; exit 0; fi; echo \"$CREW_MESSAGE\" >> canvas.txt"
"#,
    );
    let mut child = env.spawn_crew(&repo, ["run", "curious"]);
    // The question shows as soon as it is asked; the agent's process ends just after.
    let agents = wait_until(30, "the question, and the agent to stop for it", || {
        let agents = env.agents_json(&repo)?;
        (agents[0]["question"] == "which color?" && agents[0]["state"] == "exited")
            .then_some(agents)
    });
    let worktree = agents[0]["dir"].as_str().unwrap().to_owned();
    assert_eq!(
        std::fs::read_to_string(format!("{worktree}/canvas.txt")).unwrap(),
        "draft\n",
        "the workspace is kept"
    );
    let list = env.crew(&repo, ["agents", "list"]);
    let run = run_ids(&env, &repo).remove(0);
    let redactor = Redactor::new(&env).literal(run.clone(), "[RUN_ID]");
    insta::assert_snapshot!(redactor.redact(&render_output(&list)), @"
    AGENT                       STATUS   PID  AGE   CMD    LAST
    [RUN_ID]:painter  waiting  -    [DURATION]  shell  asks: which color?
    [exit status: 0]
    ");

    let answer = env.crew(&repo, ["agents", "follow-up", "painter", "blue"]);
    assert!(answer.status.success(), "{}", render_output(&answer));
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let canvas = env.git(&repo, ["show", &format!("crew/{run}-painter:canvas.txt")]);
    assert_eq!(canvas, "draft\nblue\n");
}

#[test]
fn detach_returns_the_run_id_at_once_and_the_run_goes_on() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let started = Instant::now();
    let output = env.crew(
        &repo,
        [
            "run",
            "--detach",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "sleep 1; echo later > later.txt",
        ],
    );
    assert!(output.status.success(), "{}", render_output(&output));
    assert!(started.elapsed() < Duration::from_secs(10));
    let run = String::from_utf8(output.stdout).unwrap().trim().to_owned();
    assert_eq!(run_ids(&env, &repo), std::slice::from_ref(&run));
    wait_until(30, "the detached run to complete", || {
        (manifest(&env, &repo, &run)["status"] == "completed").then_some(())
    });
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-shell:later.txt")]),
        "later\n"
    );
}

#[test]
fn cancel_of_another_sessions_run_needs_force_but_a_detached_run_is_yours() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // A run in the foreground of another terminal session (setsid: a session of its own).
    let mut other = env.crew_command(&repo);
    other
        .args(["run", "--agent", "shell", "echo ready; sleep 600"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: setsid is async-signal-safe and only affects the child.
    #[allow(unsafe_code)]
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut other, || {
            rustix::process::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let mut other = other.spawn().unwrap();
    let run = wait_until(30, "the other session's run", || {
        let run = run_ids(&env, &repo).into_iter().next()?;
        (manifest(&env, &repo, &run)["tasks"][0]["status"] == "running").then_some(run)
    });
    let redactor = Redactor::new(&env).literal(run.clone(), "[RUN_ID]");
    let refused = env.crew(&repo, ["runs", "cancel", &run]);
    insta::assert_snapshot!(redactor.redact(&render_output(&refused)), @"
    ----- stderr -----
    error: run [RUN_ID] is hosted by another session (crew run, pid [PID])
    hint: cancel it anyway with `crew runs cancel [RUN_ID] --force`
    [exit status: 2]
    ");
    let forced = env.crew(&repo, ["runs", "cancel", &run, "--force"]);
    assert!(forced.status.success(), "{}", render_output(&forced));
    wait_until(30, "the run to be cancelled", || {
        (manifest(&env, &repo, &run)["status"] == "cancelled").then_some(())
    });
    other.wait().unwrap();
    // Who cancelled it, from where, and how: in the manifest, the events and `runs show`.
    let by = manifest(&env, &repo, &run)["cancelled_by"].clone();
    assert_eq!(by["cause"], "runs_cancel", "{by:#}");
    assert_eq!(by["forced"], true, "{by:#}");
    assert_eq!(by["other_session"], true, "{by:#}");
    assert_eq!(by["uid"], rustix::process::getuid().as_raw(), "{by:#}");
    assert!(by["pid"].as_u64().is_some_and(|pid| pid > 0), "{by:#}");
    let events =
        std::fs::read_to_string(repo.join(format!(".crew/state/runs/{run}/events.jsonl"))).unwrap();
    assert!(
        events
            .lines()
            .any(|line| line.contains("\"cancel_requested\"") && line.contains("\"forced\":true")),
        "{events}"
    );
    let show = env.crew(&repo, ["runs", "show", &run]);
    let show = String::from_utf8(show.stdout).unwrap();
    let line = show
        .lines()
        .find(|line| line.starts_with("cancelled "))
        .unwrap_or_default();
    let uid = format!("uid {}", rustix::process::getuid().as_raw());
    insta::assert_snapshot!(redactor.redact(&line.replace(&uid, "uid [UID]")), @"cancelled by `crew runs cancel --force` (pid [PID], uid [UID], from another session) at [TIMESTAMP]");

    // A detached run is the user's own: no --force needed.
    let output = env.crew(
        &repo,
        [
            "run",
            "--detach",
            "--agent",
            "shell",
            "echo ready; sleep 600",
        ],
    );
    assert!(output.status.success(), "{}", render_output(&output));
    let detached = String::from_utf8(output.stdout).unwrap().trim().to_owned();
    let cancelled = env.crew(&repo, ["runs", "cancel", &detached]);
    assert!(cancelled.status.success(), "{}", render_output(&cancelled));
    wait_until(30, "the detached run to be cancelled", || {
        (manifest(&env, &repo, &detached)["status"] == "cancelled").then_some(())
    });
    let by = manifest(&env, &repo, &detached)["cancelled_by"].clone();
    assert_eq!(by["forced"], false, "{by:#}");
    assert_eq!(
        by["other_session"], true,
        "a detached host has a session of its own: {by:#}"
    );
}

#[test]
fn a_state_directory_turned_read_only_mid_run_is_reported_and_loses_no_work() {
    // File permissions do not hold root back: crew runs as `nobody` here.
    if !crew_tests::can_drop_to_nobody() {
        return;
    }
    const NOBODY: u32 = crew_tests::NOBODY;
    let env = TestEnv::reachable_by_others();
    let repo = env.repo("project");
    env.hand_to_nobody();
    let go = crew_tests::signal(&repo, "go");
    let script = format!(
        "echo first > work.txt; echo ready; while [ ! -e {go} ]; do sleep 0.05; done; echo second >> work.txt"
    );
    let mut command = env.crew_command_for_others(&repo);
    command
        .args([
            "run",
            "--workspace-mode",
            "worktree",
            "--agent",
            "shell",
            &script,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command.uid(NOBODY);
    command.gid(NOBODY);
    let mut crew = command.spawn().unwrap();
    // Read as root once `nobody`'s crew made its state: a `crew` of root's that came first
    // would make the state's directories root's, which `nobody` could not write.
    crew_tests::wait_until(60, "crew to make its run", || {
        std::fs::read_dir(repo.join(".crew/state/runs"))
            .ok()?
            .next()
            .map(|_| ())
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let run = loop {
        let running = run_ids(&env, &repo).into_iter().next().filter(|run| {
            crate::common::runs::try_manifest(&env, &repo, run)
                .is_some_and(|record| record["tasks"][0]["status"] == "running")
        });
        if let Some(run) = running {
            break run;
        }
        // A crew that ended, or never got its agent going: what it said is the failure.
        if crew.try_wait().unwrap().is_some() || std::time::Instant::now() > deadline {
            let _ = crew.kill();
            let output = crew.wait_with_output().unwrap();
            panic!("the agent never ran: {}", render_output(&output));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    // The run's directory turns read-only under the running agent.
    let run_dir = repo.join(format!(".crew/state/runs/{run}"));
    let mode = |mode| std::fs::Permissions::from_mode(mode);
    std::fs::set_permissions(&run_dir, mode(0o555)).unwrap();
    write(&go, "");
    let output = crew.wait_with_output().unwrap();
    std::fs::set_permissions(&run_dir, mode(0o755)).unwrap();

    // The user is told what was not recorded, and where the work is.
    let rendered = render_output(&output);
    assert!(!output.status.success(), "{rendered}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("error: run {run} ended, but "))
            && stderr.contains("could not be recorded in .crew/state"),
        "{rendered}"
    );
    assert!(
        stderr.contains(&format!(
            "the agents' work is saved: shell in crew/{run}-shell"
        )),
        "{rendered}"
    );
    // No work is lost: all of it is on the task's branch.
    let show = std::process::Command::new("git")
        .args(["show", &format!("crew/{run}-shell:work.txt")])
        .current_dir(&repo)
        .uid(NOBODY)
        .gid(NOBODY)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("HOME", env.home())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&show.stdout),
        "first\nsecond\n",
        "{}",
        String::from_utf8_lossy(&show.stderr)
    );
}
