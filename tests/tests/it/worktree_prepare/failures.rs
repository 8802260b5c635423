//! Failures, existing directories, subdirectories, upstream work, node_modules.

use super::*;

#[test]
fn failure_after_creation_leaves_nothing_behind() {
    let mut config = ProjectConfig::default();
    config.worktree.setup = Some(vec![
        "sh".into(),
        "-c".into(),
        "echo installing; echo broken >&2; exit 3".into(),
    ]);
    let fixture = Fixture::with_config(config);
    let before_refs = fixture.git(&["for-each-ref"]);
    let error = fixture
        .provider
        .allocate(&fixture.request("api", WorkspaceMode::Worktree))
        .unwrap_err();
    assert_eq!(error.kind, AllocateErrorKind::Failed);
    insta::assert_snapshot!(error.to_string(), @"
    the setup command `sh -c echo installing; echo broken >&2; exit 3` failed (exit status: 3); its last output:
    installing
    broken
    ");
    assert_eq!(
        fixture.git(&["for-each-ref"]),
        before_refs,
        "no branch left"
    );
    assert!(
        !fixture
            .repo
            .join(".worktrees")
            .join(fixture.run_id.as_str())
            .exists(),
        "no directory left"
    );
    // The checkout went through the trash (deleted once the lock was released): gone too.
    let trash = fixture.repo.join(".worktrees/.trash");
    assert!(
        !trash.exists() || std::fs::read_dir(&trash).unwrap().count() == 0,
        "nothing left in the trash"
    );
    let admin = fixture.repo.join(".git/worktrees");
    assert!(
        !admin.exists() || std::fs::read_dir(&admin).unwrap().count() == 0,
        "no admin entry left"
    );
    fixture.assert_git_is_clean();
}

#[test]
fn an_existing_directory_is_never_taken_over_or_removed() {
    let fixture = Fixture::new();
    let target = fixture
        .repo
        .join(".worktrees")
        .join(fixture.run_id.as_str())
        .join("api");
    write(&target.join("someone.txt"), "someone's work\n");
    let error = fixture
        .provider
        .allocate(&fixture.request("api", WorkspaceMode::Worktree))
        .unwrap_err();
    assert!(
        error.message.contains("already exists"),
        "{}",
        error.message
    );
    assert_eq!(
        std::fs::read_to_string(target.join("someone.txt")).unwrap(),
        "someone's work\n"
    );
    assert!(!fixture.branch_exists(&format!("crew/{}-api", fixture.run_id)));
}

#[test]
fn subdirectory_run_works_in_the_same_subdirectory() {
    let env = TestEnv::new();
    let repo = env.repo("project");
    let fixture = Fixture::in_dir(env, repo.join("src"), ProjectConfig::default());
    let workspace = fixture.allocate("api");
    assert_eq!(workspace.dir, workspace.root.join("src"));
    assert!(workspace.dir.join("lib.txt").is_file());
}

#[test]
fn dependent_task_starts_from_its_upstream_work() {
    let fixture = Fixture::new();
    let upstream = fixture.allocate("api");
    write(&upstream.root.join("api.txt"), "endpoint\n");
    let report = fixture
        .provider
        .teardown(&upstream, &fixture.teardown_request("api"))
        .unwrap();
    let branch = report.branch.clone().unwrap();

    let mut request = fixture.request("tests", WorkspaceMode::Worktree);
    request.upstream = vec![UpstreamWork {
        task_id: TaskId::parse("api").unwrap(),
        branch: Some(branch),
    }];
    let dependent = fixture.provider.allocate(&request).unwrap();
    assert_eq!(
        std::fs::read_to_string(dependent.root.join("api.txt")).unwrap(),
        "endpoint\n"
    );
}

#[test]
fn two_upstreams_are_merged_and_a_conflict_names_its_paths() {
    let fixture = Fixture::new();
    let mut branches = Vec::new();
    for (task, file, text) in [
        ("a", "a.txt", "from a\n"),
        ("b", "b.txt", "from b\n"),
        ("c", "a.txt", "c disagrees\n"),
    ] {
        let workspace = fixture.allocate(task);
        write(&workspace.root.join(file), text);
        let report = fixture
            .provider
            .teardown(&workspace, &fixture.teardown_request(task))
            .unwrap();
        branches.push(UpstreamWork {
            task_id: TaskId::parse(task).unwrap(),
            branch: report.branch,
        });
    }
    let mut request = fixture.request("merged", WorkspaceMode::Worktree);
    request.upstream = branches[..2].to_vec();
    let merged = fixture.provider.allocate(&request).unwrap();
    assert!(merged.root.join("a.txt").is_file() && merged.root.join("b.txt").is_file());
    let parents = fixture.env.git(&merged.root, ["log", "-1", "--format=%P"]);
    assert_eq!(
        parents.split_whitespace().count(),
        2,
        "a real merge of both upstreams"
    );

    let mut request = fixture.request("conflicted", WorkspaceMode::Worktree);
    request.upstream = vec![branches[0].clone(), branches[2].clone()];
    let error = fixture.provider.allocate(&request).unwrap_err();
    assert_eq!(error.kind, AllocateErrorKind::Conflict);
    insta::assert_snapshot!(error.to_string(), @"
    the work of upstream tasks a, c conflicts in:
      a.txt
    ");
    assert!(!fixture.branch_exists(&format!("crew/{}-conflicted", fixture.run_id)));
}

#[test]
fn node_modules_is_linked_not_work_and_the_leader_copy_is_untouched() {
    let fixture = Fixture::new();
    write(&fixture.repo.join(".gitignore"), "node_modules/\n");
    fixture.git(&["add", ".gitignore"]);
    fixture.git(&["commit", "-q", "-m", "ignore node_modules"]);
    for index in 0..50 {
        write(
            &fixture
                .repo
                .join(format!("node_modules/pkg{index}/index.js")),
            &format!("module {index}\n"),
        );
    }
    let leader_modules = tree_fingerprint(fixture.repo.join("node_modules").as_std_path());

    let workspace = fixture.allocate("api");
    let link = workspace.root.join("node_modules");
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        fixture.repo.join("node_modules").as_std_path()
    );
    // A `node_modules/` rule with a trailing slash does not match a symlink, yet git sees no
    // change, and the agent's own `git add -A` does not take the link.
    assert_eq!(
        fixture.env.git(
            &workspace.root,
            ["status", "--porcelain", "--untracked-files=all"]
        ),
        ""
    );
    write(&workspace.root.join("app.js"), "require('pkg1')\n");
    fixture.env.git(&workspace.root, ["add", "-A"]);
    let staged = fixture
        .env
        .git(&workspace.root, ["diff", "--cached", "--name-only"]);
    assert_eq!(staged, "app.js\n");

    let report = fixture
        .provider
        .teardown(&workspace, &fixture.teardown_request("api"))
        .unwrap();
    let branch = report.branch.unwrap();
    let files = fixture.git(&[
        "diff",
        "--name-only",
        workspace.base_commit.as_deref().unwrap(),
        &branch,
    ]);
    assert_eq!(files, "app.js\n", "the link is never part of the work");
    assert_eq!(
        leader_modules,
        tree_fingerprint(fixture.repo.join("node_modules").as_std_path())
    );
}

#[test]
fn a_committed_file_named_node_modules_is_left_alone() {
    let fixture = Fixture::new();
    write(&fixture.repo.join("node_modules"), "a file, tracked\n");
    fixture.git(&["add", "-f", "node_modules"]);
    fixture.git(&["commit", "-q", "-m", "odd but legal"]);
    let workspace = fixture.allocate("api");
    let metadata = std::fs::symlink_metadata(workspace.root.join("node_modules")).unwrap();
    assert!(metadata.is_file(), "the tracked file stays a file");
    assert_eq!(
        std::fs::read_to_string(workspace.root.join("node_modules")).unwrap(),
        "a file, tracked\n"
    );
    let report = fixture
        .provider
        .teardown(&workspace, &fixture.teardown_request("api"))
        .unwrap();
    assert!(
        report.committed.is_none() && report.branch_deleted,
        "an untouched file is no work"
    );
    assert_eq!(
        std::fs::read_to_string(fixture.repo.join("node_modules")).unwrap(),
        "a file, tracked\n"
    );
}

#[test]
fn copy_brings_ignored_files_and_never_follows_symlinks() {
    let mut config = ProjectConfig::default();
    config.worktree.copy = vec![".env".into(), "secrets".into(), "linked.env".into()];
    let fixture = Fixture::with_config(config);
    write(
        &fixture.repo.join(".git/info/exclude"),
        ".env\nsecrets/\nlinked.env\n",
    );
    write(&fixture.repo.join(".env"), "TOKEN=1\n");
    write(&fixture.repo.join("secrets/a.txt"), "a\n");
    std::os::unix::fs::symlink("/etc/hostname", fixture.repo.join("secrets/host")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", fixture.repo.join("linked.env")).unwrap();
    let workspace = fixture.allocate("api");
    assert_eq!(
        std::fs::read_to_string(workspace.root.join(".env")).unwrap(),
        "TOKEN=1\n"
    );
    assert_eq!(
        std::fs::read_to_string(workspace.root.join("secrets/a.txt")).unwrap(),
        "a\n"
    );
    assert!(std::fs::symlink_metadata(workspace.root.join("secrets/host")).is_err());
    assert!(std::fs::symlink_metadata(workspace.root.join("linked.env")).is_err());
    assert!(
        workspace
            .warnings
            .iter()
            .any(|warning| warning.contains("linked.env")),
        "{:?}",
        workspace.warnings
    );
}

#[test]
fn setup_command_runs_in_the_new_worktree() {
    let mut config = ProjectConfig::default();
    config.worktree.setup = Some(vec!["sh".into(), "-c".into(), "pwd > setup-ran.txt".into()]);
    let fixture = Fixture::with_config(config);
    let workspace = fixture.allocate("api");
    assert_eq!(
        std::fs::read_to_string(workspace.root.join("setup-ran.txt"))
            .unwrap()
            .trim(),
        workspace.root.as_str()
    );
}

#[test]
fn temp_workspace_lifecycle() {
    let fixture = Fixture::new();
    let workspace = fixture
        .provider
        .allocate(&fixture.request("draft", WorkspaceMode::Temp))
        .unwrap();
    assert_eq!(workspace.kind, WorkspaceKind::Temp);
    assert!(workspace.root.starts_with(fixture.env.tmp()));
    assert!(
        workspace
            .root
            .file_name()
            .unwrap()
            .starts_with("crew-ws-draft-")
    );
    let mode = std::fs::metadata(&workspace.root)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700);
    write(&workspace.root.join("draft.txt"), "scratch\n");
    std::os::unix::fs::symlink(fixture.env.home(), workspace.root.join("home")).unwrap();
    write(&fixture.env.home().join("keep.txt"), "keep\n");
    let report = fixture
        .provider
        .teardown(&workspace, &fixture.teardown_request("draft"))
        .unwrap();
    assert!(report.removed);
    assert!(!workspace.root.exists());
    assert!(fixture.env.home().join("keep.txt").exists());

    // A temp workspace pointing outside the temp dir is never removed.
    let outside = fixture.env.dir("not-temp");
    write(&outside.join("precious.txt"), "precious\n");
    let forged = TaskWorkspace {
        root: outside.clone(),
        dir: outside.clone(),
        ..workspace
    };
    let error = fixture
        .provider
        .teardown(&forged, &fixture.teardown_request("draft"))
        .unwrap_err();
    assert!(
        error
            .message
            .contains("is not where this task's workspace belongs"),
        "{}",
        error.message
    );
    assert!(outside.join("precious.txt").exists());
}

#[test]
fn dedicated_workspace_is_kept_reused_and_pruned_with_its_run() {
    let fixture = Fixture::new();
    let request = fixture.request("report", WorkspaceMode::Dedicated);
    let workspace = fixture.provider.allocate(&request).unwrap();
    let store = crew_core::StateStore::new(fixture.workspace.id(), fixture.workspace.repo_root());
    assert_eq!(
        workspace.root,
        store.dedicated_dir(&fixture.run_id, &TaskId::parse("report").unwrap())
    );
    write(&workspace.root.join("findings.json"), "[]\n");
    let report = fixture
        .provider
        .teardown(&workspace, &fixture.teardown_request("report"))
        .unwrap();
    assert!(!report.removed);
    assert_eq!(report.preserved.as_ref(), Some(&workspace.root));
    let again = fixture.provider.allocate(&request).unwrap();
    assert!(again.reused);
    assert!(
        again.root.join("findings.json").is_file(),
        "earlier files are still there"
    );
    store.remove_run(&fixture.run_id).unwrap();
    assert!(!workspace.root.exists());
}

#[test]
fn fallback_policy_decides_what_happens_outside_git() {
    let env = TestEnv::new();
    let plain = env.dir("plain");
    let fixture = Fixture::in_dir(env, plain, ProjectConfig::default());
    let error = prepare_run_error(&fixture);
    let text = format!("{}\nhint: {}", error, error.hint.as_deref().unwrap());
    insta::assert_snapshot!(fixture.env.redact(&text), @r#"
    $TEST_ENV/plain is not inside a git work tree
    hint: run crew inside a git repository, choose another --workspace-mode, or set [isolation] fallback = "temp"
    "#);
    assert!(
        fixture
            .provider
            .allocate(&fixture.request("api", WorkspaceMode::Worktree))
            .is_err()
    );

    let mut config = ProjectConfig::default();
    config.isolation.fallback = IsolationFallback::Temp;
    let provider = CrewWorkspaces::new(&config).with_temp_root(fixture.env.tmp());
    let workspace = provider
        .allocate(&fixture.request("api", WorkspaceMode::Worktree))
        .unwrap();
    assert_eq!(workspace.kind, WorkspaceKind::Temp);
    assert_eq!(
        workspace.warnings,
        [
            "workspace:temp — worktree requested but base cwd is not a git work tree; used a temp dir instead"
        ]
    );
}

#[test]
fn repository_without_commit_is_refused_before_anything_starts() {
    let env = TestEnv::new();
    let dir = env.dir("fresh");
    env.git(&dir, ["init", "-q"]);
    let fixture = Fixture::in_dir(env, dir, ProjectConfig::default());
    let error = prepare_run_error(&fixture);
    let text = format!("{}\nhint: {}", error, error.hint.as_deref().unwrap());
    insta::assert_snapshot!(fixture.env.redact(&text), @"
    the repository at $TEST_ENV/fresh has no commit yet
    hint: worktrees start from a commit: commit something first
    ");
}

#[test]
fn many_tasks_from_two_processes_all_get_their_worktrees() {
    let fixture = Fixture::new();
    let hammer = Command::new(env!("CARGO_BIN_EXE_worktree-hammer"))
        .args(["prepare", fixture.repo.as_str(), "8"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let threads: Vec<_> = (0..16)
        .map(|index| {
            let provider = fixture.provider.clone();
            let request = fixture.request(&format!("task-{index}"), WorkspaceMode::Worktree);
            std::thread::spawn(move || provider.allocate(&request))
        })
        .collect();
    let workspaces: Vec<TaskWorkspace> = threads
        .into_iter()
        .map(|thread| thread.join().unwrap().unwrap())
        .collect();
    let output = hammer.wait_with_output().unwrap();
    assert!(output.status.success(), "the second process failed");
    let other_lines = String::from_utf8(output.stdout).unwrap();
    assert_eq!(other_lines.lines().count(), 8);

    let list = fixture.git(&["worktree", "list", "--porcelain"]);
    assert_eq!(list.matches("worktree ").count(), 1 + 16 + 8, "{list}");
    assert_eq!(
        fixture.git(&["branch", "--list", "crew/*"]).lines().count(),
        24
    );
    for workspace in &workspaces {
        assert_eq!(
            fixture.env.git(&workspace.root, ["status", "--porcelain"]),
            ""
        );
    }
    for (index, workspace) in workspaces.iter().enumerate() {
        let report = fixture
            .provider
            .teardown(
                workspace,
                &fixture.teardown_request(&format!("task-{index}")),
            )
            .unwrap();
        assert!(report.removed && report.branch_deleted);
    }
    assert_eq!(
        fixture.git(&["branch", "--list", "crew/*"]).lines().count(),
        8,
        "only the other process's branches remain"
    );
}

/// The fast checkout writes what git writes: same files, modes, links and a clean status; a
/// repository with attributes goes through libgit2's filters and matches git too.
#[test]
fn worktree_files_match_a_git_checkout_of_the_same_commit() {
    for attributes in [false, true] {
        let fixture = Fixture::new();
        write(&fixture.repo.join("bin/run.sh"), "#!/bin/sh\necho run\n");
        std::fs::set_permissions(
            fixture.repo.join("bin/run.sh"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink("bin/run.sh", fixture.repo.join("run")).unwrap();
        std::os::unix::fs::symlink("../missing", fixture.repo.join("dangling")).unwrap();
        write(&fixture.repo.join("deep/a/b/c/d.txt"), "deep\n");
        write(&fixture.repo.join("empty.txt"), "");
        if attributes {
            write(
                &fixture.repo.join(".gitattributes"),
                "*.txt text eol=crlf\n",
            );
        }
        fixture.git(&["add", "-A"]);
        fixture.git(&["commit", "-q", "-m", "shapes"]);

        let workspace = fixture.allocate("shapes");
        let reference = fixture.env.root().join("reference");
        fixture.git(&[
            "worktree",
            "add",
            "-q",
            "--detach",
            reference.as_str(),
            "HEAD",
        ]);
        let ours: Vec<_> = tree_fingerprint(workspace.root.as_std_path())
            .into_iter()
            .filter(|(path, _)| path != ".git")
            .collect();
        let theirs: Vec<_> = tree_fingerprint(reference.as_std_path())
            .into_iter()
            .filter(|(path, _)| path != ".git")
            .collect();
        assert_eq!(ours, theirs, "attributes: {attributes}");
        let mode = |root: &Utf8Path| {
            std::fs::metadata(root.join("bin/run.sh"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode(&workspace.root), mode(&reference));
        assert_eq!(
            fixture.env.git(
                &workspace.root,
                ["status", "--porcelain", "--untracked-files=all"]
            ),
            ""
        );
        assert_eq!(fixture.env.git(&workspace.root, ["diff", "--stat"]), "");
    }
}
