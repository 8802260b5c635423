//! Workspace discovery against real directories, symlinks and git worktrees.

use std::os::unix::ffi::OsStrExt;

use crew_core::discovery::DiscoverWorkspaceError;
use crew_core::{Workspace, WorkspaceId};
use crew_tests::TestEnv;

#[test]
fn nested_worktree_resolves_to_the_leader() {
    let env = TestEnv::new();
    let root = env.repo("project");
    std::fs::create_dir_all(root.join(".worktrees/run1")).unwrap();
    env.git(
        &root,
        [
            "worktree",
            "add",
            "-q",
            "-b",
            "crew/run1-api",
            ".worktrees/run1/api",
        ],
    );
    let task_dir = root.join(".worktrees/run1/api/src");
    // The worktree has its own checked-out `.crew/` (committed config): still the leader.
    std::fs::create_dir_all(root.join(".worktrees/run1/api/.crew")).unwrap();

    let workspace = Workspace::discover(task_dir.as_std_path()).unwrap();
    assert_eq!(workspace.root(), root);
    assert_eq!(workspace.invoked_from(), root.join("src"));
    assert_eq!(workspace.relative_invocation_dir(), "src");

    // A directory the leader does not have maps to its nearest existing ancestor.
    std::fs::create_dir_all(root.join(".worktrees/run1/api/new/deeper")).unwrap();
    let workspace =
        Workspace::discover(root.join(".worktrees/run1/api/new/deeper").as_std_path()).unwrap();
    assert_eq!(workspace.root(), root);
    assert_eq!(workspace.invoked_from(), root);
}

#[test]
fn worktree_outside_the_leader_is_its_own_workspace() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let outside = env.root().join("elsewhere");
    env.git(
        &root,
        ["worktree", "add", "-q", "-b", "side", outside.as_str()],
    );
    let workspace = Workspace::discover(outside.as_std_path()).unwrap();
    assert_eq!(workspace.root(), outside);
}

#[test]
fn symlinked_and_dotdot_spellings_give_one_workspace_id() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let link = env.root().join("link-to-project");
    std::os::unix::fs::symlink(&root, &link).unwrap();
    let direct = Workspace::discover(root.as_std_path()).unwrap();
    for spelling in [
        link.to_string(),
        format!("{root}/src/.."),
        format!("{root}/"),
        format!("{link}/src/../"),
    ] {
        let other = Workspace::discover(std::path::Path::new(&spelling)).unwrap();
        assert_eq!(other.id(), direct.id(), "{spelling}");
        assert_eq!(
            &WorkspaceId::from_path(std::path::Path::new(&spelling)).unwrap(),
            direct.id()
        );
    }
}

#[test]
fn subdirectory_runs_remember_where_they_started() {
    let env = TestEnv::new();
    let root = env.repo("project");
    std::fs::create_dir_all(root.join("a/b")).unwrap();
    let workspace = Workspace::discover(root.join("a/b").as_std_path()).unwrap();
    assert_eq!(workspace.root(), root);
    assert_eq!(workspace.relative_invocation_dir(), "a/b");
}

#[test]
fn non_utf8_paths_get_a_clear_error() {
    let env = TestEnv::new();
    let name = std::ffi::OsStr::from_bytes(b"caf\xe9");
    let dir = env.root().as_std_path().join(name);
    std::fs::create_dir(&dir).unwrap();
    let error = Workspace::discover(&dir).unwrap_err();
    assert!(matches!(error, DiscoverWorkspaceError::Path { .. }));
    let text = env.redact(&crew_tests::error_chain(&error));
    insta::assert_snapshot!(text, @"
    error: failed to find the workspace for $TEST_ENV/caf�
    caused by: path $TEST_ENV/caf� is not valid UTF-8; crew needs UTF-8 paths to record and compare workspaces
    ");
}
