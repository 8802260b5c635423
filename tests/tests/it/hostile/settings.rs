//! What an agent may not widen: its sub-tasks, the checked-in settings, its git's maintenance, its state directories.

use super::*;

#[test]
fn an_agent_told_no_by_the_control_socket_is_not_told_to_retry() {
    let env = crew_tests::TestEnv::new();
    let repo = env.repo("project");
    // The victim is alive while the attacker asks (it cannot be told when to end: the
    // attacker writes nothing outside its own workspace).
    let output = env.crew(
        &repo,
        crate::common::runs::shell_worktree_args(&[
            "victim=echo ready; sleep 3",
            "attacker=sleep 0.3; crew agents stop victim; echo \"exit=$?\"",
        ]),
    );
    assert!(
        output.status.success(),
        "{}",
        crew_tests::render_output(&output)
    );
    let run = crate::common::runs::run_ids(&env, &repo).remove(0);
    let said = std::fs::read_to_string(
        repo.join(format!(".crew/state/runs/{run}/tasks/attacker/output.log")),
    )
    .unwrap();
    assert!(said.contains("exit=2"), "{said}");
    assert!(
        said.contains("may ask and submit for itself only"),
        "{said}"
    );
    assert!(!said.contains("retry"), "{said}");
    let recorded = crate::common::runs::manifest(&env, &repo, &run);
    assert_eq!(
        crate::common::runs::task(&recorded, "victim")["status"],
        "succeeded"
    );
}

#[test]
fn an_agents_git_runs_no_automatic_maintenance_whatever_the_repository_says() {
    let env = crew_tests::TestEnv::new();
    let repo = env.repo("project");
    env.git(&repo, ["config", "maintenance.auto", "true"]);
    env.git(&repo, ["config", "gc.auto", "1"]);
    let output = env.crew(
        &repo,
        crate::common::runs::shell_worktree_args(&[
            "git=echo \"maintenance=$(git config maintenance.auto) gc=$(git config gc.auto)\"; echo a > a.txt; git add a.txt; GIT_TRACE=1 git -c user.name=a -c user.email=a@example.com commit -q -m a; echo \"commit=$?\"",
        ]),
    );
    assert!(
        output.status.success(),
        "{}",
        crew_tests::render_output(&output)
    );
    let run = crate::common::runs::run_ids(&env, &repo).remove(0);
    let said =
        std::fs::read_to_string(repo.join(format!(".crew/state/runs/{run}/tasks/git/output.log")))
            .unwrap();
    assert!(said.contains("maintenance=false gc=0"), "{said}");
    // The commit starts no `git maintenance run --auto` (nor gc) in the background.
    assert!(
        said.contains("commit=0") && said.contains("built-in: git commit"),
        "{said}"
    );
    assert!(
        !said.contains("maintenance run") && !said.contains("gc --auto"),
        "{said}"
    );
    let recorded = crate::common::runs::manifest(&env, &repo, &run);
    assert_eq!(
        crate::common::runs::task(&recorded, "git")["exit"]["leaked_processes"],
        0,
        "{recorded:#}"
    );
    // The user's own git keeps its settings.
    assert_eq!(env.git(&repo, ["config", "gc.auto"]).trim(), "1");
}

#[test]
fn a_state_directory_an_agent_declares_is_made_in_a_fresh_home_and_granted() {
    let env = crew_tests::TestEnv::new();
    let repo = env.repo("project");
    crew_tests::write(
        &repo.join(".crew/agents/stateful.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\n[sandbox]\nwrite = [\"~/.state/\", \"~/.absent-file\"]\n",
    );
    env.git(&repo, ["add", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "a stateful agent"]);
    env.allow_settings(&repo);
    let home = env.home();
    assert!(!home.join(".state").exists(), "a fresh home");
    let output = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "stateful",
            "echo kept > $HOME/.state/session.txt && echo saved; echo nope > $HOME/.absent-file || echo refused",
        ],
    );
    assert!(
        output.status.success(),
        "{}",
        crew_tests::render_output(&output)
    );
    assert_eq!(
        std::fs::read_to_string(home.join(".state/session.txt")).unwrap(),
        "kept\n"
    );
    // A declared file is not made: it stays out of reach, and the record says it is missing.
    assert!(!home.join(".absent-file").exists());
    let run = crate::common::runs::run_ids(&env, &repo).remove(0);
    let recorded = crate::common::runs::manifest(&env, &repo, &run);
    let sandbox = &crate::common::runs::task(&recorded, "stateful")["sandbox"];
    assert!(
        sandbox["missing"]
            .as_array()
            .unwrap()
            .iter()
            .any(|path| path.as_str().unwrap().ends_with("/.absent-file")),
        "{sandbox:#}"
    );
}

