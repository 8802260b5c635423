//! Prepares many worktree workspaces at once from a separate process, for the test that several
//! `crew` processes on one repository all succeed.
//!
//! worktree-hammer prepare <repo> <count>   prints one line per task: `<task> <dir> <branch>`
//! worktree-hammer unreadable <repo>        makes a worktree holding a file nobody can read
//!                                          (run as a non-root user), tears it down, prints
//!                                          `preserved <path>` or `removed`

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::path::Path;

use crew_core::config::{ProjectConfig, WorkspaceMode};
use crew_core::provider::{TeardownRequest, WorkspaceProvider, WorkspaceRequest};
use crew_core::{RunId, TaskId, Workspace};
use crew_worktree::CrewWorkspaces;

fn request(workspace: &Workspace, run_id: &RunId, task: &str) -> WorkspaceRequest {
    WorkspaceRequest {
        workspace: workspace.id().clone(),
        repo_root: workspace.repo_root().map(Into::into),
        invocation_dir: Default::default(),
        run_id: run_id.clone(),
        task_id: TaskId::parse(task).unwrap(),
        mode: WorkspaceMode::Worktree,
        base: None,
        upstream: Vec::new(),
        progress: None,
        env: Vec::new(),
        unconfined: false,
    }
}

fn unreadable(provider: &CrewWorkspaces, workspace: &Workspace, run_id: RunId) {
    use std::os::unix::fs::PermissionsExt;
    let allocated = provider
        .allocate(&request(workspace, &run_id, "locked-out"))
        .unwrap();
    let secret = allocated.root.join("secret.txt");
    std::fs::write(&secret, "x\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o000)).unwrap();
    let teardown = TeardownRequest {
        workspace: workspace.id().clone(),
        repo_root: workspace.repo_root().map(Into::into),
        run_id,
        task_id: TaskId::parse("locked-out").unwrap(),
        agent_alive: false,
        keep: false,
        placed_for: None,
    };
    match provider.teardown(&allocated, &teardown) {
        Ok(_) => println!("removed"),
        Err(error) => println!(
            "preserved {} {}",
            error.partial.preserved.unwrap(),
            secret.exists()
        ),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let workspace = Workspace::at_root(Path::new(&args[1])).unwrap();
    let provider = CrewWorkspaces::new(&ProjectConfig::default());
    let run_id = RunId::generate();
    if args[0] == "unreadable" {
        unreadable(&provider, &workspace, run_id);
        return;
    }
    let count: usize = args[2].parse().unwrap();
    let threads: Vec<_> = (0..count)
        .map(|index| {
            let provider = provider.clone();
            let request = request(&workspace, &run_id, &format!("other-{index}"));
            std::thread::spawn(move || {
                let workspace = provider.allocate(&request).unwrap();
                format!(
                    "{} {} {}",
                    request.task_id,
                    workspace.dir,
                    workspace.branch.unwrap()
                )
            })
        })
        .collect();
    for thread in threads {
        println!("{}", thread.join().unwrap());
    }
}
