//! `crew agents …`: the live agents of this workspace.

pub mod follow_up;
pub mod list;
pub mod logs;
pub mod resume;
pub mod steer;
pub mod stop;

use std::collections::HashMap;
use std::time::Duration;

use crew_core::TaskId;
use crew_core::model::{HostRecord, RunManifest};
use crew_live::{AgentSnapshot, AlreadySucceeded};

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

/// The live agent `spec` names, with its host.
pub async fn find_live(
    ctx: &Context,
    spec: &str,
) -> Result<Option<(AgentSnapshot, HostRecord)>, CliError> {
    Ok(ctx.project().find_live(spec).await?)
}

/// A task of any run of the workspace, as `spec` names it (a bare task id: the newest run's).
pub fn find_task(ctx: &Context, spec: &str) -> Result<Option<(RunManifest, TaskId)>, CliError> {
    Ok(ctx.project().find_latest_task(spec)?)
}

pub fn not_live(ctx: &Context, spec: &str) -> CliError {
    CliError::user(format!(
        "no live agent '{spec}' in workspace {}",
        ctx.workspace().id()
    ))
    .with_hint(crate::error::NOT_LIVE_HINT)
}

/// Hosts the run of a task that has no live host, here, going on with `answer` for it when it
/// waits for one. Used by `follow-up` and `resume` when the run's host is gone.
/// Why the task `task_id` of `manifest`, whose run has no host, cannot go on with `answer`.
pub fn refuse_hosting_again(
    manifest: &RunManifest,
    task_id: &TaskId,
    answer: Option<&str>,
) -> Result<(), CliError> {
    let task = manifest
        .task(task_id)
        .expect("the task was found in this manifest");
    // A follow-up of a task that succeeded goes on in its session; a resume without a
    // message has nothing for it to do, and an agent without a session nothing to go on with.
    AlreadySucceeded::check(&manifest.run_id, task_id, task, answer.is_some())
        .map_err(|refusal| CliError::user(refusal.to_string()))
}

pub async fn host_again(
    ctx: &Context,
    manifest: RunManifest,
    task_id: TaskId,
    answer: Option<String>,
) -> Result<Outcome, CliError> {
    refuse_hosting_again(&manifest, &task_id, answer.as_deref())?;
    let host = start_host(ctx, "crew agents").await?;
    host.prepare_follow_up(&manifest.run_id, &task_id).await?;
    // Said once the run is really taken up, never before a refusal.
    if !ctx.ui.quiet {
        out!(
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

/// The run of the task `spec` names once it has ended, when the task itself has finished (it
/// was stopped) while its run still ends; `None` when the task is not finished, or its run does
/// not end within its grace and a little more.
pub async fn ended_run_of(
    ctx: &Context,
    spec: &str,
) -> Result<Option<(RunManifest, TaskId)>, CliError> {
    let patience = ctx.config().run.stop_grace.0 + Duration::from_secs(10);
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        ctx.reconcile()?;
        let Some((manifest, task_id)) = find_task(ctx, spec)? else {
            return Ok(None);
        };
        let finished = manifest
            .task(&task_id)
            .is_some_and(|task| task.status.is_finished());
        if !finished {
            return Ok(None);
        }
        if manifest.status.is_finished() {
            return Ok(Some((manifest, task_id)));
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
