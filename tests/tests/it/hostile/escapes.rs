//! What a hostile agent tries against its workspace, the leader and crew's state, confined and with the sandbox off.

use super::*;

#[test]
fn a_hostile_agent_in_a_worktree_is_confined_and_its_work_kept() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let sibling = sibling_repo(&env);
    team(&env, &repo, &escapes(&sibling));
    // crew's own first run adds its exclude lines; the canaries are taken after that.
    let warmup = env.crew(&repo, ["run", "--agent", "shell", "true"]);
    assert!(warmup.status.success(), "{}", render_output(&warmup));
    let canaries = Canaries::new(&env, &repo, &sibling);
    let before = canaries.fingerprint();

    let output = env.crew(&repo, ["run", "hostile"]);
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo)[0].clone();
    let log = output_log(&repo, &run, "hostile");
    assert!(!log.contains("ESCAPED"), "an escape worked:\n{log}");
    assert!(log.contains("TMPDIR OK") && log.contains("done"), "{log}");
    // Its host's warden server was there to try, and it could not signal it.
    assert!(log.contains("WARDEN SERVER SEEN"), "{log}");
    assert_eq!(
        canaries.fingerprint(),
        before,
        "something outside crew's roots changed"
    );
    for planted in ["new.txt", "grandchild.txt", "fsmonitor-ran", "hook-ran"] {
        assert!(!env.home().join(planted).exists(), "{planted}");
    }
    assert!(!repo.join(".crew/state/planted").exists());

    let manifest = manifest(&env, &repo, &run);
    let record = task(&manifest, "hostile");
    assert_eq!(record["sandbox"]["state"], "enforced", "{record:#}");
    assert_eq!(record["status"], "succeeded");
    // The daemon it left, without its marker, went with the task and is on the record.
    assert!(
        record["exit"]["leaked_processes"].as_u64() >= Some(1),
        "{record:#}"
    );
    let daemons = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|entry| {
            std::fs::read(entry.path().join("cmdline"))
                .is_ok_and(|line| line == b"sleep\x006131\x00")
        })
        .count();
    assert_eq!(daemons, 0, "a daemon outlived its task");
    assert!(
        record["teardown"]["security"].is_null(),
        "nothing to restore: {record:#}"
    );
    // The legitimate work, the agent's commit and what it left uncommitted, is on its branch;
    // the link to `/` is committed as a link.
    let branch = record["teardown"]["branch"].as_str().unwrap();
    let files = env.git(&repo, ["ls-tree", "-r", "--name-only", branch]);
    for file in ["work.txt", "uncommitted.txt", "root-link"] {
        assert!(files.lines().any(|line| line == file), "{file} in {files}");
    }
    let link = env.git(&repo, ["cat-file", "-p", &format!("{branch}:root-link")]);
    assert_eq!(link, "/");
    let log = env.git(&repo, ["log", "--format=%s", branch]);
    assert!(log.contains("agent's own commit"), "{log}");
    env.git(&repo, ["fsck", "--no-progress"]);
}

#[test]
fn with_the_sandbox_off_crews_checks_still_hold() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let sibling = sibling_repo(&env);
    write(
        &repo.join(".crew/config.toml"),
        "[sandbox]\nmode = \"off\"\n",
    );
    env.allow_settings(&repo);
    let plant = r#"git config core.fsmonitor "touch $HOME/fsmonitor-ran"
