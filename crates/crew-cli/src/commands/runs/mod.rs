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
pub enum RunsCommand {
    List(list::ListArgs),
    Show(show::ShowArgs),
    Cancel(cancel::CancelArgs),
    Resume(resume::ResumeArgs),
    Clean(clean::CleanArgs),
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
