//! `crew agents resume`

use crew_live::control::ErrorCode;
use crew_live::{ControlAgentError, Refusal, ResumeOutcome};

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
        // Stopped a moment ago as the last agent of its run, which is ending (or has just
        // ended) in its host: the host refuses it, or has let it go since it was listed. Once
        // the host is done with it, this command hosts the run again for it.
        Err(error)
            if matches!(
                &error,
                ControlAgentError::NotLive { .. }
                    | ControlAgentError::Refused(Refusal {
                        code: ErrorCode::AlreadyRunning | ErrorCode::UnknownRun,
                        ..
                    })
            ) =>
        {
            if let Some((manifest, task_id)) = super::ended_run_of(&ctx, &args.agent).await? {
                return super::host_again(&ctx, manifest, task_id, args.message).await;
            }
            return Err(error.into());
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
