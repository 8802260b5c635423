//! Races: the user's git changes while an agent works, an admin entry pointed elsewhere, a workspace swapped under crew.

use super::*;

/// While a worktree task runs confined by the kernel (it cannot write the shared git
/// directory), the user sets a config value, adds a hook and runs `git gc`: those are the
/// user's, kept as they are, and nothing blames the agent for them.
#[test]
fn what_the_user_changes_in_git_while_a_confined_agent_works_is_kept_and_not_blamed() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let go = crew_tests::signal(&repo, "go");
    let script = format!("echo ready; while [ ! -e {go} ]; do sleep 0.05; done");
    let mut host = env.spawn_crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            &script,
        ],
    );
    crate::common::runs::wait_for_agents_saying(&env, &repo, "ready", 1);
    env.git(&repo, ["config", "user.name", "The User"]);
    write(&repo.join(".git/hooks/pre-push"), "#!/bin/sh\nexit 0\n");
    env.git(&repo, ["gc", "-q"]);
    let config = std::fs::read_to_string(repo.join(".git/config")).unwrap();
    write(&go, "");
    assert!(host.wait().unwrap().success());
    let run = run_ids(&env, &repo).remove(0);
    let record = manifest(&env, &repo, &run);
    let task = task(&record, "shell");
    assert_eq!(task["sandbox"]["state"], "enforced", "{task:#}");
    assert!(
        task["teardown"]["security"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "{task:#}"
    );
    assert_eq!(
        std::fs::read_to_string(repo.join(".git/config")).unwrap(),
        config
    );
    assert!(repo.join(".git/hooks/pre-push").exists());
}

/// With the sandbox off, an agent rewrites its worktree's admin entry to point at another
/// repository: reported, put back, and the worktree never goes to the pool pointing elsewhere.
#[test]
fn with_the_sandbox_off_an_admin_entry_pointed_elsewhere_is_put_back_and_reported() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let sibling = sibling_repo(&env);
    write(
        &repo.join(".crew/config.toml"),
        "[sandbox]\nmode = \"off\"\n",
    );
    env.allow_settings(&repo);
    let script = format!(
        "admin=$(sed -n 's/^gitdir: //p' .git); admin=${{admin%/agent}}; echo {sibling}/.git > \"$admin/commondir\"; echo changed > work.txt"
    );
    let output = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            &script,
        ],
    );
    let shown = render_output(&output);
    let run = run_ids(&env, &repo).remove(0);
    let record = manifest(&env, &repo, &run);
    let task = task(&record, "shell");
    let findings = task["teardown"]["security"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        findings.iter().any(|finding| finding["path"]
            .as_str()
            .is_some_and(|path| path.ends_with("/commondir"))
            && finding["restored"] == true),
        "{shown}\n{task:#}"
    );
    assert!(shown.contains("SECURITY"), "{shown}");
    // Its work is on its branch, in this repository.
    assert_eq!(
        env.git(&repo, ["show", &format!("crew/{run}-shell:work.txt")]),
        "changed\n"
    );
    // No entry leads elsewhere (one the pool is making or removing meanwhile may lack its
    // file).
    for admin in std::fs::read_dir(repo.join(".git/worktrees"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(commondir) = std::fs::read_to_string(admin.path().join("commondir")) {
            assert_eq!(commondir, "../..\n", "{:?}", admin.path());
        }
    }
}

/// An unconfined agent (sandbox off) whose workspace's run directory is swapped for a link
/// after crew checked it and before its warden entered it (the racer waits for the task's
/// `output.log`, which crew opens between the two): the warden enters the directory crew
/// checked, held open since, never the link's target.
#[test]
fn an_unconfined_agent_s_workspace_swapped_after_its_check_is_never_entered() {
    for (mode, parent) in [("worktree", ".worktrees"), ("dedicated", ".crew/state/ws")] {
        race_a_swapped_workspace(mode, parent, "[sandbox]\nmode = \"off\"\n", |runs, run| {
            runs.join(run).join("tasks/swap/output.log").exists()
        });
    }
}

/// A racing process watches where a task's workspace is made (`.crew/state/ws/`, or
/// `.worktrees/` without a pool) and, the moment it appears, moves its run's directory away and
/// puts a link to a directory of the user's (laid out the same way, a file in it) in its place:
/// the confined agent never works there (an unconfined one: the test above), nor does crew
/// write the task's checkout there.
#[test]
fn a_workspace_swapped_for_a_link_as_it_is_made_never_runs_the_agent_elsewhere() {
    for (mode, parent) in [("dedicated", ".crew/state/ws"), ("worktree", ".worktrees")] {
        race_a_swapped_workspace(mode, parent, "", |_, _| true);
    }
}
