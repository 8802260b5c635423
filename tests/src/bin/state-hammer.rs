//! Drives crew's state store from a separate process, for the concurrency and crash tests.
//!
//! state-hammer create <workspace> <count>              create runs, print their ids
//! state-hammer append <workspace> <run> <label> <n>    add n tasks `<label>-<i>` to one run
//! state-hammer rewrite <workspace> <run> <size>        rewrite the run's prompts forever

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::io::Write;
use std::path::Path;

use crew_core::config::WorkspaceMode;
use crew_core::model::{RunManifest, TaskRecord};
use crew_core::{RunId, StateStore, TaskId, Workspace};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let workspace = Workspace::at_root(Path::new(&args[1])).unwrap();
    let store = StateStore::new(workspace.id(), workspace.repo_root());
    match args[0].as_str() {
        "create" => {
            let count: usize = args[2].parse().unwrap();
            let mut stdout = std::io::stdout().lock();
            for index in 0..count {
                let manifest = store
                    .create_run(|run_id| new_manifest(&workspace, run_id))
                    .unwrap();
                store
                    .update_run(&manifest.run_id, |manifest| {
                        manifest.reason =
                            Some(format!("written by {} #{index}", std::process::id()));
                        Ok(())
                    })
                    .unwrap();
                writeln!(stdout, "{}", manifest.run_id).unwrap();
            }
        }
        "append" => {
            let run_id = RunId::parse(&args[2]).unwrap();
            let label = &args[3];
            let count: usize = args[4].parse().unwrap();
            for index in 0..count {
                store
                    .update_run(&run_id, |manifest| {
                        manifest
                            .tasks
                            .push(task(&format!("{label}-{index}"), "appended"));
                        Ok(())
                    })
                    .unwrap();
            }
        }
        "rewrite" => {
            let run_id = RunId::parse(&args[2]).unwrap();
            let size: usize = args[3].parse().unwrap();
            let mut stdout = std::io::stdout().lock();
            for version in 1.. {
                let marker = char::from(b'a' + (version % 26) as u8);
                let prompt = format!("v{version}:{}", marker.to_string().repeat(size));
                store
                    .update_run(&run_id, |manifest| {
                        for task in &mut manifest.tasks {
                            task.prompt.clone_from(&prompt);
                        }
                        manifest.reason = Some(format!("version {version}"));
                        Ok(())
                    })
                    .unwrap();
                writeln!(stdout, "{version}").unwrap();
                stdout.flush().unwrap();
            }
        }
        other => panic!("unknown command {other}"),
    }
}

fn task(id: &str, prompt: &str) -> TaskRecord {
    TaskRecord::new(
        TaskId::parse(id).unwrap(),
        "shell".into(),
        prompt.into(),
        Vec::new(),
        WorkspaceMode::Single,
    )
}

fn new_manifest(workspace: &Workspace, run_id: RunId) -> RunManifest {
    let mut manifest = RunManifest::new(
        run_id,
        workspace.id().clone(),
        WorkspaceMode::Single,
        vec![task("first", "a"), task("second", "b")],
    );
    manifest.team = Some("hammer".into());
    manifest
}