printf '#!/bin/sh\ntouch $HOME/hook-ran\n' > "$CREW_PROJECT_ROOT/.git/hooks/post-merge"
chmod +x "$CREW_PROJECT_ROOT/.git/hooks/post-merge"
echo planted > planted.txt"#;
    // The agent swaps its worktree for a link to the sibling repository.
    let swap = format!(
        "echo work > work.txt; cd ..; mv \"$CREW_TASK_ID\" \"$CREW_TASK_ID.gone\"; ln -s {sibling} \"$CREW_TASK_ID\""
    );
    // The agent points its worktree's `.git` at the leader's repository.
    let repoint = "echo work > work.txt; echo \"gitdir: $CREW_PROJECT_ROOT/.git\" > .git";
    write(
        &repo.join(".crew/teams/hostile.toml"),
        &format!(
            "workspace_mode = \"worktree\"\nmax_parallel = 1\n\
             [[tasks]]\nid = \"plant\"\nagent = \"shell\"\nprompt = '''{plant}'''\n\
             [[tasks]]\nid = \"swap\"\nagent = \"shell\"\nprompt = '''{swap}'''\n\
             [[tasks]]\nid = \"repoint\"\nagent = \"shell\"\nprompt = '''{repoint}'''\n"
        ),
    );
    env.git(&repo, ["add", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "crew team"]);
    let warmup = env.crew(&repo, ["run", "--agent", "shell", "true"]);
    assert!(warmup.status.success(), "{}", render_output(&warmup));
    let sibling_before = tree_fingerprint(sibling.as_std_path());
    let leader_head = env.git(&repo, ["rev-parse", "HEAD"]);
    let config_before = std::fs::read_to_string(repo.join(".git/config")).unwrap();

    let output = env.crew(&repo, ["run", "hostile"]);
    let shown = render_output(&output);
    assert!(shown.contains("agents are NOT sandboxed"), "{shown}");
    let run = run_ids(&env, &repo)[0].clone();
    let manifest = manifest(&env, &repo, &run);

    // The tripwire put git's files back, kept what the agent wrote, and the merge line waits.
    let plant = task(&manifest, "plant");
    assert_eq!(plant["sandbox"]["state"], "off");
    let findings = plant["teardown"]["security"].as_array().unwrap();
    let changed: Vec<&str> = findings
        .iter()
        .map(|finding| finding["path"].as_str().unwrap())
        .collect();
    assert!(
        changed.iter().any(|path| path.ends_with(".git/config"))
            && changed
                .iter()
                .any(|path| path.ends_with("hooks/post-merge")),
        "{findings:#?}"
    );
    assert!(findings.iter().all(|finding| finding["restored"] == true));
    assert_eq!(
        std::fs::read_to_string(repo.join(".git/config")).unwrap(),
        config_before
    );
    assert!(!repo.join(".git/hooks/post-merge").exists());
    let plant_branch = plant["teardown"]["branch"].as_str().unwrap();
    assert!(shown.contains("SECURITY"), "{shown}");
    assert!(
        !shown.contains(&format!("git merge {plant_branch}")),
        "merge line withheld:\n{shown}"
    );
    let review = env.crew(&repo, ["runs", "show", &run]);
    let review = render_output(&review);
    assert!(
        review.contains(&format!("git merge {plant_branch}")),
        "{review}"
    );
    env.git(&repo, ["status"]);
    assert!(!env.home().join("fsmonitor-ran").exists());

    // The swapped workspace: nothing committed into the sibling, nothing of it deleted.
    let swap = task(&manifest, "swap");
    let reason = swap["teardown"]["preserved_reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("not the directory crew created") || reason.contains("replaced"),
        "{swap:#}"
    );
    assert_eq!(tree_fingerprint(sibling.as_std_path()), sibling_before);
    assert!(sibling.join("prod.env").exists());
    assert_ne!(swap["teardown"]["branch"], "main");

    // The repointed `.git`: put back and reported, the work on the task's own branch, nothing
    // committed onto the leader's.
    let repoint = task(&manifest, "repoint");
    let findings = repoint["teardown"]["security"].to_string();
    assert!(findings.contains("repoint/.git"), "{repoint:#}");
    let repoint_branch = repoint["teardown"]["branch"].as_str().unwrap();
    assert_eq!(
        env.git(&repo, ["show", &format!("{repoint_branch}:work.txt")])
            .trim(),
        "work"
    );
    assert_eq!(env.git(&repo, ["rev-parse", "HEAD"]), leader_head);
    assert_eq!(
        env.git(&repo, ["status", "--porcelain"]),
        "",
        "the leader's checkout is as it was"
    );
}

