//! Recycled worktrees: the next task gets a worktree that holds nothing of the previous one but
//! what `keep_ignored` allows, on its own branch and base; the pool stays bounded.

use std::time::Duration;

use crew_core::config::ProjectConfig;
use crew_core::provider::WorkspaceProvider;
use crew_tests::{tree_fingerprint, write};

use crate::common::worktrees::Fixture;

fn pooled_dirs(fixture: &Fixture) -> usize {
    std::fs::read_dir(fixture.repo.join(".worktrees/.pool")).map_or(0, |entries| entries.count())
}

/// A project whose recycled worktrees keep their ignored `target/`.
fn keeping_target() -> Fixture {
    let mut config = ProjectConfig::default();
    config.worktree.keep_ignored = vec!["target".into()];
    Fixture::with_config(config)
}

fn pooled_paths(fixture: &Fixture) -> Vec<camino::Utf8PathBuf> {
    std::fs::read_dir(fixture.repo.join(".worktrees/.pool"))
        .unwrap()
        .map(|entry| camino::Utf8PathBuf::try_from(entry.unwrap().path()).unwrap())
        .collect()
}

/// Each file's path and a hash of what it holds, as `tree_fingerprint` gives them.
type Files = Vec<(String, String)>;

/// The files of `workspace`, and those of a fresh `git worktree add` of its base: `.git`,
/// `target/` and `node_modules` aside.
fn beside_a_fresh_checkout(
    fixture: &Fixture,
    workspace: &crew_core::provider::TaskWorkspace,
) -> (Files, Files) {
    let fresh = fixture.env.root().join("fresh");
    fixture.git(&[
        "worktree",
        "add",
        "-q",
        "--detach",
        fresh.as_str(),
        workspace.base_commit.as_deref().unwrap(),
    ]);
    let strip = |dir: &camino::Utf8Path| -> Files {
        tree_fingerprint(dir.as_std_path())
            .into_iter()
            .filter(|(path, _)| {
                path != ".git" && !path.starts_with("target") && path != "node_modules"
            })
            .collect()
    };
    (strip(&workspace.root), strip(&fresh))
}

#[test]
fn a_recycled_worktree_holds_nothing_of_the_previous_task_but_keep_ignored() {
    let fixture = keeping_target();
    write(&fixture.repo.join(".gitignore"), "target/\n*.log\n.env\n");
    write(&fixture.repo.join("node_modules/pkg/index.js"), "linked\n");
    fixture.git(&["add", ".gitignore"]);
    fixture.git(&["commit", "-q", "-m", "ignores"]);

    let first = fixture.allocate("first");
    let root = first.root.clone();
    write(&root.join("src/lib.txt"), "changed by first\n");
    write(&root.join("untracked/notes.txt"), "first's notes\n");
    write(&root.join("build.log"), "ignored output\n");
    write(&root.join(".env"), "SECRET=first\n");
    write(&root.join("target/debug/cache.bin"), "build cache\n");
    fixture.env.git(&root, ["rm", "-q", "README.md"]);
    let report = fixture
        .provider
        .teardown(&first, &fixture.teardown_request("first"))
        .unwrap();
    assert!(report.recycled && report.removed);
    assert!(!root.exists());
    assert_eq!(pooled_dirs(&fixture), 1);
    assert_eq!(
        (report.ignored_files, report.ignored_bytes),
        (
            2,
            "ignored output\n".len() as u64 + "SECRET=first\n".len() as u64
        )
    );

    let second = fixture.allocate("second");
    assert_eq!(pooled_dirs(&fixture), 0, "the pooled worktree was taken");
    assert_ne!(second.root, root);
    let (files, fresh) = beside_a_fresh_checkout(&fixture, &second);
    assert_eq!(files, fresh, "exactly the files of the base commit");
    assert_eq!(
        std::fs::read_to_string(second.root.join("target/debug/cache.bin")).unwrap(),
        "build cache\n",
        "keep_ignored is kept"
    );
    assert!(
        std::fs::symlink_metadata(second.root.join("node_modules"))
            .unwrap()
            .file_type()
            .is_symlink(),
        "links are made anew"
    );
    assert_eq!(
        fixture.env.git(
            &second.root,
            ["status", "--porcelain", "--untracked-files=all"]
        ),
        ""
    );
    let head = fixture.env.git(&second.root, ["symbolic-ref", "HEAD"]);
    assert_eq!(
        head.trim(),
        format!("refs/heads/crew/{}-second", fixture.run_id)
    );
    let list = fixture.git(&["worktree", "list", "--porcelain"]);
    assert!(
        list.contains(&format!("worktree {}", second.root)),
        "{list}"
    );
    assert!(
        list.contains(&format!("branch refs/heads/crew/{}-second", fixture.run_id)),
        "{list}"
    );

    // The first task's work is on its branch, untouched by the recycling.
    let saved = fixture.git(&[
        "show",
        &format!("crew/{}-first:src/lib.txt", fixture.run_id),
    ]);
    assert_eq!(saved, "changed by first\n");
    let fsck = fixture
        .env
        .git_output(&fixture.repo, ["fsck", "--no-progress"]);
    assert!(fsck.status.success());
}

