//! An agent in a worktree, its own git directory, and the user's history.

use super::*;

#[test]
fn an_agent_in_a_worktree_can_touch_neither_history_nor_any_branch_but_its_own() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // An earlier run's saved work, and history both packed and loose.
    let early_run = finished_run(
        &env,
        &repo,
        &[
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            "echo early > early.txt",
        ],
    );
    let early_branch = format!("crew/{early_run}-shell");
    env.git(&repo, ["gc", "-q"]);
    write(&repo.join("README.md"), "# changed, loose\n");
    env.git(&repo, ["commit", "-q", "-am", "a loose commit"]);
    let attack = attacks(&early_branch);
    commit_team(
        &env,
        &repo,
        &format!(
            r#"workspace_mode = "worktree"
[[tasks]]
id = "sib"
agent = "shell"
prompt = "echo sib > sib.txt"
[[tasks]]
id = "hostile"
agent = "shell"
prompt = '''{attack}'''
check = '''git update-ref -d refs/heads/{early_branch}; rm -f "$CREW_PROJECT_ROOT/.git/refs/heads/{early_branch}"; true'''
"#
        ),
    );
    let refs_before = refs(&env, &repo);
    let objects_before = objects(&repo);

    let output = env.crew(&repo, ["run", "t"]);
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo)[0].clone();
    let log = output_log(&repo, &run, "hostile");
    assert!(!log.contains("ESCAPED"), "an attack worked:\n{log}");
    assert!(log.contains("done"), "{log}");
    let manifest = manifest(&env, &repo, &run);
    let hostile = task(&manifest, "hostile");
    assert_eq!(hostile["sandbox"]["state"], "enforced", "{hostile:#}");
    assert_eq!(hostile["check"]["passed"], true, "{hostile:#}");

    // Nothing the repository held changed: its objects, every ref, the earlier run's reflog.
    let objects_after = objects(&repo);
    for object in &objects_before {
        assert!(
            objects_after.contains(object),
            "{object:?} changed or went: {objects_after:?}"
        );
    }
    let refs_after = refs(&env, &repo);
    for (name, id) in &refs_before {
        assert_eq!(refs_after.get(name), Some(id), "{name} moved or went");
    }
    assert!(
        !refs_after.contains_key("refs/tags/planted"),
        "{refs_after:?}"
    );
    assert!(
        repo.join(format!(".git/logs/refs/heads/{early_branch}"))
            .exists()
    );
    // The sibling's work and the agent's own are on their branches.
    let sib_branch = task(&manifest, "sib")["teardown"]["branch"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        env.git(&repo, ["show", &format!("{sib_branch}:sib.txt")]),
        "sib\n"
    );
    let branch = hostile["teardown"]["branch"].as_str().unwrap();
    let files = env.git(&repo, ["ls-tree", "-r", "--name-only", branch]);
    for file in ["work.txt", "left.txt"] {
        assert!(files.lines().any(|line| line == file), "{file} in {files}");
    }
    let subjects = env.git(&repo, ["log", "--format=%s", branch]);
    assert!(subjects.contains("agent's own commit"), "{subjects}");
    assert!(hostile["teardown"]["security"].is_null(), "{hostile:#}");

    // History reads, before and after an ordinary clean-up of the user's.
    env.git(&repo, ["fsck", "--full", "--no-progress"]);
    env.git(&repo, ["gc", "-q", "--prune=now"]);
    env.git(&repo, ["fsck", "--full", "--no-progress"]);
    assert_eq!(
        env.git(&repo, ["show", &format!("{early_branch}:early.txt")]),
        "early\n"
    );
    assert_eq!(
        env.git(&repo, ["show", "main:README.md"]),
        "# changed, loose\n"
    );
}

#[test]
fn an_agent_that_repoints_its_git_directory_has_its_own_work_committed_and_nothing_else() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let sibling = env.repo("sibling");
    write(&sibling.join("prod.env"), "SECRET=1\n");
    write(&sibling.join("untracked.txt"), "mine\n");
    let sibling_before = tree_fingerprint(sibling.as_std_path());
    let repoint = format!(
        r#"echo work > work.txt
G=$(git rev-parse --absolute-git-dir)
echo "{sibling}/.git" > "$G/commondir"
echo "{sibling}/.git" > "$G/gitdir"
echo "gitdir: {sibling}/.git" > .git
echo done"#
    );
    let output = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            &repoint,
        ],
    );
    let shown = render_output(&output);
    assert!(output.status.success(), "{shown}");
    let run = run_ids(&env, &repo)[0].clone();
    assert!(output_log(&repo, &run, "shell").contains("done"));
    let manifest = manifest(&env, &repo, &run);
    let record = task(&manifest, "shell");
    assert_eq!(record["sandbox"]["state"], "enforced", "{record:#}");

    // crew put its pointers back, said so, and took the agent's work — only the agent's.
    let findings = record["teardown"]["security"].to_string();
    for changed in ["agent/commondir", "agent/gitdir", "shell/.git"] {
        assert!(findings.contains(changed), "{changed}: {record:#}");
    }
    assert!(shown.contains("SECURITY"), "{shown}");
    let branch = record["teardown"]["branch"].as_str().unwrap();
    let files = env.git(&repo, ["ls-tree", "-r", "--name-only", branch]);
    assert!(files.lines().any(|line| line == "work.txt"), "{files}");
    assert!(
        !files.contains("prod.env") && !files.contains("untracked"),
        "{files}"
    );
    assert_eq!(tree_fingerprint(sibling.as_std_path()), sibling_before);
    env.git(&repo, ["fsck", "--full", "--no-progress"]);
}

