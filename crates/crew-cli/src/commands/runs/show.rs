//! `crew runs show`

use crate::context::Context;
use crate::summary::{SummaryFor, summary};
use crate::{CliError, Outcome};

/// Show one run: its tasks, their outcome, and where their work is.
#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// The run id, or a unique prefix of it.
    pub run: String,
    /// Print the run's manifest as JSON.
    #[arg(long)]
    pub json: bool,
}

pub async fn cmd_runs_show(args: ShowArgs, ui: crate::ui::Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    let run_id = ctx.resolve_run(&args.run)?;
    // A run whose host died is shown interrupted, as `crew runs list` shows it, not running.
    // Best effort: a run that cannot be read is refused by the read below, with its own error.
    let _ = ctx.project().run_ended(&run_id);
    let manifest = ctx.read_run(&run_id)?;
    if args.json {
        say!("{}", serde_json::to_string_pretty(&manifest)?);
        return Ok(Outcome::Success);
    }
    let team = manifest.team.as_deref().unwrap_or("-");
    say!(
        "run {}  team {team}  {} mode  created {}",
        manifest.run_id,
        manifest.mode_label(),
        manifest.created_at
    );
    if manifest.schema_version > crew_core::model::MANIFEST_SCHEMA_VERSION {
        say!(
            "  written by a newer crew (schema version {}, this one knows {}): shown as this crew reads it, and read-only to it",
            manifest.schema_version,
            crew_core::model::MANIFEST_SCHEMA_VERSION
        );
    }
    if let Some(reason) = &manifest.reason {
        say!("  {}", crate::ui::sanitize_lines(reason, "  "));
    }
    say!(no_newline: "{}", summary(&ctx, &manifest, SummaryFor::Review));
    crate::commands::run::looked_at(&ctx, &manifest);
    Ok(Outcome::Success)
}
