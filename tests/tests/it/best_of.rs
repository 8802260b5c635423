//! Best of N: one task run several times, its attempts compared, one picked and landed; the
//! check command each result is held to, run as confined as the agent.

use camino::Utf8Path;
use crew_tests::{Redactor, TestEnv, render_output, write};

use crate::common::runs::{finished_run, manifest, run_ids, task};

/// A team `best` whose task `fix` runs three times: attempt 2 writes what the check wants,
/// attempts 1 and 3 do not (3 also writes a second file). The check passes when `src/lib.txt`
/// holds `good`.
fn best_of_three(env: &TestEnv) -> camino::Utf8PathBuf {
    let repo = env.repo("project");
    write(
        &repo.join(".crew/teams/best.toml"),
        r#"check = "grep -q good src/lib.txt || { echo \"no good in $CREW_TASK_ID\"; exit 3; }"

[[tasks]]
id = "fix"
agent = "shell"
attempts = 3
prompt = '''
case "$CREW_TASK_ID" in
  fix.2) printf 'one\ngood\nthree\n' > src/lib.txt ;;
  fix.3) printf 'one\nbad\nthree\n' > src/lib.txt; echo extra > extra.txt ;;
  *) printf 'one\nworse\nthree\n' > src/lib.txt ;;
esac
'''
"#,
    );
    repo
}

