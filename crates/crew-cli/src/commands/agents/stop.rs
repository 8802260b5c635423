//! `crew agents stop`

use crew_live::control::Op;

use crate::context::Context;
use crate::ui::Ui;
use crate::{CliError, Outcome};

/// Stop a live agent: TERM to its process group, KILL after the grace period.
///
/// Stopping it again kills it at once. Its work stays in its workspace and is saved to its
/// branch when the task's workspace is torn down.
#[derive(Debug, clap::Args)]
pub struct StopArgs {
    /// The agent: <runId>:<taskId>, <runPrefix>:<taskId>, or <taskId> when unambiguous.
    pub agent: String,
}

#[allow(clippy::print_stdout)]
pub async fn cmd_agents_stop(args: StopArgs, ui: Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    let (agent, response) = super::send(&ctx, &args.agent, |agent| Op::Stop { agent }).await?;
    if !ui.quiet {
        let how = response
            .result
            .as_ref()
            .and_then(|result| result.get("stop"))
            .and_then(|stop| stop.as_str())
            .unwrap_or("stopped");
        let said = match how {
            "terminated" => "exited after TERM",
            "killed" => "needed KILL",
            "already_exited" => "had already exited",
            other => other,
        };
        println!("{}: {said}", agent.agent_id);
    }
    Ok(Outcome::Success)
}