#[test]
fn a_task_takes_the_pooled_worktree_that_kept_its_build_output_before_a_refilled_one() {
    let fixture = keeping_target();
    write(&fixture.repo.join(".gitignore"), "target/\n");
    fixture.git(&["add", ".gitignore"]);
    fixture.git(&["commit", "-q", "-m", "ignores"]);
    let first = fixture.allocate("first");
    write(&first.root.join("target/debug/cache.bin"), "build cache\n");
    let report = fixture
        .provider
        .teardown(&first, &fixture.teardown_request("first"))
        .unwrap();
    assert!(report.recycled);
    // A run's end refills the pool in the background: newer worktrees, with no build output.
    let added =
        crew_worktree::pool::refill_at_head(&fixture.repo, fixture.provider.settings(), || false)
            .unwrap();
    assert!(
        added > 0,
        "the refill added cold worktrees beside the warm one"
    );

    let second = fixture.allocate("second");
    assert_eq!(
        std::fs::read_to_string(second.root.join("target/debug/cache.bin")).ok(),
        Some("build cache\n".to_owned()),
        "the warm worktree was taken"
    );
}

#[test]
fn a_recycled_worktree_moves_to_another_base() {
    let fixture = Fixture::new();
    let first = fixture.allocate("first");
    fixture
        .provider
        .teardown(&first, &fixture.teardown_request("first"))
        .unwrap();
    // The leader moves on: files change, appear and disappear.
    write(&fixture.repo.join("src/lib.txt"), "newer\n");
    write(&fixture.repo.join("docs/new.md"), "# new\n");
    fixture.git(&["rm", "-q", "README.md"]);
    fixture.git(&["add", "-A"]);
    fixture.git(&["commit", "-q", "-m", "move on"]);
    let second = fixture.allocate("second");
    assert_eq!(
        std::fs::read_to_string(second.root.join("src/lib.txt")).unwrap(),
        "newer\n"
    );
    assert!(second.root.join("docs/new.md").is_file());
    assert!(!second.root.join("README.md").exists());
    assert_eq!(
        fixture.env.git(
            &second.root,
            ["status", "--porcelain", "--untracked-files=all"]
        ),
        ""
    );
    assert_eq!(
        fixture.env.git(&second.root, ["rev-parse", "HEAD"]),
        fixture.git(&["rev-parse", "HEAD"])
    );
}