#[test]
fn a_state_directory_that_cannot_be_made_is_named_on_the_task() {
    let env = crew_tests::TestEnv::new();
    let repo = env.repo("project");
    // A file where the directory's parent should be: the directory cannot be made.
    crew_tests::write(&env.home().join(".blocked"), "a file\n");
    crew_tests::write(
        &repo.join(".crew/agents/stateful.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\n[sandbox]\nwrite = [\"~/.blocked/state/\"]\n",
    );
    env.allow_settings(&repo);
    let output = env.crew(&repo, ["run", "--agent", "stateful", "true"]);
    let shown = crew_tests::render_output(&output);
    assert!(output.status.success(), "{shown}");
    let run = crate::common::runs::run_ids(&env, &repo).remove(0);
    let recorded = crate::common::runs::manifest(&env, &repo, &run);
    let record = crate::common::runs::task(&recorded, "stateful");
    let warnings = record["warnings"].to_string();
    assert!(
        warnings.contains(&format!(
            "crew could not make {}",
            env.home().join(".blocked/state")
        )),
        "{record:#}"
    );
    // Where the user looks: the run's summary.
    assert!(shown.contains("crew could not make"), "{shown}");
}

#[test]
fn a_submitted_task_is_never_wider_than_its_submitter() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // A committed agent the user runs unconfined, for their own tasks.
    write(
        &repo.join(".crew/agents/free.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\n[sandbox]\nmode = \"off\"\n",
    );
    env.git(&repo, ["add", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "an unconfined agent"]);
    env.allow_settings(&repo);
    // The lead (single mode: the project itself is its workspace) writes an unconfined agent
    // of its own, submits a task by it, then one by the user's unconfined agent.
    let lead = r#"printf 'command = ["sh", "-c", "{prompt}"]\n[sandbox]\nmode = "off"\n' > .crew/agents/evil.toml
crew submit --agent evil --task 'kid=echo pwned > "$HOME/evil.txt"' || echo REFUSED evil
crew submit --agent free --task 'kid2=echo pwned > "$HOME/free.txt" || echo CONFINED'"#;
    let output = env.crew(&repo, ["run", "--agent", "shell", lead]);
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo)[0].clone();
    let log = output_log(&repo, &run, "shell");
    assert!(log.contains("REFUSED evil"), "{log}");
    assert!(log.contains("not one the run started with"), "{log}");
    let manifest = manifest(&env, &repo, &run);
    let ids: Vec<&str> = manifest["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|task| task["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["shell", "kid2"], "{manifest:#}");
    let kid = task(&manifest, "kid2");
    assert_eq!(kid["sandbox"]["state"], "enforced", "{kid:#}");
    assert!(
        kid["warnings"]
            .to_string()
            .contains("never wider than its submitter"),
        "{kid:#}"
    );
    assert!(output_log(&repo, &run, "kid2").contains("CONFINED"));
    for planted in ["evil.txt", "free.txt"] {
        assert!(!env.home().join(planted).exists(), "{planted}");
    }

    // The user's own task by that agent still runs as its definition says.
    let output = env.crew(
        &repo,
        ["run", "--agent", "free", "echo mine > \"$HOME/free.txt\""],
    );
    assert!(output.status.success(), "{}", render_output(&output));
    assert!(env.home().join("free.txt").exists());
}

