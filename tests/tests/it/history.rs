//! The repository's history, its refs and other tasks' branches are out of an agent's reach
//! (ARCHITECTURE.md, "The agent's own git directory"): an agent in a worktree, under the real
//! kernel sandbox, tries to delete and rewrite objects, move and delete other branches and
//! their reflogs, and repoint its git directory; the user's history must still pass `git fsck
//! --full` (also after an ordinary `git gc --prune=now`), every ref but the agent's own branch
//! must be where it was, and the agent's own work must be on its branch. Honest git keeps
//! working, whatever state the user's refs are in.

use std::collections::BTreeMap;

use camino::Utf8Path;
use crew_tests::{TestEnv, render_output, tree_fingerprint, wait_until, write};

use crate::common::runs::{finished_run, manifest, run_ids, task};

/// Every ref of the repository with the object it names.
fn refs(env: &TestEnv, repo: &Utf8Path) -> BTreeMap<String, String> {
    env.git(repo, ["for-each-ref", "--format=%(refname) %(objectname)"])
        .lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(name, id)| (name.to_owned(), id.to_owned()))
        .collect()
}

/// The repository's pack files and loose objects, with what each holds.
fn objects(repo: &Utf8Path) -> Vec<(String, String)> {
    tree_fingerprint(repo.join(".git/objects").as_std_path())
}

fn output_log(repo: &Utf8Path, run: &str, task: &str) -> String {
    std::fs::read_to_string(repo.join(format!(".crew/state/runs/{run}/tasks/{task}/output.log")))
        .unwrap()
}

fn commit_team(env: &TestEnv, repo: &Utf8Path, team: &str) {
    write(&repo.join(".crew/teams/t.toml"), team);
    env.git(repo, ["add", ".crew"]);
    env.git(repo, ["commit", "-q", "-m", "crew team"]);
}

/// What a hostile agent tries on the shared git directory `$C`, straight and through git. A
/// write that works prints `ESCAPED <what>`; git's own commands are expected to work, on the
/// agent's own view only.
fn attacks(early_branch: &str) -> String {
    format!(
        r#"
C="$CREW_PROJECT_ROOT/.git"
try() {{ name=$1; shift; if ( "$@" ) 2>/dev/null; then echo "ESCAPED $name"; fi; }}
try delete-pack sh -c 'rm "$0"/objects/pack/*.pack' "$C"
try rewrite-loose sh -c 'for f in "$0"/objects/??/*; do printf x > "$f" && exit 0; done; exit 1' "$C"
try plant-object sh -c 'mkdir -p "$0/objects/ab" && echo x > "$0/objects/ab/cdef"' "$C"
try remove-ref sh -c 'rm "$0/refs/heads/{early_branch}"' "$C"
try remove-reflog sh -c 'rm -r "$0"/logs/refs/heads/crew/*' "$C"
try packed-refs sh -c 'echo > "$0/packed-refs"' "$C"
try admin-entry sh -c 'for d in "$0"/worktrees/*/; do echo /elsewhere/.git > "$d/gitdir" && exit 0; done; exit 1' "$C"
git update-ref refs/heads/{early_branch} HEAD
git update-ref -d "refs/heads/crew/$CREW_RUN_ID-sib"
git update-ref refs/heads/main HEAD
git tag -f planted
git reflog expire --expire=now --all
git gc -q --prune=now
git repack -q -a -d
echo work > work.txt
git add work.txt && git -c user.name=agent -c user.email=agent@example.com commit -q -m "agent's own commit"
echo left > left.txt
echo done
"#
    )
}

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
    let go = env.root().join("go");
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
    let go = env.root().join("go");
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

/// What an agent runs to move its branch onto a commit whose blob exists nowhere (`git mktree
/// --missing`, `commit-tree`), writing the commit's id to `ghost.id`.
const GHOST_COMMIT: &str = r#"export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.com GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.com
tree=$(printf '100644 blob 0123456789012345678901234567890123456789\tghost.txt\n' | git mktree --missing)
commit=$(git commit-tree "$tree" -p HEAD -m ghost)
git update-ref HEAD "$commit" && echo "$commit" > ghost.id"#;

