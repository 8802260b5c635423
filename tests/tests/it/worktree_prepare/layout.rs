//! A worktree as crew makes it, and the leader it leaves alone.

use super::*;

#[test]
fn worktree_is_a_real_git_worktree_on_its_branch() {
    let fixture = Fixture::new();
    let workspace = fixture.allocate("api");
    assert_eq!(workspace.kind, WorkspaceKind::Worktree);
    let expected_root = fixture
        .repo
        .join(".worktrees")
        .join(fixture.run_id.as_str())
        .join("api");
    assert_eq!(workspace.root, expected_root);
    assert_eq!(
        workspace.branch.as_deref(),
        Some(format!("crew/{}-api", fixture.run_id).as_str())
    );
    assert!(!workspace.reused);
    let head = fixture.git(&["rev-parse", "HEAD"]);
    assert_eq!(workspace.base_commit.as_deref(), Some(head.trim()));

    // git agrees: registered, locked, on the branch, clean, with the files of HEAD.
    let list = fixture.git(&["worktree", "list", "--porcelain"]);
    assert!(
        list.contains(&format!("worktree {expected_root}")),
        "{list}"
    );
    assert!(
        list.contains(&format!("branch refs/heads/crew/{}-api", fixture.run_id)),
        "{list}"
    );
    assert!(list.contains("locked crew: in use by run"), "{list}");
    assert_eq!(
        fixture.env.git(
            &workspace.root,
            ["status", "--porcelain", "--untracked-files=all"]
        ),
        ""
    );
    assert_eq!(
        std::fs::read_to_string(workspace.root.join("src/lib.txt")).unwrap(),
        "one\ntwo\nthree\n"
    );
    // crew's directories are excluded in the leader without touching a tracked file.
    assert_eq!(
        fixture.git(&["status", "--porcelain", "--untracked-files=all"]),
        ""
    );
    let exclude = std::fs::read_to_string(fixture.repo.join(".git/info/exclude")).unwrap();
    assert!(
        exclude.lines().any(|line| line == "/.worktrees/"),
        "{exclude}"
    );
}

/// Each run's worktrees are placed apart from the others' (the file system's "top of a
/// hierarchy" hint on `.worktrees/`), so that a checkout does not land among the inodes of
/// worktrees just deleted; the flag is not inherited by what is made inside.
#[test]
fn worktrees_directory_asks_the_file_system_to_place_runs_apart() {
    let fixture = Fixture::new();
    if let Err(error) = places_apart(&fixture.repo) {
        eprintln!(
            "skipped: the file system under {} has no file flags ({error})",
            fixture.repo
        );
        return;
    }
    let workspace = fixture.allocate("api");
    let worktrees = fixture.repo.join(".worktrees");
    assert!(
        places_apart(&worktrees).unwrap(),
        "{worktrees} is not marked as the top of a hierarchy"
    );
    for inside in [workspace.root.parent().unwrap(), workspace.root.as_path()] {
        assert!(!places_apart(inside).unwrap(), "{inside}");
    }
}

#[test]
fn leader_is_byte_identical_after_a_worktree_task() {
    let fixture = Fixture::new();
    write(&fixture.repo.join("notes/untracked.txt"), "mine\n");
    let before = fixture.leader_snapshot();
    let workspace = fixture.allocate("api");
    write(
        &workspace.root.join("src/lib.txt"),
        "changed by the agent\n",
    );
    write(&workspace.root.join("new.txt"), "new\n");
    fixture
        .provider
        .teardown(&workspace, &fixture.teardown_request("api"))
        .unwrap();
    assert_eq!(before, fixture.leader_snapshot());
}

#[test]
fn leader_with_changes_and_detached_head_is_untouched_in_other_modes() {
    let fixture = Fixture::new();
    write(&fixture.repo.join("README.md"), "staged change\n");
    fixture.git(&["add", "README.md"]);
    write(&fixture.repo.join("src/lib.txt"), "unstaged change\n");
    write(&fixture.repo.join("scratch.txt"), "untracked\n");
    let head = fixture.git(&["rev-parse", "HEAD"]);
    fixture.git(&["checkout", "-q", "--detach", head.trim()]);
    let before = fixture.leader_snapshot();
    for (task, mode) in [
        ("one", WorkspaceMode::Single),
        ("two", WorkspaceMode::Temp),
        ("three", WorkspaceMode::Dedicated),
    ] {
        let workspace = fixture
            .provider
            .allocate(&fixture.request(task, mode))
            .unwrap();
        write(
            &workspace.dir.join(format!("{task}-output.txt")),
            "output\n",
        );
        fixture
            .provider
            .teardown(&workspace, &fixture.teardown_request(task))
            .unwrap();
        // The single-mode task wrote into the leader itself; that file is the agent's work.
        let _ = std::fs::remove_file(fixture.repo.join("one-output.txt"));
        assert_eq!(before, fixture.leader_snapshot(), "after {mode}");
    }
}

