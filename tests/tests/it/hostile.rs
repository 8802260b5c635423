//! Agents as the untrusted party (ARCHITECTURE.md, "Agents are untrusted"): an agent that tries
//! each escape, against the real kernel sandbox and with the sandbox off, where crew's own
//! checks must still hold.
//!
//! Each attempt prints `ESCAPED <what>` when it worked; the tests read the agent's output, the
//! run's record, and fingerprints of everything outside crew's roots taken before and after.

use camino::{Utf8Path, Utf8PathBuf};
use crew_tests::{TestEnv, render_output, tree_fingerprint, write};

use crate::common::runs::{manifest, run_ids, task, try_manifest};

/// What the world outside crew's roots looks like: the home directory, a sibling repository
/// (worktree, `.git` included), the leader's own files and its git config and hooks.
struct Canaries {
    paths: Vec<Utf8PathBuf>,
}

impl Canaries {
    fn new(env: &TestEnv, leader: &Utf8Path, sibling: &Utf8Path) -> Self {
        write(&env.home().join("canary.txt"), "do not touch\n");
        Canaries {
            paths: vec![
                env.home(),
                sibling.to_owned(),
                leader.join("README.md"),
                leader.join("src"),
                leader.join(".git/config"),
                leader.join(".git/hooks"),
                leader.join(".git/refs/heads/main"),
            ],
        }
    }

    fn fingerprint(&self) -> Vec<(Utf8PathBuf, Vec<(String, String)>)> {
        self.paths
            .iter()
            .map(|path| {
                let print = if path.is_dir() {
                    tree_fingerprint(path.as_std_path())
                } else {
                    vec![(String::new(), std::fs::read_to_string(path).unwrap())]
                };
                (path.clone(), print)
            })
            .collect()
    }
}

/// A repository whose checked-in settings switch the sandbox off, allowed by the user: the
/// control run in which an attack must work.
fn unconfined_repo(env: &TestEnv) -> Utf8PathBuf {
    let off = env.repo("unconfined");
    write(
        &off.join(".crew/config.toml"),
        "[sandbox]\nmode = \"off\"\n",
    );
    env.allow_settings(&off);
    off
}

/// A sibling repository with a tracked file, an untracked one and an ignored `prod.env`.
fn sibling_repo(env: &TestEnv) -> Utf8PathBuf {
    let sibling = env.repo("sibling");
    write(&sibling.join(".gitignore"), "prod.env\n");
    env.git(&sibling, ["add", ".gitignore"]);
    env.git(&sibling, ["commit", "-q", "-m", "ignore prod.env"]);
    write(&sibling.join("prod.env"), "SECRET=1\n");
    write(&sibling.join("untracked.txt"), "mine\n");
    sibling
}

/// The escapes a hostile agent tries from its worktree; each prints `ESCAPED <what>` if it
/// worked. Then it does its real work: a commit of its own and a file left uncommitted.
fn escapes(sibling: &Utf8Path) -> String {
    format!(
        r##"
warden=$PPID
echo work > work.txt
git add work.txt && git -c user.name=agent -c user.email=agent@example.com commit -q -m "agent's own commit"
echo uncommitted > uncommitted.txt
ln -s / root-link
echo tmp > "$TMPDIR/scratch" && echo "TMPDIR OK"
try() {{ name=$1; shift; if ( "$@" ) 2>/dev/null; then echo "ESCAPED $name"; fi; }}
try home sh -c 'echo pwned >> "$HOME/canary.txt"'
try home-new sh -c 'echo pwned > "$HOME/new.txt"'
try sibling sh -c 'echo pwned >> {sibling}/README.md'
try sibling-git sh -c 'echo "[core] fsmonitor = touch /tmp/x" >> {sibling}/.git/config'
try leader-file sh -c 'echo pwned >> "$CREW_PROJECT_ROOT/README.md"'
try leader-state sh -c 'echo pwned > "$CREW_PROJECT_ROOT/.crew/state/planted"'
try git-config git config core.fsmonitor "touch $HOME/fsmonitor-ran"
try git-hook sh -c 'printf "#!/bin/sh\ntouch $HOME/hook-ran\n" > "$CREW_PROJECT_ROOT/.git/hooks/post-merge"'
try git-info sh -c 'echo "* filter=evil" > "$CREW_PROJECT_ROOT/.git/info/attributes"'
try main-branch sh -c 'git update-ref refs/heads/main HEAD; test "$(git -C "$CREW_PROJECT_ROOT" rev-parse main)" = "$(git rev-parse HEAD)"'
try new-branch sh -c 'git branch planted; git -C "$CREW_PROJECT_ROOT" rev-parse -q --verify planted'
try objects sh -c 'touch "$CREW_PROJECT_ROOT/.git/objects/planted"'
try rename-workspace mv "$PWD" "$PWD.moved"
try grandchild sh -c 'sh -c "echo pwned > \"\$HOME/grandchild.txt\""'
try signal-warden kill -0 "$warden"
for p in /proc/[0-9]*; do
  if [ "$(cat "$p/comm" 2>/dev/null)" = crew-wardens ]; then
    echo "WARDEN SERVER SEEN"; try signal-server kill -0 "${{p#/proc/}}"
  fi
done
(setsid env -i sh -c 'cd /; exec sleep 6131' </dev/null >/dev/null 2>&1 &)
echo done
"##
    )
}

fn team(env: &TestEnv, repo: &Utf8Path, prompt: &str) {
    write(
        &repo.join(".crew/teams/hostile.toml"),
        &format!(
            "workspace_mode = \"worktree\"\n[[tasks]]\nid = \"hostile\"\nagent = \"shell\"\nprompt = '''{prompt}'''\n"
        ),
    );
    env.git(repo, ["add", ".crew"]);
    env.git(repo, ["commit", "-q", "-m", "crew team"]);
}

fn output_log(repo: &Utf8Path, run: &str, task: &str) -> String {
    std::fs::read_to_string(repo.join(format!(".crew/state/runs/{run}/tasks/{task}/output.log")))
        .unwrap()
}

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

/// The same escapes with the sandbox off: the kernel stops none of them, and this test shows
/// which ones crew's own checks still catch — git's files are put back and reported, the moved
/// workspace is reported and nothing is committed or removed on a guess.
#[test]
fn with_the_sandbox_off_the_tripwire_and_teardown_catch_what_they_can() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let sibling = sibling_repo(&env);
    write(
        &repo.join(".crew/config.toml"),
        "[sandbox]\nmode = \"off\"\n",
    );
    env.allow_settings(&repo);
    team(&env, &repo, &escapes(&sibling));
    let warmup = env.crew(&repo, ["run", "--agent", "shell", "true"]);
    assert!(warmup.status.success(), "{}", render_output(&warmup));
    let config_before = std::fs::read_to_string(repo.join(".git/config")).unwrap();

    let output = env.crew(&repo, ["run", "hostile"]);
    let run = run_ids(&env, &repo)[0].clone();
    let log = output_log(&repo, &run, "hostile");
    let escaped: Vec<&str> = log
        .lines()
        .filter_map(|line| line.strip_prefix("ESCAPED "))
        .collect();
    assert!(
        [
            "home",
            "sibling",
            "git-config",
            "git-hook",
            "rename-workspace"
        ]
        .iter()
        .all(|name| escaped.contains(name)),
        "unconfined, the attempts work: {escaped:?}"
    );

    let manifest = manifest(&env, &repo, &run);
    let record = task(&manifest, "hostile");
    assert_eq!(record["sandbox"]["state"], "off");
    let restored: Vec<&str> = record["teardown"]["security"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|finding| finding["restored"] == true)
        .map(|finding| finding["path"].as_str().unwrap())
        .collect();
    for file in [
        ".git/config",
        ".git/hooks/post-merge",
        ".git/info/attributes",
    ] {
        assert!(
            restored.iter().any(|path| path.ends_with(file)),
            "{file} put back: {restored:?}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(repo.join(".git/config")).unwrap(),
        config_before
    );
    assert!(!repo.join(".git/hooks/post-merge").exists());
    let reason = record["teardown"]["preserved_reason"]
        .as_str()
        .unwrap_or("");
    assert!(reason.contains("is gone"), "{record:#}");
    let moved = repo.join(format!(".worktrees/{run}/hostile.moved"));
    assert!(
        moved.join("uncommitted.txt").exists(),
        "the moved workspace and its work are left where the agent put them"
    );
    assert!(render_output(&output).contains("SECURITY"));
}

