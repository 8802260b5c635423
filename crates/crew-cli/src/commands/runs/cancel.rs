//! `crew runs cancel`

use crew_core::model::RunStatus;
use crew_live::control::Op;

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

#[allow(clippy::print_stdout)]
pub async fn cmd_runs_cancel(args: CancelArgs, ui: crate::ui::Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    ctx.reconcile()?;
    let run_id = ctx.resolve_run(&args.run)?;
    let manifest = ctx.read_run(&run_id)?;
    let live_host = manifest
        .host
        .clone()
        .filter(|host| manifest.status == RunStatus::Running && host.identity.is_alive());
    let Some(host) = live_host else {
        if manifest.status.is_finished() && manifest.status != RunStatus::Interrupted {
            return Err(CliError::user(format!(
                "run {run_id} is already {}",
                manifest.status
            )));
        }
        let by = crew_core::CancelRecord::by_this_process(crew_core::CancelCause::HostGone);
        let event = crew_core::model::RunEvent::new(
            None,
            crew_core::model::EventKind::CancelRequested { by: by.clone() },
        );
        ctx.store().update_run(&run_id, |manifest| {
            manifest.set_status(RunStatus::Cancelled)?;
            manifest.reason = Some("cancelled after its host was gone".into());
            manifest.cancelled_by.get_or_insert(by);
            Ok(())
        })?;
        let _ = ctx.store().append_event(&run_id, &event);
        if !ui.quiet {
            println!("run {run_id} cancelled (its host was gone)");
        }
        return Ok(Outcome::Success);
    };
    let own_session = crew_live::procscan::session_of(None);
    let host_session = crew_live::procscan::session_of(Some(host.identity.pid));
    let detached = host
        .label
        .as_deref()
        .is_some_and(crate::foreground::Detached::labels);
    let same_session = crew_live::procscan::same_session(own_session, host_session);
    if !args.force && !detached && same_session != Some(true) {
        let label = host.label.as_deref().unwrap_or("another process");
        return Err(CliError::user(format!(
            "run {run_id} is hosted by another session ({label}, pid {})",
            host.identity.pid
        ))
        .with_hint(format!(
            "cancel it anyway with `crew runs cancel {run_id} --force`"
        )));
    }
    let response = ctx
        .call(
            &host,
            Op::CancelRun {
                run: run_id.clone(),
                force: args.force,
            },
        )
        .await?;
    if let Some(error) = response.error {
        return Err(CliError::user(error.message));
    }
    if !ui.quiet {
        println!("run {run_id}: cancelling; its agents stop gracefully and their work is kept");
    }
    Ok(Outcome::Success)
}
