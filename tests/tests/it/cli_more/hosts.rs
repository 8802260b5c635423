//! Hosts and their listings: a newer crew's runs, finding the host, the user's listing, ignored files.

use super::*;

#[test]
fn runs_of_a_newer_crew_are_never_cleaned_or_pruned() {
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
            "dedicated",
            "echo work > work.txt",
        ],
    );
    let path = repo.join(format!(".crew/state/runs/{run}/manifest.json"));
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json["schema_version"] = 99.into();
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    let work = repo.join(format!(".crew/state/ws/{run}/shell/work.txt"));

    let clean = env.crew(&repo, ["runs", "clean", &run]);
    let redactor = Redactor::new(&env).literal(run.clone(), "[RUN_ID]");
    insta::assert_snapshot!(redactor.redact(&render_output(&clean)), @"
    ----- stderr -----
    error: run [RUN_ID] was written by a newer crew (schema version 99); this crew leaves it as it is
    hint: clean it with the crew that made it
    [exit status: 2]
    ");
    write(
        &repo.join(".crew/config.toml"),
        "[retention]\nmax_kept_runs = 0\nautomatic = false\n",
    );
    let prune = env.crew(&repo, ["runs", "prune"]);
    assert!(prune.status.success(), "{}", render_output(&prune));
    assert!(work.exists(), "the newer run's workspace is still there");
    assert_eq!(run_ids(&env, &repo), [run]);
}

#[test]
fn agents_find_the_crew_that_hosts_them_even_off_the_users_path() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // crew started by its full path, with a PATH that does not hold it (as `cargo run` does).
    let output = env
        .crew_command(&repo)
        .env("PATH", "/usr/bin:/bin")
        .args(["run", "--agent", "shell", "command -v crew"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let log = std::fs::read_to_string(
        repo.join(format!(".crew/state/runs/{run}/tasks/shell/output.log")),
    )
    .unwrap();
    assert_eq!(log.trim(), crew_tests::crew_bin().as_str());
    // A finished agent's newest line is listed too.
    let listed = env.crew(&repo, ["agents", "list", "--all-runs", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed[0]["last_line"], crew_tests::crew_bin().as_str());
}

#[test]
fn an_agent_is_told_that_listing_agents_is_the_users() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let output = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "crew agents list; echo \"exit $?\"",
        ],
    );
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let log = std::fs::read_to_string(
        repo.join(format!(".crew/state/runs/{run}/tasks/shell/output.log")),
    )
    .unwrap();
    assert!(
        log.contains(&format!(
            "`crew agents list` runs inside agent {run}:shell: listing agents takes the user's own `crew`"
        )),
        "{log}"
    );
    assert!(log.contains("exit 2"), "{log}");
    assert!(!log.contains("AGENT "), "{log}");
}

#[test]
fn the_first_run_of_a_fresh_project_publishes_its_listing() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    assert!(!repo.join(".crew").exists());
    let mut child = env.spawn_crew(
        &repo,
        ["run", "--agent", "shell", "echo started; sleep 600"],
    );
    let live = repo.join(".crew/state/live");
    crew_tests::wait_until(20, "the host's published listing", || {
        std::fs::read_dir(&live)
            .ok()?
            .flatten()
            .any(|entry| entry.file_name().to_string_lossy().ends_with(".json"))
            .then_some(())
    });
    child.kill().unwrap();
    child.wait().unwrap();
}

