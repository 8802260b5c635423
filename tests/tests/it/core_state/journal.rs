//! Manifests rewritten under their readers, changes written together, the task journal.

use super::*;

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
