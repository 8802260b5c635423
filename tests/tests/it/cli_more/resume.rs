//! Resuming agents of finished and going runs.

use super::*;

#[test]
fn resuming_an_agent_of_a_completed_run_is_refused_before_anything_is_said() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let output = env.crew(&repo, ["run", "--agent", "shell", "echo done"]);
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let resumed = env.crew(&repo, ["agents", "resume", "shell", "go on"]);
    let redactor = Redactor::new(&env).literal(run.clone(), "[RUN_ID]");
    insta::assert_snapshot!(redactor.redact(&render_output(&resumed)), @"
    ----- stderr -----
    error: task shell of run [RUN_ID] already succeeded, and its agent keeps no session to go on with; for more work, start a new run (its branch is where the work is)
    [exit status: 2]
    ");
}

#[test]
fn node_modules_copied_is_the_worktrees_own_and_never_the_agents_work() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(&repo.join(".gitignore"), "node_modules/\n");
    for index in 0..20 {
        write(
            &repo.join(format!("node_modules/pkg{index}/index.js")),
            &format!("module {index}\n"),
        );
    }
    std::os::unix::fs::symlink("../pkg1/index.js", repo.join("node_modules/pkg0/bin")).unwrap();
    write(
        &repo.join(".crew/config.toml"),
        "[worktree]\nlink_mode = \"copy\"\n",
    );
    env.git(&repo, ["add", ".gitignore", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "ignore node_modules"]);
    let leader = tree_fingerprint(repo.join("node_modules").as_std_path());
    // A sandboxed agent installs into its own node_modules, then does its work.
    let run = finished_run(
        &env,
        &repo,
        &[
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "test ! -L node_modules && test -L node_modules/pkg0/bin && echo patched > node_modules/pkg1/index.js && echo app > app.js",
        ],
    );
    let record = task(&manifest(&env, &repo, &run), "shell").clone();
    assert_eq!(record["status"], "succeeded", "{record:#}");
    assert_eq!(
        tree_fingerprint(repo.join("node_modules").as_std_path()),
        leader,
        "the leader's node_modules is untouched"
    );
    let branch = record["teardown"]["branch"].as_str().unwrap();
    let files = env.git(&repo, ["ls-tree", "-r", "--name-only", branch]);
    assert!(!files.contains("node_modules"), "{files}");
    assert!(files.lines().any(|line| line == "app.js"));
    assert!(
        record["teardown"]["ignored_paths"].is_null(),
        "the copy is crew's, not the agent's ignored files: {record:#}"
    );
}

#[test]
fn resuming_an_agent_of_a_finished_run_uses_its_resume_template_and_the_message() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/agents/retry.toml"),
        "command = [\"sh\", \"-c\", \"echo first try; exit 1\"]\nresume = [\"sh\", \"-c\", \"echo resumed with: {message} / $CREW_MESSAGE\"]\n",
    );
    let output = env.crew(&repo, ["run", "--agent", "retry", "do it"]);
    assert_eq!(output.status.code(), Some(1), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let resumed = env.crew(&repo, ["agents", "resume", "retry", "try again"]);
    assert!(resumed.status.success(), "{}", render_output(&resumed));
    let record = task(&manifest(&env, &repo, &run), "retry").clone();
    assert_eq!(record["status"], "succeeded", "{record:#}");
    let log = std::fs::read_to_string(
        repo.join(format!(".crew/state/runs/{run}/tasks/retry/output.log")),
    )
    .unwrap();
    assert!(log.starts_with("first try\n"), "{log}");
    assert!(
        log.ends_with("resumed with: try again / try again\n"),
        "{log}"
    );
}

