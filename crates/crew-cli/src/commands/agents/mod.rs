//! `crew agents …`: the live agents of this workspace.

pub mod follow_up;
pub mod list;
pub mod logs;
pub mod resume;
pub mod steer;
pub mod stop;

use std::collections::HashMap;

use crew_core::model::{HostRecord, RunManifest, TaskStatus};
use crew_core::{AgentId, TaskId};
use crew_live::AgentSnapshot;
use crew_live::control::{Op, Response};

use crate::context::Context;
use crate::foreground::start_host;
use crate::summary::outcome;
use crate::ui::Ui;
use crate::{CliError, Outcome};

#[derive(Debug, clap::Subcommand)]
// Each subcommand's arguments are built only when it is the one invoked: `crew agents list`
// answers in a couple of milliseconds, and building the whole command tree was a tenth of that.
#[command(defer = true)]
pub enum AgentsCommand {
    /// List the agents of this workspace.
    List(list::ListArgs),
    /// Send a message to a running agent now, through its steer mode.
    Steer(steer::SteerArgs),
    /// Send a message after the agent's current turn, or answer its question.
    FollowUp(follow_up::FollowUpArgs),
    /// Stop a live agent: TERM to its process group, KILL after the grace period.
    Stop(stop::StopArgs),
    /// Restart a stopped or finished agent in its workspace.
    Resume(resume::ResumeArgs),
    /// Print an agent's output (stdout and stderr, as they came).
    Logs(logs::LogsArgs),
}

pub async fn run(command: AgentsCommand, ui: Ui) -> Result<Outcome, CliError> {
    match command {
        AgentsCommand::List(args) => list::cmd_agents_list(args, ui).await,
        AgentsCommand::Steer(args) => steer::cmd_agents_steer(args, ui).await,
        AgentsCommand::FollowUp(args) => follow_up::cmd_agents_follow_up(args, ui).await,
        AgentsCommand::Stop(args) => stop::cmd_agents_stop(args, ui).await,
        AgentsCommand::Resume(args) => resume::cmd_agents_resume(args, ui).await,
        AgentsCommand::Logs(args) => logs::cmd_agents_logs(args, ui).await,
    }
}

/// The one item `spec` names among `ids`: `<runId>:<taskId>`, `<runPrefix>:<taskId>`, or a
/// bare `<taskId>` when only one run has it.
pub fn resolve_spec<'a, T>(
    items: &'a [T],
    id_of: impl Fn(&T) -> &AgentId,
    spec: &str,
) -> Result<Option<&'a T>, CliError> {
    if let Some(exact) = items.iter().find(|item| id_of(item).to_string() == spec) {
        return Ok(Some(exact));
    }
    let (run_prefix, task) = match spec.split_once(':') {
        Some((run, task)) => (Some(run), task),
        None => (None, spec),
    };
    let matches: Vec<&T> = items
        .iter()
        .filter(|item| {
            let id = id_of(item);
            id.task_id().as_str() == task
                && run_prefix.is_none_or(|prefix| id.run_id().as_str().starts_with(prefix))
        })
        .collect();
    match matches.len() {
        0 => Ok(None),
        1 => Ok(Some(matches[0])),
        _ => {
            let ids: Vec<String> = matches.iter().map(|item| id_of(item).to_string()).collect();
            Err(CliError::user(format!(
                "'{spec}' matches several agents: {}",
                ids.join(", ")
            ))
            .with_hint("name one as <runId>:<taskId>; a unique prefix of the run id is enough"))
        }
    }
}

/// The live agent `spec` names, with its host.
pub async fn find_live(
    ctx: &Context,
    spec: &str,
) -> Result<Option<(AgentSnapshot, HostRecord)>, CliError> {
    let live = ctx.live_agents().await;
    let found = resolve_spec(&live.agents, |(agent, _)| &agent.agent_id, spec)?.cloned();
    if found.is_none() && !live.unanswered.is_empty() {
        return Err(CliError::user(format!(
            "no live agent '{spec}' found, but {} host(s) of this workspace did not answer: {}",
            live.unanswered.len(),
            live.unanswered.join("; ")
        ))
        .with_hint("retry in a moment; a busy host answers again once its connections close"));
    }
    Ok(found)
}