#[test]
fn the_pool_is_bounded_by_size_and_age_and_prune_empties_it() {
    let mut config = ProjectConfig::default();
    config.worktree.pool_size = 2;
    config.worktree.pool_max_age = crew_core::config::HumanDuration(Duration::from_millis(800));
    let fixture = Fixture::with_config(config);
    let workspaces: Vec<_> = (0..4)
        .map(|index| fixture.allocate(&format!("t{index}")))
        .collect();
    for (index, workspace) in workspaces.iter().enumerate() {
        fixture
            .provider
            .teardown(workspace, &fixture.teardown_request(&format!("t{index}")))
            .unwrap();
    }
    assert_eq!(pooled_dirs(&fixture), 2, "never more than pool_size");

    std::thread::sleep(Duration::from_secs(1));
    let fresh = fixture.allocate("after-expiry");
    assert_eq!(pooled_dirs(&fixture), 0, "too old: removed, not recycled");
    fixture
        .provider
        .teardown(&fresh, &fixture.teardown_request("after-expiry"))
        .unwrap();
    assert_eq!(pooled_dirs(&fixture), 1);

    let store = crew_core::StateStore::new(fixture.workspace.id(), fixture.workspace.repo_root());
    let report =
        crew_worktree::listing::prune(&fixture.repo, fixture.provider.settings(), &store, false)
            .unwrap();
    assert_eq!(report.emptied_pool, 1);
    assert_eq!(pooled_dirs(&fixture), 0);
    let list = fixture.git(&["worktree", "list", "--porcelain"]);
    assert_eq!(list.matches("worktree ").count(), 1, "{list}");
}

#[test]
fn emptying_the_pool_deletes_nothing_while_it_holds_the_repository_lock() {
    let fixture = Fixture::new();
    let workspaces = ["one", "two"].map(|task| (task, fixture.allocate(task)));
    for (task, workspace) in &workspaces {
        fixture
            .provider
            .teardown(workspace, &fixture.teardown_request(task))
            .unwrap();
    }
    assert_eq!(pooled_dirs(&fixture), 2);
    let common = fixture.repo.join(".git");
    let trash = fixture.repo.join(".worktrees/.trash");
    let files_in_trash = || {
        tree_fingerprint(trash.as_std_path())
            .into_iter()
            .filter(|(path, _)| path.ends_with("src/lib.txt"))
            .count()
    };

    let lock = crew_worktree::create::repo_lock(&common).unwrap();
    let emptied = crew_worktree::pool::empty(&common, &fixture.repo, fixture.provider.settings());
    assert_eq!(emptied, 2);
    // Taken out of the pool under the lock, but not deleted there: other tasks' worktrees
    // would wait on the deletion of every file.
    assert_eq!(pooled_dirs(&fixture), 0);
    assert_eq!(files_in_trash(), 2, "deleted while the lock was held");
    drop(lock);
    assert_eq!(
        files_in_trash(),
        0,
        "not deleted once the lock was released"
    );
    let list = fixture.git(&["worktree", "list", "--porcelain"]);
    assert_eq!(list.matches("worktree ").count(), 1, "{list}");
}

#[test]
fn pool_size_zero_turns_recycling_off() {
    let mut config = ProjectConfig::default();
    config.worktree.pool_size = 0;
    let fixture = Fixture::with_config(config);
    let workspace = fixture.allocate("only");
    let report = fixture
        .provider
        .teardown(&workspace, &fixture.teardown_request("only"))
        .unwrap();
    assert!(report.removed && !report.recycled);
    assert_eq!(pooled_dirs(&fixture), 0);
    let list = fixture.git(&["worktree", "list", "--porcelain"]);
    assert_eq!(list.matches("worktree ").count(), 1, "{list}");
}

