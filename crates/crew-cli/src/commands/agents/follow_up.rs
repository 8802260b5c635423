//! `crew agents follow-up`

use crew_live::ControlAgentError;
use crew_live::FollowUpOutcome;

use crate::context::Context;
use crate::ui::Ui;
use crate::{CliError, Outcome};

/// Send a message after the agent's current turn, or answer its question.
///
/// A running agent gets it when its turn ends (or when its process ends, by a resume); an agent
/// that exited — one that asked a question, typically — is resumed with it in the same
/// workspace, and a task that finished (succeeded too) goes on in its session in a workspace on
/// its branch. When the run's host is gone, this command hosts the run until it ends.
#[derive(Debug, clap::Args)]
pub struct FollowUpArgs {
    /// The agent: <runId>:<taskId>, <runPrefix>:<taskId>, or <taskId> when unambiguous.
    pub agent: String,
    /// The message or answer.
    pub message: String,
}

pub async fn cmd_agents_follow_up(args: FollowUpArgs, ui: Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    if super::find_live(&ctx, &args.agent).await?.is_none() {
        ctx.reconcile()?;
        if let Some((manifest, task_id)) = super::find_task(&ctx, &args.agent)? {
            return super::host_again(&ctx, manifest, task_id, Some(args.message)).await;
        }
        return Err(super::not_live(&ctx, &args.agent));
    }
    let done = match ctx
        .project()
        .follow_up(&args.agent, args.message.clone())
        .await
    {
        // Let go by its host since it was listed (its run ending): hosted again here once that
        // run has ended.
        Err(error @ ControlAgentError::NotLive { .. }) => {
            if let Some((manifest, task_id)) = super::ended_run_of(&ctx, &args.agent).await? {
                return super::host_again(&ctx, manifest, task_id, Some(args.message)).await;
            }
            return Err(error.into());
        }
        done => done?,
    };
    if !ui.quiet {
        let agent = done.agent_id;
        match done.follow_up {
            FollowUpOutcome::Resumed { .. } => out!("resumed {agent} with the message"),
            FollowUpOutcome::Answered => out!("answered {agent}'s question; it goes on"),
            FollowUpOutcome::Requeued => out!(
                "resuming {agent} with the message: its task starts again in a new workspace on its branch"
            ),
            FollowUpOutcome::Queued { .. } => {
                out!("queued for {agent} after its current turn")
            }
        }
    }
    Ok(Outcome::Success)
}