#[test]
fn a_dedicated_agent_cannot_commit_into_the_project() {
    for sandbox in ["enforce", "off"] {
        let env = TestEnv::new();
        let repo = env.repo("project");
        write(
            &repo.join(".crew/config.toml"),
            &format!("[sandbox]\nmode = \"{sandbox}\"\n"),
        );
        env.allow_settings(&repo);
        write(&repo.join("mine.txt"), "the user's untracked file\n");
        let head = env.git(&repo, ["rev-parse", "HEAD"]);
        let output = env.crew(
            &repo,
            [
                "run",
                "--agent",
                "shell",
                "--workspace-mode",
                "dedicated",
                "echo work > work.txt; git add -A && git -c user.name=a -c user.email=a@example.com commit -q -m agent && echo ESCAPED commit; true",
            ],
        );
        assert!(output.status.success(), "{}", render_output(&output));
        let run = run_ids(&env, &repo)[0].clone();
        let log = output_log(&repo, &run, "shell");
        assert!(!log.contains("ESCAPED"), "sandbox {sandbox}: {log}");
        assert_eq!(
            env.git(&repo, ["rev-parse", "HEAD"]),
            head,
            "sandbox {sandbox}"
        );
        let status = env.git(&repo, ["status", "--porcelain"]);
        assert!(
            status.contains("?? mine.txt"),
            "sandbox {sandbox}: {status}"
        );
        let dedicated = repo.join(format!(".crew/state/ws/{run}/shell/work.txt"));
        assert!(
            dedicated.exists(),
            "the agent's work stays in its workspace"
        );
        // Every field of an exit is in the JSON, as the README promises, zero or not.
        let listed = env.crew(&repo, ["agents", "list", "--all-runs", "--json"]);
        let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
        assert_eq!(
            listed[0]["exit"],
            serde_json::json!({
                "code": 0, "signal": null, "stopped_by": null,
                "leaked_processes": 0, "timed_out": false, "ended_after_session": false
            })
        );
    }
}

#[test]
fn sandbox_check_tries_the_kernel_and_shows_what_each_agent_may_write() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/agents/builder.toml"),
        "command = [\"make\"]\n[sandbox]\nwrite = [\"~/.cache\", \"/opt/absent-cache\"]\n",
    );
    std::fs::create_dir_all(env.home().join(".cache")).unwrap();
    let output = env.crew(&repo, ["sandbox", "check", "--json"]);
    assert!(output.status.success(), "{}", render_output(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["confines"], true, "{report:#}");
    let builder = &report["agents"][0];
    assert_eq!(builder["agent"], "builder");
    assert_eq!(builder["sandbox"], "enforced");
    assert_eq!(
        builder["write"],
        serde_json::json!([
            { "path": env.home().join(".cache"), "exists": true },
            { "path": "/opt/absent-cache", "exists": false },
        ])
    );
    assert_eq!(report["agents"][1]["agent"], "shell");

    write(
        &repo.join(".crew/config.toml"),
        "[sandbox]\nmode = \"off\"\n",
    );
    let output = env.crew(&repo, ["sandbox", "check", "builder"]);
    let shown = render_output(&output);
    assert!(
        shown.contains("agent builder (off)") && shown.contains("mode = \"off\""),
        "{shown}"
    );
}

