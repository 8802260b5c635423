//! Stopping and resuming agents, after their host died too.

use super::*;

#[test]
fn a_bare_task_name_means_the_same_agent_to_stop_and_to_resume() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // An earlier run has a task of the same name.
    let first = env.crew(
        &repo,
        crate::common::runs::shell_worktree_args(&["sc=true"]),
    );
    assert!(first.status.success(), "{}", render_output(&first));
    let mut args = crate::common::runs::shell_worktree_args(&[
        "sc=if [ -n \"$CREW_MESSAGE\" ]; then echo \"$CREW_MESSAGE\" > said.txt; exit 0; fi; echo ready; while true; do sleep 0.1; done",
    ]);
    args.insert(1, "--quiet".to_owned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut host = start_run(&env, &repo, &args, 1);
    let second = run_ids(&env, &repo).remove(0);

    let stop = env.crew(&repo, ["agents", "stop", "sc"]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    // Its only task stopped by a person: the run is cancelled, not failed; the command says
    // a task was stopped (1), not that it was interrupted (130).
    assert_eq!(host.wait().unwrap().code(), Some(1));
    assert_eq!(manifest(&env, &repo, &second)["status"], "cancelled");
    // Whoever follows the run learns last that the run no longer keeps it for a resume.
    let events =
        std::fs::read_to_string(repo.join(format!(".crew/state/runs/{second}/events.jsonl")))
            .unwrap();
    let last = events
        .lines()
        .rev()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|event| event["event"] == "task_status" && event["task"] == "sc")
        .unwrap();
    assert_eq!(last["reason"], "stopped by request", "{events}");
    let resume = env.crew(&repo, ["agents", "resume", "sc", "go on"]);
    assert!(resume.status.success(), "{}", render_output(&resume));
    let recorded = manifest(&env, &repo, &second);
    assert_eq!(
        crate::common::runs::task(&recorded, "sc")["status"],
        "succeeded",
        "{recorded:#}"
    );
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{second}-sc:said.txt")]),
        "go on\n"
    );
}

#[test]
fn a_dedicated_task_reads_as_done_and_a_plain_clean_keeps_its_only_copy() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let output = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "dedicated",
            "echo result > result.txt",
        ],
    );
    let said = render_output(&output);
    assert!(output.status.success(), "{said}");
    assert!(
        !said.contains("NOT ON ITS BRANCH") && !said.contains("kept with work not on a branch"),
        "{said}"
    );
    assert!(
        said.contains("its work is in its dedicated workspace"),
        "{said}"
    );
    assert!(!said.contains("crew runs clean"), "{said}");
    let run = run_ids(&env, &repo).remove(0);
    let result = repo.join(format!(".crew/state/ws/{run}/shell/result.txt"));
    assert!(result.is_file());

    let clean = env.crew(&repo, ["runs", "clean", &run]);
    let said = render_output(&clean);
    assert_eq!(clean.status.code(), Some(2), "{said}");
    assert!(
        said.contains("only copy") && said.contains("--force"),
        "{said}"
    );
    assert!(result.is_file(), "a plain clean keeps the work");
    let forced = env.crew(&repo, ["runs", "clean", &run, "--force"]);
    assert!(forced.status.success(), "{}", render_output(&forced));
    assert!(!result.exists());
}

#[test]
fn a_follow_up_queued_before_a_stop_reaches_the_agent_when_a_later_host_resumes_it() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut args = crate::common::runs::shell_worktree_args(&[
        "sc=if [ -n \"$CREW_MESSAGE\" ]; then echo \"$CREW_MESSAGE\" >> said.txt; exit 0; fi; echo ready; while true; do sleep 0.1; done",
    ]);
    args.insert(1, "--quiet".to_owned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut host = start_run(&env, &repo, &args, 1);
    let run = run_ids(&env, &repo).remove(0);
    let queued = env.crew(&repo, ["agents", "follow-up", "sc", "then the docs"]);
    assert!(queued.status.success(), "{}", render_output(&queued));
    let stop = env.crew(&repo, ["agents", "stop", "sc"]);
    assert!(stop.status.success(), "{}", render_output(&stop));
    host.wait().unwrap();
    // The host is gone: the follow-up waits on the task's record.
    let recorded = manifest(&env, &repo, &run);
    assert_eq!(
        crate::common::runs::task(&recorded, "sc")["follow_ups"],
        serde_json::json!(["then the docs"]),
        "{recorded:#}"
    );
    let resume = env.crew(&repo, ["agents", "resume", "sc"]);
    assert!(resume.status.success(), "{}", render_output(&resume));
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-sc:said.txt")]),
        "then the docs\n"
    );
    let recorded = manifest(&env, &repo, &run);
    let task = crate::common::runs::task(&recorded, "sc");
    assert_eq!(task["status"], "succeeded", "{recorded:#}");
    assert!(task["follow_ups"].is_null(), "delivered once: {recorded:#}");
}

