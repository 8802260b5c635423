//! Runs a small team in a fresh repository and prints what happens as it happens, the way an
//! editor embedding crew would show it: task status changes, the agents' output lines, then
//! where each task's work is.
//!
//! ```text
//! cargo run -p crew-live --example run_team
//! ```

#![allow(clippy::print_stdout)]

#[path = "support/repository.rs"]
mod repository;

use std::sync::Arc;

use crew_live::{AgentEvent, Host, HostEvent, HostOptions, Project, RunSpec};
use crew_worktree::CrewWorkspaces;

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let repo = dir.path();
    repository::new_repository(
        repo,
        &[(
            ".crew/teams/hello.toml",
            "workspace_mode = \"worktree\"\n\n\
         [[tasks]]\nid = \"greet\"\nagent = \"shell\"\nprompt = \"echo hello > greeting.txt && echo said hello\"\n\n\
         [[tasks]]\nid = \"count\"\nagent = \"shell\"\nprompt = \"seq 3 > count.txt && cat count.txt\"\n",
        )],
    )?;

    // One project folder, its workspaces given by crew's own provider.
    let project = Project::open(repo, |config| Arc::new(CrewWorkspaces::new(config)))?;
    let team = project.config_dir().load_team("hello")?;
    let host = Host::start(
        &project,
        HostOptions {
            label: "run_team example".into(),
            crew_dir: None,
        },
    )
    .await?;
    let spec = RunSpec::of(team);
    let manifest = host.create(&spec).await?;
    let mut events = host.events();
    let running = host.start_run(&manifest.run_id, Default::default());
    let mut finish = std::pin::pin!(running.finish());
    let finished = loop {
        tokio::select! {
            // What happened is printed before the end is.
            biased;
            Some(event) = events.next() => match event {
                Ok(HostEvent::Task(change)) => println!("task {} {}", change.task_id, change.status),
                Ok(HostEvent::Agent(agent)) => {
                    if let AgentEvent::Output { agent_id, line, .. } = *agent {
                        println!("  {agent_id}: {line}");
                    }
                }
                // How far a checkout has come: for a progress display, not for this log.
                Ok(HostEvent::Activity(_)) => {}
                Err(lagged) => println!("(missed events: {lagged})"),
            },
            result = &mut finish => break result?,
        }
    };
    while let Some(change) = events.try_next_task() {
        println!("task {} {}", change.task_id, change.status);
    }
    println!("run {}", finished.status);
    for task in &finished.tasks {
        if let Some(branch) = task
            .teardown
            .as_ref()
            .and_then(|report| report.branch.as_ref())
        {
            println!("{}: its work is on {branch}", task.id);
        }
    }
    Ok(())
}