/// A task of any run of the workspace, as `spec` names it.
pub fn find_task(ctx: &Context, spec: &str) -> Result<Option<(RunManifest, TaskId)>, CliError> {
    let mut tasks: Vec<(AgentId, RunManifest)> = Vec::new();
    for listing in ctx.store().list_runs().map_err(CliError::internal)? {
        let Ok(manifest) = listing.manifest else {
            continue;
        };
        for task in &manifest.tasks {
            tasks.push((
                AgentId::new(manifest.run_id.clone(), task.id.clone()),
                manifest.clone(),
            ));
        }
    }
    Ok(resolve_spec(&tasks, |(id, _)| id, spec)?
        .map(|(id, manifest)| (manifest.clone(), id.task_id().clone())))
}

pub fn not_live(ctx: &Context, spec: &str) -> CliError {
    CliError::user(format!(
        "no live agent '{spec}' in workspace {}",
        ctx.workspace().id()
    ))
    .with_hint("`crew agents list --all-runs` shows the agents of this workspace, live or not")
}

/// Sends `op` to the host of the live agent `spec` names.
pub async fn send(
    ctx: &Context,
    spec: &str,
    op: impl FnOnce(String) -> Op,
) -> Result<(AgentSnapshot, Response), CliError> {
    let Some((agent, host)) = find_live(ctx, spec).await? else {
        // A task waiting for an answer in a run nobody hosts any more (cancelled, or its host
        // died): say so, and what can be done with it.
        if let Some((manifest, task_id)) = find_task(ctx, spec)?
            && manifest
                .task(&task_id)
                .is_some_and(|task| task.status == TaskStatus::Waiting)
        {
            let run_id = &manifest.run_id;
            return Err(CliError::user(format!(
                "agent {run_id}:{task_id} is not running: it waits for an answer in run {run_id}, which no process hosts any more"
            ))
            .with_hint(format!(
                "answer it with `crew agents follow-up {task_id} \"<answer>\"` (crew hosts the run again), or `crew runs clean {run_id}` to save its work and remove its workspace"
            )));
        }
        return Err(not_live(ctx, spec));
    };
    let response = ctx
        .call(&host, op(agent.agent_id.to_string()))
        .await
        .map_err(CliError::internal)?;
    if let Some(error) = &response.error {
        return Err(CliError::user(error.message.clone()));
    }
    Ok((agent, response))
}

/// Hosts the run of a task that has no live host, here, going on with `answer` for it when it
/// waits for one. Used by `follow-up` and `resume` when the run's host is gone.
#[allow(clippy::print_stdout)]
pub async fn host_again(
    ctx: &Context,
    manifest: RunManifest,
    task_id: TaskId,
    answer: Option<String>,
) -> Result<Outcome, CliError> {
    let task = manifest
        .task(&task_id)
        .expect("the task was found in this manifest");
    if task.status == TaskStatus::Succeeded {
        return Err(CliError::user(format!(
            "task {task_id} of run {} already succeeded",
            manifest.run_id
        ))
        .with_hint("for more work, start a new run (its branch is where the work is)"));
    }
    let host = start_host(ctx, "crew agents").await?;
    host.prepare_resume(&manifest.run_id)
        .await
        .map_err(crate::foreground::run_error)?;
    // Said once the run is really taken up, never before a refusal.
    if !ctx.ui.quiet {
        println!(
            "crew: run {} has no live host; hosting it here until it ends (Ctrl-C stops it and keeps the work)",
            manifest.run_id
        );
    }
    let resumes = HashMap::from([(task_id, answer)]);
    let finished =
        crate::foreground::run_here(ctx, &host, &manifest.run_id, resumes, !ctx.ui.quiet).await?;
    crate::commands::run::print_result(ctx, &finished, false)?;
    Ok(outcome(&finished))
}