#[test]
fn honest_git_works_in_a_worktree_after_the_user_packs_refs_and_collects_garbage_mid_task() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let go = crew_tests::signal(&repo, "go");
    let script = format!(
        r#"while [ ! -e {go} ]; do sleep 0.05; done
export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.com GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.com
echo one > one.txt && git add one.txt && git commit -q -m one && echo OK commit
echo two >> one.txt && git commit -q -a --amend -m "one, amended" && echo OK amend
echo wip > wip.txt && git add wip.txt && git stash -q && git stash pop -q && echo OK stash
git checkout -q -b mine && git checkout -q - && echo OK branch
git tag mine-tag && echo OK tag
git gc -q && echo OK gc"#
    );
    let mut child = env
        .crew_command(&repo)
        .args([
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            &script,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let run = wait_until(30, "the agent to start", || {
        let run = run_ids(&env, &repo).into_iter().next()?;
        (task(&manifest(&env, &repo, &run), "shell")["status"] == "running").then_some(run)
    });
    // The user tidies the repository while the agent works: its task branch becomes packed.
    env.git(&repo, ["gc", "-q"]);
    env.git(&repo, ["pack-refs", "--all"]);
    write(&go, "");
    let status = child.wait().unwrap();
    assert!(status.success());

    let log = output_log(&repo, &run, "shell");
    for step in ["commit", "amend", "stash", "branch", "tag", "gc"] {
        assert!(log.contains(&format!("OK {step}")), "{step}:\n{log}");
    }
    for noise in ["error", "fatal", "packed-refs.lock"] {
        assert!(!log.contains(noise), "{noise}:\n{log}");
    }
    let manifest = manifest(&env, &repo, &run);
    let branch = task(&manifest, "shell")["teardown"]["branch"]
        .as_str()
        .unwrap()
        .to_owned();
    let subjects = env.git(&repo, ["log", "--format=%s", &branch]);
    assert!(subjects.contains("one, amended"), "{subjects}");
    assert!(!subjects.lines().any(|line| line == "one"), "{subjects}");
    assert_eq!(
        env.git(&repo, ["show", &format!("{branch}:one.txt")]),
        "one\ntwo\n"
    );
    assert_eq!(
        env.git(&repo, ["show", &format!("{branch}:wip.txt")]),
        "wip\n"
    );
    // What the agent named in its own view stays there.
    let refs = refs(&env, &repo);
    assert!(
        !refs.contains_key("refs/heads/mine") && !refs.contains_key("refs/tags/mine-tag"),
        "{refs:?}"
    );
    env.git(&repo, ["fsck", "--full", "--no-progress"]);
}

#[test]
fn a_single_mode_agent_cannot_change_crews_settings_or_what_git_runs_for_the_user() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(&repo.join(".crew/config.toml"), "[run]\nmax_parallel = 2\n");
    write(
        &repo.join(".crew/agents/helper.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\n",
    );
    env.git(&repo, ["add", ".crew"]);
    env.git(&repo, ["commit", "-q", "-m", "crew settings"]);
    env.git(&repo, ["pack-refs", "--all"]);
    let watched = [
        ".crew/config.toml",
        ".crew/agents/helper.toml",
        ".git/config",
        ".git/packed-refs",
    ];
    let before: Vec<String> = watched
        .iter()
        .map(|path| std::fs::read_to_string(repo.join(path)).unwrap())
        .collect();
    let attack = r##"
try() { name=$1; shift; if ( "$@" ) 2>/dev/null; then echo "ESCAPED $name"; fi; }
try config sh -c 'printf "[sandbox]\nmode = \"off\"\n" >> .crew/config.toml'
try agent sh -c 'printf "command = [\"sh\"]\n[sandbox]\nmode = \"off\"\n" > .crew/agents/evil.toml'
try team sh -c 'echo x > .crew/teams/evil.toml'
try state sh -c 'for f in .crew/state/runs/*/manifest.json; do echo {} > "$f" && exit 0; done; exit 1'
try git-config git config core.fsmonitor "touch $HOME/fsmonitor-ran"
try git-hook sh -c 'printf "#!/bin/sh\ntouch $HOME/hook-ran\n" > .git/hooks/post-merge'
# Its own view of the git directory: planted there, the user's stays clean.
echo "* filter=evil" > .git/info/attributes
echo work > work.txt
git add work.txt && git -c user.name=agent -c user.email=agent@example.com commit -q -m "agent's work" && echo COMMITTED
# Its own view of the git directory: blanked there, the user's stays whole.
echo > .git/packed-refs && echo BLANKED
crew runs list > /dev/null && echo LISTED
echo done
"##;
    let output = env.crew(&repo, ["run", "--agent", "shell", attack]);
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo)[0].clone();
    let log = output_log(&repo, &run, "shell");
    assert!(!log.contains("ESCAPED"), "an attack worked:\n{log}");
    for step in ["COMMITTED", "BLANKED", "LISTED", "done"] {
        assert!(log.contains(step), "{step}:\n{log}");
    }
    let after: Vec<String> = watched
        .iter()
        .map(|path| std::fs::read_to_string(repo.join(path)).unwrap())
        .collect();
    assert_eq!(after, before);
    for planted in [
        ".crew/agents/evil.toml",
        ".crew/teams/evil.toml",
        ".git/hooks/post-merge",
        ".git/info/attributes",
    ] {
        assert!(!repo.join(planted).exists(), "{planted}");
    }
    let manifest = manifest(&env, &repo, &run);
    let record = task(&manifest, "shell");
    let read_only = record["sandbox"]["read_only"].to_string();
    assert!(
        read_only.contains("project/.crew") && read_only.contains(".git/config"),
        "{record:#}"
    );
    assert!(
        record["sandbox"]["private"]
            .to_string()
            .contains("project/.git"),
        "{record:#}"
    );
    // Single mode's agent works on the user's own checkout: its commit is on the user's branch.
    assert_eq!(
        env.git(&repo, ["log", "-1", "--format=%s", "main"]).trim(),
        "agent's work"
    );
    env.git(&repo, ["fsck", "--full", "--no-progress"]);
}

