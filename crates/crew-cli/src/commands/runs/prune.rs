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

/// Starts `crew runs prune --if-due` in the background when `[retention]` may have something
/// to prune (judged from the runs' names alone). The run's end never waits for it.
pub fn prune_in_background(ctx: &Context) {
    let retention = &ctx.config().retention;
    if !retention.automatic || !ctx.store().prune_due(retention, SystemTime::now()) {
        return;
    }
    start_in_background(ctx, &["runs", "prune", "--if-due"]);
}

/// Starts `crew <args> --quiet --color never` in the project, detached from this process's
/// output; it is reaped when it ends. What a run's end starts (a prune, a refill of the pool)
/// is a courtesy: one that cannot start now happens after a later run, or by hand.
pub fn start_in_background(ctx: &Context, args: &[&str]) {
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let started = std::process::Command::new(exe)
        .args(args)
        .args(["--quiet", "--color", "never"])
        .current_dir(ctx.workspace().root())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    match started {
        // Reaped when it ends, so that a long-lived host (`crew mcp`, `crew serve`) keeps no
        // zombie; a `crew run` that exits first leaves it to init.
        Ok(mut child) => {
            std::thread::spawn(move || child.wait());
        }
        Err(error) => tracing::debug!("could not start crew {args:?} in the background: {error}"),
    }
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
