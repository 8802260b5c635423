//! With the sandbox off: what the tripwire and teardown catch of an agent's changes to git.

use super::*;

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