/// A process the old task left behind (or anything else) may still write into a worktree
/// while it waits in the pool: whatever it changed, staged, added or ignored is undone when the
/// next task takes it, and a directory it swapped for a link is not written through.
#[test]
fn what_changes_in_a_pooled_worktree_while_it_waits_is_undone_when_taken() {
    let fixture = keeping_target();
    write(&fixture.repo.join(".gitignore"), "target/\n*.log\n");
    write(&fixture.repo.join("lib/deep/mod.txt"), "module\n");
    fixture.git(&["add", "-A"]);
    fixture.git(&["commit", "-q", "-m", "more files"]);

    let first = fixture.allocate("first");
    write(&first.root.join("target/cache.bin"), "kept cache\n");
    let report = fixture
        .provider
        .teardown(&first, &fixture.teardown_request("first"))
        .unwrap();
    assert!(report.recycled, "{report:?}");
    let pooled = pooled_paths(&fixture);
    let [waiting] = pooled.as_slice() else {
        panic!("one pooled worktree: {pooled:?}")
    };

    // The hostile writer, while the worktree waits.
    let outside = fixture.env.root().join("outside");
    write(&outside.join("mod.txt"), "outside, never written\n");
    write(&waiting.join("src/lib.txt"), "planted\n");
    std::fs::remove_file(waiting.join("README.md")).unwrap();
    write(&waiting.join("staged.txt"), "staged\n");
    fixture.env.git(waiting, ["add", "staged.txt"]);
    write(&waiting.join("untracked/a/b.txt"), "untracked\n");
    write(&waiting.join("run.log"), "ignored\n");
    std::fs::remove_dir_all(waiting.join("lib/deep")).unwrap();
    std::os::unix::fs::symlink(&outside, waiting.join("lib/deep")).unwrap();

    let second = fixture.allocate("second");
    assert_eq!(pooled_dirs(&fixture), 0, "the pooled worktree was taken");
    let (files, fresh) = beside_a_fresh_checkout(&fixture, &second);
    assert_eq!(files, fresh, "exactly the base commit");
    assert!(
        !std::fs::symlink_metadata(second.root.join("lib/deep"))
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link is gone, the directory is back"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("mod.txt")).unwrap(),
        "outside, never written\n"
    );
    assert_eq!(
        std::fs::read_to_string(second.root.join("target/cache.bin")).unwrap(),
        "kept cache\n",
        "keep_ignored is kept"
    );
    assert_eq!(
        fixture.env.git(
            &second.root,
            [
                "status",
                "--porcelain",
                "--untracked-files=all",
                "--ignored"
            ]
        ),
        "!! target/cache.bin\n"
    );
}

/// A name that is not UTF-8 cannot be handed to the checkout one by one: the whole worktree is
/// checked out instead, and the file still goes.
#[test]
fn a_pooled_worktree_given_a_name_that_is_not_utf8_is_still_cleaned() {
    use std::os::unix::ffi::OsStrExt;
    let fixture = Fixture::new();
    let first = fixture.allocate("first");
    fixture
        .provider
        .teardown(&first, &fixture.teardown_request("first"))
        .unwrap();
    let waiting = pooled_paths(&fixture).remove(0);
    let odd = waiting
        .as_std_path()
        .join(std::ffi::OsStr::from_bytes(b"caf\xe9.txt"));
    std::fs::write(&odd, "latin-1 name\n").unwrap();
    write(&waiting.join("src/lib.txt"), "planted\n");

    let second = fixture.allocate("second");
    let names: Vec<_> = std::fs::read_dir(&second.root)
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert!(
        !names.iter().any(|name| name.as_bytes() == b"caf\xe9.txt"),
        "{names:?}"
    );
    assert_eq!(
        fixture.env.git(
            &second.root,
            ["status", "--porcelain", "--untracked-files=all"]
        ),
        ""
    );
}

#[test]
fn a_worktree_a_leftover_process_still_uses_is_never_pooled() {
    let fixture = Fixture::with_config(ProjectConfig::default());
    let first = fixture.allocate("first");
    write(&first.root.join("work.txt"), "work\n");
    // A process of the old task that nothing killed, working inside the worktree.
    let mut lingering = std::process::Command::new("sleep")
        .arg("60")
        .current_dir(first.root.join("src"))
        .spawn()
        .unwrap();
    let report = fixture
        .provider
        .teardown(&first, &fixture.teardown_request("first"))
        .unwrap();
    lingering.kill().unwrap();
    lingering.wait().unwrap();
    assert!(report.committed.is_some(), "the work is saved: {report:?}");
    assert!(!report.recycled, "not handed to the next task: {report:?}");
    assert_eq!(pooled_dirs(&fixture), 0);
}

