//! The state store against real processes and real files: concurrent writers, crashes in the
//! middle of a write, symlink escapes, corrupt files, reconciliation and retention.

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use camino::Utf8Path;
use crew_core::config::{RetentionSettings, WorkspaceMode};
use crew_core::host::HostIdentity;
use crew_core::model::{HostRecord, RunManifest, RunStatus, TaskRecord, TaskStatus, Timestamp};
use crew_core::store::StateError;
use crew_core::{RunId, StateStore, TaskId, Workspace};
use crew_tests::{TestEnv, places_apart, tree_fingerprint, write};

const HAMMER: &str = env!("CARGO_BIN_EXE_state-hammer");

fn store_at(root: &Utf8Path) -> (Workspace, StateStore) {
    let workspace = Workspace::at_root(root.as_std_path()).unwrap();
    let store = StateStore::new(workspace.id(), workspace.repo_root());
    (workspace, store)
}

fn new_run(store: &StateStore, workspace: &Workspace, tasks: &[&str]) -> RunManifest {
    store
        .create_run(|run_id| {
            RunManifest::new(
                run_id,
                workspace.id().clone(),
                WorkspaceMode::Single,
                tasks
                    .iter()
                    .map(|id| {
                        TaskRecord::new(
                            TaskId::parse(id).unwrap(),
                            "shell".into(),
                            "true".into(),
                            vec![],
                            WorkspaceMode::Single,
                        )
                    })
                    .collect(),
            )
        })
        .unwrap()
}

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

fn host_of(child: &std::process::Child) -> HostIdentity {
    HostIdentity::of_pid(child.id()).unwrap().unwrap()
}

