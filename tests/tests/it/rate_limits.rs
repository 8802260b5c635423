//! A provider's rate limit lowers how many of its tasks run (DESIGN §8c): while a task of a
//! provider waits for a limit to lift, crew starts no other task of that provider, which would
//! only meet the same limit; another provider's tasks take the free slots.

use crew_tests::{TestEnv, render_output, wait_until, write};

use crate::common::runs::{manifest, run_ids, task};

/// The stand-in of Claude Code as two definitions: `claude` and `other` (no credentials, so
/// each is a provider of its own name).
fn project_with_two_providers(env: &TestEnv) -> camino::Utf8PathBuf {
    let repo = env.repo("project");
    let fake = crew_tests::helper_bin("fake-claude");
    let flags =
        r#""-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose""#;
    let definition = format!(
        "command = [\"{fake}\", {flags}]\nresume = [\"{fake}\", \"--resume\", \"{{session_id}}\", {flags}]\nprotocol = \"claude-stream-json\"\n"
    );
    write(&repo.join(".crew/agents/claude.toml"), &definition);
    write(&repo.join(".crew/agents/other.toml"), &definition);
    repo
}

/// Where in the run's events `task` first reached `status` (after the event at `after`): the
/// log is in the order the run recorded them, which two events of one millisecond keep.
fn first_at(
    events: &[serde_json::Value],
    task: &str,
    status: &str,
    after: Option<usize>,
) -> Option<usize> {
    events.iter().enumerate().position(|(at, event)| {
        after.is_none_or(|after| at > after)
            && event["event"] == "task_status"
            && event["task"] == task
            && event["status"] == status
    })
}

#[test]
fn a_limited_provider_s_next_task_waits_for_the_limit_while_another_provider_s_takes_the_slot() {
    let env = TestEnv::new();
    let repo = project_with_two_providers(&env);
    // One slot. `limited` pauses on its provider's limit for a few seconds; `after` is of the
    // same provider, `elsewhere` of another.
    write(
        &repo.join(".crew/teams/limited.toml"),
        "workspace_mode = \"worktree\"\non_limit = \"pause\"\nmax_parallel = 1\n\n[[tasks]]\nid = \"limited\"\nagent = \"claude\"\nprompt = \"write limited.txt then hit the limit for 4 seconds\"\n\n[[tasks]]\nid = \"after\"\nagent = \"claude\"\nprompt = \"write after.txt\"\n\n[[tasks]]\nid = \"elsewhere\"\nagent = \"other\"\nprompt = \"write elsewhere.txt\"\n",
    );
    let run = env.crew(&repo, ["run", "limited"]);
    assert!(run.status.success(), "{}", render_output(&run));
    let run = run_ids(&env, &repo).remove(0);
    let recorded = manifest(&env, &repo, &run);
    for id in ["limited", "after", "elsewhere"] {
        assert_eq!(task(&recorded, id)["status"], "succeeded", "{recorded:#}");
    }
    let events: Vec<serde_json::Value> =
        std::fs::read_to_string(repo.join(format!(".crew/state/runs/{run}/events.jsonl")))
            .unwrap()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect();
    let at = |task: &str, status: &str, after: Option<usize>| {
        first_at(&events, task, status, after)
            .unwrap_or_else(|| panic!("{task} was never {status}: {events:#?}"))
    };
    let paused = at("limited", "paused", None);
    let after = at("after", "preparing", None);
    let elsewhere = at("elsewhere", "preparing", None);
    assert!(
        elsewhere > paused && elsewhere < after,
        "the other provider's task took the slot the pause freed: {events:#?}"
    );
    // `limited` went on when its limit lifted (its second start), and only then did its
    // provider's next task start.
    let went_on = at("limited", "running", Some(paused));
    assert!(
        after > went_on,
        "the limited provider's next task started before its limit lifted: {events:#?}"
    );
}

#[test]
fn a_limited_provider_holds_its_tasks_with_slots_free_until_a_resume_lifts_it() {
    let env = TestEnv::new();
    let repo = project_with_two_providers(&env);
    write(
        &repo.join(".crew/teams/held.toml"),
        "workspace_mode = \"worktree\"\non_limit = \"pause\"\nmax_parallel = 4\n\n[[tasks]]\nid = \"limited\"\nagent = \"claude\"\nprompt = \"write limited.txt then hit the limit for 3600 seconds\"\n\n[[tasks]]\nid = \"after\"\nagent = \"claude\"\nprompt = \"write after.txt\"\ndepends_on = [\"gate\"]\n\n[[tasks]]\nid = \"gate\"\nagent = \"shell\"\nprompt = \"sleep 2\"\n",
    );
    let mut host = env.spawn_crew(&repo, ["run", "held"]);
    // `gate` ends while `limited` waits for its limit: three slots are free, and `after` is
    // ready, but of the limited provider.
    let run = wait_until(30, "the gate to finish while the limit holds", || {
        let run = run_ids(&env, &repo).into_iter().next()?;
        let recorded = manifest(&env, &repo, &run);
        (task(&recorded, "limited")["status"] == "paused"
            && task(&recorded, "gate")["status"] == "succeeded")
            .then_some(run)
    });
    std::thread::sleep(std::time::Duration::from_secs(2));
    let recorded = manifest(&env, &repo, &run);
    assert_eq!(
        task(&recorded, "after")["status"],
        "pending",
        "{recorded:#}"
    );
    // Whose limit it is, for the board's header: a definition with no credential is a
    // provider of its own name.
    assert_eq!(
        task(&recorded, "limited")["limit"]["provider"],
        "claude",
        "{recorded:#}"
    );
    // A person need not wait: resumed, the limited task goes on, and its provider ramps up.
    let resumed = env.crew(&repo, ["agents", "resume", &format!("{run}:limited")]);
    assert!(resumed.status.success(), "{}", render_output(&resumed));
    let ended = wait_until(60, "the run's end", || host.try_wait().unwrap());
    assert!(ended.success());
    let recorded = manifest(&env, &repo, &run);
    for id in ["limited", "after", "gate"] {
        assert_eq!(task(&recorded, id)["status"], "succeeded", "{recorded:#}");
    }
}
