//! `crew runs …`: the runs of this workspace.

pub mod cancel;
pub mod clean;
pub mod list;
pub mod prune;
pub mod resume;
pub mod show;

use crate::ui::Ui;
use crate::{CliError, Outcome};

#[derive(Debug, clap::Subcommand)]
// Each subcommand's arguments are built only when it is the one invoked: `crew agents list`
// answers in a couple of milliseconds, and building the whole command tree was a tenth of that.
#[command(defer = true)]
pub enum RunsCommand {
    /// List the runs of this workspace, newest first.
    List(list::ListArgs),
    /// Show one run: its tasks, their outcome, and where their work is.
    Show(show::ShowArgs),
    /// Cancel a run: its agents are stopped gracefully and their work is kept.
    Cancel(cancel::CancelArgs),
    /// Resume a run whose host is gone (interrupted, failed or cancelled).
    Resume(resume::ResumeArgs),
    /// Remove a finished run: the workspaces it still keeps, then its state.
    Clean(clean::CleanArgs),
    /// Remove old finished runs, as `[retention]` says (their `dedicated` workspaces go too).
    Prune(prune::PruneArgs),
}

pub async fn run(command: RunsCommand, ui: Ui) -> Result<Outcome, CliError> {
    match command {
        RunsCommand::List(args) => list::cmd_runs_list(args, ui).await,
        RunsCommand::Show(args) => show::cmd_runs_show(args, ui).await,
        RunsCommand::Cancel(args) => cancel::cmd_runs_cancel(args, ui).await,
        RunsCommand::Resume(args) => resume::cmd_runs_resume(args, ui).await,
        RunsCommand::Clean(args) => clean::cmd_runs_clean(args, ui).await,
        RunsCommand::Prune(args) => prune::cmd_runs_prune(args, ui).await,
    }
}
