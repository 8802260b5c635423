//! `crew agents steer`

use crate::context::Context;
use crate::ui::Ui;
use crate::{CliError, Outcome};

/// Send a message to a running agent now, through its steer mode.
///
/// Only agents of this workspace can be steered. Agents whose steer mode is "none" refuse;
/// send them a follow-up instead.
#[derive(Debug, clap::Args)]
pub struct SteerArgs {
    /// The agent: <runId>:<taskId>, <runPrefix>:<taskId>, or <taskId> when unambiguous.
    pub agent: String,
    /// The message.
    pub message: String,
}

pub async fn cmd_agents_steer(args: SteerArgs, ui: Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    let steered = ctx.project().steer(&args.agent, args.message).await?;
    if !ui.quiet {
        say!("sent to {}", steered.agent_id);
    }
    Ok(Outcome::Success)
}