/// With the sandbox off, an agent plants a command in the repository's git config and its host
/// is killed before the task ends. The run taken up again (and the run cleaned) is checked
/// against the copy taken before the agents, not against what the agent planted: the config is
/// put back and the change reported.
#[test]
fn after_a_killed_host_the_tripwire_checks_against_the_copy_from_before_the_agents() {
    for verb in ["resume", "clean"] {
        let env = TestEnv::new();
        let repo = env.repo("project");
        write(
            &repo.join(".crew/config.toml"),
            "[sandbox]\nmode = \"off\"\n",
        );
        env.allow_settings(&repo);
        let config_before = std::fs::read_to_string(repo.join(".git/config")).unwrap();
        // Taken up again, the agent finds its mark and ends.
        let plant = r#"[ -e planted.flag ] && exit 0
printf '[core]\n\tfsmonitor = "touch $HOME/fsmonitor-ran"\n' >> "$CREW_PROJECT_ROOT/.git/config" && echo PLANTED && touch planted.flag
sleep 600"#;
        let mut host = env.spawn_crew(&repo, ["run", "--agent", "shell", plant]);
        let run = crew_tests::wait_until(30, "the agent to plant", || {
            let run = run_ids(&env, &repo).into_iter().next()?;
            repo.join("planted.flag").exists().then_some(run)
        });
        host.kill().unwrap();
        host.wait().unwrap();
        assert!(output_log(&repo, &run, "shell").contains("PLANTED"));
        assert_ne!(
            std::fs::read_to_string(repo.join(".git/config")).unwrap(),
            config_before
        );

        let taken_up = match verb {
            "resume" => env.crew(&repo, ["runs", "resume", &run]),
            _ => env.crew(&repo, ["runs", "clean", &run]),
        };
        let shown = render_output(&taken_up);
        assert_eq!(
            std::fs::read_to_string(repo.join(".git/config")).unwrap(),
            config_before,
            "{verb}: {shown}"
        );
        if verb == "clean" {
            assert!(
                shown.contains("SECURITY") && shown.contains(".git/config"),
                "{verb}: {shown}"
            );
        } else {
            let manifest = manifest(&env, &repo, &run);
            let findings = task(&manifest, "shell")["teardown"]["security"].to_string();
            assert!(findings.contains(".git/config"), "{verb}: {manifest:#}");
        }
        env.git(&repo, ["status"]);
        assert!(!env.home().join("fsmonitor-ran").exists(), "{verb}");
    }
}

/// With the sandbox off an agent can write the repository's refs itself: what it destroys (an
/// earlier run's saved work deleted, the user's branch moved back) is reported with where each
/// was, so that the user can put it back; what moves forward (its own commit on the checkout's
/// branch) is not.
#[test]
fn with_the_sandbox_off_a_deleted_or_rewound_ref_is_reported_with_where_it_was() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/config.toml"),
        "[sandbox]\nmode = \"off\"\n",
    );
    env.allow_settings(&repo);
    let early = crate::common::runs::finished_run(
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
    let early_branch = format!("crew/{early}-shell");
    let early_tip = env
        .git(&repo, ["rev-parse", &early_branch])
        .trim()
        .to_owned();
    write(&repo.join("more.txt"), "more\n");
    env.git(&repo, ["add", "more.txt"]);
    env.git(&repo, ["commit", "-q", "-m", "more"]);
    env.git(&repo, ["branch", "users-own"]);
    env.git(&repo, ["branch", "users-older", "HEAD~1"]);
    let users_tip = env.git(&repo, ["rev-parse", "users-own"]).trim().to_owned();
    let attack = format!(
        r#"export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.com GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.com
git update-ref -d refs/heads/{early_branch}
git update-ref refs/heads/users-own users-own~1
echo work > work.txt && git add work.txt && git commit -q -m "its own"
git update-ref refs/heads/users-older HEAD
echo done"#
    );
    let output = env.crew(&repo, ["run", "--agent", "shell", &attack]);
    let shown = render_output(&output);
    let run = run_ids(&env, &repo)[0].clone();
    assert!(output_log(&repo, &run, "shell").contains("done"), "{shown}");
    let manifest = manifest(&env, &repo, &run);
    let record = task(&manifest, "shell");
    assert_eq!(record["sandbox"]["state"], "off");
    let findings = record["teardown"]["security"].as_array().unwrap().clone();
    let about = |name: &str| {
        findings
            .iter()
            .find(|finding| finding["path"].as_str().unwrap().ends_with(name))
            .cloned()
    };
    let deleted = about(&format!("refs/heads/{early_branch}")).expect("the deletion is said");
    assert!(
        deleted["change"].as_str().unwrap().contains(&early_tip),
        "{deleted}"
    );
    let moved = about("refs/heads/users-own").expect("the rewind is said");
    assert!(
        moved["change"].as_str().unwrap().contains(&users_tip),
        "{moved}"
    );
    // A branch of the user's moved forward onto the agent's commit: said too.
    let forward = about("refs/heads/users-older").expect("the fast-forward is said");
    assert!(
        forward["change"]
            .as_str()
            .unwrap()
            .contains("moved forward"),
        "{forward}"
    );
    assert!(about("refs/heads/main").is_none(), "{findings:?}");
    // The objects it and crew wrote hold what their names say: nothing to say of them.
    assert!(
        !findings
            .iter()
            .any(|finding| finding["path"].as_str().unwrap().contains("/objects/")),
        "{findings:#?}"
    );
    assert!(shown.contains("SECURITY"), "{shown}");
    // With what was said, the user puts it back.
    env.git(
        &repo,
        [
            "update-ref",
            &format!("refs/heads/{early_branch}"),
            &early_tip,
        ],
    );
    assert_eq!(
        env.git(&repo, ["show", &format!("{early_branch}:early.txt")]),
        "early\n"
    );
}

/// With the sandbox off an agent can write the object store itself: a loose object of the
/// user's history rewritten to hold the agent's content (git reads loose objects without
/// checking them against their names) is reported and moved aside, so that the user's git
/// refuses the missing object rather than hand out the forged one.
#[test]
fn with_the_sandbox_off_a_rewritten_object_of_the_users_history_is_reported_and_moved_aside() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/config.toml"),
        "[sandbox]\nmode = \"off\"\n",
    );
    env.allow_settings(&repo);
    let readme = env
        .git(&repo, ["rev-parse", "HEAD:README.md"])
        .trim()
        .to_owned();
    let (fan, rest) = readme.split_at(2);
    let attack = format!(
        r#"forged=$(printf 'forged by the agent\n' | git hash-object -w --stdin)
store=$(git rev-parse --git-path objects)
target="$CREW_PROJECT_ROOT/.git/objects/{fan}/{rest}"
chmod u+w "$target" && cp "$store/$(echo $forged | cut -c1-2)/$(echo $forged | cut -c3-)" "$target" && echo FORGED
# A FIFO named as an object (crew must not wait on it) and a link to a file of the user's.
mkdir -p "$CREW_PROJECT_ROOT/.git/objects/ee"
mkfifo "$CREW_PROJECT_ROOT/.git/objects/ee/{fifo}"
ln -s "$HOME/.secret" "$CREW_PROJECT_ROOT/.git/objects/ee/{link}""#,
        fifo = "1".repeat(38),
        link = "2".repeat(38),
    );
    let output = env.crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "worktree",
            &attack,
        ],
    );
    let shown = render_output(&output);
    let run = run_ids(&env, &repo)[0].clone();
    assert!(
        output_log(&repo, &run, "shell").contains("FORGED"),
        "{shown}"
    );
    let manifest = manifest(&env, &repo, &run);
    let record = task(&manifest, "shell");
    assert_eq!(record["sandbox"]["state"], "off");
    let findings = record["teardown"]["security"].as_array().unwrap().clone();
    let forged = findings
        .iter()
        .find(|finding| {
            finding["path"]
                .as_str()
                .unwrap()
                .ends_with(&format!("objects/{fan}/{rest}"))
        })
        .unwrap_or_else(|| panic!("the rewritten object is said: {findings:#?}"));
    assert!(
        forged["change"].as_str().unwrap().contains("moved aside"),
        "{forged}"
    );
    // Neither the FIFO nor the link is taken for an object; each is said.
    for name in ["1", "2"] {
        let planted = format!("objects/ee/{}", name.repeat(38));
        assert!(
            findings
                .iter()
                .any(|finding| finding["path"].as_str().unwrap().ends_with(&planted)),
            "{planted}: {findings:#?}"
        );
    }
    assert!(shown.contains("SECURITY"), "{shown}");
    // The user's git no longer reads the agent's content for it, and what was said puts the
    // object back from the checkout.
    let read = std::process::Command::new("git")
        .args(["cat-file", "-p", &readme])
        .current_dir(&repo)
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&read.stdout).contains("forged"),
        "{}",
        String::from_utf8_lossy(&read.stdout)
    );
    env.git(&repo, ["hash-object", "-w", "README.md"]);
    assert_eq!(
        env.git(&repo, ["show", "HEAD:README.md"]),
        "# test repository\n"
    );
    env.git(&repo, ["fsck", "--strict"]);
}

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