#[test]
fn best_of_three_with_a_check_compare_pick_and_land() {
    let env = TestEnv::new();
    let repo = best_of_three(&env);
    let run = finished_run(&env, &repo, &["run", "best"]);
    let recorded = manifest(&env, &repo, &run);
    // Recorded as what its attempts run in, not as the default mode.
    assert_eq!(recorded["workspace_mode"], "worktree", "{recorded:#}");
    let listed = env.crew(&repo, ["runs", "list", "--json"]);
    let runs: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(runs[0]["workspace_mode"], "worktree", "{runs:#}");

    // Three attempts, each on its own branch, each held to the check.
    for (number, passed) in [(1, false), (2, true), (3, false)] {
        let attempt = task(&recorded, &format!("fix.{number}"));
        assert_eq!(attempt["status"], "succeeded", "{recorded:#}");
        assert_eq!(
            attempt["attempt_of"],
            serde_json::json!({ "task": "fix", "number": number, "of": 3 })
        );
        assert_eq!(attempt["check"]["passed"], passed, "{attempt:#}");
        assert_eq!(
            attempt["teardown"]["branch"],
            format!("crew/{run}-fix.{number}")
        );
        // Alternatives never conflict with each other on the radar.
        assert!(attempt["overlaps"].is_null(), "{attempt:#}");
    }
    let failed = &task(&recorded, "fix.1")["check"];
    assert_eq!(failed["code"], 3);
    assert_eq!(failed["output_tail"], "no good in fix.1");
    assert_eq!(
        std::fs::read_to_string(repo.join(format!(".crew/state/runs/{run}/tasks/fix.3/check.log")))
            .unwrap(),
        "no good in fix.3\n"
    );

    // Side by side: files, lines, check.
    let redactor = Redactor::new(&env).literal(run.clone(), "[RUN_ID]");
    let compared = env.crew(&repo, ["compare", "fix"]);
    insta::assert_snapshot!(redactor.redact(&render_output(&compared)), @r#"
    [RUN_ID]:fix: 3 attempts of "case \"$CREW_TASK_ID\" in"

    ATTEMPT  STATUS     FILES  +/-    CHECK            COST  DURATION  BRANCH
    1        succeeded  1      +1 -1  failed (exit 3)  -     [DURATION]      crew/[RUN_ID]-fix.1
    2        succeeded  1      +1 -1  passed           -     [DURATION]      crew/[RUN_ID]-fix.2
    3        succeeded  2      +2 -1  failed (exit 3)  -     [DURATION]      crew/[RUN_ID]-fix.3

    FILE         1      2      3
    extra.txt    ·      ·      +1 -0
    src/lib.txt  +1 -1  +1 -1  +1 -1

    fix.1: check failed (exit 3): no good in fix.1
    fix.3: check failed (exit 3): no good in fix.3

    see one: crew diff [RUN_ID]:fix.<N>; keep one: crew pick [RUN_ID]:fix <N>
    [exit status: 0]
    "#);
    let json: serde_json::Value =
        serde_json::from_slice(&env.crew(&repo, ["compare", "fix", "--json"]).stdout).unwrap();
    let files: Vec<usize> = json["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|attempt| attempt["files"].as_array().unwrap().len())
        .collect();
    assert_eq!(files, [1, 1, 2], "{json:#}");

    // Nothing lands before a pick: the run's result for `fix` is not chosen yet.
    let main = env.git(&repo, ["rev-parse", "main"]);
    let unpicked = env.crew(&repo, ["diff", "fix"]);
    assert_eq!(
        unpicked.status.code(),
        Some(2),
        "{}",
        render_output(&unpicked)
    );
    // Nothing was landing: the hint goes back to what was asked.
    let said = render_output(&unpicked);
    assert!(
        said.contains("then show its work again") && !said.contains("land again"),
        "{said}"
    );
    let refused = env.crew(&repo, ["land", &run]);
    assert_eq!(
        refused.status.code(),
        Some(2),
        "{}",
        render_output(&refused)
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("none is picked yet"),
        "{}",
        render_output(&refused)
    );
    assert_eq!(env.git(&repo, ["rev-parse", "main"]), main);

    // Someone builds on attempt 3's branch: it holds more than the attempt now.
    let third = format!("crew/{run}-fix.3");
    let side = env.dir("side");
    env.git(&repo, ["worktree", "add", "-q", side.as_str(), &third]);
    write(&side.join("mine.txt"), "my own work\n");
    env.git(&side, ["add", "mine.txt"]);
    env.git(&side, ["commit", "-q", "-m", "my own work"]);
    env.git(&repo, ["worktree", "remove", side.as_str()]);
    let third_tip = env.git(&repo, ["rev-parse", &third]);

    let bad = env.crew(&repo, ["pick", "fix", "4"]);
    assert_eq!(bad.status.code(), Some(2), "{}", render_output(&bad));
    // An attempt whose check failed is not kept without a word.
    let failing = env.crew(&repo, ["pick", "fix", "1"]);
    let said = render_output(&failing);
    assert_eq!(failing.status.code(), Some(2), "{said}");
    assert!(
        said.contains("attempt fix.1 did not pass its check") && said.contains("--force"),
        "{said}"
    );
    assert_ne!(
        task(&manifest(&env, &repo, &run), "fix.1")["attempt_of"]["picked"],
        true
    );
    let picked = env.crew(&repo, ["pick", "fix", "2"]);
    assert!(picked.status.success(), "{}", render_output(&picked));
    let said = String::from_utf8_lossy(&picked.stdout).into_owned();
    assert!(
        said.contains(&format!("deleted crew/{run}-fix.1")),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "kept {third}: it holds commits the attempt did not make"
        )),
        "{said}"
    );
    let branches = env.git(
        &repo,
        ["branch", "--list", "crew/*", "--format=%(refname:short)"],
    );
    assert_eq!(
        branches.lines().collect::<Vec<_>>(),
        [format!("crew/{run}-fix.2"), third.clone()]
    );
    assert_eq!(
        env.git(&repo, ["rev-parse", &third]),
        third_tip,
        "untouched"
    );
    let recorded = manifest(&env, &repo, &run);
    assert_eq!(task(&recorded, "fix.2")["attempt_of"]["picked"], true);
    assert!(task(&recorded, "fix.1")["teardown"]["branch"].is_null());

    // The task's work is now the picked attempt's.
    let diff = env.crew(&repo, ["diff", "fix"]);
    assert!(
        String::from_utf8_lossy(&diff.stdout).contains("+good"),
        "{}",
        render_output(&diff)
    );

    // The run lands its result: the picked attempt, and says its check passed.
    let landed = env.crew(&repo, ["land", &run]);
    assert!(landed.status.success(), "{}", render_output(&landed));
    let said = String::from_utf8_lossy(&landed.stdout).into_owned();
    assert!(said.contains("landed fix.2 on main"), "{said}");
    assert!(said.contains("checks: fix.2 passed"), "{said}");
    assert_eq!(
        std::fs::read_to_string(repo.join("src/lib.txt")).unwrap(),
        "one\ngood\nthree\n"
    );
    assert!(!repo.join("extra.txt").exists());
}