/// An agent's commit whose objects exist nowhere (`git mktree --missing`, `commit-tree`): no
/// path that takes an agent's work into the repository — its teardown, `crew runs clean` after
/// its host was killed, done twice — writes any part of it or moves a branch onto it.
#[test]
fn an_agent_s_commit_whose_objects_exist_nowhere_never_reaches_the_repository() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let ghost = GHOST_COMMIT;
    let objects = |env: &TestEnv| -> String {
        env.git(&repo, ["cat-file", "--batch-all-objects", "--batch-check"])
    };
    let before = objects(&env);

    // Worktree mode, its host killed, then `crew runs clean`, twice.
    let script = format!("{ghost}\nsleep 600");
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
    let run = wait_until(30, "the agent's ghost commit", || {
        let run = run_ids(&env, &repo).into_iter().next()?;
        repo.join(format!(".worktrees/{run}/shell/ghost.id"))
            .exists()
            .then_some(run)
    });
    let branch = format!("crew/{run}-shell");
    let base = env.git(&repo, ["rev-parse", &branch]);
    host.kill().unwrap();
    host.wait().unwrap();
    for _ in 0..2 {
        let clean = env.crew(&repo, ["runs", "clean", &run]);
        assert!(
            !render_output(&clean).contains("removed run"),
            "{}",
            render_output(&clean)
        );
        assert_eq!(env.git(&repo, ["rev-parse", &branch]), base, "not moved");
        assert_eq!(objects(&env), before, "no part of it written");
    }
    env.git(&repo, ["fsck", "--full", "--no-progress"]);

    // Single mode, its teardown.
    let single = env.crew(&repo, ["run", "--agent", "shell", ghost]);
    let _ = render_output(&single);
    assert_eq!(objects(&env), before, "no part of it written");
    env.git(&repo, ["fsck", "--full", "--no-progress"]);
    assert!(
        env.git(&repo, ["log", "--all", "--format=%s"])
            .lines()
            .all(|subject| subject != "ghost")
    );
}

/// A worktree kept because its work could not be taken (here, a commit whose objects exist
/// nowhere) is safe to step into: it uses the repository's own git again, so the
/// `core.fsmonitor` the agent set in its `config.worktree` never runs on the user's `git
/// status`, and the summary names where the agent's git directory was kept.
#[test]
fn a_kept_worktree_uses_the_repository_s_git_and_never_the_agent_s_config() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    env.git(&repo, ["config", "extensions.worktreeConfig", "true"]);
    let marker = env.root().join("fsmonitor-ran");
    let script = format!(
        "git config --worktree core.fsmonitor \"touch {marker}; false\"\necho work > work.txt\n{GHOST_COMMIT}"
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
    let kept = repo.join(format!(".worktrees/{run}/shell"));
    assert!(kept.join("work.txt").is_file(), "kept: {shown}");
    let dot_git = std::fs::read_to_string(kept.join(".git")).unwrap();
    assert!(!dot_git.trim_end().ends_with("/agent"), "{dot_git}");
    assert!(
        shown.contains("the agent's git directory is kept at"),
        "{shown}"
    );
    let _ = std::fs::remove_file(&marker);
    let status = env.git_output(&kept, ["status", "--porcelain"]);
    assert!(status.status.success(), "{}", render_output(&status));
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("work.txt"),
        "{}",
        render_output(&status)
    );
    assert!(
        !marker.exists(),
        "the agent's fsmonitor ran on the user's git status"
    );
}

/// `.crew/state/views` planted as a link to a directory laid out as spare views are: no task
/// takes a view from it, and none is put there.
#[test]
fn a_spare_views_directory_planted_as_a_link_is_never_followed() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let first = env.crew(&repo, ["run", "--agent", "shell", "true"]);
    assert!(first.status.success(), "{}", render_output(&first));
    let views = repo.join(".crew/state/views");
    std::fs::remove_dir_all(&views).unwrap();
    let decoy = env.root().join("decoy");
    for name in ["planted/upper", "planted/work"] {
        std::fs::create_dir_all(decoy.join(name)).unwrap();
    }
    write(&decoy.join("planted/start.spare"), "{}");
    std::os::unix::fs::symlink(&decoy, &views).unwrap();
    let before = crew_tests::tree_fingerprint(decoy.as_std_path());
    for _ in 0..2 {
        let next = env.crew(&repo, ["run", "--agent", "shell", "true"]);
        assert!(next.status.success(), "{}", render_output(&next));
    }
    assert!(views.is_symlink(), "the link is left as it is");
    assert_eq!(
        crew_tests::tree_fingerprint(decoy.as_std_path()),
        before,
        "nothing taken from or put in the link's target"
    );
}

/// An agent committed, its host was killed, and the user deleted its worktree: the commit is
/// not lost with the worktree's entry when the run is taken up again; it is on the task's
/// branch.
#[test]
fn an_agent_s_commit_survives_its_killed_host_and_its_deleted_worktree() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let go = env.root().join("go");
    let script = format!(
        r#"export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.com GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.com
if [ -e committed.txt ]; then echo again; exit 0; fi
echo first > committed.txt && git add committed.txt && git commit -q -m "the agent's" && echo ready
while [ ! -e {go} ]; do sleep 0.05; done"#
    );
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
    let run = run_ids(&env, &repo).remove(0);
    host.kill().unwrap();
    host.wait().unwrap();
    std::fs::remove_dir_all(repo.join(format!(".worktrees/{run}/shell"))).unwrap();
    write(&go, "");
    let resumed = env.crew(&repo, ["runs", "resume", &run]);
    let shown = render_output(&resumed);
    let log = env.git(&repo, ["log", "--format=%s", &format!("crew/{run}-shell")]);
    assert!(
        log.lines().any(|subject| subject == "the agent's"),
        "{shown}\n{log}"
    );
    env.git(&repo, ["fsck", "--full", "--no-progress"]);
}
