//! An agent in single mode, its private view of git, and the user's history.

use super::*;

/// A `single` task works in the project itself, so its git directory is the user's: the agent
/// sees a private view of it. Its attacks on the history, on other branches (an earlier run's,
/// a sibling's saved work, the user's own), on other tasks' worktrees and on crew's pool land
/// in its view or are refused; its own commit on the checkout's branch, and a branch it made,
/// reach the repository.
#[test]
fn an_agent_in_single_mode_can_touch_neither_history_nor_any_branch_but_its_own() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    env.git(&repo, ["branch", "users-own"]);
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
    let loose_commit = env.git(&repo, ["rev-parse", "HEAD"]).trim().to_owned();
    let loose = format!("{}/{}", &loose_commit[..2], &loose_commit[2..]);
    // One at a time: the sibling's work is saved, and its worktree pooled, before the agent.
    let attack = format!(
        r#"
export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.com GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.com
C="$CREW_PROJECT_ROOT/.git"
try() {{ name=$1; shift; if ( "$@" ) 2>/dev/null; then echo "ESCAPED $name"; fi; }}
echo work > work.txt && git add work.txt && git commit -q -m "agent's own commit" && echo COMMITTED
git branch agent-topic && echo BRANCHED
git update-ref refs/heads/{early_branch} HEAD
git update-ref -d "refs/heads/crew/$CREW_RUN_ID-sib"
git update-ref refs/heads/users-own HEAD
git tag -f planted
chmod u+w "$C/objects/{loose}" && printf x > "$C/objects/{loose}" && echo REWROTE-IN-VIEW
try pool-worktree sh -c 'for d in "$CREW_PROJECT_ROOT"/.worktrees/.pool/*/; do echo x > "$d/planted.txt" && exit 0; done; exit 1'
try admin-entry sh -c 'for d in "$0"/worktrees/*/; do echo /elsewhere/.git > "$d/gitdir" && exit 0; done; exit 1' "$C"
try config sh -c 'echo "[core]" >> "$0/config"' "$C"
rm -f "$C"/objects/pack/*.pack && echo PACKS-GONE-IN-VIEW
mkdir -p "$C/objects/ab" && echo x > "$C/objects/ab/cdef"
rm -rf "$C"/logs/refs/heads/crew
rm -rf "$C"/refs/heads/crew
echo > "$C/packed-refs"
git reflog expire --expire=now --all
git gc -q --prune=now
git repack -q -a -d
echo done
"#
    );
    commit_team(
        &env,
        &repo,
        &format!(
            r#"max_parallel = 1
[[tasks]]
id = "sib"
agent = "shell"
prompt = "echo sib > sib.txt"
workspace_mode = "worktree"
[[tasks]]
id = "hostile"
agent = "shell"
prompt = '''{attack}'''
workspace_mode = "single"
"#
        ),
    );
    let refs_before = refs(&env, &repo);
    let objects_before = objects(&repo);

    let output = env.crew(&repo, ["run", "t"]);
    let shown = render_output(&output);
    assert!(output.status.success(), "{shown}");
    let run = run_ids(&env, &repo)[0].clone();
    let log = output_log(&repo, &run, "hostile");
    assert!(!log.contains("ESCAPED"), "an attack worked:\n{log}");
    for step in [
        "COMMITTED",
        "BRANCHED",
        "PACKS-GONE-IN-VIEW",
        "REWROTE-IN-VIEW",
        "done",
    ] {
        assert!(log.contains(step), "{step}:\n{log}");
    }
    let manifest = manifest(&env, &repo, &run);
    let hostile = task(&manifest, "hostile");
    assert_eq!(hostile["sandbox"]["state"], "enforced", "{hostile:#}");
    assert!(
        hostile["sandbox"]["private"]
            .to_string()
            .contains("project/.git"),
        "{hostile:#}"
    );

    // Nothing the repository held changed: its objects, every ref but the checkout's branch.
    let objects_after = objects(&repo);
    for object in &objects_before {
        assert!(
            objects_after.contains(object),
            "{object:?} changed or went: {objects_after:?}"
        );
    }
    let sib_branch = task(&manifest, "sib")["teardown"]["branch"]
        .as_str()
        .unwrap()
        .to_owned();
    let refs_after = refs(&env, &repo);
    for (name, id) in &refs_before {
        if name == "refs/heads/main" {
            continue;
        }
        assert_eq!(refs_after.get(name), Some(id), "{name} moved or went");
    }
    assert!(
        refs_after.contains_key(&format!("refs/heads/{sib_branch}")),
        "{refs_after:?}"
    );
    assert!(
        repo.join(format!(".git/logs/refs/heads/{early_branch}"))
            .exists()
    );
    // Its own: the commit on the checkout's branch, and the branch and the tag it made.
    assert_eq!(
        env.git(&repo, ["log", "-1", "--format=%s", "main"]).trim(),
        "agent's own commit"
    );
    assert_eq!(
        refs_after.get("refs/heads/agent-topic"),
        refs_after.get("refs/heads/main")
    );
    assert_eq!(
        refs_after.get("refs/tags/planted"),
        refs_after.get("refs/heads/main")
    );
    // What it tried on others' refs and on git's files is said.
    let findings = hostile["teardown"]["security"].to_string();
    for moved in [early_branch.as_str(), sib_branch.as_str(), "users-own"] {
        assert!(findings.contains(moved), "{moved}: {hostile:#}");
    }
    assert!(shown.contains("SECURITY"), "{shown}");
    assert!(
        !repo.join(".git/objects/ab/cdef").exists(),
        "a planted object"
    );

    // History reads, before and after an ordinary clean-up of the user's.
    env.git(&repo, ["fsck", "--full", "--no-progress"]);
    env.git(&repo, ["gc", "-q", "--prune=now"]);
    env.git(&repo, ["fsck", "--full", "--no-progress"]);
    assert_eq!(
        env.git(&repo, ["show", &format!("{early_branch}:early.txt")]),
        "early\n"
    );
    assert_eq!(
        env.git(&repo, ["show", &format!("{sib_branch}:sib.txt")]),
        "sib\n"
    );
    assert_eq!(
        env.git(&repo, ["show", "main~1:README.md"]),
        "# changed, loose\n"
    );
    // The view is gone with the task.
    assert!(
        !repo
            .join(format!(".crew/state/runs/{run}/tasks/hostile/git"))
            .exists()
    );
}

/// Honest git in the project itself: commits, an amend, a stash, branches and tags of its own
/// and a `git gc` all work in the agent's view whatever the user's refs are (packed), and what
/// is the agent's reaches the repository: the branch it is on, what it made, what it staged.
#[test]
fn honest_git_works_in_single_mode_and_its_own_reaches_the_repository() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    env.git(&repo, ["gc", "-q"]);
    env.git(&repo, ["pack-refs", "--all"]);
    let script = r#"
export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.com GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.com
echo one > one.txt && git add one.txt && git commit -q -m one && echo OK commit
echo two >> one.txt && git commit -q -a --amend -m "one, amended" && echo OK amend
echo wip > wip.txt && git add wip.txt && git stash -q && git stash pop -q && echo OK stash
git tag mine-tag && echo OK tag
git gc -q && echo OK gc
git checkout -q -b topic && echo three > three.txt && git add three.txt && git commit -q -m three && echo OK branch
echo staged > staged.txt && git add staged.txt && echo OK staged
"#;
    let output = env.crew(&repo, ["run", "--agent", "shell", script]);
    let shown = render_output(&output);
    assert!(output.status.success(), "{shown}");
    let run = run_ids(&env, &repo)[0].clone();
    let log = output_log(&repo, &run, "shell");
    for step in ["commit", "amend", "stash", "tag", "gc", "branch", "staged"] {
        assert!(log.contains(&format!("OK {step}")), "{step}:\n{log}");
    }
    for noise in ["error", "fatal"] {
        assert!(!log.contains(noise), "{noise}:\n{log}");
    }
    assert!(!shown.contains("SECURITY"), "{shown}");
    // The checkout is on the agent's branch, with its commits, its tag and what it staged.
    assert_eq!(
        env.git(&repo, ["symbolic-ref", "HEAD"]).trim(),
        "refs/heads/topic"
    );
    assert_eq!(
        env.git(&repo, ["log", "--format=%s", "-2", "topic"]),
        "three\none, amended\n"
    );
    assert_eq!(
        env.git(&repo, ["log", "-1", "--format=%s", "main"]).trim(),
        "one, amended"
    );
    assert_eq!(
        env.git(&repo, ["rev-parse", "mine-tag"]),
        env.git(&repo, ["rev-parse", "main"])
    );
    assert_eq!(env.git(&repo, ["show", ":staged.txt"]), "staged\n");
    let status = env.git(&repo, ["status", "--porcelain"]);
    assert!(status.contains("A  staged.txt"), "{status}");
    assert_eq!(env.git(&repo, ["show", "topic:wip.txt"]), "wip\n");
    env.git(&repo, ["fsck", "--full", "--no-progress"]);
}

/// The user commits on the checkout's branch while a `single` agent works: the branch keeps the
/// user's commit, and the agent's goes to a branch of its own, said in the task's warnings.
#[test]
fn a_single_agents_commits_go_to_a_branch_of_their_own_when_the_user_moved_the_checkouts() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let go = crew_tests::signal(&repo, "go");
    let committed = repo.join("committed.flag");
    let script = format!(
        r#"export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.com GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.com
echo agent > agent.txt && git add agent.txt && git commit -q -m "the agent's" && echo COMMITTED && touch committed.flag
while [ ! -e {go} ]; do sleep 0.05; done"#
    );
    let mut child = env
        .crew_command(&repo)
        .args(["run", "--agent", "shell", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(30, "the agent's commit", || {
        committed.exists().then_some(())
    });
    let run = run_ids(&env, &repo).remove(0);
    write(&repo.join("user.txt"), "user\n");
    env.git(&repo, ["add", "user.txt"]);
    env.git(&repo, ["commit", "-q", "-m", "the user's"]);
    write(&go, "");
    assert!(child.wait().unwrap().success());

    assert!(output_log(&repo, &run, "shell").contains("COMMITTED"));
    assert_eq!(
        env.git(&repo, ["log", "-1", "--format=%s", "main"]).trim(),
        "the user's"
    );
    let rescue = format!("crew/{run}-shell");
    assert_eq!(
        env.git(&repo, ["log", "-1", "--format=%s", &rescue]).trim(),
        "the agent's"
    );
    let manifest = manifest(&env, &repo, &run);
    let record = task(&manifest, "shell");
    assert_eq!(record["teardown"]["branch"], rescue.as_str(), "{record:#}");
    assert!(
        record["teardown"]["warnings"]
            .to_string()
            .contains(&format!("its commits are on {rescue}")),
        "{record:#}"
    );
    env.git(&repo, ["fsck", "--full", "--no-progress"]);
}

/// A `single` agent commits, and its host is killed before the task ends: its commits are in
/// its view of the git directory, and `crew runs clean` takes them into the repository before
/// the run's state goes.
#[test]
fn a_single_agents_commits_survive_its_killed_host_and_a_clean() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let script = r#"export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.com GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.com
echo agent > agent.txt && git add agent.txt && git commit -q -m "the agent's" && touch committed.flag
sleep 600"#;
    let mut host = env.spawn_crew(&repo, ["run", "--agent", "shell", script]);
    let run = wait_until(30, "the agent's commit", || {
        let run = run_ids(&env, &repo).into_iter().next()?;
        repo.join("committed.flag").exists().then_some(run)
    });
    host.kill().unwrap();
    host.wait().unwrap();
    // The agent is gone with its host (its warden saw to it).
    let agent_alive = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
            std::fs::read(entry.path().join("cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains("committed.flag"))
        })
    };
    wait_until(30, "the agent to end", || (!agent_alive()).then_some(()));
    assert_ne!(
        env.git(&repo, ["log", "-1", "--format=%s", "main"]).trim(),
        "the agent's",
        "not taken yet"
    );
    let clean = env.crew(&repo, ["runs", "clean", &run]);
    assert!(clean.status.success(), "{}", render_output(&clean));
    assert_eq!(
        env.git(&repo, ["log", "-1", "--format=%s", "main"]).trim(),
        "the agent's"
    );
    env.git(&repo, ["fsck", "--full", "--no-progress"]);
}

/// A `single` task whose agent wrote nothing in git leaves its view for the next task (making
/// and removing those directories is most of what a one-line task costs the disk), and a
/// spare view holds nothing of an earlier task when the next one takes it: one an earlier
/// agent (or anyone) left something in is removed, never taken as the next agent's.
#[test]
fn a_single_task_takes_a_spare_view_of_git_only_when_it_holds_nothing() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let spares = repo.join(".crew/state/views");
    let spare_views = || -> Vec<camino::Utf8PathBuf> {
        let Ok(entries) = spares.read_dir_utf8() else {
            return Vec::new();
        };
        entries.flatten().map(|entry| entry.into_path()).collect()
    };
    let quiet = env.crew(&repo, ["run", "--agent", "shell", "true"]);
    assert!(quiet.status.success(), "{}", render_output(&quiet));
    let left = spare_views();
    assert_eq!(left.len(), 1, "{left:?}");
    let run = run_ids(&env, &repo)[0].clone();
    let task_dir = repo.join(format!(".crew/state/runs/{run}/tasks/shell"));
    assert!(!task_dir.join("git").exists(), "moved, not copied");
    assert!(
        !left[0].join("start.json").exists(),
        "where that task started goes"
    );
    assert!(
        left[0].join("start.spare").is_file(),
        "its file is kept for the next record"
    );

    // Something left in the spare's layer: a branch of the user's, moved.
    let main = env.git(&repo, ["rev-parse", "main"]).trim().to_owned();
    write(
        &left[0].join("upper/refs/heads/planted"),
        &format!("{main}\n"),
    );
    let before = refs(&env, &repo);
    let next = env.crew(&repo, ["run", "--agent", "shell", "true"]);
    let shown = render_output(&next);
    assert!(next.status.success(), "{shown}");
    assert_eq!(refs(&env, &repo), before, "nothing of the spare was taken");
    assert!(!shown.contains("SECURITY"), "{shown}");
    assert!(!left[0].exists(), "the spare that held something is gone");
    let left = spare_views();
    assert_eq!(left.len(), 1, "the next task's own view is spare now");

    // An attribute set on a spare's root (an ACL, a mark): that spare is not taken either.
    rustix::fs::setxattr(
        left[0].join("upper").as_std_path(),
        "user.planted",
        b"x",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    let next = env.crew(&repo, ["run", "--agent", "shell", "true"]);
    assert!(next.status.success(), "{}", render_output(&next));
    let mut names = [0u8; 256];
    for spare in spare_views() {
        let length = rustix::fs::llistxattr(spare.join("upper").as_std_path(), &mut names).unwrap();
        let names = String::from_utf8_lossy(&names[..length]).into_owned();
        assert!(!names.contains("user.planted"), "{spare}: {names:?}");
    }

    // An agent that changes its `.git` itself (the overlay's root: the layer's own directory)
    // and nothing in it: its view is not kept for another task. The mode is one no umask gives
    // (`.git` is 0700 under `umask 077`, 0755 under 022), so the chmod is a change under both.
    let before = spare_views();
    assert_eq!(before.len(), 1);
    let chmod = env.crew(&repo, ["run", "--agent", "shell", "chmod 751 .git"]);
    assert!(chmod.status.success(), "{}", render_output(&chmod));
    assert!(spare_views().is_empty(), "that view went");

    // A link among the spares, to a view made elsewhere: never taken.
    let decoy = env.root().join("decoy");
    std::fs::create_dir_all(decoy.join("upper")).unwrap();
    std::fs::create_dir_all(decoy.join("work")).unwrap();
    std::os::unix::fs::symlink(&decoy, spares.join("planted")).unwrap();
    let next = env.crew(&repo, ["run", "--agent", "shell", "true"]);
    assert!(next.status.success(), "{}", render_output(&next));
    assert!(
        spares.join("planted").is_symlink(),
        "the link is where it was: {:?}",
        spare_views()
    );
    std::fs::remove_file(spares.join("planted")).unwrap();

    // A spare's former record says the checkout was elsewhere: the next task's is its own.
    let spare = spare_views();
    assert_eq!(spare.len(), 1, "{spare:?}");
    write(
        &spare[0].join("start.spare"),
        r#"{"head":"ref: refs/heads/elsewhere","index":null}"#,
    );

    // A task that commits: what it gives reaches the repository, and its view is not kept.
    let script = r#"export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.com GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.com
echo agent > agent.txt && git add agent.txt && git commit -q -m "the agent's""#;
    let committing = env.crew(&repo, ["run", "--agent", "shell", script]);
    assert!(
        committing.status.success(),
        "{}",
        render_output(&committing)
    );
    assert_eq!(
        env.git(&repo, ["log", "-1", "--format=%s", "main"]).trim(),
        "the agent's"
    );
    assert!(
        spare_views().is_empty(),
        "a view that held commits is not kept"
    );
    env.git(&repo, ["fsck", "--full", "--no-progress"]);
}