#[test]
fn a_listings_directory_swapped_for_a_link_is_never_read_written_or_swept_through() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let first = env.crew(&repo, ["run", "--agent", "shell", "true"]);
    assert!(first.status.success(), "{}", render_output(&first));
    // What an unconfined agent could leave: the listings' directory, a link to the user's.
    let outside = env.dir("outside");
    write(&outside.join("precious.json"), "{\"not\": \"a listing\"}\n");
    let before = tree_fingerprint(outside.as_std_path());
    let live = repo.join(".crew/state/live");
    if live.exists() {
        std::fs::remove_dir_all(&live).unwrap();
    }
    std::os::unix::fs::symlink(&outside, &live).unwrap();
    for args in [
        &["runs", "list"][..],
        &["agents", "list"],
        &["run", "--agent", "shell", "echo ran"],
    ] {
        let output = env.crew(&repo, args);
        assert!(
            output.status.success(),
            "{args:?}: {}",
            render_output(&output)
        );
    }
    assert_eq!(tree_fingerprint(outside.as_std_path()), before);
}

#[test]
fn pnpm_installs_into_the_project_s_store_inside_the_sandbox() {
    // pnpm, pinned with the agent programs; a dependency from a tarball, so no registry.
    let Some(programs) = crew_tests::agent_programs(
        "pnpm",
        "pnpm_installs_into_the_project_s_store_inside_the_sandbox",
    ) else {
        return;
    };
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join("package.json"),
        "{\"name\": \"app\", \"version\": \"1.0.0\"}\n",
    );
    write(
        &repo.join("dep/package/package.json"),
        "{\"name\": \"dep\", \"version\": \"1.0.0\"}\n",
    );
    write(&repo.join("dep/package/index.js"), "module.exports = 1;\n");
    let tar = std::process::Command::new("tar")
        .args(["czf", "dep.tgz", "-C", "dep", "package"])
        .current_dir(&repo)
        .status()
        .unwrap();
    assert!(tar.success());
    env.git(&repo, ["add", "."]);
    env.git(&repo, ["commit", "-q", "-m", "app"]);
    let mut command = env.crew_command(&repo);
    let path = format!(
        "{programs}:{}",
        command
            .get_envs()
            .find(|(name, _)| *name == "PATH")
            .and_then(|(_, value)| value.map(|value| value.to_string_lossy().into_owned()))
            .unwrap_or_default()
    );
    let run = command
        .env("PATH", path)
        .args([
            "run",
            "--quiet",
            "--agent",
            "shell",
            "pnpm add ./dep.tgz > pnpm.txt 2>&1; pnpm store path > store.txt",
        ])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", render_output(&run));
    let said = std::fs::read_to_string(repo.join("pnpm.txt")).unwrap_or_default();
    assert!(
        repo.join("node_modules/dep/index.js").exists(),
        "the install failed inside the sandbox: {said}"
    );
    let store = std::fs::read_to_string(repo.join("store.txt")).unwrap();
    let caches = env.home().join(".local/state/crew/caches");
    assert!(store.trim().starts_with(caches.as_str()), "{store}");
    assert!(!env.home().join(".local/share/pnpm").exists());
}

#[test]
fn toolchains_write_the_project_s_caches_and_never_the_user_s() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let user_cargo = env.home().join(".cargo");
    write(&user_cargo.join("config.toml"), "[net]\nretry = 7\n");
    write(
        &user_cargo.join("credentials.toml"),
        "[registry]\ntoken = \"secret\"\n",
    );
    write(
        &user_cargo.join("registry/cache/kept.crate"),
        "the user's\n",
    );
    write(&env.home().join(".npm/kept"), "the user's\n");
    // Each tool's cache is written where the agent is pointed; then it tries the user's own,
    // and to swap the project's cargo settings for its own.
    let script = r#"set -u
for dir in "$npm_config_cache" "$YARN_CACHE_FOLDER" "$PIP_CACHE_DIR" "$UV_CACHE_DIR" "$GOMODCACHE" "$GOCACHE" "$CARGO_HOME/registry"; do
  mkdir -p "$dir" && echo warm > "$dir/probe" || echo "REFUSED $dir"
done
npm config get cache > npm-cache.txt
cat "$CARGO_HOME/config.toml" > cargo-config.txt
test -e "$CARGO_HOME/credentials.toml" && echo LEAKED > leaked.txt
echo poisoned > "$HOME/.cargo/registry/cache/kept.crate"
echo poisoned > "$HOME/.npm/kept"
rm -f "$CARGO_HOME/config.toml" && echo '[build]
rustc-wrapper = "/tmp/evil"' > "$CARGO_HOME/config.toml"
exit 0"#;
    let run = env.crew(&repo, ["run", "--quiet", "--agent", "shell", script]);
    assert!(run.status.success(), "{}", render_output(&run));
    let run_id = run_ids(&env, &repo).remove(0);
    let log = output_log(&repo, &run_id, "shell");
    assert!(!log.contains("REFUSED"), "{log}");
    let caches = env.home().join(".local/state/crew/caches");
    let npm_cache = std::fs::read_to_string(repo.join("npm-cache.txt")).unwrap_or_default();
    // npm itself reads the variable (where npm is installed: CI has it).
    if !npm_cache.is_empty() {
        assert!(npm_cache.trim().starts_with(caches.as_str()), "{npm_cache}");
    }
    assert_eq!(
        std::fs::read_to_string(repo.join("cargo-config.txt")).unwrap(),
        "[net]\nretry = 7\n",
        "the user's cargo settings reach the agent"
    );
    assert!(
        !repo.join("leaked.txt").exists(),
        "credentials are not linked"
    );
    assert_eq!(
        std::fs::read_to_string(user_cargo.join("registry/cache/kept.crate")).unwrap(),
        "the user's\n"
    );
    assert_eq!(
        std::fs::read_to_string(env.home().join(".npm/kept")).unwrap(),
        "the user's\n"
    );
    // The next start has the user's settings again, and the caches still warm.
    let again = env.crew(
        &repo,
        [
            "run",
            "--quiet",
            "--agent",
            "shell",
            "cat \"$CARGO_HOME/config.toml\" > again.txt; cat \"$npm_config_cache/probe\" >> again.txt",
        ],
    );
    assert!(again.status.success(), "{}", render_output(&again));
    assert_eq!(
        std::fs::read_to_string(repo.join("again.txt")).unwrap(),
        "[net]\nretry = 7\nwarm\n"
    );
}

#[test]
fn a_write_the_sandbox_refused_is_named_in_the_task_s_reason_with_what_to_add() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // As a toolchain does in a fresh home: it makes its own directory there, and fails.
    let run = env.crew(
        &repo,
        [
            "run",
            "--quiet",
            "--agent",
            "shell",
            r#"mkdir "$HOME/.newtool" || exit 3"#,
        ],
    );
    assert_eq!(run.status.code(), Some(1), "{}", render_output(&run));
    let first = run_ids(&env, &repo).remove(0);
    let record = task(&manifest(&env, &repo, &first), "shell").clone();
    let reason = record["reason"].as_str().unwrap_or_default();
    let refused = env.home().join(".newtool");
    assert!(
        reason.contains(&format!("the sandbox refused writing {refused}"))
            && reason.contains("`[sandbox] write` of agent `shell`")
            && reason.contains("crew sandbox allow"),
        "{record:#}"
    );
    assert!(!refused.exists());
    // One that succeeds anyway keeps it as a warning; a write it may make is never named.
    let run = env.crew(
        &repo,
        [
            "run",
            "--quiet",
            "--agent",
            "shell",
            r#"mkdir "$HOME/.other" 2>&1; echo "cannot write $PWD/inside: Permission denied"; true"#,
        ],
    );
    assert!(run.status.success(), "{}", render_output(&run));
    let second = run_ids(&env, &repo)
        .into_iter()
        .find(|run| *run != first)
        .unwrap();
    let record = task(&manifest(&env, &repo, &second), "shell").clone();
    let warnings = record["warnings"].to_string();
    assert!(
        warnings.contains(&format!(
            "the sandbox refused writing {}",
            env.home().join(".other")
        )),
        "{record:#}"
    );
    assert!(!warnings.contains("inside"), "{record:#}");
}

/// A pseudo-terminal of this process, as a user's terminal is: its controlling side (what the
/// user types goes in there) and the device path programs in it read from.
fn user_terminal() -> (std::fs::File, String) {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).unwrap();
    grantpt(&master).unwrap();
    unlockpt(&master).unwrap();
    let path = ptsname(&master, Vec::new()).unwrap();
    let path = path.to_string_lossy().into_owned();
    let master = std::fs::File::from(master);
    (master, path)
}

