//! Retention, run prefixes, git's exclude, the running index.

use super::*;

#[test]
fn retention_prunes_old_and_excess_finished_runs_with_their_dedicated_dirs() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let (workspace, store) = store_at(&root);
    let mut finished = Vec::new();
    for _ in 0..4 {
        let run = new_run(&store, &workspace, &["api"]);
        store
            .update_run(&run.run_id, |manifest| {
                manifest.set_status(RunStatus::Completed)
            })
            .unwrap();
        let dedicated = store
            .ensure_dedicated_dir(&run.run_id, &TaskId::parse("api").unwrap())
            .unwrap();
        write(&dedicated.join("report.txt"), "kept until pruned\n");
        finished.push(run.run_id);
        std::thread::sleep(Duration::from_millis(2));
    }
    let running = new_run(&store, &workspace, &["api"]);
    let retention = RetentionSettings {
        max_kept_runs: 2,
        max_run_age_days: 7,
        automatic: false,
    };

    let dry = store.prune(&retention, SystemTime::now(), true).unwrap();
    assert_eq!(dry.pruned, vec![finished[1].clone(), finished[0].clone()]);
    assert_eq!(
        store.run_ids().unwrap().len(),
        5,
        "a dry run changes nothing"
    );

    let report = store.prune(&retention, SystemTime::now(), false).unwrap();
    assert_eq!(report.pruned, dry.pruned);
    let left = store.run_ids().unwrap();
    assert_eq!(
        left,
        vec![
            running.run_id.clone(),
            finished[3].clone(),
            finished[2].clone()
        ]
    );
    assert!(!store.dedicated_root().join(finished[0].as_str()).exists());
    assert!(
        store
            .dedicated_root()
            .join(finished[3].as_str())
            .join("api/report.txt")
            .exists()
    );

    // Ten days later everything finished is too old; the running run stays.
    let later = SystemTime::now() + Duration::from_secs(10 * 86_400);
    let report = store.prune(&retention, later, false).unwrap();
    assert_eq!(report.pruned.len(), 2);
    assert_eq!(store.run_ids().unwrap(), vec![running.run_id]);
}

#[test]
fn run_prefixes_resolve_like_git_hashes() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let (workspace, store) = store_at(&root);
    // Two runs whose ids share a first character (37 runs always hold such a pair).
    let mut runs: Vec<crew_core::RunId> = Vec::new();
    let (first, second) = loop {
        let run = new_run(&store, &workspace, &["api"]).run_id;
        if let Some(twin) = runs
            .iter()
            .find(|other| other.as_str()[..1] == run.as_str()[..1])
        {
            break (twin.clone(), run);
        }
        runs.push(run);
    };
    assert_eq!(store.resolve_run(first.as_str()).unwrap(), first);
    let unique_len = (1..=first.as_str().len())
        .find(|&len| !second.as_str().starts_with(&first.as_str()[..len]))
        .unwrap();
    assert_eq!(
        store.resolve_run(&first.as_str()[..unique_len]).unwrap(),
        first
    );
    assert!(matches!(
        store.resolve_run(&first.as_str()[..unique_len - 1]),
        Err(StateError::AmbiguousRun { .. })
    ));
    assert!(matches!(
        store.resolve_run("zzzz"),
        Err(StateError::UnknownRun { .. })
    ));
}

#[test]
fn state_is_excluded_from_git_without_touching_tracked_files() {
    let env = TestEnv::new();
    let root = env.repo("project");
    write(&root.join(".gitignore"), "*.log\n");
    env.git(&root, ["add", ".gitignore"]);
    env.git(&root, ["commit", "-q", "-m", "ignore logs"]);
    let (workspace, store) = store_at(&root);
    let run = new_run(&store, &workspace, &["api"]);
    store
        .append_event(
            &run.run_id,
            &crew_core::model::RunEvent::new(None, crew_core::model::EventKind::RunCreated),
        )
        .unwrap();
    assert_eq!(
        env.git(&root, ["status", "--porcelain", "--untracked-files=all"]),
        ""
    );
    let exclude = std::fs::read_to_string(root.join(".git/info/exclude")).unwrap();
    assert!(
        exclude.lines().any(|line| line == "/.crew/state/"),
        "{exclude}"
    );
    assert_eq!(
        std::fs::read_to_string(root.join(".gitignore")).unwrap(),
        "*.log\n"
    );
    let (events, unreadable) = store.read_events(&run.run_id).unwrap();
    assert_eq!((events.len(), unreadable), (1, 0));
    assert!(events[0].at <= Timestamp::now());
}

#[test]
fn live_runs_are_found_through_the_running_index_without_reading_finished_ones() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let (workspace, store) = store_at(&root);
    let mut live = Command::new("sleep").arg("60").spawn().unwrap();
    let running = hosted_run(&store, &workspace, host_of(&live));
    let finished = new_run(&store, &workspace, &["api"]).run_id;
    store
        .update_run(&finished, |manifest| {
            manifest.set_status(RunStatus::Completed)
        })
        .unwrap();
    assert_eq!(
        store.running_run_ids().unwrap(),
        std::slice::from_ref(&running)
    );

    // The finished run's manifest becomes a FIFO: anything that read it would block forever.
    let path = store.manifest_path(&finished);
    let original = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let made = Command::new("mkfifo").arg(path.as_str()).status().unwrap();
    assert!(made.success());
    let (done, heard) = std::sync::mpsc::channel();
    let reader = StateStore::new(workspace.id(), workspace.repo_root());
    std::thread::spawn(move || {
        let reconciled = reader.reconcile().map_err(|error| error.to_string());
        let live = reader.glance_running().map(|runs| runs.len());
        let _ = done.send((reconciled, live.map_err(|error| error.to_string())));
    });
    let (reconciled, live_runs) = heard
        .recv_timeout(Duration::from_secs(20))
        .expect("reconciling read a finished run's manifest");
    assert_eq!(reconciled, Ok(Vec::new()));
    assert_eq!(live_runs, Ok(1));
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, original).unwrap();

    // A marker a crash left for a finished run is skipped, and reconciling removes it.
    let marker = root.join(".crew/state/running").join(finished.as_str());
    write(&marker, "");
    assert_eq!(store.glance_running().unwrap().len(), 1);
    store.reconcile().unwrap();
    assert!(!marker.exists());

    // A state made before the index gets it built from the manifests.
    std::fs::remove_dir_all(root.join(".crew/state/running")).unwrap();
    assert_eq!(
        store.running_run_ids().unwrap(),
        std::slice::from_ref(&running)
    );

    // The host gone, the run is interrupted and leaves the index.
    live.kill().unwrap();
    live.wait().unwrap();
    assert_eq!(store.reconcile().unwrap(), std::slice::from_ref(&running));
    assert_eq!(store.running_run_ids().unwrap(), Vec::<RunId>::new());
}