#[test]
fn run_refuses_dirty_leader() {
    let fixture = Fixture::new();
    write(&fixture.repo.join("README.md"), "staged\n");
    fixture.git(&["add", "README.md"]);
    write(&fixture.repo.join("src/lib.txt"), "unstaged\n");
    let error = prepare_run_error(&fixture);
    assert_eq!(error.kind, AllocateErrorKind::Unavailable);
    let text = format!("{}\nhint: {}", error, error.hint.as_deref().unwrap());
    insta::assert_snapshot!(fixture.env.redact(&text), @"
    the leader checkout $TEST_ENV/project has uncommitted changes to tracked files:
      README.md
      src/lib.txt
    hint: commit or stash these changes (`git stash`) so that every task starts from what you see; untracked files do not block. To start from a commit instead, pass `--base <ref>`; `[worktree] require_clean_leader = false` in .crew/config.toml turns this check off
    ");
    assert!(
        !fixture.repo.join(".worktrees").exists(),
        "nothing was created"
    );
    assert_eq!(fixture.git(&["branch", "--list", "crew/*"]), "");

    // A deletion refuses too.
    fixture.git(&["checkout", "-q", "--", "."]);
    fixture.git(&["reset", "-q"]);
    std::fs::remove_file(fixture.repo.join("README.md")).unwrap();
    assert!(prepare_run_error(&fixture).message.contains("README.md"));
}

#[test]
fn modified_submodule_refuses_and_untracked_files_do_not() {
    let fixture = Fixture::new();
    let library = fixture.env.repo("library");
    let output = fixture.env.git_output(
        &fixture.repo,
        [
            "-c",
            "protocol.file.allow=always",
            "submodule",
            "add",
            "-q",
            library.as_str(),
            "vendor/library",
        ],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    fixture.git(&["commit", "-q", "-m", "add submodule"]);
    write(&fixture.repo.join("untracked.txt"), "never blocks\n");
    write(&fixture.repo.join("build/out.o"), "ignored output\n");
    write(&fixture.repo.join(".git/info/exclude"), "build/\n");
    fixture
        .provider
        .allocate(&fixture.request("ok", WorkspaceMode::Worktree))
        .unwrap();

    let submodule = fixture.repo.join("vendor/library");
    write(
        &submodule.join("README.md"),
        "changed inside the submodule\n",
    );
    fixture
        .env
        .git(&submodule, ["commit", "-q", "-am", "move the submodule"]);
    let error = prepare_run_error(&fixture);
    assert!(
        error.message.contains("vendor/library"),
        "{}",
        error.message
    );
}

#[test]
fn preparing_twice_reuses_the_worktree() {
    let fixture = Fixture::new();
    let first = fixture.allocate("api");
    write(&first.root.join("progress.txt"), "half done\n");
    let second = fixture.allocate("api");
    assert!(second.reused);
    assert_eq!(second.root, first.root);
    assert_eq!(
        std::fs::read_to_string(second.root.join("progress.txt")).unwrap(),
        "half done\n"
    );
}

#[test]
fn leftover_branch_without_directory_is_taken_up_and_never_reset() {
    let fixture = Fixture::new();
    let branch = format!("crew/{}-api", fixture.run_id);
    fixture.git(&["branch", &branch]);
    // The crashed attempt had committed work on the branch.
    let scratch = fixture.env.root().join("scratch");
    fixture.git(&["worktree", "add", "-q", scratch.as_str(), &branch]);
    write(&scratch.join("earlier.txt"), "from the first attempt\n");
    fixture.env.git(&scratch, ["add", "-A"]);
    fixture
        .env
        .git(&scratch, ["commit", "-q", "-m", "earlier work"]);
    fixture.git(&["worktree", "remove", scratch.as_str()]);
    let tip = fixture.git(&["rev-parse", &branch]);

    let workspace = fixture.allocate("api");
    assert!(
        workspace.reused,
        "a branch that existed is reported as reused"
    );
    assert_eq!(fixture.git(&["rev-parse", &branch]), tip, "never reset");
    assert_eq!(
        std::fs::read_to_string(workspace.root.join("earlier.txt")).unwrap(),
        "from the first attempt\n"
    );
    // Its teardown keeps the branch: it holds work.
    let report = fixture
        .provider
        .teardown(&workspace, &fixture.teardown_request("api"))
        .unwrap();
    assert!(!report.branch_deleted);
    assert!(fixture.branch_exists(&branch));
}

#[test]
fn branch_checked_out_elsewhere_gives_an_actionable_error() {
    let fixture = Fixture::new();
    let branch = format!("crew/{}-api", fixture.run_id);
    let elsewhere = fixture.env.root().join("elsewhere");
    fixture.git(&["worktree", "add", "-q", "-b", &branch, elsewhere.as_str()]);
    let error = fixture
        .provider
        .allocate(&fixture.request("api", WorkspaceMode::Worktree))
        .unwrap_err();
    let text = format!("{}\nhint: {}", error, error.hint.as_deref().unwrap());
    insta::assert_snapshot!(fixture.env.redact(&text).replace(fixture.run_id.as_str(), "[RUN_ID]"), @"
    branch crew/[RUN_ID]-api is already checked out at $TEST_ENV/elsewhere
    hint: switch that checkout to another branch, or remove that worktree with `git worktree remove`, then retry; crew never takes over crew/[RUN_ID]-api from elsewhere
    ");
    assert!(
        !fixture
            .repo
            .join(".worktrees")
            .join(fixture.run_id.as_str())
            .join("api")
            .exists()
    );
}