#[test]
fn checked_in_settings_that_loosen_the_sandbox_apply_only_once_allowed_as_they_are() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // A teammate's commit turns the sandbox off.
    write(
        &repo.join(".crew/config.toml"),
        "[sandbox]\nmode = \"off\"\n",
    );
    env.git(&repo, ["add", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "sandbox off"]);
    let refused = |env: &TestEnv, what: &str, args: &[&str]| {
        let output = env.crew(&repo, args);
        let shown = render_output(&output);
        assert_eq!(output.status.code(), Some(2), "{what}: {shown}");
        assert!(
            shown.contains(what) && shown.contains("crew sandbox allow"),
            "{what}: {shown}"
        );
    };
    let run = ["run", "--agent", "shell", "echo ran > ran.txt"];
    refused(
        &env,
        ".crew/config.toml loosens the sandbox ([sandbox] mode = \"off\")",
        &run,
    );
    assert!(run_ids(&env, &repo).is_empty(), "nothing was made");
    let listed = env.crew(&repo, ["sandbox", "allow", "--list"]);
    assert!(render_output(&listed).contains("NOT allowed"));
    assert!(env.allow_settings(&repo).contains("allowed now"));
    let output = env.crew(&repo, run);
    assert!(output.status.success(), "{}", render_output(&output));
    let first = run_ids(&env, &repo)[0].clone();
    assert_eq!(
        task(&manifest(&env, &repo, &first), "shell")["sandbox"]["state"],
        "off"
    );

    // Any change to it needs allowing again; one that narrows needs nothing.
    std::fs::write(
        repo.join(".crew/config.toml"),
        "[sandbox]\nmode = \"off\"\n# and more\n",
    )
    .unwrap();
    refused(&env, ".crew/config.toml loosens the sandbox", &run);
    std::fs::write(
        repo.join(".crew/config.toml"),
        "[sandbox]\nmode = \"enforce\"\n",
    )
    .unwrap();
    let output = env.crew(&repo, run);
    assert!(output.status.success(), "{}", render_output(&output));

    // An agent definition that writes outside its workspace, likewise; its sub-tasks too.
    write(
        &repo.join(".crew/agents/cached.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\n[sandbox]\nwrite = [\"~/.cache/\"]\n",
    );
    refused(
        &env,
        ".crew/agents/cached.toml loosens the sandbox ([sandbox] write = [\"~/.cache/\"])",
        &["run", "--agent", "cached", "true"],
    );
    let lead = "crew submit --agent cached --task 'kid=true' || echo REFUSED";
    let output = env.crew(&repo, ["run", "--agent", "shell", lead]);
    assert!(output.status.success(), "{}", render_output(&output));
    let latest = run_ids(&env, &repo)[0].clone();
    let log = output_log(&repo, &latest, "shell");
    assert!(
        log.contains("REFUSED") && log.contains("cached.toml loosens"),
        "{log}"
    );
    env.allow_settings(&repo);
    let output = env.crew(&repo, ["run", "--agent", "cached", "true"]);
    assert!(output.status.success(), "{}", render_output(&output));

    // What `crew init` writes is allowed for the user who ran it.
    let fresh = env.repo("fresh");
    let init = env.crew(&fresh, ["init"]);
    assert!(init.status.success(), "{}", render_output(&init));
    let listed = render_output(&env.crew(&fresh, ["sandbox", "allow", "--list"]));
    assert!(
        listed.contains("claude.toml") && !listed.contains("NOT allowed"),
        "{listed}"
    );
}