#[test]
fn what_an_agent_plants_in_a_submodules_git_directory_is_put_back_and_reported() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let library = env.repo("library");
    env.git(
        &repo,
        [
            "-c",
            "protocol.file.allow=always",
            "submodule",
            "add",
            "-q",
            library.as_str(),
            "lib",
        ],
    );
    env.git(&repo, ["commit", "-q", "-m", "a submodule"]);
    let config = repo.join(".git/modules/lib/config");
    let before = std::fs::read_to_string(&config).unwrap();
    let plant = r#"printf '[core]\n\tfsmonitor = "touch $HOME/fsmonitor-ran"\n' >> "$CREW_PROJECT_ROOT/.git/modules/lib/config" && echo PLANTED"#;
    let output = env.crew(&repo, ["run", "--agent", "shell", plant]);
    let shown = render_output(&output);
    let run = run_ids(&env, &repo)[0].clone();
    assert!(output_log(&repo, &run, "shell").contains("PLANTED"));
    let manifest = manifest(&env, &repo, &run);
    let record = task(&manifest, "shell");
    let findings = record["teardown"]["security"].to_string();
    assert!(findings.contains("modules/lib/config"), "{record:#}");
    assert!(shown.contains("SECURITY"), "{shown}");
    assert_eq!(std::fs::read_to_string(&config).unwrap(), before);
    env.git(&repo, ["status"]);
    assert!(!env.home().join("fsmonitor-ran").exists());
}

#[test]
fn an_agent_s_git_directory_reads_as_the_repository_s_annotated_tags_and_all() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    env.git(&repo, ["tag", "-a", "v1", "-m", "release one"]);
    env.git(&repo, ["tag", "light"]);
    // What a reader of refs sees (git itself, and readers of `packed-refs` such as GitPython,
    // which aider uses): each annotated tag peeled to its commit, as in the repository.
    let script = r#"git show-ref -d > refs.txt; git describe > described.txt; head -1 "$(git rev-parse --git-common-dir)/packed-refs" > header.txt"#;
    let run = env.crew(
        &repo,
        [
            "run",
            "--quiet",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            script,
        ],
    );
    let run_id = run_ids(&env, &repo).remove(0);
    assert!(
        run.status.success(),
        "{}\n{}",
        render_output(&run),
        output_log(&repo, &run_id, "shell")
    );
    let branch = format!("crew/{run_id}-shell");
    let seen = |file: &str| env.git(&repo, ["show", &format!("{branch}:{file}")]);
    let expected = env.git(&repo, ["show-ref", "-d", "--tags"]);
    let refs = seen("refs.txt");
    for line in expected.lines() {
        assert!(
            refs.lines().any(|seen| seen == line),
            "{line} not in {refs}"
        );
    }
    assert_eq!(seen("described.txt").trim(), "v1");
    let header = seen("header.txt");
    assert!(header.contains("peeled"), "{header}");
}
