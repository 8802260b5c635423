//! Records that are corrupt, newer or older, and hosts that died.

use super::*;

#[test]
fn corrupt_manifest_is_reported_with_its_path_and_left_alone() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let (workspace, store) = store_at(&root);
    let good = new_run(&store, &workspace, &["api"]);
    let bad = new_run(&store, &workspace, &["api"]);
    let bad_path = store.manifest_path(&bad.run_id);
    let full = std::fs::read(&bad_path).unwrap();
    std::fs::write(&bad_path, &full[..full.len() / 2]).unwrap();
    let truncated = std::fs::read(&bad_path).unwrap();

    let listed = store.list_runs().unwrap();
    assert_eq!(listed.len(), 2);
    for listing in &listed {
        if listing.run_id == bad.run_id {
            let error = listing.manifest.as_ref().unwrap_err();
            assert!(matches!(error, StateError::Corrupt { .. }));
            assert!(error.to_string().contains(bad_path.as_str()), "{error}");
        } else {
            assert!(listing.manifest.is_ok());
        }
    }
    // A glance (status and host only, for listings) is refused the same way, and skips it.
    assert!(matches!(
        store.glance_run(&bad.run_id),
        Err(StateError::Corrupt { .. })
    ));
    let glances = store.glance_runs().unwrap();
    assert_eq!(glances.len(), 1);
    assert_eq!(glances[0].run_id, good.run_id);
    assert_eq!(glances[0].status, good.status);
    assert!(store.update_run(&bad.run_id, |_| Ok(())).is_err());
    assert_eq!(
        std::fs::read(&bad_path).unwrap(),
        truncated,
        "left exactly as it was"
    );
    store
        .update_run(&good.run_id, |manifest| {
            manifest.set_status(RunStatus::Completed)
        })
        .unwrap();
    assert_eq!(store.reconcile().unwrap(), Vec::<RunId>::new());
    assert_eq!(std::fs::read(&bad_path).unwrap(), truncated);
}

#[test]
fn newer_schema_is_read_only() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let (workspace, store) = store_at(&root);
    let run = new_run(&store, &workspace, &["api"]);
    let path = store.manifest_path(&run.run_id);
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    json["schema_version"] = 99.into();
    json["a_field_from_the_future"] = "x".into();
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    let before = std::fs::read(&path).unwrap();
    assert_eq!(store.read_run(&run.run_id).unwrap().schema_version, 99);
    let error = store.update_run(&run.run_id, |_| Ok(())).unwrap_err();
    insta::assert_snapshot!(env.redact(&error.to_string()).replace(run.run_id.as_str(), "[RUN_ID]"), @"run manifest $TEST_ENV/project/.crew/state/runs/[RUN_ID]/manifest.json has schema version 99, newer than this crew supports (1); it is read-only to this crew");
    assert_eq!(std::fs::read(&path).unwrap(), before);

    // A future format this crew cannot even parse is still named as newer, not as corrupt.
    std::fs::write(&path, "{\"schema_version\": 7, \"tasks\": \"reshaped\"}").unwrap();
    assert!(matches!(
        store.read_run(&run.run_id),
        Err(StateError::NewerSchema { found: 7, .. })
    ));
    assert!(matches!(
        store.glance_run(&run.run_id),
        Err(StateError::NewerSchema { found: 7, .. })
    ));
}

