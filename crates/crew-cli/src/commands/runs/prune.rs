//! `crew runs prune`

use std::time::SystemTime;

use crate::context::Context;
use crate::{CliError, Outcome};

/// Remove old finished runs, as `[retention]` says (their `dedicated` workspaces go too).
///
/// Runs beyond `max_kept_runs` (newest kept) or older than `max_run_age_days` are removed.
/// Running runs and runs with a task waiting for an answer are never pruned.
#[derive(Debug, clap::Args)]
pub struct PruneArgs {
    /// Show what would be removed, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON: `{"pruned": [run ids], "kept": N, "dry_run": bool}`.
    #[arg(long)]
    pub json: bool,
    /// The prune a run's end starts by itself: in a session of its own, saying nothing, and
    /// only runs whose work is on a branch or in the project.
    #[arg(long, hide = true)]
    pub if_due: bool,
}

pub async fn cmd_runs_prune(args: PruneArgs, ui: crate::ui::Ui) -> Result<Outcome, CliError> {
    if args.if_due {
        // Out of the terminal's session: the run that started it has ended, and its user's
        // Ctrl-C is not for this.
        let _ = rustix::process::setsid();
        let ctx = Context::discover(ui)?;
        ctx.reconcile()?;
        ctx.store()
            .prune_saved(&ctx.config().retention, SystemTime::now())?;
        return Ok(Outcome::Success);
    }
    let ctx = Context::discover(ui)?;
    ctx.reconcile()?;
    let (store, retention, dry_run) = (
        ctx.store().clone(),
        ctx.config().retention.clone(),
        args.dry_run,
    );
    let what = if dry_run {
        "looking at runs"
    } else {
        "pruning runs"
    };
    // A spinner only where nothing else reads the output.
    let shown = crate::ui::Ui {
        live: ui.live && !args.json,
        ..ui
    };
    let report = crate::block::while_working(&shown, what, move || {
        store.prune(&retention, SystemTime::now(), dry_run)
    })
    .await?;
    if args.json {
        let json = serde_json::json!({ "pruned": report.pruned, "kept": report.kept, "dry_run": args.dry_run });
        say!("{}", serde_json::to_string_pretty(&json)?);
    } else if !ui.quiet {
        let verb = if args.dry_run {
            "would remove"
        } else {
            "removed"
        };
        for run_id in &report.pruned {
            say!("{verb} run {run_id}");
        }
        let summary = if args.dry_run {
            "would be removed"
        } else {
            "removed"
        };
        say!(
            "{} run(s) {summary}, {} kept",
            report.pruned.len(),
            report.kept
        );
    }
    Ok(Outcome::Success)
}
