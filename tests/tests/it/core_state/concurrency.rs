//! Many writers at once, a writer killed, links planted where state goes.

use super::*;

#[test]
fn two_processes_creating_runs_get_distinct_ids_and_lose_nothing() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let (_, store) = store_at(&root);
    let mut all_ids = Vec::new();
    for _round in 0..10 {
        let children: Vec<_> = (0..2)
            .map(|_| {
                Command::new(HAMMER)
                    .args(["create", root.as_str(), "5"])
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in children {
            let output = child.wait_with_output().unwrap();
            assert!(output.status.success());
            all_ids.extend(
                String::from_utf8(output.stdout)
                    .unwrap()
                    .lines()
                    .map(str::to_owned),
            );
        }
    }
    assert_eq!(all_ids.len(), 100);
    let mut unique = all_ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 100, "run ids must be distinct");
    let listed = store.list_runs().unwrap();
    assert_eq!(listed.len(), 100);
    for listing in listed {
        let manifest = listing.manifest.unwrap();
        // The update after creation was not lost.
        assert!(manifest.reason.unwrap().starts_with("written by "));
        assert_eq!(manifest.tasks.len(), 2);
    }
}

#[test]
fn concurrent_updates_to_one_run_are_all_kept() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let (workspace, store) = store_at(&root);
    let run = new_run(&store, &workspace, &["seed"]);
    let children: Vec<_> = ["left", "right"]
        .iter()
        .map(|label| {
            Command::new(HAMMER)
                .args(["append", root.as_str(), run.run_id.as_str(), label, "40"])
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let manifest = store.read_run(&run.run_id).unwrap();
    assert_eq!(
        manifest.tasks.len(),
        81,
        "1 seed task + 2 × 40 appended, none lost"
    );
    for label in ["left", "right"] {
        let ids: Vec<_> = manifest
            .tasks
            .iter()
            .filter(|task| task.id.as_str().starts_with(label))
            .map(|task| task.id.as_str().to_owned())
            .collect();
        let expected: Vec<_> = (0..40).map(|index| format!("{label}-{index}")).collect();
        assert_eq!(
            ids, expected,
            "each writer's updates arrive complete and in order"
        );
    }
}

#[test]
fn a_writer_killed_mid_write_leaves_a_complete_manifest() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let (workspace, store) = store_at(&root);
    let run = new_run(&store, &workspace, &["a", "b", "c", "d"]);
    for round in 0..12u64 {
        let mut child = Command::new(HAMMER)
            .args(["rewrite", root.as_str(), run.run_id.as_str(), "200000"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        // Different moments in the write cycle each round.
        std::thread::sleep(Duration::from_millis(20 + round * 7));
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&child),
            rustix::process::Signal::KILL,
        )
        .unwrap();
        child.wait().unwrap();
        let manifest = store.read_run(&run.run_id).unwrap();
        let prompts: Vec<&str> = manifest
            .tasks
            .iter()
            .map(|task| task.prompt.as_str())
            .collect();
        let first = prompts[0];
        assert!(
            prompts.iter().all(|prompt| *prompt == first),
            "all tasks must carry the same version"
        );
        if first != "true" {
            let (version, body) = first.split_once(':').unwrap();
            assert_eq!(body.len(), 200_000, "version {version} is complete");
            assert_eq!(
                manifest.reason.as_deref(),
                Some(format!("version {}", &version[1..]).as_str())
            );
        }
    }
}

#[test]
fn symlinked_state_directory_is_refused_and_the_canary_is_untouched() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let canary = env.dir("canary");
    write(&canary.join("precious.txt"), "do not touch\n");
    let before = tree_fingerprint(canary.as_std_path());
    std::fs::create_dir_all(root.join(".crew")).unwrap();
    std::os::unix::fs::symlink(&canary, root.join(".crew/state")).unwrap();
    let (workspace, store) = store_at(&root);
    let error = store
        .create_run(|run_id| {
            RunManifest::new(
                run_id,
                workspace.id().clone(),
                WorkspaceMode::Single,
                vec![],
            )
        })
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("failed to prepare the state directory"),
        "{error}"
    );
    assert!(
        crew_tests::error_chain(&error).contains("is a symlink"),
        "{error}"
    );
    assert_eq!(before, tree_fingerprint(canary.as_std_path()));
    assert!(
        store.list_runs().is_err(),
        "listing through the link is refused too"
    );
}

#[test]
fn symlinked_runs_directory_is_refused() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let canary = env.dir("canary");
    std::fs::create_dir_all(root.join(".crew/state")).unwrap();
    std::os::unix::fs::symlink(&canary, root.join(".crew/state/runs")).unwrap();
    let (workspace, store) = store_at(&root);
    assert!(
        store
            .create_run(|run_id| RunManifest::new(
                run_id,
                workspace.id().clone(),
                WorkspaceMode::Single,
                vec![]
            ))
            .is_err()
    );
    assert_eq!(std::fs::read_dir(&canary).unwrap().count(), 0);
}

#[test]
fn manifest_replaced_by_a_symlink_is_never_written_through() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let (workspace, store) = store_at(&root);
    let run = new_run(&store, &workspace, &["api"]);
    let canary = env.root().join("canary.json");
    write(&canary, "{\"canary\": true}\n");
    let manifest_path = store.manifest_path(&run.run_id);
    std::fs::remove_file(&manifest_path).unwrap();
    std::os::unix::fs::symlink(&canary, &manifest_path).unwrap();
    let error = store
        .update_run(&run.run_id, |manifest| {
            manifest.set_status(RunStatus::Completed)
        })
        .unwrap_err();
    assert!(
        crew_tests::error_chain(&error).contains("is a symlink"),
        "{error}"
    );
    assert_eq!(
        std::fs::read_to_string(&canary).unwrap(),
        "{\"canary\": true}\n"
    );
    assert!(
        std::fs::symlink_metadata(&manifest_path)
            .unwrap()
            .file_type()
            .is_symlink()
    );
}
