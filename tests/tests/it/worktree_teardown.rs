//! Teardown never loses work: every kind of change ends on the branch, readable with
//! `git diff <base> <branch>`, and anything uncertain keeps the worktree.

use std::os::unix::fs::PermissionsExt;

use crew_core::provider::WorkspaceProvider;
use crew_tests::{tree_fingerprint, write};

use crate::common::worktrees::Fixture;

#[test]
fn every_kind_of_change_ends_on_the_branch() {
    let fixture = Fixture::new();
    write(&fixture.repo.join("old-name.txt"), "to be renamed\n");
    write(&fixture.repo.join("script.sh"), "echo hi\n");
    write(&fixture.repo.join("doomed.txt"), "to be deleted\n");
    fixture.git(&["add", "-A"]);
    fixture.git(&["commit", "-q", "-m", "more files"]);
    // The repository hides untracked files from `git status`: crew must not be fooled.
    fixture.git(&["config", "status.showUntrackedFiles", "no"]);
    write(&fixture.env.home().join("diary.txt"), "private\n");
    let home_before = tree_fingerprint(fixture.env.home().as_std_path());
    let outside = fixture.env.dir("outside");
    write(&outside.join("canary.txt"), "canary\n");
    let outside_before = tree_fingerprint(outside.as_std_path());

    let workspace = fixture.allocate("api");
    let root = &workspace.root;
    write(&root.join("src/lib.txt"), "one\ntwo changed\nthree\n");
    write(&root.join("brand-new.txt"), "untracked file\n");
    write(
        &root.join("new-dir/deeper/file.txt"),
        "untracked directory\n",
    );
    std::fs::remove_file(root.join("doomed.txt")).unwrap();
    std::fs::rename(root.join("old-name.txt"), root.join("new-name.txt")).unwrap();
    std::fs::set_permissions(
        root.join("script.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::os::unix::fs::symlink(fixture.env.home(), root.join("home")).unwrap();
    std::os::unix::fs::symlink("../../..", root.join("up")).unwrap();
    std::os::unix::fs::symlink("/", root.join("abs")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("new-dir/outside")).unwrap();
    // Some work the agent committed itself, and some it only staged.
    write(&root.join("committed.txt"), "agent commit\n");
    fixture.env.git(root, ["add", "committed.txt"]);
    fixture
        .env
        .git(root, ["commit", "-q", "-m", "agent's own commit"]);
    write(&root.join("staged.txt"), "staged only\n");
    fixture.env.git(root, ["add", "staged.txt"]);

    let report = fixture
        .provider
        .teardown(&workspace, &fixture.teardown_request("api"))
        .unwrap();
    assert!(report.removed);
    assert!(report.committed.is_some());
    assert!(!report.branch_deleted);
    let branch = report.branch.clone().unwrap();
    assert_eq!(branch, format!("crew/{}-api", fixture.run_id));
    assert_eq!(
        report.merge_hint.as_deref(),
        Some(format!("git merge {branch}").as_str())
    );
    assert!(!root.exists());

    let base = workspace.base_commit.as_deref().unwrap();
    let changes = fixture.git(&["diff", "--name-status", "-M", base, &branch]);
    insta::assert_snapshot!(changes, @"
    A	abs
    A	brand-new.txt
    A	committed.txt
    D	doomed.txt
    A	home
    A	new-dir/deeper/file.txt
    A	new-dir/outside
    R100	old-name.txt	new-name.txt
    M	script.sh
    M	src/lib.txt
    A	staged.txt
    A	up
    ");
    let modes = fixture.git(&["ls-tree", &branch, "script.sh", "home", "up", "abs"]);
    assert!(modes.contains("100755 blob"), "{modes}");
    assert_eq!(
        modes.matches("120000 blob").count(),
        3,
        "symlinks are saved as links: {modes}"
    );
    assert_eq!(fixture.git(&["show", &format!("{branch}:up")]), "../../..");
    let author = fixture.git(&["log", "-1", "--format=%an <%ae>%n%s", &branch]);
    assert_eq!(
        author,
        format!(
            "crew <crew@localhost>\ncrew: save the work of task api (run {})\n",
            fixture.run_id
        )
    );
    let stat = report.diffstat.unwrap();
    let without_renames = fixture.git(&["diff", "--name-only", "--no-renames", base, &branch]);
    assert_eq!(stat.files_changed, without_renames.lines().count());

    assert_eq!(
        home_before,
        tree_fingerprint(fixture.env.home().as_std_path())
    );
    assert_eq!(outside_before, tree_fingerprint(outside.as_std_path()));
    fixture.assert_git_is_clean();
}

#[test]
fn clean_task_leaves_neither_worktree_nor_branch() {
    let fixture = Fixture::new();
    let workspace = fixture.allocate("idle");
    let report = fixture
        .provider
        .teardown(&workspace, &fixture.teardown_request("idle"))
        .unwrap();
    assert!(report.removed && report.branch_deleted);
    assert!(report.branch.is_none() && report.committed.is_none());
    assert!(!fixture.branch_exists(&format!("crew/{}-idle", fixture.run_id)));
    assert!(
        !fixture
            .repo
            .join(".worktrees")
            .join(fixture.run_id.as_str())
            .exists()
    );
    fixture.assert_git_is_clean();
}

#[test]
fn ignored_files_are_named_counted_and_kept_with_the_run() {
    let fixture = Fixture::new();
    write(&fixture.repo.join(".gitignore"), "target/\n*.log\n");
    fixture.git(&["add", ".gitignore"]);
    fixture.git(&["commit", "-q", "-m", "ignore build output"]);
    let workspace = fixture.allocate("build");
    write(&workspace.root.join("target/debug/app"), &"x".repeat(1000));
    write(&workspace.root.join("target/debug/app.d"), &"y".repeat(24));
    write(&workspace.root.join("build.log"), "log\n");
    let report = fixture
        .provider
        .teardown(&workspace, &fixture.teardown_request("build"))
        .unwrap();
    assert_eq!((report.ignored_files, report.ignored_bytes), (3, 1028));
    let mut named = report.ignored_paths.clone();
    named.sort();
    assert_eq!(named, ["build.log", "target/"]);
    let kept = report.ignored_kept_in.as_ref().unwrap();
    assert_eq!(
        std::fs::read_to_string(kept.join("target/debug/app.d")).unwrap(),
        "y".repeat(24)
    );
    assert!(kept.join("build.log").is_file());
    assert!(
        report.removed && report.branch_deleted,
        "ignored files are not work on the branch"
    );
}

#[test]
fn files_in_an_uninitialized_submodule_keep_the_worktree() {
    let fixture = Fixture::new();
    // A gitlink (a submodule entry) that is not initialized in worktrees.
    let head = fixture.git(&["rev-parse", "HEAD"]);
    let cacheinfo = format!("160000,{},vendor/lib", head.trim());
    fixture.git(&["update-index", "--add", "--cacheinfo", &cacheinfo]);
    fixture.git(&["commit", "-q", "-m", "vendor a submodule"]);
    // As git leaves an uninitialized submodule: an empty directory.
    std::fs::create_dir_all(fixture.repo.join("vendor/lib")).unwrap();
    let workspace = fixture.allocate("sub");
    write(&workspace.root.join("vendor/lib/patch.txt"), "edited\n");
    let error = fixture
        .provider
        .teardown(&workspace, &fixture.teardown_request("sub"))
        .unwrap_err();
    assert!(
        error.message.contains("holds files in vendor/lib"),
        "{}",
        error.message
    );
    assert_eq!(error.partial.preserved.as_ref(), Some(&workspace.root));
    assert!(!error.partial.recycled);
    assert!(workspace.root.join("vendor/lib/patch.txt").is_file());
}

#[test]
fn nested_repository_preserves_the_worktree() {
    let fixture = Fixture::new();
    let workspace = fixture.allocate("nested");
    let nested = workspace.root.join("experiment");
    std::fs::create_dir_all(&nested).unwrap();
    fixture.env.git(&nested, ["init", "-q"]);
    write(&nested.join("idea.txt"), "only here\n");
    let error = fixture
        .provider
        .teardown(&workspace, &fixture.teardown_request("nested"))
        .unwrap_err();
    assert!(
        error
            .message
            .contains("nested git repository at experiment"),
        "{}",
        error.message
    );
    assert_eq!(error.partial.preserved.as_ref(), Some(&workspace.root));
    assert!(nested.join("idea.txt").is_file(), "the work is still there");
    let list = fixture.git(&["worktree", "list", "--porcelain"]);
    assert!(list.contains(workspace.root.as_str()), "{list}");
    assert!(
        !list.contains("locked"),
        "preserved worktrees are unlocked for the user: {list}"
    );
}

#[test]
fn detached_head_preserves_the_worktree() {
    let fixture = Fixture::new();
    let workspace = fixture.allocate("detached");
    fixture
        .env
        .git(&workspace.root, ["checkout", "-q", "--detach"]);
    write(&workspace.root.join("lost-if-removed.txt"), "x\n");
    fixture.env.git(&workspace.root, ["add", "-A"]);
    fixture
        .env
        .git(&workspace.root, ["commit", "-q", "-m", "detached work"]);
    let error = fixture
        .provider
        .teardown(&workspace, &fixture.teardown_request("detached"))
        .unwrap_err();
    assert!(
        error.message.contains("not on a branch"),
        "{}",
        error.message
    );
    assert!(workspace.root.join("lost-if-removed.txt").is_file());
}

#[test]
fn a_live_agent_keeps_its_worktree() {
    let fixture = Fixture::new();
    let workspace = fixture.allocate("busy");
    write(&workspace.root.join("half.txt"), "in progress\n");
    let mut request = fixture.teardown_request("busy");
    request.agent_alive = true;
    let error = fixture.provider.teardown(&workspace, &request).unwrap_err();
    assert!(error.message.contains("may still be running"));
    assert!(workspace.root.join("half.txt").is_file());

    request.agent_alive = false;
    request.keep = true;
    let report = fixture.provider.teardown(&workspace, &request).unwrap();
    assert_eq!(report.preserved.as_ref(), Some(&workspace.root));
    assert!(workspace.root.join("half.txt").is_file());
}

/// The uid the permission tests drop to when they run as root (CI does): `nobody`.
const UNPRIVILEGED: u32 = 65534;

#[test]
fn unreadable_files_preserve_the_worktree() {
    // Root reads every file whatever its mode, so the teardown runs in a helper process as an
    // unprivileged user that owns the test's directories.
    let env = crew_tests::TestEnv::reachable_by_others();
    let repo = env.repo("project");
    let fixture = Fixture::in_dir(env, repo, crew_core::config::ProjectConfig::default());
    let hammer = fixture
        .env
        .runnable_by_others(camino::Utf8Path::new(env!("CARGO_BIN_EXE_worktree-hammer")));
    let mut command = std::process::Command::new(&hammer);
    fixture
        .env
        .hermetic(&mut command)
        .args(["unreadable", fixture.repo.as_str()]);
    if rustix::process::geteuid().is_root() {
        let status = std::process::Command::new("chown")
            .args([
                "-R",
                &format!("{UNPRIVILEGED}:{UNPRIVILEGED}"),
                fixture.env.root().as_str(),
            ])
            .status()
            .unwrap();
        assert!(status.success());
        std::os::unix::process::CommandExt::uid(&mut command, UNPRIVILEGED);
        std::os::unix::process::CommandExt::gid(&mut command, UNPRIVILEGED);
    }
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let expected_root = fixture.repo.join(".worktrees");
    assert!(
        stdout.starts_with(&format!("preserved {expected_root}/")),
        "{stdout}"
    );
    assert!(
        stdout.trim_end().ends_with("true"),
        "the unreadable file is still there: {stdout}"
    );
}