#[test]
fn an_agent_has_terminals_of_its_own_and_never_the_user_s() {
    use std::io::{Read, Write};
    let env = TestEnv::new();
    let repo = env.repo("project");
    let (mut user, device) = user_terminal();
    // Held open as a shell in it would: the terminal is live while the agent runs.
    let _shell = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&device)
        .unwrap();
    // The agent starts a program in a terminal of its own (as a shell tool does), then goes
    // for the user's: it reads what they type, and types into it.
    let script = format!(
        r#"script -qc tty /dev/null > own.txt 2>&1
ls /dev/pts > listed.txt
(timeout 2 cat {device} > stolen.txt 2>&1 &)
echo 'rm -rf ~' > {device} 2> typed.txt || echo refused >> typed.txt
sleep 1
true"#
    );
    let mut host = env.spawn_crew(&repo, ["run", "--quiet", "--agent", "shell", &script]);
    // Meanwhile the user types a secret.
    std::thread::sleep(std::time::Duration::from_millis(300));
    user.write_all(b"hunter2\n").unwrap();
    let ended = host.wait().unwrap();
    assert!(ended.success());
    let own = std::fs::read_to_string(repo.join("own.txt")).unwrap_or_default();
    assert!(
        own.trim().starts_with("/dev/pts/"),
        "its own terminal: {own}"
    );
    let stolen = std::fs::read_to_string(repo.join("stolen.txt")).unwrap_or_default();
    assert!(
        !stolen.contains("hunter2"),
        "the agent read the user's keystrokes: {stolen}"
    );
    let listed = std::fs::read_to_string(repo.join("listed.txt")).unwrap_or_default();
    let user_number = device.rsplit('/').next().unwrap();
    assert!(
        !listed.lines().any(|line| line == user_number),
        "the user's terminal is there to open: {listed}"
    );
    // What reached the user's screen: read without waiting for more.
    rustix::fs::fcntl_setfl(&user, rustix::fs::OFlags::NONBLOCK).unwrap();
    let mut shown = Vec::new();
    let _ = user.read_to_end(&mut shown);
    assert!(
        !String::from_utf8_lossy(&shown).contains("rm -rf"),
        "the agent typed into the user's terminal: {}",
        String::from_utf8_lossy(&shown)
    );
    let run = run_ids(&env, &repo).remove(0);
    let record = task(&manifest(&env, &repo, &run), "shell").clone();
    assert_eq!(record["sandbox"]["private_terminals"], true, "{record:#}");
}

#[test]
fn an_agent_with_no_network_reaches_no_host_and_none_of_the_user_s_local_servers() {
    use std::os::linux::net::SocketAddrExt;
    let env = TestEnv::new();
    let repo = env.repo("project");
    // The user's local servers: a TCP one, a UDP one and an abstract unix socket.
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp_port = tcp.local_addr().unwrap().port();
    tcp.set_nonblocking(true).unwrap();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    udp.set_nonblocking(true).unwrap();
    let name = format!("crew-test-{}", std::process::id());
    let abstract_addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
    let _abstract = std::os::unix::net::UnixListener::bind_addr(&abstract_addr).unwrap();
    write(
        &repo.join(".crew/agents/isolated.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\n[sandbox]\nnetwork = \"none\"\n",
    );
    write(
        &repo.join(".crew/agents/open.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\n",
    );
    let probe = format!(
        r#"import socket
def attempt(what, do):
    try:
        do()
        print(what, "REACHED")
    except OSError as error:
        print(what, "refused:", error)
attempt("tcp", lambda: socket.create_connection(("127.0.0.1", {tcp_port}), timeout=2))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"agent", ("127.0.0.1", {udp_port})))
attempt("abstract", lambda: socket.socket(socket.AF_UNIX).connect("\0{name}"))
def own():
    server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen()
    socket.create_connection(server.getsockname(), timeout=2)
attempt("own loopback", own)
"#
    );
    write(&repo.join("probe.py"), &probe);
    env.git(&repo, ["add", "probe.py"]);
    env.git(&repo, ["commit", "-q", "-m", "probe"]);
    let seen = |agent: &str| {
        let run = env.crew(
            &repo,
            [
                "run",
                "--quiet",
                "--agent",
                agent,
                "python3 probe.py > seen.txt 2>&1",
            ],
        );
        assert!(run.status.success(), "{}", render_output(&run));
        std::fs::read_to_string(repo.join("seen.txt")).unwrap()
    };
    let drain_udp = || {
        let mut buffer = [0u8; 16];
        let mut heard = 0;
        while udp.recv(&mut buffer).is_ok() {
            heard += 1;
        }
        heard
    };
    let accepted = || {
        let mut count = 0;
        while tcp.accept().is_ok() {
            count += 1;
        }
        count
    };
    // With the network open, the same probe reaches the user's TCP and UDP servers: the
    // probe works, and what follows is the sandbox's doing.
    let open = seen("open");
    assert!(
        open.contains("tcp REACHED") && open.contains("udp REACHED"),
        "{open}"
    );
    assert!(accepted() >= 1 && drain_udp() >= 1, "{open}");
    // Abstract sockets are scoped to the agent's own sandbox in every mode (ABI 6).
    assert!(open.contains("abstract refused"), "{open}");
    let isolated = seen("isolated");
    for refused in ["tcp refused", "abstract refused"] {
        assert!(isolated.contains(refused), "{refused}: {isolated}");
    }
    assert_eq!(accepted(), 0, "{isolated}");
    // A datagram is sent without an answer either way: what counts is that none arrived.
    assert_eq!(
        drain_udp(),
        0,
        "a datagram reached the user's server: {isolated}"
    );
    // Its own loopback works: a test suite's own server is not the network.
    assert!(isolated.contains("own loopback REACHED"), "{isolated}");
    let runs = run_ids(&env, &repo);
    let newest = runs
        .iter()
        .map(|run| manifest(&env, &repo, run))
        .find(|record| task(record, "isolated")["id"] == "isolated")
        .unwrap();
    assert_eq!(
        task(&newest, "isolated")["sandbox"]["network"],
        "none",
        "{newest:#}"
    );
}

#[test]
fn an_agent_that_connects_from_a_child_it_reaps_is_never_answered_as_the_user() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // The trick: a child connects (the kernel records the child as the peer), exits and is
    // reaped, and the agent talks on the connection it kept. Traced after that, the peer's
    // pid names nothing, or another process; it must never count as the user's. (Without the
    // defence about one try in a hundred got the user's answer.)
    let probe = r#"import json, os, socket, sys
answers = {"ok": 0, "refused": 0}
address = os.environ["CREW_SOCKET"]
if address.startswith("@"):
    address = "\0" + address[1:]
for attempt in range(1000):
    connection = socket.socket(socket.AF_UNIX)
    child = os.fork()
    if child == 0:
        try:
            connection.connect(address)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    try:
        request = {"id": attempt, "workspace": os.environ["CREW_PROJECT_ROOT"], "op": "list"}
        connection.sendall((json.dumps(request) + "\n").encode())
        line = connection.makefile().readline()
        answer = json.loads(line)
        answers["ok" if answer.get("ok") else "refused"] += 1
    except (OSError, ValueError):
        answers["refused"] += 1
    connection.close()
print(json.dumps(answers))
"#;
    write(&repo.join("probe.py"), probe);
    env.git(&repo, ["add", "probe.py"]);
    env.git(&repo, ["commit", "-q", "-m", "probe"]);
    let run = env.crew(
        &repo,
        [
            "run",
            "--quiet",
            "--agent",
            "shell",
            "python3 probe.py > answers.json",
        ],
    );
    assert!(run.status.success(), "{}", render_output(&run));
    let answers: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo.join("answers.json")).unwrap()).unwrap();
    assert_eq!(answers["ok"], 0, "answered as the user: {answers}");
    assert_eq!(answers["refused"], 1000, "{answers}");
    // The user's own command is answered all the same.
    let listed = env.crew(&repo, ["agents", "list"]);
    assert!(listed.status.success(), "{}", render_output(&listed));
}

/// Each confined agent reaches its host by a connection of its own (an abstract socket it
/// listens on once confined, which only its own sandbox may connect to), and the host's socket
/// is hidden from it: it cannot reach another agent's connection (found in `/proc/net/unix`)
/// nor the host's socket (its path is in the run's record), so nothing it does is ever taken
/// for the user's or another agent's.
#[test]
fn an_agent_reaches_its_host_by_its_own_connection_only() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let probe = r#"import json, os, socket, glob, time
own = os.environ["CREW_SOCKET"]
print("OWN", own.startswith("@"))
time.sleep(0.5)
def request(address, op):
    connection = socket.socket(socket.AF_UNIX)
    connection.settimeout(5)
    connection.connect(address)
    connection.sendall((json.dumps({"id": 1, "workspace": os.environ["CREW_PROJECT_ROOT"], "op": op, "agent": "victim"}) + "\n").encode())
    return json.loads(connection.makefile().readline())
names = set()
for line in open("/proc/net/unix").read().splitlines()[1:]:
    fields = line.split()
    if len(fields) >= 8 and fields[-1].startswith("@crew-"):
        names.add(fields[-1])
print("SEEN", len(names))
for name in names:
    if name == own:
        continue
    try:
        answer = request("\0" + name[1:], "stop")
        print("REACHED", name, answer)
    except OSError as error:
        print("REFUSED", name, error.errno)