/// The pool's worktrees that are ready to take: locked as pooled, their directory there.
fn ready_in_pool(env: &crew_tests::TestEnv, repo: &camino::Utf8Path) -> Vec<String> {
    let listed = env.git(repo, ["worktree", "list", "--porcelain"]);
    let mut ready = Vec::new();
    for block in listed.split("\n\n") {
        let path = block
            .lines()
            .find_map(|line| line.strip_prefix("worktree "))
            .unwrap_or_default();
        if path.contains("/.worktrees/.pool/")
            && block.contains(crew_worktree::pool::POOLED)
            && camino::Utf8Path::new(path).is_dir()
        {
            ready.push(path.to_owned());
        }
    }
    ready
}

/// The inode of a directory: kept when the pool hands a worktree on (it is renamed).
fn inode(path: &str) -> u64 {
    std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).unwrap())
}

#[test]
fn the_pool_refills_itself_after_a_run_and_the_next_run_starts_recycled() {
    let env = crew_tests::TestEnv::new();
    let repo = crate::common::runs::repo_with_config(&env, "[worktree]\npool_size = 3\n");
    let head = env.git(&repo, ["rev-parse", "HEAD"]);
    crate::common::runs::shell_worktree_run(&env, &repo, &["first=true"]);
    // The run's one worktree went back to the pool; the refill adds the two it lacks.
    let ready = crew_tests::wait_until(60, "the pool to refill", || {
        let ready = ready_in_pool(&env, &repo);
        (ready.len() == 3).then_some(ready)
    });
    for path in &ready {
        let path = camino::Utf8Path::new(path);
        assert_eq!(
            env.git(path, ["status", "--porcelain"]),
            "",
            "{path} is clean"
        );
        assert_eq!(
            env.git(path, ["rev-parse", "HEAD"]),
            head,
            "{path} is at HEAD"
        );
    }
    let pooled: Vec<u64> = ready.iter().map(|path| inode(path)).collect();

    // The next run's tasks each get one of them, not a fresh checkout.
    let run = crate::common::runs::shell_worktree_run(
        &env,
        &repo,
        &[
            "a=stat -c %i . > inode.txt",
            "b=stat -c %i . > inode.txt",
            "c=stat -c %i . > inode.txt",
        ],
    );
    for task in ["a", "b", "c"] {
        let shown = env.git(&repo, ["show", &format!("crew/{run}-{task}:inode.txt")]);
        let used: u64 = shown.trim().parse().unwrap();
        assert!(
            pooled.contains(&used),
            "{task} ran in inode {used}, not one of {pooled:?}"
        );
    }
}

#[test]
fn a_refill_gives_way_to_a_running_run_and_what_it_leaves_is_swept() {
    let env = crew_tests::TestEnv::new();
    let repo = crate::common::runs::repo_with_config(&env, "[worktree]\npool_size = 2\n");
    // A run going on: the refill does nothing.
    let mut running = env.spawn_crew(
        &repo,
        [
            "run",
            "--agent",
            "shell",
            "--workspace-mode",
            "single",
            "sleep 30",
        ],
    );
    crew_tests::wait_until(30, "the run to start", || {
        let agents = env.agents_json(&repo)?;
        (!agents.as_array()?.is_empty()).then_some(())
    });
    let refill = env.crew(&repo, ["worktrees", "refill"]);
    assert!(
        refill.status.success(),
        "{}",
        crew_tests::render_output(&refill)
    );
    assert!(ready_in_pool(&env, &repo).is_empty());
    let _ = running.kill();
    let _ = running.wait();
    let _ = env.crew(&repo, ["runs", "list"]);

    // Nothing running: it fills the pool. Killed at any moment, what it leaves is swept by
    // the next refill, and nothing is lost or left registered beside the pool.
    let mut killed = env
        .crew_command(&repo)
        .args(["worktrees", "refill"])
        .spawn()
        .unwrap();
    crew_tests::wait_until(30, "the refill to start filling", || {
        let listed = env.git(&repo, ["worktree", "list", "--porcelain"]);
        listed.contains("/.worktrees/.pool/").then_some(())
    });
    let _ = killed.kill();
    let _ = killed.wait();
    let again = env.crew(&repo, ["worktrees", "refill"]);
    assert!(
        again.status.success(),
        "{}",
        crew_tests::render_output(&again)
    );
    assert_eq!(ready_in_pool(&env, &repo).len(), 2);
    let listed = env.git(&repo, ["worktree", "list", "--porcelain"]);
    assert_eq!(
        listed.matches("worktree ").count(),
        3,
        "the project and two pooled worktrees: {listed}"
    );
    let pool_dirs = std::fs::read_dir(repo.join(".worktrees/.pool"))
        .unwrap()
        .count();
    assert_eq!(pool_dirs, 2, "no half-filled directory left");
}

