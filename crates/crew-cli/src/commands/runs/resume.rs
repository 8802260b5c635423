//! `crew runs resume`

use std::collections::HashMap;

use crate::context::Context;
use crate::foreground::start_host;
use crate::summary::outcome;
use crate::{CliError, Outcome};

/// Resume a run whose host is gone (interrupted, failed or cancelled).
///
/// Tasks that succeeded are not run again; the others start again (worktree tasks from their
/// branch); tasks waiting for an answer wait again. The run is hosted here until it ends.
#[derive(Debug, clap::Args)]
pub struct ResumeArgs {
    /// The run id, or a unique prefix of it.
    pub run: String,
    /// Print the final run manifest as JSON instead of the summary.
    #[arg(long)]
    pub json: bool,
}

pub async fn cmd_runs_resume(args: ResumeArgs, ui: crate::ui::Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    ctx.reconcile()?;
    let run_id = ctx.resolve_run(&args.run)?;
    let host = start_host(&ctx, "crew runs resume").await?;
    host.prepare_resume(&run_id).await?;
    let manifest = crate::foreground::run_here(
        &ctx,
        &host,
        &run_id,
        HashMap::new(),
        !ctx.ui.quiet && !args.json,
    )
    .await?;
    crate::commands::run::print_result(&ctx, &manifest, args.json)?;
    Ok(outcome(&manifest))
}