#[test]
fn an_agent_stopped_while_its_run_goes_on_resumes_in_the_workspace_it_left() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut child = start_twice(
        &env,
        &repo,
        &[
            "--task",
            "keep=echo keeping; sleep 600",
            "--task",
            "victim=echo draft > draft.txt; echo started; sleep 600",
        ],
    );
    let agent_state = |id: &str| listed_agent(&env, &repo, id);
    wait_until(20, "both agents to run", || {
        let running = |id| agent_state(id) == Some(("running".into(), "running".into()));
        let log = std::fs::read_to_string(
            repo.join(".crew/state/runs")
                .join(run_ids(&env, &repo).first()?.as_str())
                .join("tasks/victim/output.log"),
        )
        .ok()?;
        (running("keep") && running("victim") && log.contains("started")).then_some(())
    });
    let run = run_ids(&env, &repo).remove(0);

    let stop = env.crew(&repo, ["agents", "stop", "victim"]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    wait_until(20, "the stopped task to be recorded", || {
        (agent_state("victim")?.0 == "stopped").then_some(())
    });
    let stopped = task(&manifest(&env, &repo, &run), "victim").clone();
    assert!(
        stopped["teardown"].is_null(),
        "the workspace is held: {stopped:#}"
    );
    assert!(
        stopped["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("crew agents resume {run}:victim")),
        "{stopped:#}"
    );

    let resumed = env.crew(&repo, ["agents", "resume", "victim", "go on"]);
    assert!(resumed.status.success(), "{}", render_output(&resumed));
    wait_until(20, "the resumed task to succeed", || {
        (agent_state("victim")?.0 == "succeeded").then_some(())
    });
    let log = std::fs::read_to_string(
        repo.join(format!(".crew/state/runs/{run}/tasks/victim/output.log")),
    )
    .unwrap();
    assert!(
        log.ends_with("resumed with draft: go on\n"),
        "the resume ran in the workspace the agent left: {log}"
    );
    assert_eq!(
        agent_state("keep"),
        Some(("running".into(), "running".into())),
        "the other agent never noticed"
    );

    // Once nothing but stopped tasks is left, the run ends.
    let stop = env.crew(&repo, ["agents", "stop", "keep"]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    child.wait().unwrap();
    let finished = manifest(&env, &repo, &run);
    assert_eq!(task(&finished, "keep")["status"], "stopped", "{finished:#}");
    assert_eq!(task(&finished, "keep")["reason"], "stopped by request");
    assert!(
        !task(&finished, "keep")["teardown"].is_null(),
        "{finished:#}"
    );
    let victim = task(&finished, "victim");
    let branch = victim["teardown"]["branch"].as_str().unwrap();
    let files = env.git(&repo, ["ls-tree", "-r", "--name-only", branch]);
    assert!(files.lines().any(|line| line == "draft.txt"), "{files}");
}

#[test]
fn a_finished_task_of_a_live_run_is_resumed_on_its_branch_while_the_run_goes_on() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut child = start_twice(
        &env,
        &repo,
        &[
            "--keep-going",
            "--task",
            "keep=sleep 600",
            "--task",
            "broken=echo draft > draft.txt; exit 3",
            "--task",
            "fine=true",
        ],
    );
    let status = |id: &str| listed_agent(&env, &repo, id).map(|(status, _)| status);
    wait_until(20, "the broken task to fail while the run goes on", || {
        (status("broken")? == "failed" && status("fine")? == "succeeded").then_some(())
    });
    let run = run_ids(&env, &repo).remove(0);

    let done = env.crew(&repo, ["agents", "resume", "fine"]);
    let redactor = Redactor::new(&env).literal(run.clone(), "[RUN_ID]");
    insta::assert_snapshot!(redactor.redact(&render_output(&done)), @"
    ----- stderr -----
    error: task fine of run [RUN_ID] already succeeded, and its agent keeps no session to go on with; for more work, start a new run (its branch is where the work is)
    [exit status: 2]
    ");

    let resumed = env.crew(&repo, ["agents", "resume", "broken", "fix it"]);
    insta::assert_snapshot!(redactor.redact(&render_output(&resumed)), @"
    resuming [RUN_ID]:broken: its task starts again in a new workspace on its branch
    [exit status: 0]
    ");
    wait_until(20, "the resumed task to succeed", || {
        (status("broken")? == "succeeded").then_some(())
    });
    let log = std::fs::read_to_string(
        repo.join(format!(".crew/state/runs/{run}/tasks/broken/output.log")),
    )
    .unwrap();
    assert!(
        log.ends_with("resumed with draft: fix it\n"),
        "the resume took up the branch the failed attempt left: {log}"
    );
    let stop = env.crew(&repo, ["agents", "stop", "keep"]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    child.wait().unwrap();
    let finished = manifest(&env, &repo, &run);
    assert_eq!(
        task(&finished, "broken")["status"],
        "succeeded",
        "{finished:#}"
    );
    assert_eq!(task(&finished, "broken")["attempts"], 2, "{finished:#}");
}