#[test]
fn a_check_is_confined_like_its_agent_and_leaves_nothing_running() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let hooks = env.git(&repo, ["rev-parse", "--git-path", "hooks"]);
    let hook = repo.join(hooks.trim()).join("post-checkout");
    // The agent writes the script its check will run: the script tries to reach out of the
    // workspace (the project, the shared git hooks), to find the control socket, and leaves a
    // daemon behind.
    let script = format!(
        r#"cat > check.sh <<'EOF'
echo planted > {root}/planted.txt && echo "wrote the project"
printf '#!/bin/sh\necho hooked\n' > {hook} && echo "planted a hook"
echo "socket=${{CREW_SOCKET:-none}} check=$CREW_CHECK"
setsid sleep 1000 < /dev/null > /dev/null 2>&1 &
echo "daemon=$!"
EOF
echo done > result.txt"#,
        root = repo,
        hook = hook,
    );
    let run = finished_run(
        &env,
        &repo,
        &[
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "--check",
            "sh check.sh",
            &script,
        ],
    );
    let recorded = manifest(&env, &repo, &run);
    let check = &task(&recorded, "shell")["check"];
    let tail = check["output_tail"].as_str().unwrap().to_owned();
    assert_eq!(check["passed"], true, "{check:#}");
    assert!(!repo.join("planted.txt").exists(), "{tail}");
    assert!(!hook.exists(), "{tail}");
    assert!(!tail.contains("wrote the project"), "{tail}");
    assert!(!tail.contains("planted a hook"), "{tail}");
    assert!(tail.contains("socket=none check=1"), "{tail}");
    let daemon: u32 = tail
        .lines()
        .find_map(|line| line.strip_prefix("daemon="))
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("{tail}"));
    assert!(
        !Utf8Path::new(&format!("/proc/{daemon}")).exists(),
        "the check's daemon {daemon} outlived it"
    );
}

#[test]
fn attempts_that_cannot_be_run_as_asked_are_refused_before_anything_starts() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/teams/chain.toml"),
        r#"[[tasks]]
id = "a"
agent = "shell"
prompt = "true"
attempts = 2

[[tasks]]
id = "b"
agent = "shell"
prompt = "true"
depends_on = ["a"]
attempts = 11
check = " "
"#,
    );
    let refused = env.crew(&repo, ["run", "chain"]);
    insta::assert_snapshot!(env.redact(&render_output(&refused)), @r"
    ----- stderr -----
    error: $TEST_ENV/project/.crew/teams/chain.toml:5:12: key `tasks[0].attempts`: task `b` depends on `a`, which would run 2 attempts: crew cannot know which one it builds on; run `a` on its own, `crew pick` an attempt, then start `b` from its branch (`crew run --base`)
    error: $TEST_ENV/project/.crew/teams/chain.toml:12:12: key `tasks[1].attempts`: attempts must be from 1 to 10, not 11
    error: $TEST_ENV/project/.crew/teams/chain.toml:13:9: key `tasks[1].check`: an empty check command: give one or leave the key out
    [exit status: 2]
    ");
    let single = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--attempts",
            "2",
            "--workspace-mode",
            "single",
            "true",
        ],
    );
    assert_eq!(single.status.code(), Some(2), "{}", render_output(&single));
    assert!(
        String::from_utf8_lossy(&single.stderr).contains("attempts need worktree mode"),
        "{}",
        render_output(&single)
    );
    let zero = env.crew(
        &repo,
        ["run", "--agent", "shell", "--attempts", "0", "true"],
    );
    assert_eq!(zero.status.code(), Some(2), "{}", render_output(&zero));
    assert!(run_ids(&env, &repo).is_empty(), "no run was made");
    assert_eq!(
        env.git(&repo, ["branch", "--list", "crew/*"]),
        "",
        "no branch was made"
    );
}