/// A task waits on `crew ask`, its host is killed, and the run's record is edited (by an
/// agent working in the project, or by hand) to name another directory as the task's
/// workspace — in the manifest, or in the task journal the dead host left beside it: `crew
/// runs clean` must neither delete that directory nor commit into it.
#[test]
fn runs_clean_never_acts_on_a_workspace_an_edited_manifest_names() {
    for (mode, forged_in) in [
        ("temp", "manifest.json"),
        ("worktree", "manifest.json"),
        ("worktree", "changes.jsonl"),
    ] {
        let env = TestEnv::new();
        let repo = env.repo("project");
        let victim = sibling_repo(&env);
        let mut host = env.spawn_crew(
            &repo,
            [
                "run",
                "--agent",
                "shell",
                "--workspace-mode",
                mode,
                "echo draft > idea.txt; crew ask 'go on?'",
            ],
        );
        // Waiting in the run's record, not only in the live listing, which is told first.
        let run = crew_tests::wait_until(30, "the task to wait for its answer", || {
            let run = run_ids(&env, &repo).into_iter().next()?;
            // The run's directory may come a moment before its manifest.
            let recorded = try_manifest(&env, &repo, &run)?;
            (task(&recorded, "shell")["status"] == "waiting").then_some(run)
        });
        host.kill().unwrap();
        host.wait().unwrap();
        let journal = repo.join(format!(".crew/state/runs/{run}/changes.jsonl"));
        let path = repo.join(format!(".crew/state/runs/{run}/{forged_in}"));
        let real_root = if forged_in == "manifest.json" {
            // The next command finds the host dead and writes the run whole (interrupted),
            // its task journal folded in: the manifest is then the one record to forge.
            let listed = env.crew(&repo, ["runs", "list"]);
            assert!(listed.status.success(), "{}", render_output(&listed));
            assert!(!journal.exists(), "{mode}");
            let mut forged: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let workspace = &mut forged["tasks"][0]["workspace"];
            let real_root = Utf8PathBuf::from(workspace["root"].as_str().unwrap());
            workspace["root"] = victim.as_str().into();
            workspace["dir"] = victim.as_str().into();
            std::fs::write(&path, serde_json::to_vec_pretty(&forged).unwrap()).unwrap();
            real_root
        } else {
            // The task's latest record in the journal (or, where the host folded it into the
            // manifest, the manifest's, as a line of the manifest's generation), appended
            // again naming the victim: the next command folds it in as the record.
            // Named with the manifest's generation: a line of an older one is skipped.
            let recorded: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(
                    repo.join(format!(".crew/state/runs/{run}/manifest.json")),
                )
                .unwrap(),
            )
            .unwrap();
            let lines = std::fs::read_to_string(&journal).unwrap_or_default();
            let latest = lines
                .lines()
                .rev()
                .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
                .find(|line| line["task"]["workspace"].is_object());
            let mut forged = latest.unwrap_or_else(|| {
                serde_json::json!({
                    "at": recorded["updated_at"],
                    "task": recorded["tasks"][0],
                })
            });
            forged["journal"] = recorded["journal"].clone();
            assert!(forged["task"]["workspace"].is_object(), "{mode}: {forged}");
            let workspace = &mut forged["task"]["workspace"];
            let real_root = Utf8PathBuf::from(workspace["root"].as_str().unwrap());
            workspace["root"] = victim.as_str().into();
            workspace["dir"] = victim.as_str().into();
            let mut appended = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&journal)
                .unwrap();
            use std::io::Write as _;
            writeln!(appended, "{forged}").unwrap();
            real_root
        };
        let victim_before = tree_fingerprint(victim.as_std_path());
        let victim_head = env.git(&victim, ["rev-parse", "HEAD"]);

        let clean = env.crew(&repo, ["runs", "clean", &run]);
        let shown = render_output(&clean);
        assert_eq!(clean.status.code(), Some(2), "{mode}: {shown}");
        // A forged journal line is the record once folded into the manifest.
        let manifest = repo.join(format!(".crew/state/runs/{run}/manifest.json"));
        assert!(
            shown.contains("is not where this task's workspace belongs")
                && shown.contains(&format!("as recorded in {manifest}")),
            "{mode}: {shown}"
        );
        assert_eq!(
            tree_fingerprint(victim.as_std_path()),
            victim_before,
            "{mode}"
        );
        assert_eq!(
            env.git(&victim, ["rev-parse", "HEAD"]),
            victim_head,
            "{mode}"
        );
        assert!(
            real_root.join("idea.txt").exists(),
            "{mode}: the agent's real workspace is kept too"
        );
    }
}