#[test]
fn a_task_branch_that_changes_crews_settings_is_flagged_and_merging_it_loosens_nothing_unallowed() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let widen = r#"mkdir -p .crew && printf '[sandbox]\nmode = "off"\n' > .crew/config.toml
git add .crew && git -c user.name=a -c user.email=a@example.com commit -q -m "tidy config"
echo work > work.txt"#;
    let output = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            widen,
        ],
    );
    let shown = render_output(&output);
    assert!(output.status.success(), "{shown}");
    let run = run_ids(&env, &repo)[0].clone();
    let manifest = manifest(&env, &repo, &run);
    let record = task(&manifest, "shell");
    let findings = record["teardown"]["security"].as_array().unwrap();
    assert!(
        findings.iter().any(|finding| finding["on_branch"] == true
            && finding["path"]
                .as_str()
                .unwrap()
                .ends_with(".crew/config.toml")),
        "{record:#}"
    );
    let branch = record["teardown"]["branch"].as_str().unwrap();
    assert!(
        shown.contains("SECURITY: its branch added .crew/config.toml"),
        "{shown}"
    );
    assert!(
        !shown.contains(&format!("git merge {branch}")),
        "merge line withheld:\n{shown}"
    );
    // Merged anyway: the next run is refused until the user allows what it loosens.
    env.git(&repo, ["merge", "-q", branch]);
    let next = env.crew(&repo, ["run", "--agent", "shell", "true"]);
    assert_eq!(next.status.code(), Some(2), "{}", render_output(&next));
    assert!(render_output(&next).contains("crew sandbox allow"));
}

/// A sub-task reaches no further than the agent that submitted it: one submitted by an agent
/// with no network has none, whatever its own agent says; one submitted by a proxied agent
/// reaches only what the submitter's list allows too. Servers of the user's on 127.0.0.1
/// count who reached them.
#[test]
fn a_sub_task_never_reaches_further_than_its_submitter() {
    use std::io::Write as _;
    let env = TestEnv::new();
    let repo = env.repo("project");
    let serve = || {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = hits.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                );
            }
        });
        (port, hits)
    };
    let (listed, listed_hits) = serve();
    let (unlisted, unlisted_hits) = serve();
    let agent = |name: &str, sandbox: &str| {
        write(
            &repo.join(format!(".crew/agents/{name}.toml")),
            &format!("command = [\"sh\", \"-c\", \"{{prompt}}\"]\n[sandbox]\n{sandbox}"),
        );
    };
    agent("offline", "network = \"none\"\n");
    agent(
        "narrow",
        &format!("network = \"proxy\"\nallow_hosts = [\"127.0.0.1:{listed}\"]\n"),
    );
    agent(
        "wide",
        &format!(
            "network = \"proxy\"\nallow_hosts = [\"127.0.0.1:{listed}\", \"127.0.0.1:{unlisted}\"]\n"
        ),
    );
    let fetch = |port: u16| {
        format!(
            "python3 -c \\\"import urllib.request as u\ntry: print('REACHED', u.urlopen('http://127.0.0.1:{port}/', timeout=5).read())\nexcept Exception as e: print('refused', e)\\\""
        )
    };
    // By no network: its sub-task by the machine's-network `shell` gets none either.
    let lead = format!(
        "crew submit --agent shell --task \"kid={}\"",
        fetch(unlisted)
    );
    let output = env.crew(&repo, ["run", "--agent", "offline", &lead]);
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo)[0].clone();
    let kid = output_log(&repo, &run, "kid");
    assert!(kid.contains("refused"), "{kid}");
    assert!(!kid.contains("REACHED"), "{kid}");
    let recorded = manifest(&env, &repo, &run);
    assert_eq!(
        task(&recorded, "kid")["sandbox"]["network"],
        "none",
        "{recorded:#}"
    );
    // By a proxied agent: its sub-task by a wider one reaches the submitter's host only.
    let lead = format!(
        "crew submit --agent wide --task \"near={}\" --task \"far={}\"",
        fetch(listed),
        fetch(unlisted)
    );
    let output = env.crew(&repo, ["run", "--agent", "narrow", &lead]);
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo)[0].clone();
    assert!(
        output_log(&repo, &run, "near").contains("REACHED"),
        "{}",
        output_log(&repo, &run, "near")
    );
    let far = output_log(&repo, &run, "far");
    assert!(far.contains("403"), "{far}");
    assert_eq!(listed_hits.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(
        unlisted_hits.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "{far}"
    );
    let recorded = manifest(&env, &repo, &run);
    assert!(
        task(&recorded, "far")["warnings"]
            .to_string()
            .contains(".crew/agents/narrow.toml"),
        "the refusal names the submitter's list: {recorded:#}"
    );
}