/// Starts `crew run --agent shell --check <check> true` and waits until its check runs and
/// has printed the pid of the process it leaves waiting: returns the host, the run, and that
/// pid.
fn run_with_a_long_check(
    env: &TestEnv,
    repo: &Utf8Path,
    check: &str,
) -> (std::process::Child, String, u32) {
    let mut host = env
        .crew_command(repo)
        .args(["run", "--agent", "shell", "--check", check, "true"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = host.stderr.take().unwrap();
    std::thread::spawn(
        move || {
            for _ in std::io::BufRead::lines(std::io::BufReader::new(stderr)) {}
        },
    );
    let run = crew_tests::wait_until(30, "the run", || run_ids(env, repo).into_iter().next());
    let log = repo.join(format!(".crew/state/runs/{run}/tasks/shell/check.log"));
    let sleeper = crew_tests::wait_until(30, "the check to start its sleeper", || {
        let text = std::fs::read_to_string(&log).ok()?;
        text.lines()
            .find_map(|line| line.strip_prefix("sleeper="))?
            .parse()
            .ok()
    });
    (host, run, sleeper)
}

/// Whether `pid` is gone (or a zombie nobody has reaped yet: it runs nothing).
fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

#[test]
fn a_running_check_is_shown_and_crew_agents_stop_stops_it() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let (mut host, run, sleeper) =
        run_with_a_long_check(&env, &repo, "sleep 120 & echo sleeper=$!; wait");
    // Listed as checking while it runs (the listing is published a moment after the check
    // started: on a busy machine, after its first line).
    let agents = crew_tests::wait_until(10, "the check to be listed", || {
        let listed = env.crew(&repo, ["agents", "list", "--json"]);
        let agents: serde_json::Value = serde_json::from_slice(&listed.stdout).ok()?;
        (agents[0]["state"] == "checking").then_some(agents)
    });
    assert_eq!(agents[0]["activity"], "checking", "{agents:#}");

    let stop = env.crew(&repo, ["agents", "stop", "shell"]);
    let said = render_output(&stop);
    assert!(stop.status.success(), "{said}");
    assert!(!said.contains("already exited"), "{said}");
    let status = host.wait().unwrap();
    assert!(status.code().is_some(), "{status:?}");
    crew_tests::wait_until(10, "the check's sleeper to be gone", || {
        gone(sleeper).then_some(())
    });
    let recorded = manifest(&env, &repo, &run);
    let check = &task(&recorded, "shell")["check"];
    assert_eq!(check["stopped"], true, "{check:#}");
    assert_eq!(check["passed"], false, "{check:#}");
    // Afterwards a failed check is not shown as a plain success.
    let listed = env.crew(&repo, ["agents", "list", "--all-runs"]);
    let table = render_output(&listed);
    assert!(table.contains("succeeded, check failed"), "{table}");
}

#[test]
fn ctrl_c_twice_kills_a_check_that_ignores_term() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/config.toml"),
        "[run]\nstop_grace = \"60s\"\n",
    );
    env.git(&repo, ["add", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "a long grace"]);
    let (mut host, run, sleeper) = run_with_a_long_check(
        &env,
        &repo,
        "trap '' TERM; sleep 120 & echo sleeper=$!; wait",
    );
    let started = std::time::Instant::now();
    let interrupt = || {
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&host),
            rustix::process::Signal::INT,
        )
        .unwrap();
    };
    interrupt();
    std::thread::sleep(std::time::Duration::from_millis(300));
    interrupt();
    let status = host.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(40),
        "the 60 s grace was not cut short"
    );
    crew_tests::wait_until(10, "the check's sleeper to be gone", || {
        gone(sleeper).then_some(())
    });
    let recorded = manifest(&env, &repo, &run);
    let check = &task(&recorded, "shell")["check"];
    assert_eq!(check["stopped"], true, "{check:#}");
    assert_eq!(check["passed"], false, "{check:#}");
}

#[test]
fn a_task_whose_check_failed_lands_only_when_forced() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let run = finished_run(
        &env,
        &repo,
        &[
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "--check",
            "exit 4",
            "echo work > work.txt",
        ],
    );
    let main = env.git(&repo, ["rev-parse", "main"]);
    let refused = env.crew(&repo, ["land", &run]);
    let said = render_output(&refused);
    assert_eq!(refused.status.code(), Some(2), "{said}");
    assert!(
        said.contains("the check of shell (failed (exit 4)) failed") && said.contains("--force"),
        "{said}"
    );
    assert_eq!(
        env.git(&repo, ["rev-parse", "main"]),
        main,
        "nothing landed"
    );
    let forced = env.crew(&repo, ["land", &run, "--force"]);
    assert!(forced.status.success(), "{}", render_output(&forced));
    assert_eq!(
        std::fs::read_to_string(repo.join("work.txt")).unwrap(),
        "work\n"
    );
}
