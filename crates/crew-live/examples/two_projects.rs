//! Two project folders in one process, as an editor with two folders open holds them: each
//! hosts its own run, and each sees (and may control) only its own agents.
//!
//! ```text
//! cargo run -p crew-live --example two_projects
//! ```

#![allow(clippy::print_stdout)]

#[path = "support/repository.rs"]
mod repository;

use std::sync::Arc;
use std::time::Duration;

use crew_core::{CancelCause, CancelRecord};
use crew_live::{Host, HostOptions, Project, RunSpec};
use crew_worktree::CrewWorkspaces;

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let dirs = [tempfile::tempdir()?, tempfile::tempdir()?];
    let mut projects = Vec::new();
    let mut hosts = Vec::new();
    let mut runs = Vec::new();
    for (dir, name) in dirs.iter().zip(["left", "right"]) {
        let team = format!(
            "[[tasks]]\nid = \"{name}\"\nagent = \"shell\"\nprompt = \"echo working; sleep 600\"\n"
        );
        repository::new_repository(dir.path(), &[(".crew/teams/work.toml", &team)])?;
        let project = Project::open(dir.path(), |config| Arc::new(CrewWorkspaces::new(config)))?;
        let host = Host::start(
            &project,
            HostOptions {
                label: format!("two_projects example ({name})"),
                crew_dir: None,
            },
        )
        .await?;
        let spec = RunSpec::of(project.config_dir().load_team("work")?);
        let manifest = host.create(&spec).await?;
        runs.push(host.start_run(&manifest.run_id, Default::default()));
        projects.push(project);
        hosts.push(host);
    }

    // Each folder lists only its own agents, once they run.
    let mut listed = Vec::new();
    for project in &projects {
        let agents = loop {
            let live = project.live_agents().await;
            if !live.agents.is_empty() {
                break live.agents;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let ids: Vec<String> = agents
            .iter()
            .map(|(agent, _)| agent.agent_id.to_string())
            .collect();
        println!("{} sees {}", project.workspace().root(), ids.join(", "));
        listed.push(agents);
    }

    // The left folder cannot stop the right folder's agent: it does not even see it. (The
    // right host, asked on its own socket as the left folder, refuses too.)
    let (right_agent, _) = &listed[1][0];
    let right_id = right_agent.agent_id.to_string();
    match projects[0].stop(&right_id).await {
        Ok(stopped) => println!("left stopped {}: it should not have", stopped.agent_id),
        Err(refused) => println!("left stopping {right_id}: refused: {refused}"),
    }
    // Its own agent, it stops.
    let (left_agent, _) = &listed[0][0];
    let stopped = projects[0].stop(&left_agent.agent_id.to_string()).await?;
    println!(
        "left stopped {}: {}",
        stopped.agent_id,
        stopped.stop.as_str()
    );

    for run in runs {
        run.canceller()
            .cancel(CancelRecord::new(CancelCause::Interrupt))
            .await;
        let finished = run.finish().await?;
        println!("run {} {}", finished.run_id, finished.status);
    }
    Ok(())
}
