//! Listing crew's worktrees and branches, and pruning only what holds no work.

use crew_core::provider::WorkspaceProvider;
use crew_core::{StateStore, TaskId};
use crew_tests::write;
use crew_worktree::listing::{self, WorktreeState};

use crate::common::worktrees::Fixture;

#[test]
fn orphans_are_found_and_only_work_free_ones_are_pruned() {
    let fixture = Fixture::new();
    let store = StateStore::new(fixture.workspace.id(), fixture.workspace.repo_root());
    let settings = fixture.provider.settings().clone();
    let repo_root = fixture.workspace.repo_root().unwrap().to_owned();

    // A worktree with uncommitted work and no run in the state: kept.
    let busy = fixture.allocate("busy");
    write(&busy.root.join("work.txt"), "unsaved\n");
    // A clean worktree of no known run: pruned, and its branch (at HEAD, merged) deleted.
    let idle = fixture.allocate("idle");
    // A branch with work whose worktree is gone: kept, unmerged.
    let done = fixture.allocate("done");
    write(&done.root.join("done.txt"), "finished\n");
    let report = fixture
        .provider
        .teardown(&done, &fixture.teardown_request("done"))
        .unwrap();
    let done_branch = report.branch.unwrap();
    // A crew worktree the user locked: never touched.
    let locked = fixture.allocate("locked");
    fixture.git(&["worktree", "unlock", locked.root.as_str()]);
    fixture.git(&[
        "worktree",
        "lock",
        "--reason",
        "mine, hands off",
        locked.root.as_str(),
    ]);
    // An empty unregistered directory under the worktrees directory.
    let stray = fixture
        .repo
        .join(".worktrees")
        .join(fixture.run_id.as_str())
        .join("stray");
    std::fs::create_dir_all(&stray).unwrap();
    // A worktree crew did not make.
    let foreign = fixture.env.root().join("foreign");
    fixture.git(&["worktree", "add", "-q", "-b", "feature", foreign.as_str()]);

    // A worktree whose directory vanished (registered, directory gone). Made last: crew sweeps
    // such entries of its own before each new worktree.
    let vanished = fixture.allocate("vanished");
    std::fs::remove_dir_all(&vanished.root).unwrap();

    let listed = listing::list(&repo_root, &settings, &store, listing::BranchScope::All).unwrap();
    // Clean or not, a worktree left behind is named in the start-of-run warning.
    let named: Vec<_> = listed
        .needs_attention()
        .0
        .iter()
        .map(|worktree| worktree.path.clone())
        .collect();
    assert!(
        named.contains(&idle.root) && named.contains(&busy.root),
        "{named:?}"
    );
    let state_of = |task: &str| {
        listed
            .worktrees
            .iter()
            .find(|worktree| worktree.task_id == TaskId::parse(task).unwrap())
            .map(|worktree| (worktree.state, worktree.uncommitted))
    };
    assert_eq!(
        state_of("vanished"),
        Some((WorktreeState::MissingDirectory, None))
    );
    assert_eq!(state_of("busy"), Some((WorktreeState::UnknownRun, Some(1))));
    assert_eq!(state_of("idle"), Some((WorktreeState::UnknownRun, Some(0))));
    assert_eq!(state_of("stray"), Some((WorktreeState::Unregistered, None)));
    assert!(
        !listed
            .worktrees
            .iter()
            .any(|worktree| worktree.path == foreign)
    );
    assert!(
        listed
            .branches
            .iter()
            .any(|branch| branch.name == done_branch && !branch.merged)
    );
    let (attention, unmerged) = listed.needs_attention();
    assert!(
        attention
            .iter()
            .any(|worktree| worktree.task_id.as_str() == "busy")
    );
    assert!(unmerged.iter().any(|branch| branch.name == done_branch));

    let before = fixture.git(&["worktree", "list", "--porcelain"]);
    let dry = listing::prune(&repo_root, &settings, &store, true).unwrap();
    assert_eq!(
        fixture.git(&["worktree", "list", "--porcelain"]),
        before,
        "a dry run changes nothing"
    );
    assert!(stray.exists());

    let report = listing::prune(&repo_root, &settings, &store, false).unwrap();
    assert_eq!(report.removed_worktrees, dry.removed_worktrees);
    assert_eq!(report.deleted_branches, dry.deleted_branches);
    assert!(report.removed_worktrees.contains(&idle.root));
    assert!(report.removed_worktrees.contains(&stray));
    assert_eq!(report.removed_admin_entries.len(), 1);
    assert!(
        report
            .deleted_branches
            .contains(&format!("crew/{}-idle", fixture.run_id))
    );
    assert!(
        report
            .deleted_branches
            .contains(&format!("crew/{}-vanished", fixture.run_id))
    );
    assert!(busy.root.join("work.txt").is_file(), "work is never pruned");
    assert!(
        locked.root.exists(),
        "a user-locked worktree is never pruned"
    );
    assert!(foreign.exists());
    assert!(fixture.branch_exists(&done_branch), "unmerged work is kept");
    assert!(
        report
            .kept
            .iter()
            .any(|(what, why)| what == &done_branch && why.contains("git merge"))
    );

    let list = fixture.git(&["worktree", "list", "--porcelain"]);
    assert!(
        !list.contains(idle.root.as_str()) && !list.contains(vanished.root.as_str()),
        "{list}"
    );
    let fsck = fixture
        .env
        .git_output(&fixture.repo, ["fsck", "--no-progress"]);
    assert!(fsck.status.success());
}

#[test]
fn merged_means_the_work_is_in_head_and_none_is_left_unsaved() {
    let fixture = Fixture::new();
    let store = StateStore::new(fixture.workspace.id(), fixture.workspace.repo_root());
    let settings = fixture.provider.settings().clone();
    let repo_root = fixture.workspace.repo_root().unwrap().to_owned();
    let merged = |name: &str| {
        let listed =
            listing::list(&repo_root, &settings, &store, listing::BranchScope::All).unwrap();
        listed
            .branches
            .iter()
            .find(|branch| branch.name.ends_with(name))
            .unwrap_or_else(|| panic!("no branch {name}: {listed:?}"))
            .merged
    };

    // A branch still at its base, whose worktree holds uncommitted work: not merged.
    let busy = fixture.allocate("busy");
    write(&busy.root.join("draft.txt"), "unsaved\n");
    assert!(!merged("-busy"));

    // A branch whose work was squashed into the leader: merged, and prune deletes it.
    let squashed = fixture.allocate("squashed");
    write(&squashed.root.join("feature.txt"), "feature\n");
    let report = fixture
        .provider
        .teardown(&squashed, &fixture.teardown_request("squashed"))
        .unwrap();
    let branch = report.branch.unwrap();
    assert!(!merged("-squashed"), "not yet in the leader");
    fixture.git(&["merge", "-q", "--squash", &branch]);
    fixture.git(&["commit", "-q", "-m", "squash the feature"]);
    assert!(merged("-squashed"), "squashed in");
    let pruned = listing::prune(&repo_root, &settings, &store, false).unwrap();
    assert!(pruned.deleted_branches.contains(&branch), "{pruned:?}");
}
