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

mod concurrency;
mod journal;
mod layout;
mod retention;
mod versions;

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
