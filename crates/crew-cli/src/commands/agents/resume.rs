//! `crew agents resume`

use std::time::Duration;

use crew_core::TaskId;
use crew_core::model::RunManifest;
use crew_live::control::ErrorCode;
use crew_live::{ControlAgentError, ResumeOutcome};

use crate::context::Context;
use crate::ui::Ui;
use crate::{CliError, Outcome};

/// Restart a stopped or finished agent in its workspace.
///
/// It runs its `resume` template (with MESSAGE as `{message}`), or its command when it has
/// none. When the run's host is gone, this command hosts the run until it ends.
#[derive(Debug, clap::Args)]
pub struct ResumeArgs {
    /// The agent: <runId>:<taskId>, <runPrefix>:<taskId>, or <taskId> when unambiguous.
    pub agent: String,
    /// A message for the resumed agent.
    pub message: Option<String>,
}

pub async fn cmd_agents_resume(args: ResumeArgs, ui: Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    if super::find_live(&ctx, &args.agent).await?.is_none() {
        ctx.reconcile()?;
        if let Some((manifest, task_id)) = super::find_task(&ctx, &args.agent)? {
            return super::host_again(&ctx, manifest, task_id, args.message).await;
        }
        return Err(super::not_live(&ctx, &args.agent));
    }
    let resumed = match ctx
        .project()
        .resume(&args.agent, args.message.clone())
        .await
    {
        Err(ControlAgentError::Refused(refusal))
            if matches!(
                refusal.code,
                ErrorCode::AlreadyRunning | ErrorCode::UnknownRun
            ) =>
        {
            // Stopped a moment ago as the last agent of its run, which is ending (or has just
            // ended) in its host: once the host is done with it, this command hosts the run
            // again for it.
            if let Some((manifest, task_id)) = ended_run_of(&ctx, &args.agent).await? {
                return super::host_again(&ctx, manifest, task_id, args.message).await;
            }
            return Err(ControlAgentError::Refused(refusal).into());
        }
        resumed => resumed?,
    };
    if !ui.quiet {
        match resumed.outcome {
            ResumeOutcome::Requeued => out!(
                "resuming {}: its task starts again in a new workspace on its branch",
                resumed.agent_id
            ),
            ResumeOutcome::Restarted { .. } => out!("resumed {}", resumed.agent_id),
        }
    }
    Ok(Outcome::Success)
}

/// The run of the task `spec` names once it has ended, when the task itself has finished (it
/// was stopped) while its run still ends; `None` when the task is not finished, or its run does
/// not end within its grace and a little more.
async fn ended_run_of(
    ctx: &Context,
    spec: &str,
) -> Result<Option<(RunManifest, TaskId)>, CliError> {
    let patience = ctx.config().run.stop_grace.0 + Duration::from_secs(10);
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        ctx.reconcile()?;
        let Some((manifest, task_id)) = super::find_task(ctx, spec)? else {
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