for path in glob.glob(os.environ["CREW_PROJECT_ROOT"] + "/.crew/state/runs/*/manifest.json"):
    socket_path = (json.load(open(path)).get("host") or {}).get("socket")
    if socket_path:
        try:
            answer = request(socket_path, "stop")
            print("REACHED-MAIN", answer)
        except OSError as error:
            print("NO-MAIN", error.errno)
answer = request("\0" + own[1:], "stop")
print("OWN-ANSWER", answer.get("error", {}).get("code"))
"#;
    write(&repo.join("probe.py"), probe);
    env.git(&repo, ["add", "probe.py"]);
    env.git(&repo, ["commit", "-q", "-m", "probe"]);
    let output = env.crew(
        &repo,
        crate::common::runs::shell_worktree_args(&[
            "victim=echo ready; sleep 4",
            "attacker=python3 probe.py",
        ]),
    );
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let said = output_log(&repo, &run, "attacker");
    assert!(said.contains("OWN True"), "{said}");
    // It saw the victim's connection, and could not use it; nor the host's socket.
    let seen: usize = said
        .lines()
        .find_map(|line| line.strip_prefix("SEEN "))
        .and_then(|count| count.parse().ok())
        .unwrap_or(0);
    assert!(seen >= 2, "{said}");
    assert!(said.contains("REFUSED @crew-"), "{said}");
    assert!(!said.contains("REACHED"), "{said}");
    assert!(said.contains("NO-MAIN"), "{said}");
    // Its own connection answers it as itself: refused what only the user may do.
    assert!(said.contains("OWN-ANSWER forbidden"), "{said}");
    let recorded = manifest(&env, &repo, &run);
    assert_eq!(task(&recorded, "victim")["status"], "succeeded");
    assert_eq!(
        task(&recorded, "attacker")["sandbox"]["own_connection"],
        true
    );
}

#[test]
fn an_agent_reads_no_secret_from_another_process_s_environment() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    // The host holds a secret it keeps out of agents' environments; the agent goes looking for
    // it in every process's /proc/<pid>/environ (the host's, its warden's, the user's).
    let script = r#"for p in /proc/[0-9]*; do tr '\0' '\n' < $p/environ 2>/dev/null | grep -q hunter2 && echo "FOUND in $p"; done > found.txt; true"#;
    let run = env
        .crew_command(&repo)
        .env("CREW_TEST_SECRET", "hunter2")
        .args(["run", "--quiet", "--agent", "shell", script])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", render_output(&run));
    let found = std::fs::read_to_string(repo.join("found.txt")).unwrap();
    assert!(found.is_empty(), "{found}");
}

#[test]
fn an_agent_cannot_ask_the_user_s_tmux_server_to_run_a_command() {
    if !crate::common::tmux::installed("an_agent_cannot_ask_the_user_s_tmux_server") {
        return;
    }
    let env = TestEnv::new();
    let repo = env.repo("project");
    // The user's tmux server, at tmux's own place (/tmp/tmux-<uid>/<name>): an unconfined
    // program that runs whatever a client on its socket asks.
    let name = format!("crew-hostile-{}", std::process::id());
    let tmux = |args: &[&str]| {
        std::process::Command::new("tmux")
            .env_remove("TMUX_TMPDIR")
            .env_remove("TMUX")
            .arg("-L")
            .arg(&name)
            .args(args)
            .output()
            .unwrap()
    };
    let started = tmux(&["new-session", "-d", "sleep 120"]);
    assert!(started.status.success(), "{}", render_output(&started));
    let escaped = env.root().join("escaped.txt");
    let script = format!(
        "tmux -L {name} run-shell 'echo escaped > {escaped}' > asked.txt 2>&1; tmux -L {name} new-window -d 'sleep 300' >> asked.txt 2>&1; true"
    );
    let run = env
        .crew_command(&repo)
        .env_remove("TMUX_TMPDIR")
        .args(["run", "--quiet", "--agent", "shell", &script])
        .output()
        .unwrap();
    let windows = tmux(&["list-windows", "-F", "#{window_index}"]);
    let _ = tmux(&["kill-server"]);
    assert!(run.status.success(), "{}", render_output(&run));
    let asked = std::fs::read_to_string(repo.join("asked.txt")).unwrap_or_default();
    assert!(
        !escaped.exists(),
        "the user's tmux ran the agent's command: {asked}"
    );
    assert_eq!(
        String::from_utf8_lossy(&windows.stdout).lines().count(),
        1,
        "the agent opened a window in the user's tmux: {asked}"
    );
    let run_id = run_ids(&env, &repo).remove(0);
    let record = task(&manifest(&env, &repo, &run_id), "shell").clone();
    let hidden = record["sandbox"]["hidden"].to_string();
    assert!(hidden.contains("/tmp/tmux-"), "{record:#}");
}