#[test]
fn a_resume_does_not_run_again_an_agent_that_had_finished_when_its_host_died() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // The agent appends: run twice, its work would say so. The host is killed while the
    // task's check runs, after the agent's exit was recorded and before the teardown.
    let mut host = env
        .crew_command(&repo)
        .args([
            "run",
            "--quiet",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "--check",
            "test -f checked.flag || { touch checked.flag; sleep 600; }",
            "echo once >> work.txt",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(30, "the check to run", || {
        let agents = env.agents_json(&repo)?;
        (agents[0]["state"] == "checking").then_some(())
    });
    signal(&host, rustix::process::Signal::KILL);
    host.wait().unwrap();
    let run = run_ids(&env, &repo).remove(0);

    let resumed = env.crew(&repo, ["runs", "resume", &run]);
    assert!(resumed.status.success(), "{}", render_output(&resumed));
    let recorded = manifest(&env, &repo, &run);
    let task = crate::common::runs::task(&recorded, "shell");
    assert_eq!(task["status"], "succeeded", "{recorded:#}");
    assert_eq!(task["attempts"], 1, "not started again: {recorded:#}");
    assert_eq!(task["check"]["passed"], true, "{recorded:#}");
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-shell:work.txt")]),
        "once\n"
    );
}

#[test]
fn a_run_whose_creation_was_interrupted_before_its_manifest_is_named_and_cleaned() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let first = env.crew(&repo, ["run", "--agent", "shell", "true"]);
    assert!(first.status.success(), "{}", render_output(&first));
    let runs = repo.join(".crew/state/runs");
    let (old, new) = ("abcdefgh-0mx5aaaaa", "abcdefgh-0mx5bbbbb");
    for run in [old, new] {
        std::fs::create_dir(runs.join(run)).unwrap();
    }
    let aged = std::process::Command::new("touch")
        .args(["-d", "1 minute ago", runs.join(old).as_str()])
        .status()
        .unwrap();
    assert!(aged.success());
    let list = render_output(&env.crew(&repo, ["runs", "list"]));
    assert!(
        list.contains("never written (its creation was interrupted)"),
        "{list}"
    );
    let fresh = env.crew(&repo, ["runs", "clean", new]);
    assert_eq!(fresh.status.code(), Some(2), "{}", render_output(&fresh));
    assert!(runs.join(new).exists(), "one being made is left alone");
    let clean = env.crew(&repo, ["runs", "clean", old]);
    assert!(clean.status.success(), "{}", render_output(&clean));
    assert!(!runs.join(old).exists());
}

#[test]
fn a_run_resumed_after_its_host_died_mid_checkout_never_hands_the_agent_the_half_made_worktree() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let run = kill_host_mid_preparation(&env, &repo);
    let base = env.git(&repo, ["rev-parse", "HEAD"]);

    let resumed = env.crew(&repo, ["runs", "resume", &run]);
    let shown = render_output(&resumed);
    assert!(resumed.status.success(), "{shown}");
    // The task's work is the agent's file alone: nothing the checkout had not reached yet is
    // committed as deleted.
    let branch = format!("crew/{run}-shell");
    let changed = env.git(&repo, ["diff", "--name-status", base.trim(), &branch]);
    assert_eq!(changed.trim(), "A\tagent.txt", "{shown}");
    assert_eq!(
        env.git(&repo, ["show", &format!("{branch}:src/lib.txt")]),
        "one\ntwo\nthree\n"
    );
    assert!(shown.contains("it was made again from"), "{shown}");
}