#[test]
fn a_newer_run_is_never_removed_and_an_older_one_never_read() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let (workspace, store) = store_at(&root);
    let mut versions = Vec::new();
    for version in [99, 0] {
        let run = new_run(&store, &workspace, &["api"]);
        store
            .update_run(&run.run_id, |manifest| {
                manifest.set_status(RunStatus::Completed)
            })
            .unwrap();
        let dedicated = store
            .ensure_dedicated_dir(&run.run_id, &run.tasks[0].id)
            .unwrap();
        write(&dedicated.join("work.txt"), "kept\n");
        let path = store.manifest_path(&run.run_id);
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        json["schema_version"] = version.into();
        std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
        versions.push((version, run.run_id, dedicated));
    }
    let retention = crew_core::config::RetentionSettings {
        max_kept_runs: 0,
        max_run_age_days: 0,
        automatic: false,
    };
    let report = store
        .prune(&retention, std::time::SystemTime::now(), false)
        .unwrap();
    assert!(report.pruned.is_empty(), "{report:?}");
    for (version, run_id, dedicated) in &versions {
        assert!(dedicated.join("work.txt").exists(), "version {version}");
        let removed = store.remove_run(run_id);
        let read = store.read_run(run_id);
        match version {
            99 => {
                assert!(matches!(
                    removed,
                    Err(StateError::NewerSchema { found: 99, .. })
                ));
                assert!(read.is_ok(), "still readable");
            }
            _ => {
                assert!(matches!(
                    removed,
                    Err(StateError::OlderSchema { found: 0, .. })
                ));
                assert!(matches!(
                    read,
                    Err(StateError::OlderSchema { found: 0, .. })
                ));
            }
        }
    }
    let (_, older, _) = &versions[1];
    let error = store.read_run(older).unwrap_err();
    insta::assert_snapshot!(env.redact(&error.to_string()).replace(older.as_str(), "[RUN_ID]"), @"run manifest $TEST_ENV/project/.crew/state/runs/[RUN_ID]/manifest.json has schema version 0, which no crew writes (this one writes 1); it was left as it is");
}

#[test]
fn reconcile_marks_runs_of_dead_and_impersonated_hosts_interrupted() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let other_root = env.repo("other");
    let (workspace, store) = store_at(&root);
    let (other_workspace, other_store) = store_at(&other_root);

    // A host that has exited.
    let mut dead = Command::new("sleep").arg("60").spawn().unwrap();
    let dead_identity = host_of(&dead);
    dead.kill().unwrap();
    dead.wait().unwrap();
    let dead_run = hosted_run(&store, &workspace, dead_identity.clone());

    // The host's pid now belongs to an unrelated process: same pid, different start time.
    let mut unrelated = Command::new("sleep").arg("60").spawn().unwrap();
    let impersonated = HostIdentity {
        start_time: host_of(&unrelated).start_time.saturating_sub(1),
        ..host_of(&unrelated)
    };
    let reused_run = hosted_run(&store, &workspace, impersonated);

    // A live host.
    let live = Command::new("sleep").arg("60").spawn().unwrap();
    let live_run = hosted_run(&store, &workspace, host_of(&live));

    // Another workspace whose host is dead too: not ours to touch.
    let foreign_run = hosted_run(&other_store, &other_workspace, dead_identity);
    let foreign_manifest = std::fs::read(other_store.manifest_path(&foreign_run)).unwrap();

    let mut changed = store.reconcile().unwrap();
    changed.sort();
    let mut expected = vec![dead_run.clone(), reused_run.clone()];
    expected.sort();
    assert_eq!(changed, expected);

    for run_id in [&dead_run, &reused_run] {
        let manifest = store.read_run(run_id).unwrap();
        assert_eq!(manifest.status, RunStatus::Interrupted);
        let api = manifest.task(&TaskId::parse("api").unwrap()).unwrap();
        assert_eq!(api.status, TaskStatus::Failed);
        assert!(
            api.reason
                .as_deref()
                .unwrap()
                .starts_with("interrupted: host process")
        );
        let docs = manifest.task(&TaskId::parse("docs").unwrap()).unwrap();
        assert_eq!(
            docs.status,
            TaskStatus::Pending,
            "tasks that never started stay pending"
        );
    }
    assert_eq!(
        store.read_run(&live_run).unwrap().status,
        RunStatus::Running
    );
    let glance = store.glance_run(&live_run).unwrap();
    assert_eq!(glance.status, RunStatus::Running);
    assert_eq!(glance.host, store.read_run(&live_run).unwrap().host);
    assert!(glance.host.is_some_and(|host| host.identity.is_alive()));
    assert_eq!(
        std::fs::read(other_store.manifest_path(&foreign_run)).unwrap(),
        foreign_manifest
    );
    assert!(
        unrelated.try_wait().unwrap().is_none(),
        "the unrelated process is untouched"
    );
    assert_eq!(
        store.reconcile().unwrap(),
        Vec::<RunId>::new(),
        "reconcile is idempotent"
    );

    for mut child in [unrelated, live] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