#[test]
fn as_an_unprivileged_user_an_agent_has_no_network_and_terminals_and_shared_memory_of_its_own() {
    use std::os::unix::process::CommandExt;
    // File permissions do not hold root back; the namespaces differ for an ordinary user:
    // crew runs as `nobody` here.
    if !crew_tests::can_drop_to_nobody() {
        return;
    }
    const NOBODY: u32 = crew_tests::NOBODY;
    let env = TestEnv::reachable_by_others();
    let repo = env.repo("project");
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    server.set_nonblocking(true).unwrap();
    write(
        &repo.join(".crew/agents/isolated.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\n[sandbox]\nnetwork = \"none\"\n",
    );
    env.hand_to_nobody();
    // A segment of shared memory anyone may write, as a program might leave it.
    let segment = Utf8PathBuf::from(format!("/dev/shm/crew-test-nobody-{}", std::process::id()));
    write(&segment, "the user's\n");
    std::fs::set_permissions(
        &segment,
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    let script = format!(
        "bash -c 'echo hello > /dev/tcp/127.0.0.1/{port}' 2> tcp.txt && echo REACHED >> tcp.txt; script -qc tty /dev/null > own.txt 2>&1; cat {segment} > shm.txt 2>&1; echo agent >> {segment}; true"
    );
    let mut command = env.crew_command_for_others(&repo);
    command.args(["run", "--quiet", "--agent", "isolated", &script]);
    command.uid(NOBODY);
    command.gid(NOBODY);
    let run = command.output().unwrap();
    let left = std::fs::read_to_string(&segment);
    let _ = std::fs::remove_file(&segment);
    assert!(run.status.success(), "{}", render_output(&run));
    let shm = std::fs::read_to_string(repo.join("shm.txt")).unwrap_or_default();
    assert!(!shm.contains("the user's"), "{shm}");
    assert_eq!(left.unwrap(), "the user's\n");
    let tcp = std::fs::read_to_string(repo.join("tcp.txt")).unwrap_or_default();
    assert!(!tcp.contains("REACHED"), "{tcp}");
    assert!(
        server.accept().is_err(),
        "the user's server was reached: {tcp}"
    );
    let own = std::fs::read_to_string(repo.join("own.txt")).unwrap_or_default();
    assert!(
        own.trim().starts_with("/dev/pts/"),
        "its own terminal: {own}"
    );
}

/// The user's runtime directory holds the agent's own temp dir (the user's TMPDIR is there):
/// the directory cannot be covered whole, and what stands beside the agent's dir — the user's
/// session bus, an ssh agent's socket — is covered one entry at a time. The agent cannot
/// connect to a real server listening there.
#[test]
fn the_users_sockets_beside_an_agents_temp_dir_in_the_runtime_directory_are_hidden() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let runtime = env.root().join("run-user");
    let tmp = runtime.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::set_permissions(
        &runtime,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let bus = runtime.join("bus");
    let listener = std::os::unix::net::UnixListener::bind(&bus).unwrap();
    listener.set_nonblocking(true).unwrap();
    let probe = format!(
        r#"python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect("{bus}"); print("REACHED")' 2>/dev/null || echo REFUSED; echo "tmp=$TMPDIR""#
    );
    let output = env
        .crew_command(&repo)
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("TMPDIR", &tmp)
        .args(["run", "--agent", "shell", &probe])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", render_output(&output));
    let run = run_ids(&env, &repo).remove(0);
    let said = output_log(&repo, &run, "shell");
    assert!(said.contains(&format!("tmp={tmp}")), "{said}");
    assert!(said.contains("REFUSED"), "{said}");
    assert!(!said.contains("REACHED"), "{said}");
    assert!(
        listener.accept().is_err(),
        "a connection came through: {said}"
    );
    let recorded = manifest(&env, &repo, &run);
    assert!(
        task(&recorded, "shell")["sandbox"]["hidden"]
            .to_string()
            .contains("run-user/bus"),
        "{recorded:#}"
    );
}

/// The kernel's keyrings are confined by no namespace and not by Landlock: an agent inherits
/// its host's session keyring, and what the user's login put there (a Kerberos ticket, a file
/// system's key) is its to read. A confined agent is refused the keyrings, and does not find
/// the key's name in `/proc/keys` either; with the sandbox off, the same agent reads the
/// secret and its name (the attack works here).
#[test]
fn a_confined_agent_cannot_read_the_secrets_in_its_user_s_keyring() {
    use std::os::unix::process::CommandExt;
    let env = TestEnv::new();
    let description = format!("crew-test-secret-{}", std::process::id());
    let secret = format!("hunter2-{}", std::process::id());
    let read = |repo: &Utf8Path| -> String {
        let mut command = env.crew_command(repo);
        command.args([
            "run",
            "--quiet",
            "--agent",
            "shell",
            &format!(
                "{} keyring {description} > seen.txt; grep {description} /proc/keys >> seen.txt; true",
                crew_tests::helper_bin("fake-agent")
            ),
        ]);
        let (name, payload) = (
            std::ffi::CString::new(description.clone()).unwrap(),
            secret.clone().into_bytes(),
        );
        // The host starts in a session keyring of its own that holds the secret, as the
        // user's login session would.
        #[allow(unsafe_code)]
        // SAFETY: between fork and exec: two system calls on memory made before the fork.
        unsafe {
            command.pre_exec(move || {
                const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;
                const KEY_SPEC_SESSION_KEYRING: libc::c_long = -3;
                let joined = libc::syscall(libc::SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, 0usize);
                let added = libc::syscall(
                    libc::SYS_add_key,
                    c"user".as_ptr(),
                    name.as_ptr(),
                    payload.as_ptr(),
                    payload.len(),
                    KEY_SPEC_SESSION_KEYRING,
                );
                if joined < 0 || added < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let run = command.output().unwrap();
        assert!(run.status.success(), "{}", render_output(&run));
        std::fs::read_to_string(repo.join("seen.txt")).unwrap()
    };

    let confined = env.repo("confined");
    let seen = read(&confined);
    assert!(
        seen.contains("refused keyring: Operation not permitted") && !seen.contains(&secret),
        "{seen}"
    );
    // Nor the key's name, from the kernel's listing of the keys it may view.
    assert!(!seen.contains(&description), "{seen}");

    let unconfined = env.repo("unconfined");
    write(
        &unconfined.join(".crew/config.toml"),
        "[sandbox]\nmode = \"off\"\n",
    );
    env.allow_settings(&unconfined);
    let seen = read(&unconfined);
    assert!(
        seen.starts_with(&format!("ESCAPED keyring {secret}\n")) && seen.contains(&description),
        "{seen}"
    );
}

/// Landlock refuses an agent every write outside its places, but not a file's metadata: a
/// confined agent could `chmod` any file its user owns (as root, any of the system's: a
/// root-owned program made setuid) and `touch` it. In its namespace every mount is read-only
/// but its places: a private key it tries to make world-readable, the repository's packs it
/// tries to make unreadable, a program it tries to make setuid and a file it backdates stay as
/// they were, in a worktree and in single mode, while what it does in its own places works.
#[test]
fn a_confined_agent_changes_no_mode_or_time_of_what_it_may_not_write() {
    use std::os::unix::fs::PermissionsExt;
    let env = TestEnv::new();
    let repo = env.repo("project");
    env.git(&repo, ["gc", "-q"]);
    let key = env.home().join(".ssh/id_ed25519");
    write(&key, "private\n");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let program = env.root().join("bin/tool");
    write(&program, "#!/bin/sh\n");
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let packs = repo.join(".git/objects/pack");
    let pack = std::fs::read_dir(&packs)
        .unwrap()
        .flatten()
        .map(|entry| entry.path())
        .find(|path| {
            path.extension()
                .is_some_and(|extension| extension == "pack")
        })
        .unwrap();
    // Modes, and the times of the files only the agent could touch (git freshens a pack's
    // time itself when it writes an object the pack holds).
    let state = |path: &std::path::Path| {
        let metadata = std::fs::metadata(path).unwrap();
        let time = (!path.starts_with(&repo)).then(|| metadata.modified().unwrap());
        (metadata.permissions().mode(), time)
    };
    let watched = [
        key.as_std_path(),
        program.as_std_path(),
        packs.as_std_path(),
        &pack,
    ];
    let before: Vec<_> = watched.iter().map(|path| state(path)).collect();
    let attempt = format!(
        "chmod 644 {key} && echo ESCAPED key; chmod 4755 {program} && echo ESCAPED setuid; \
         chmod 000 {packs} {pack} && echo ESCAPED packs; touch -d 2001-01-01 {key} && echo ESCAPED time; \
         echo mine > mine.sh && chmod +x mine.sh && touch -d 2001-01-01 mine.sh && echo OWN OK",
        pack = pack.display()
    );
    for mode in ["worktree", "single"] {
        let output = env.crew(
            &repo,
            [
                "run",
                "--quiet",
                "--workspace-mode",
                mode,
                "--agent",
                "shell",
                &attempt,
            ],
        );
        assert!(
            output.status.success(),
            "{mode}: {}",
            render_output(&output)
        );
        let run = run_ids(&env, &repo)[0].clone();
        let log = output_log(&repo, &run, "shell");
        // In single mode the git directory is the agent's private view: its chmod there
        // changes its view, and the repository's own packs are compared below.
        let escaped = log.lines().any(|line| {
            line.starts_with("ESCAPED") && !(mode == "single" && line == "ESCAPED packs")
        });
        assert!(!escaped, "{mode}: {log}");
        assert!(log.contains("OWN OK"), "{mode}: {log}");
        let after: Vec<_> = watched.iter().map(|path| state(path)).collect();
        assert_eq!(after, before, "{mode}: {log}");
        std::fs::remove_file(repo.join("mine.sh")).ok();
    }
    env.git(&repo, ["fsck", "--no-progress"]);
}

/// The same as an ordinary user, whose own files are the ones its agent could `chmod`: crew
/// run by `nobody`, whose private key its agent tries to make world-readable.
#[test]
fn as_an_unprivileged_user_a_confined_agent_changes_no_mode_of_its_user_s_files() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if !crew_tests::can_drop_to_nobody() {
        return;
    }
    let env = TestEnv::reachable_by_others();
    let repo = env.repo("project");
    let key = env.home().join(".ssh/id_ed25519");
    write(&key, "private\n");
    env.hand_to_nobody();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut command = env.crew_command_for_others(&repo);
    command.args([
        "run",
        "--quiet",
        "--agent",
        "shell",
        &format!("chmod 644 {key} && echo ESCAPED key; echo mine > mine.sh && chmod +x mine.sh && echo OWN OK"),
    ]);
    command.uid(crew_tests::NOBODY);
    command.gid(crew_tests::NOBODY);
    let run = command.output().unwrap();
    assert!(run.status.success(), "{}", render_output(&run));
    let log = output_log(&repo, &run_ids(&env, &repo)[0], "shell");
    assert!(!log.contains("ESCAPED") && log.contains("OWN OK"), "{log}");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{log}");
}

/// A lock needs no right to write: an agent that opened crew's state lock or its repository
/// lock (both readable to it) and held it would stall its host's every record and every other
/// task's workspace for as long as it liked. In its namespace both files are covered: what it
/// locks is not theirs, and while it holds it, the real locks are free.
#[test]
fn an_agent_cannot_hold_crew_s_locks() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let warmup = env.crew(
        &repo,
        [
            "run",
            "--workspace-mode",
            "worktree",
            "--agent",
            "shell",
            "true",
        ],
    );
    assert!(warmup.status.success(), "{}", render_output(&warmup));
    let locks = [
        repo.join(".crew/state/lock"),
        repo.join(".git/crew-worktrees.lock"),
    ];
    let fake = crew_tests::helper_bin("fake-agent");
    for lock in &locks {
        let mut run = env
            .crew_command(&repo)
            .args([
                "run",
                "--quiet",
                "--workspace-mode",
                "worktree",
                "--agent",
                "shell",
                &format!("{fake} hold-lock {lock} 30"),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        crate::common::runs::wait_for_agents_saying(&env, &repo, "held", 1);
        // While the agent holds what it took for the lock, the lock itself is free.
        let file = std::fs::File::open(lock).unwrap();
        let free = file.try_lock();
        let _ = run.kill();
        let _ = run.wait();
        assert!(free.is_ok(), "{lock} is held by the agent: {free:?}");
    }
}

/// What covers crew's lock files in an agent's namespace is the agent's own: a lock one agent
/// holds on it keeps no other agent from taking its own (with `/dev/null` over them, one inode
/// for the whole machine, the first agent's lock refused every other's, and a lock of a
/// hostile agent would hold every other agent's `crew` command up).
#[test]
fn an_agent_s_lock_on_its_cover_of_crew_s_lock_holds_up_no_other_agent() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let lock = repo.join(".crew/state/lock");
    let fake = crew_tests::helper_bin("fake-agent");
    let warmup = env.crew(&repo, ["run", "--agent", "shell", "true"]);
    assert!(warmup.status.success(), "{}", render_output(&warmup));
    let mut runs = Vec::new();
    for _ in 0..2 {
        runs.push(
            env.crew_command(&repo)
                .args([
                    "run",
                    "--quiet",
                    "--workspace-mode",
                    "worktree",
                    "--agent",
                    "shell",
                    &format!("{fake} hold-lock {lock} 30"),
                ])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    crate::common::runs::wait_for_agents_saying(&env, &repo, "held", 2);
    for mut run in runs {
        let _ = run.kill();
        let _ = run.wait();
    }
}

/// A confined agent keeps no capability, nor gains one by its exec: run by root, it would hold
/// every capability of its own namespace, and where the kernel gives it none (namespaces
/// refused) every capability of root's — loading a kernel module from its workspace, setting
/// the clock — which Landlock does not refuse. Nor does a program that carries capabilities
/// of its own (`setcap`, as root) give them to it. With the sandbox off, root's agent has
/// them (what the test reads is there to read).
#[test]
fn a_confined_agent_keeps_no_capability_with_or_without_a_namespace_of_its_own() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let mut show = "grep -E '^Cap(Inh|Prm|Eff|Amb)' /proc/self/status".to_owned();
    // A grep that carries a capability of its own, where one can be given (as root).
    let carrying = env.root().join("bin/grep-carrying");
    std::fs::create_dir_all(carrying.parent().unwrap()).unwrap();
    let given = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "PATH=$PATH:/usr/sbin:/sbin; cp \"$(command -v grep)\" {carrying} && setcap cap_dac_read_search+ep {carrying}"
        ))
        .output()
        .unwrap();
    let lines = if given.status.success() {
        show.push_str(&format!(
            "; {carrying} -E '^Cap(Prm|Eff)' /proc/self/status"
        ));
        6
    } else {
        // Only root may give a file a capability; CI (root, with setcap) must.
        assert!(
            std::env::var_os("CREW_TESTS_REQUIRE_SETCAP").is_none(),
            "setcap failed: {}",
            render_output(&given)
        );
        eprintln!(
            "skipped: a program carrying a capability (setcap failed: {})",
            String::from_utf8_lossy(&given.stderr).trim()
        );
        4
    };
    let show = show.as_str();
    // The sets the agent printed, and those of them that hold a capability.
    let sets = |dir: &Utf8Path, run: std::process::Output| -> (usize, Vec<String>) {
        assert!(run.status.success(), "{}", render_output(&run));
        let log = output_log(dir, &run_ids(&env, dir)[0], "shell");
        let shown: Vec<&str> = log.lines().filter(|line| line.starts_with("Cap")).collect();
        let held = shown
            .iter()
            .filter(|line| !line.ends_with("0000000000000000"))
            .map(|line| (*line).to_owned())
            .collect();
        (shown.len(), held)
    };

    let confined = env.crew(&repo, ["run", "--agent", "shell", show]);
    assert_eq!(sets(&repo, confined), (lines, Vec::new()));

    let without = crate::common::runs::crew_without_namespaces(&env, &repo)
        .args(["run", "--agent", "shell", show])
        .output()
        .unwrap();
    if crate::common::runs::namespace_refused_to_the_test(&without) {
        return;
    }
    assert_eq!(sets(&repo, without), (lines, Vec::new()));

    if rustix::process::geteuid().is_root() {
        let off = unconfined_repo(&env);
        let run = env.crew(&off, ["run", "--agent", "shell", show]);
        let (shown, held) = sets(&off, run);
        assert!(shown == lines && held.len() >= 3, "{held:?}");
    }
}

/// Confined agents of one host share a user namespace its host made once (cheaper than one of
/// their own at each start), and that gives none of them another's: an agent that finds a
/// sibling tries to read and enter its mount and network namespaces, from where it is and
/// from a user namespace of its own. With the sandbox off (root only, where the agents have
/// no namespaces and the capabilities to enter any) the same attempts get in: the attack
/// works where nothing stops it.
#[test]
fn agents_share_their_host_s_user_namespace_and_none_enters_another_s_namespaces() {
    let env = TestEnv::new();
    // The sibling says where it is and waits; the other goes at it, then lets it go (each
    // waits 30 s at most: a test that fails ends).
    let script = r#"own=$(readlink /proc/self/ns/user)
case "$CREW_AGENT_ID" in
*:shell-1) echo "own $own"; echo $$ > sibling.pid; for i in $(seq 600); do [ -e attacked ] && break; sleep 0.05; done; exit 0 ;;
esac
echo "own $own"
for i in $(seq 600); do [ -s sibling.pid ] && break; sleep 0.05; done
pid=$(cat sibling.pid)
{
echo "sibling $pid"
readlink /proc/$pid/ns/mnt && echo "ESCAPED read its mount namespace"
nsenter --mount=/proc/$pid/ns/mnt true && echo "ESCAPED into its mount namespace"
nsenter --net=/proc/$pid/ns/net true && echo "ESCAPED into its network namespace"
unshare -Ur nsenter --mount=/proc/$pid/ns/mnt true && echo "ESCAPED into its mount namespace from a namespace of its own"
} > attack.txt 2>&1
touch attacked"#;
    let attack = |repo: &Utf8Path| -> (String, Vec<String>) {
        let run = env.crew(
            repo,
            [
                "run",
                "--agent",
                "shell",
                "--fan-out",
                "2",
                "--max-parallel",
                "2",
                script,
            ],
        );
        assert!(run.status.success(), "{}", render_output(&run));
        let run_id = &run_ids(&env, repo)[0];
        let namespaces = ["shell-1", "shell-2"]
            .iter()
            .map(|task| {
                let log = output_log(repo, run_id, task);
                let own = log.lines().find_map(|line| line.strip_prefix("own "));
                own.unwrap_or_else(|| panic!("{task} said nothing: {log}"))
                    .to_owned()
            })
            .collect();
        let attack = std::fs::read_to_string(repo.join("attack.txt")).unwrap();
        assert!(attack.starts_with("sibling "), "{attack}");
        (attack, namespaces)
    };

    let repo = env.repo("project");
    let (attempts, namespaces) = attack(&repo);
    assert!(!attempts.contains("ESCAPED"), "{attempts}");
    let host = std::fs::read_link("/proc/self/ns/user").unwrap();
    assert_eq!(namespaces[0], namespaces[1], "{attempts}");
    assert_ne!(namespaces[0], host.to_string_lossy(), "{attempts}");

    if rustix::process::geteuid().is_root() {
        let off = unconfined_repo(&env);
        let (attempts, _) = attack(&off);
        assert!(
            attempts.contains("ESCAPED into its mount namespace\n"),
            "{attempts}"
        );
    }
}

/// System V shared memory and message queues are found by a number, not a path, so Landlock
/// does not see them: in the machine's IPC namespace an agent could list, read and remove
/// those of every program of its user (as root, of everyone's: a database's shared memory).
/// A confined agent has an IPC namespace of its own: it sees none of the host's objects,
/// removes none, and makes its own as before.
#[test]
fn a_confined_agent_reaches_no_system_v_ipc_object_outside_its_sandbox() {
    let env = TestEnv::new();
    // Made by `ipcmk` as the user's programs would, in this process's namespace; the ids are
    // what the agent goes for (as `ipcs` would have shown it).
    let make = |what: &str| -> String {
        let made = std::process::Command::new("ipcmk")
            .arg(what)
            .output()
            .unwrap();
        assert!(made.status.success(), "{}", render_output(&made));
        let said = String::from_utf8(made.stdout).unwrap();
        said.rsplit(' ').next().unwrap().trim().to_owned()
    };
    let listed = |table: &str, id: &str| {
        std::fs::read_to_string(format!("/proc/sysvipc/{table}"))
            .unwrap()
            .lines()
            .any(|line| line.split_whitespace().nth(1) == Some(id))
    };
    let remove = |flag: &str, id: &str| {
        let _ = std::process::Command::new("ipcrm")
            .args([flag, id])
            .output();
    };
    // What the agent says it did to a queue and a segment made for it, and whether each is
    // still there after (then removed).
    let attack = |repo: &Utf8Path| -> (String, bool, bool) {
        let (queue, memory) = (make("-Q"), make("-M4096"));
        let script = format!(
            r#"ipcs -q -m | grep -E '^0x' | sed 's/^/SEEN /' > attack.txt
ipcrm -q {queue} 2>/dev/null && echo 'ESCAPED removed the queue' >> attack.txt
ipcrm -m {memory} 2>/dev/null && echo 'ESCAPED removed the shared memory' >> attack.txt
own=$(ipcmk -Q) && echo "OWN $own" >> attack.txt && ipcrm -q "${{own##* }}"
true"#
        );
        let run = env.crew(repo, ["run", "--agent", "shell", &script]);
        let kept = (listed("msg", &queue), listed("shm", &memory));
        remove("-q", &queue);
        remove("-m", &memory);
        assert!(run.status.success(), "{}", render_output(&run));
        let attempts = std::fs::read_to_string(repo.join("attack.txt")).unwrap();
        (attempts, kept.0, kept.1)
    };

    let repo = env.repo("project");
    let (attempts, queue_kept, memory_kept) = attack(&repo);
    assert!(
        !attempts.contains("ESCAPED") && !attempts.contains("SEEN"),
        "{attempts}"
    );
    assert!(queue_kept && memory_kept, "{attempts}");
    assert!(attempts.contains("OWN Message queue id: "), "{attempts}");

    // With the sandbox off, the same agent removes both.
    let off = unconfined_repo(&env);
    let (attempts, queue_kept, memory_kept) = attack(&off);
    assert!(
        attempts.contains("ESCAPED removed the queue")
            && attempts.contains("ESCAPED removed the shared memory"),
        "{attempts}"
    );
    assert!(!queue_kept && !memory_kept, "{attempts}");
}

/// POSIX shared memory is files in `/dev/shm`, which every program may write: a confined
/// agent could read, fill or remove any other program's segment there (a browser's, a
/// database's, the sound server's). It gets a `/dev/shm` of its own: the user's segment is
/// not there, it stays as it was, and the agent's own shared memory works and goes with it.
#[test]
fn a_confined_agent_has_shared_memory_of_its_own_and_never_the_user_s() {
    let env = TestEnv::new();
    let segment = Utf8PathBuf::from(format!("/dev/shm/crew-test-{}", std::process::id()));
    let own = format!("crew-test-own-{}", std::process::id());
    // What the agent read of the user's segment, what it says of its own, and what is left
    // of the user's after it appended to it and removed it.
    let attack = |repo: &Utf8Path, agent: &str| -> (String, Option<String>) {
        write(&segment, "the user's\n");
        let script = format!(
            r#"cat {segment} > attack.txt 2>/dev/null
echo agent >> {segment} 2>/dev/null
rm -f {segment} 2>/dev/null
echo mine > /dev/shm/{own} && [ "$(cat /dev/shm/{own})" = mine ] && echo "OWN shared memory" >> attack.txt
true"#
        );
        let run = env.crew(repo, ["run", "--agent", agent, &script]);
        assert!(run.status.success(), "{}", render_output(&run));
        let left = std::fs::read_to_string(&segment).ok();
        let _ = std::fs::remove_file(&segment);
        (
            std::fs::read_to_string(repo.join("attack.txt")).unwrap(),
            left,
        )
    };

    let repo = env.repo("project");
    let (attempts, left) = attack(&repo, "shell");
    let own_left = std::path::Path::new("/dev/shm").join(&own).exists();
    assert!(!attempts.contains("the user's"), "{attempts}");
    assert_eq!(left.as_deref(), Some("the user's\n"), "{attempts}");
    assert!(attempts.contains("OWN shared memory"), "{attempts}");
    assert!(
        !own_left,
        "the agent's own segment landed in the user's /dev/shm"
    );

    // With the sandbox off, the same agent reads the user's, and removes it.
    let off = unconfined_repo(&env);
    let (attempts, left) = attack(&off, "shell");
    let _ = std::fs::remove_file(std::path::Path::new("/dev/shm").join(&own));
    assert!(attempts.contains("the user's"), "{attempts}");
    assert_eq!(left, None, "{attempts}");

    // A definition that grants the user's `/dev/shm` by name, allowed, shares it.
    let shared = env.repo("shared");
    write(
        &shared.join(".crew/agents/shared.toml"),
        "command = [\"sh\", \"-c\", \"{prompt}\"]\n[sandbox]\nwrite = [\"/dev/shm\"]\n",
    );
    env.allow_settings(&shared);
    let (attempts, left) = attack(&shared, "shared");
    let _ = std::fs::remove_file(std::path::Path::new("/dev/shm").join(&own));
    assert!(attempts.contains("the user's"), "{attempts}");
    assert_eq!(left, None, "{attempts}");
}

/// An agent started from the user's terminal had it as its controlling terminal: through
/// `/dev/tty` it could push keystrokes into it (`TIOCSTI`, which the user's shell reads once
/// crew is done) or read from it. No agent has a controlling terminal: `/dev/tty` does not
/// open for it, confined or not, and nothing it tries reaches the terminal crew runs in.
#[test]
fn an_agent_has_no_controlling_terminal_to_type_into() {
    use crate::common::tmux::{Tmux, crew_script_with};
    let env = TestEnv::new();
    // Its marker is built at run time: the screen never shows it unless it was typed.
    let inject = r#"python3 -c '
import fcntl, os, termios
try:
    fd = os.open("/dev/tty", os.O_RDONLY)
except OSError as error:
    print("no terminal:", error.strerror)
    raise SystemExit
try:
    for key in "pla" + "nted\n":
        fcntl.ioctl(fd, termios.TIOCSTI, key.encode())
    print("ESCAPED typed into the terminal")
except OSError as error:
    print("opened the terminal, refused:", error.strerror)
' > tried.txt 2>&1"#;
    for repo in [env.repo("project"), unconfined_repo(&env)] {
        let script = crew_script_with(
            &env,
            &repo,
            &[
                "run".into(),
                "--quiet".into(),
                "--agent".into(),
                "shell".into(),
                inject.into(),
            ],
            "inject.sh",
            &[],
        );
        let Some(terminal) = Tmux::start(&env, "an_agent_has_no_controlling_terminal", &script)
        else {
            return;
        };
        let screen = terminal.screen_when("crew to end", |screen| screen.contains("EXITED-"));
        let tried = std::fs::read_to_string(repo.join("tried.txt")).unwrap_or_default();
        assert!(screen.contains("EXITED-0"), "{screen}\n{tried}");
        assert_eq!(
            tried.trim(),
            "no terminal: No such device or address",
            "{screen}"
        );
        assert!(!screen.contains("planted"), "{screen}\n{tried}");
    }
}

/// While a worktree task runs confined by the kernel (it cannot write the shared git
/// directory), the user sets a config value, adds a hook and runs `git gc`: those are the
/// user's, kept as they are, and nothing blames the agent for them.
#[test]
fn what_the_user_changes_in_git_while_a_confined_agent_works_is_kept_and_not_blamed() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let go = env.root().join("go");
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

/// Runs a task `swap` three times in `mode` (its run directories made in `parent`) while a
/// racer swaps each run directory holding `swap/` for a link to a directory of the user's,
/// once `ready(<.crew/state/runs>, <run>)` says so; then checks that the agent never ran
/// there and crew wrote nothing there.
fn race_a_swapped_workspace(
    mode: &str,
    parent: &str,
    config: &str,
    ready: fn(&std::path::Path, &std::ffi::OsStr) -> bool,
) {
    let env = TestEnv::new();
    let repo = env.repo("project");
    write(
        &repo.join(".crew/config.toml"),
        &format!("[worktree]\npool_size = 0\n{config}"),
    );
    env.allow_settings(&repo);
    let victim = env.root().join("victim");
    let ws = repo.join(parent);
    std::fs::create_dir_all(&ws).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let racer = {
        let (ws, runs, victim, stop, aside) = (
            ws.clone().into_std_path_buf(),
            repo.join(".crew/state/runs").into_std_path_buf(),
            victim.clone().into_std_path_buf(),
            stop.clone(),
            env.root().join("aside").into_std_path_buf(),
        );
        std::thread::spawn(move || {
            let mut swapped = 0;
            std::fs::create_dir_all(&aside).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for run in std::fs::read_dir(&ws).into_iter().flatten().flatten() {
                    let run_dir = run.path();
                    let name = run.file_name();
                    if run_dir.is_symlink()
                        || !run_dir.join("swap").is_dir()
                        || !ready(&runs, &name)
                    {
                        continue;
                    }
                    std::fs::create_dir_all(victim.join(&name).join("swap")).unwrap();
                    std::fs::write(victim.join(&name).join("swap/canary.txt"), "mine\n").unwrap();
                    if std::fs::rename(&run_dir, aside.join(&name)).is_ok() {
                        std::os::unix::fs::symlink(victim.join(&name), &run_dir).unwrap();
                        swapped += 1;
                    }
                }
                std::thread::yield_now();
            }
            swapped
        })
    };
    for _ in 0..3 {
        let output = env.crew(
            &repo,
            [
                "run",
                "--agent",
                "shell",
                "--workspace-mode",
                mode,
                "--task",
                "swap=rm -f canary.txt; echo ran > ran.txt",
            ],
        );
        let _ = render_output(&output);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swapped = racer.join().unwrap();
    assert!(
        swapped > 0,
        "{mode} {config}: the racer never had its chance"
    );
    for run in std::fs::read_dir(&victim).unwrap().flatten() {
        let task = run.path().join("swap");
        // Neither the agent nor crew wrote there: the canary alone.
        let mut left: Vec<String> = std::fs::read_dir(&task)
            .unwrap()
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["canary.txt"],
            "{mode} {config}: the agent or crew wrote in {}",
            task.display()
        );
    }
}