fn hosted_run(store: &StateStore, workspace: &Workspace, host: HostIdentity) -> RunId {
    let run = new_run(store, workspace, &["api", "docs"]);
    store
        .update_run(&run.run_id, |manifest| {
            manifest.host = Some(HostRecord {
                identity: host,
                socket: None,
                label: None,
            });
            let api = TaskId::parse("api").unwrap();
            manifest.set_task_status(&api, TaskStatus::Preparing)?;
            manifest.set_task_status(&api, TaskStatus::Running)?;
            Ok(())
        })
        .unwrap();
    run.run_id
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

/// A host rewrites its running manifest by exchanging it with a spare: readers in other
/// threads (other stores, which remember nothing) read it whole every time, whatever the
/// moment; the host's store never takes another store's write for its own; and when the run
/// ends, the spare goes.
#[test]
fn readers_of_a_manifest_its_host_keeps_rewriting_always_read_it_whole() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let (workspace, store) = store_at(&root);
    let run = hosted_run(&store, &workspace, HostIdentity::current().unwrap());
    let run_dir = root.join(".crew/state/runs").join(run.as_str());
    let spare = run_dir.join(".manifest.json.spare");
    assert!(spare.exists(), "the host's first exchange left a spare");
    let api = TaskId::parse("api").unwrap();
    let writes = 300;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (root, run, done) = (root.clone(), run.clone(), done.clone());
            std::thread::spawn(move || {
                let (_, reader) = store_at(&root);
                let mut reads = 0;
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    let manifest = reader.read_run(&run).unwrap();
                    assert_eq!(manifest.tasks.len(), 2);
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    for write in 0..writes {
        store
            .update_run(&run, |manifest| {
                // Lengths that change, so that a read cut short would not parse.
                let reason = "x".repeat(write % 97);
                manifest.task_mut(&api)?.reason = Some(reason);
                Ok(())
            })
            .unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    for reader in readers {
        assert!(reader.join().unwrap() > 0);
    }

    // Another store writes the running manifest (a new file); the host's next change starts
    // from that write, not from what it remembers.
    let (_, other) = store_at(&root);
    other
        .update_run(&run, |manifest| {
            manifest
                .task_mut(&api)?
                .warnings
                .push("from elsewhere".into());
            Ok(())
        })
        .unwrap();
    store
        .update_run(&run, |manifest| {
            manifest.task_mut(&api)?.reason = Some("after".into());
            Ok(())
        })
        .unwrap();
    let manifest = store.read_run(&run).unwrap();
    let task = manifest.task(&api).unwrap();
    assert_eq!(task.warnings, ["from elsewhere"]);
    assert_eq!(task.reason.as_deref(), Some("after"));

    store
        .update_run(&run, |manifest| {
            manifest.host = None;
            manifest.set_status(RunStatus::Interrupted)
        })
        .unwrap();
    assert!(!spare.exists(), "an ended run keeps no spare");
    assert_eq!(
        store
            .read_run(&run)
            .unwrap()
            .task(&api)
            .unwrap()
            .reason
            .as_deref(),
        Some("after")
    );
}

#[test]
fn changes_written_together_are_all_kept_and_a_refused_one_leaves_nothing() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let (workspace, store) = store_at(&root);
    let run = hosted_run(&store, &workspace, HostIdentity::current().unwrap());
    let store = std::sync::Arc::new(store);
    let api = TaskId::parse("api").unwrap();
    // Another process appends tasks meanwhile, through the lock, one write per change.
    let hammer = Command::new(HAMMER)
        .args(["append", root.as_str(), run.as_str(), "other", "40"])
        .spawn()
        .unwrap();
    let threads: Vec<_> = (0..8)
        .map(|thread| {
            let (store, run, api) = (store.clone(), run.clone(), api.clone());
            std::thread::spawn(move || {
                for change in 0..25 {
                    let api = api.clone();
                    let hostile = thread == 0 && change % 5 == 4;
                    let result = store.update_run_together(&run, move |manifest| {
                        let warning = format!("{thread}-{change}");
                        if hostile {
                            // Changes the manifest, then is refused: nothing of it may stay.
                            manifest.task_mut(&api)?.warnings.push("refused".into());
                            manifest.task_mut(&TaskId::parse("missing").unwrap())?;
                        }
                        manifest.task_mut(&api)?.warnings.push(warning);
                        Ok(change)
                    });
                    match result {
                        Ok(value) => assert!(!hostile && value == change),
                        Err(StateError::Transition(_)) => assert!(hostile),
                        Err(error) => panic!("{error}"),
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let mut hammer = hammer;
    assert!(hammer.wait().unwrap().success());
    let manifest = store.read_run(&run).unwrap();
    let warnings = &manifest.task(&api).unwrap().warnings;
    assert!(!warnings.iter().any(|warning| warning == "refused"));
    for thread in 0..8 {
        let expected: Vec<String> = (0..25)
            .filter(|change| thread != 0 || change % 5 != 4)
            .map(|change| format!("{thread}-{change}"))
            .collect();
        let written: Vec<&String> = warnings
            .iter()
            .filter(|warning| warning.starts_with(&format!("{thread}-")))
            .collect();
        assert_eq!(
            written,
            expected.iter().collect::<Vec<_>>(),
            "in order, none lost"
        );
    }
    let appended = manifest
        .tasks
        .iter()
        .filter(|task| task.id.as_str().starts_with("other-"))
        .count();
    assert_eq!(appended, 40, "the other process's changes were kept too");
}

/// A running run's host records each step of a task by appending the task's record to the run's
/// journal (`changes.jsonl`), not by writing the manifest whole: what a change costs does not
/// grow with the run. Another process reads every change, while it is appended and across the
/// whole writes another process makes meanwhile; the run's end folds the journal in.
#[test]
fn a_task_s_change_is_appended_and_read_back_whole_by_anyone() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let (workspace, store) = store_at(&root);
    let names: Vec<String> = (0..200).map(|n| format!("t{n}")).collect();
    let run = new_run(
        &store,
        &workspace,
        &names.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .run_id;
    // The host's first write: the manifest whole, and this store remembers it.
    store
        .update_run(&run, |manifest| {
            manifest.host = Some(HostRecord {
                identity: HostIdentity::current().unwrap(),
                socket: None,
                label: None,
            });
            Ok(())
        })
        .unwrap();
    let manifest_path = store.manifest_path(&run);
    let journal_path = store.run_dir(&run).join("changes.jsonl");
    let whole = std::fs::metadata(&manifest_path).unwrap();
    let store = std::sync::Arc::new(store);
    let threads: Vec<_> = (0..4)
        .map(|thread| {
            let (store, run) = (store.clone(), run.clone());
            std::thread::spawn(move || {
                for n in (thread..20).step_by(4) {
                    let task = TaskId::parse(&format!("t{n}")).unwrap();
                    let run_id = run.clone();
                    store
                        .update_task_together(&run, &task, move |record| {
                            record.set_status(&run_id, TaskStatus::Preparing, Timestamp::now())?;
                            record.warnings.push(format!("step of t{n}"));
                            Ok(())
                        })
                        .unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    // Twenty changes, and the manifest is the file it was: what went to disk is the twenty
    // records, a fraction of the run.
    let now = std::fs::metadata(&manifest_path).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (now.ino(), now.mtime_nsec()),
        (whole.ino(), whole.mtime_nsec())
    );
    let journal = std::fs::read_to_string(&journal_path).unwrap();
    assert_eq!(journal.lines().count(), 20, "{journal}");
    assert!(
        journal.len() < whole.len() as usize,
        "{} ≥ {}",
        journal.len(),
        whole.len()
    );

    // Another process's store sees every change.
    let (_, other) = store_at(&root);
    let read = other.read_run(&run).unwrap();
    for n in 0..200 {
        let task = read
            .task(&TaskId::parse(&format!("t{n}")).unwrap())
            .unwrap();
        let expected = if n < 20 {
            TaskStatus::Preparing
        } else {
            TaskStatus::Pending
        };
        assert_eq!(task.status, expected, "t{n}");
        assert_eq!(task.warnings.len(), usize::from(n < 20), "t{n}");
    }

    // An append cut by a crash (a line without its end) is no change; lines of an older
    // generation (a whole write that crashed before removing the journal) are already in the
    // manifest and are skipped.
    let stale = journal
        .lines()
        .find(|line| line.contains("\"id\":\"t0\""))
        .unwrap()
        .replace("\"warnings\":[\"step of t0\"]", "\"warnings\":[\"stale\"]");
    assert!(stale.contains("stale"), "{stale}");
    // Another process's whole write (a new generation, the journal folded in and emptied:
    // truncated while the run runs, no file made and deleted at each whole write).
    other
        .update_run(&run, |manifest| {
            manifest.max_parallel = 7;
            Ok(())
        })
        .unwrap();
    assert_eq!(
        std::fs::metadata(&journal_path).unwrap().len(),
        0,
        "a whole write folds the journal in"
    );
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&journal_path)
        .unwrap();
    use std::io::Write as _;
    writeln!(file, "{stale}").unwrap();
    write!(file, "{{\"journal\":").unwrap();
    drop(file);
    for reader in [&other, &*store] {
        let read = reader.read_run(&run).unwrap();
        assert_eq!(read.max_parallel, 7);
        let t0 = read.task(&TaskId::parse("t0").unwrap()).unwrap();
        assert_eq!(
            t0.warnings,
            ["step of t0"],
            "an older generation's line was applied"
        );
        assert_eq!(t0.status, TaskStatus::Preparing);
    }

    // The host goes on appending after the other process's write; its end folds all in.
    let t1 = TaskId::parse("t1").unwrap();
    store
        .update_task_together(&run, &t1, |record| {
            record.warnings.push("after".into());
            Ok(())
        })
        .unwrap();
    assert_eq!(
        other.read_run(&run).unwrap().task(&t1).unwrap().warnings,
        ["step of t1", "after"]
    );
    store
        .update_run(&run, |manifest| {
            manifest.status = RunStatus::Completed;
            Ok(())
        })
        .unwrap();
    assert!(!journal_path.exists());
    let ended: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    assert!(ended.get("journal").is_none(), "{ended}");
    let t1_json = ended["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|task| task["id"] == "t1")
        .unwrap();
    assert_eq!(
        t1_json["warnings"],
        serde_json::json!(["step of t1", "after"])
    );
}

/// The journal never grows past the manifest it goes with: once it would, the next change
/// writes the manifest whole, folding it in, so a long run's appends and whole writes together
/// cost what its changes were.
#[test]
fn the_journal_is_folded_in_before_it_outgrows_the_manifest() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let (workspace, store) = store_at(&root);
    let run = new_run(&store, &workspace, &["a", "b", "c", "d"]).run_id;
    store.update_run(&run, |_| Ok(())).unwrap();
    let manifest_path = store.manifest_path(&run);
    let journal_path = store.run_dir(&run).join("changes.jsonl");
    let a = TaskId::parse("a").unwrap();
    let mut whole_writes = 0;
    let mut last = std::fs::metadata(&manifest_path).unwrap().len();
    for n in 0..60 {
        store
            .update_task_together(&run, &a, move |record| {
                record.warnings = vec![format!("change {n}")];
                Ok(())
            })
            .unwrap();
        let manifest = std::fs::metadata(&manifest_path).unwrap().len();
        let journal = std::fs::metadata(&journal_path).map_or(0, |meta| meta.len());
        assert!(
            journal <= manifest + 1024,
            "change {n}: journal {journal} manifest {manifest}"
        );
        if !journal_path.exists() || journal < last {
            whole_writes += 1;
        }
        last = journal;
    }
    assert!(
        whole_writes >= 5,
        "{whole_writes} whole writes in 60 changes"
    );
    assert!(
        whole_writes <= 30,
        "{whole_writes} whole writes in 60 changes"
    );
    let (_, other) = store_at(&root);
    assert_eq!(
        other.read_run(&run).unwrap().task(&a).unwrap().warnings,
        ["change 59"]
    );
}

/// Each run's records are placed apart from the others' (the file system's "top of a
/// hierarchy" hint on `runs/`), so that a run's new files do not land among the inodes of runs
/// just removed; the flag is not inherited by a run's own directory.
#[test]
fn runs_directory_asks_the_file_system_to_place_runs_apart() {
    let env = TestEnv::new();
    let root = env.repo("project");
    if let Err(error) = places_apart(&root) {
        eprintln!("skipped: the file system under {root} has no file flags ({error})");
        return;
    }
    let (workspace, store) = store_at(&root);
    let run = new_run(&store, &workspace, &["a"]);
    assert!(
        places_apart(&store.runs_dir()).unwrap(),
        "{} is not marked as the top of a hierarchy",
        store.runs_dir()
    );
    assert!(!places_apart(&store.run_dir(&run.run_id)).unwrap());
}

#[test]
fn a_state_directory_planted_as_a_link_gets_nothing_made_in_its_target() {
    let env = TestEnv::new();
    let root = env.repo("project");
    let canary = env.dir("canary");
    std::fs::create_dir_all(root.join(".crew")).unwrap();
    std::os::unix::fs::symlink(&canary, root.join(".crew/state")).unwrap();
    let run = env.crew(&root, ["run", "--agent", "shell", "true"]);
    let shown = crew_tests::render_output(&run);
    assert!(!run.status.success(), "{shown}");
    assert!(shown.contains("it is a symlink"), "{shown}");
    assert_eq!(
        std::fs::read_dir(&canary).unwrap().count(),
        0,
        "nothing made through the link: {shown}"
    );
}