/// `crew agents list` reads the listings hosts publish, before its command line is even
/// parsed (`crew_cli::quick`); a live host whose listing cannot be read is asked over its
/// socket instead, and its agents are listed all the same.
#[test]
fn a_live_host_whose_listing_cannot_be_read_is_asked_for_its_agents() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut child = env.spawn_crew(
        &repo,
        ["run", "--agent", "shell", "echo started; sleep 600"],
    );
    let listed = || {
        let output = env.crew(&repo, ["agents", "list", "--json"]);
        assert!(output.status.success(), "{}", render_output(&output));
        let agents: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        agents
            .as_array()
            .unwrap()
            .iter()
            .map(|agent| agent["task_id"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    // Published once its agent has said something (and nothing is written after that).
    wait_until(20, "the agent in the published listing", || {
        let listing = std::fs::read_dir(repo.join(".crew/state/live"))
            .ok()?
            .flatten()
            .find(|entry| entry.file_name().to_string_lossy().ends_with(".json"))?;
        std::fs::read_to_string(listing.path())
            .ok()?
            .contains("started")
            .then_some(())
    });
    assert_eq!(listed(), ["shell"]);
    // The listing names the host that wrote it, so no manifest is read to trust it: with the
    // run's manifest unreadable for a moment, its agent is listed all the same.
    let run = run_ids(&env, &repo).remove(0);
    let manifest_path = repo.join(format!(".crew/state/runs/{run}/manifest.json"));
    let kept = std::fs::read(&manifest_path).unwrap();
    std::fs::write(&manifest_path, "{ not a manifest").unwrap();
    let without_manifest = listed();
    std::fs::write(&manifest_path, &kept).unwrap();
    assert_eq!(without_manifest, ["shell"]);
    // The listing, spoiled: the host is alive and only its socket can tell.
    let listings: Vec<_> = std::fs::read_dir(repo.join(".crew/state/live"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    let published: Vec<Vec<u8>> = listings
        .iter()
        .map(|path| std::fs::read(path).unwrap())
        .collect();
    for path in &listings {
        std::fs::write(path, "{ not a listing").unwrap();
    }
    assert_eq!(listed(), ["shell"]);
    let table = env.crew(&repo, ["agents", "list"]);
    assert!(
        String::from_utf8_lossy(&table.stdout).contains("shell"),
        "{}",
        render_output(&table)
    );
    // Put back, then left by a host that died: its writer is not alive, so it is not
    // trusted, and nothing is listed.
    for (path, bytes) in listings.iter().zip(&published) {
        std::fs::write(path, bytes).unwrap();
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(listings.iter().any(|path| path.exists()));
    assert_eq!(listed(), Vec::<String>::new());
}

#[test]
fn an_agents_log_keeps_its_newest_output_within_its_limit() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/config.toml"),
        "[run]\nmax_output_log = \"64KiB\"\n",
    );
    // 3,000 numbered lines of 100 bytes: about 300 KB.
    let run = finished_run(
        &env,
        &repo,
        &[
            "run",
            "--agent",
            "shell",
            "i=0; while [ $i -lt 3000 ]; do printf 'line %05d %090d\\n' $i 0; i=$((i+1)); done",
        ],
    );
    let log = repo.join(format!(".crew/state/runs/{run}/tasks/shell/output.log"));
    let current = std::fs::read_to_string(&log).unwrap();
    let before = std::fs::read_to_string(format!("{log}.1")).unwrap();
    assert!(current.len() <= 64 * 1024 && before.len() <= 64 * 1024);
    assert!(
        current.starts_with("[crew: the log reached its limit of 64KiB;"),
        "{}",
        &current[..200]
    );
    assert!(current.ends_with(&format!("line 02999 {:090}\n", 0)));
    // `crew agents logs` shows both parts, in order, ending with the newest line.
    let logs = env.crew(&repo, ["agents", "logs", "shell"]);
    let shown = String::from_utf8(logs.stdout).unwrap();
    assert_eq!(shown, format!("{before}{current}"));
}

#[test]
fn an_agents_ignored_files_are_named_and_kept_and_never_reach_the_next_task() {
    let env = TestEnv::new();
    // One pooled worktree, the one the first task gives back: the next task must get it.
    let repo = crate::common::runs::repo_with_config(&env, "[worktree]\npool_size = 1\n");
    write(&repo.join(".gitignore"), ".env\nbuild/\n");
    env.git(&repo, ["add", ".gitignore"]);
    env.git(&repo, ["commit", "-q", "-m", "ignores"]);
    // The user's own global excludes hide notes.md from git too.
    write(&env.home().join("global-ignore"), "notes.md\n");
    write(
        &env.home().join(".gitconfig"),
        &format!(
            "[core]\n\texcludesFile = {}\n",
            env.home().join("global-ignore")
        ),
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
            "echo SECRET=1 > .env; mkdir build; echo o > build/out.o; echo n > notes.md; echo work > work.txt",
        ],
    );
    let record = task(&manifest(&env, &repo, &run), "shell").clone();
    let mut named: Vec<&str> = record["teardown"]["ignored_paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|path| path.as_str().unwrap())
        .collect();
    named.sort();
    assert_eq!(named, [".env", "build/", "notes.md"]);
    assert_eq!(record["teardown"]["ignored_files"], 3);
    assert_eq!(record["teardown"]["recycled"], true, "{record:#}");
    let kept = repo.join(format!(".crew/state/runs/{run}/tasks/shell/ignored"));
    assert_eq!(
        std::fs::read_to_string(kept.join("notes.md")).unwrap(),
        "n\n",
        "the file the global excludes hid is kept"
    );
    assert!(kept.join(".env").is_file() && kept.join("build/out.o").is_file());
    let shown = env.crew(&repo, ["runs", "show", &run]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains("3 ignored file(s) the agent wrote") && shown.contains("notes.md"),
        "{shown}"
    );

    // The next task gets the recycled worktree: none of it is there.
    let output = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "ls -A",
        ],
    );
    assert!(output.status.success(), "{}", render_output(&output));
    let next = run_ids(&env, &repo).remove(0);
    let pool = repo.join(".worktrees/.pool");
    assert_eq!(
        std::fs::read_dir(&pool).map_or(0, |entries| entries.count()),
        1,
        "the first worktree was taken from the pool and given back"
    );
    let listing = std::fs::read_to_string(
        repo.join(format!(".crew/state/runs/{next}/tasks/shell/output.log")),
    )
    .unwrap();
    for leftover in [".env", "build", "notes.md", "work.txt"] {
        assert!(
            !listing.lines().any(|line| line == leftover),
            "{leftover} reached the next task: {listing}"
        );
    }
}