#[test]
fn a_worktree_where_the_task_made_a_link_is_not_pooled_so_nothing_is_written_through_it() {
    let fixture = Fixture::new();
    let outside = fixture.env.dir("outside");
    write(&outside.join("mine.txt"), "not crew's\n");
    let before = tree_fingerprint(outside.as_std_path());
    let first = fixture.allocate("first");
    // The task swaps a tracked directory for a link to a directory outside.
    std::fs::remove_dir_all(first.root.join("src")).unwrap();
    std::os::unix::fs::symlink(&outside, first.root.join("src")).unwrap();
    let report = fixture
        .provider
        .teardown(&first, &fixture.teardown_request("first"))
        .unwrap();
    assert!(report.removed && !report.recycled, "{report:?}");
    assert_eq!(pooled_dirs(&fixture), 0);
    // Its work is the link, committed as a link.
    let branch = report.branch.unwrap();
    let kind = fixture.git(&["cat-file", "-t", &format!("{branch}:src")]);
    assert_eq!(kind.trim(), "blob");
    let second = fixture.allocate("second");
    assert_eq!(
        std::fs::read_to_string(second.root.join("src/lib.txt")).unwrap(),
        "one\ntwo\nthree\n"
    );
    assert_eq!(tree_fingerprint(outside.as_std_path()), before);
}

/// A racing process swaps the pool's directory for a link to a directory of the user's the
/// moment a refill makes a spare worktree there: the checkout is never written through the
/// link (the refill fills the directory it made, by handle).
#[test]
fn a_pool_swapped_for_a_link_as_a_refill_fills_it_is_never_written_through() {
    let env = crew_tests::TestEnv::new();
    let repo = crate::common::runs::repo_with_config(&env, "[worktree]\npool_size = 2\n");
    // Enough files that a checkout gives the racer its chance.
    for index in 0..400 {
        write(&repo.join(format!("src/{index}.txt")), "a file\n");
    }
    env.git(&repo, ["add", "src"]);
    env.git(&repo, ["commit", "-q", "-m", "files"]);
    let pool = repo.join(".worktrees/.pool").into_std_path_buf();
    std::fs::create_dir_all(&pool).unwrap();
    let victim = env.root().join("victim").into_std_path_buf();
    let aside = env.root().join("aside").into_std_path_buf();
    std::fs::create_dir_all(&victim).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let racer = {
        let (pool, victim, aside, stop) =
            (pool.clone(), victim.clone(), aside.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let spare = std::fs::read_dir(&pool)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .find(|entry| entry.path().is_dir());
                if let Some(spare) = spare {
                    std::fs::create_dir_all(victim.join(spare.file_name())).unwrap();
                    std::fs::rename(&pool, &aside).unwrap();
                    std::os::unix::fs::symlink(&victim, &pool).unwrap();
                    return Some(spare.file_name());
                }
                std::thread::yield_now();
            }
            None
        })
    };
    let output = env.crew(&repo, ["worktrees", "refill"]);
    let shown = crew_tests::render_output(&output);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let spare = racer
        .join()
        .unwrap()
        .unwrap_or_else(|| panic!("the racer never had its chance: {shown}"));
    let written: Vec<String> = std::fs::read_dir(victim.join(&spare))
        .unwrap()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        written.is_empty(),
        "the refill wrote {written:?} through the link: {shown}"
    );
    // The spare it made was filled where it was made.
    assert!(aside.join(&spare).join("src/0.txt").exists(), "{shown}");
}
