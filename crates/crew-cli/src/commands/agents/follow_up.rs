//! `crew agents follow-up`

use crew_live::control::Op;

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

#[allow(clippy::print_stdout)]
pub async fn cmd_agents_follow_up(args: FollowUpArgs, ui: Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    if super::find_live(&ctx, &args.agent).await?.is_none() {
        ctx.reconcile()?;
        if let Some((manifest, task_id)) = super::find_task(&ctx, &args.agent)? {
            return super::host_again(&ctx, manifest, task_id, Some(args.message)).await;
        }
        return Err(super::not_live(&ctx, &args.agent));
    }
    let message = args.message;
    let (agent, response) =
        super::send(&ctx, &args.agent, |agent| Op::FollowUp { agent, message }).await?;
    if !ui.quiet {
        let outcome = response
            .result
            .as_ref()
            .and_then(|result| result.pointer("/follow_up/outcome"))
            .and_then(|outcome| outcome.as_str());
        match outcome {
            Some("resumed") => println!("resumed {} with the message", agent.agent_id),
            Some("answered") => println!("answered {}'s question; it goes on", agent.agent_id),
            Some("requeued") => println!(
                "resuming {} with the message: its task starts again in a new workspace on its branch",
                agent.agent_id
            ),
            _ => println!("queued for {} after its current turn", agent.agent_id),
        }
    }
    Ok(Outcome::Success)
}
