//! `crew agents stop`

use crew_live::StopOutcome;

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

pub async fn cmd_agents_stop(args: StopArgs, ui: Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    let stopped = ctx.project().stop(&args.agent).await?;
    if !ui.quiet {
        let said = match stopped.stop {
            StopOutcome::Terminated => "exited after TERM",
            StopOutcome::Killed => "needed KILL",
            StopOutcome::AlreadyExited => "had already exited",
            StopOutcome::EndedPaused => "was paused; its task ends, stopped, its work saved",
        };
        say!("{}: {said}", stopped.agent_id);
    }
    Ok(Outcome::Success)
}
