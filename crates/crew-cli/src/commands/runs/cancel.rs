//! `crew runs cancel`

use crew_live::Cancelled;

use crate::context::Context;
use crate::{CliError, Outcome};

/// Cancel a run: its agents are stopped gracefully and their work is kept.
///
/// A run hosted by another terminal session (another `crew run`, an editor) is only cancelled
/// with --force; a run started with `crew run --detach` or by a lead agent over `crew mcp` is yours to cancel. A run whose host is gone is marked cancelled.
#[derive(Debug, clap::Args)]
pub struct CancelArgs {
    /// The run id, or a unique prefix of it.
    pub run: String,
    /// Cancel even when another session hosts the run.
    #[arg(long)]
    pub force: bool,
}

pub async fn cmd_runs_cancel(args: CancelArgs, ui: crate::ui::Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    ctx.reconcile()?;
    let run_id = ctx.resolve_run(&args.run)?;
    let said = match ctx.project().cancel_run(&run_id, args.force).await? {
        Cancelled::HostWasGone => format!("run {run_id} cancelled (its host was gone)"),
        Cancelled::Cancelling => {
            format!("run {run_id}: cancelling; its agents stop gracefully and their work is kept")
        }
    };
    if !ui.quiet {
        say!("{said}");
    }
    Ok(Outcome::Success)
}
