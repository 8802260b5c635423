//! `crew runs clean`

use crew_core::provider::WorkspaceKind;
use crew_live::{CleanOptions, CleanRunError, TaskCleaned};

use crate::context::Context;
use crate::{CliError, Outcome};

/// Remove a finished run: the workspaces it still keeps, then its state.
///
/// Workspaces kept for a question never answered, preserved by a teardown, or never torn down
/// (a run whose host died) are torn down the careful way first: their work is committed to the task branch, which is kept. A
/// workspace that still cannot be removed safely keeps the run, unless --force. Branches are
/// never deleted here.
#[derive(Debug, clap::Args)]
pub struct CleanArgs {
    /// The run id, or a unique prefix of it.
    pub run: String,
    /// Show what would be done, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Remove the run's state even when one of its workspaces had to be kept, and its
    /// dedicated workspaces with their files.
    #[arg(long)]
    pub force: bool,
}

pub async fn cmd_runs_clean(args: CleanArgs, ui: crate::ui::Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    ctx.reconcile()?;
    let run_id = ctx.resolve_run(&args.run)?;
    let options = CleanOptions {
        dry_run: args.dry_run,
        force: args.force,
    };
    let result = ctx.project().clean_run(&run_id, options).await;
    let shown = match &result {
        Ok(cleaned) | Err(CleanRunError::Kept { cleaned, .. }) => Some(cleaned),
        Err(_) => None,
    };
    for task in shown
        .map(|cleaned| cleaned.tasks.as_slice())
        .unwrap_or_default()
    {
        match task {
            TaskCleaned::WouldTearDown { task, root } => {
                say!("would tear down {root} ({task})")
            }
            TaskCleaned::TornDown {
                task,
                kind,
                branch,
                security,
                ignored,
            } => {
                // Said even when quiet: the run's state, where the record would be, goes.
                for finding in security {
                    say!(
                        "{task}: SECURITY: the agent {} {} ({})",
                        finding.change,
                        finding.path,
                        if finding.restored {
                            "put back, or never reached the repository"
                        } else {
                            "could not be put back"
                        }
                    );
                }
                if !ui.quiet {
                    match (branch, kind) {
                        (Some(branch), WorkspaceKind::Single) => {
                            say!("{task}: its commits saved on {branch}")
                        }
                        (None, WorkspaceKind::Single) => {
                            say!("{task}: its git work taken into the repository")
                        }
                        (Some(branch), _) => {
                            say!("{task}: work saved on {branch}; workspace removed")
                        }
                        (None, _) => say!("{task}: workspace removed"),
                    }
                }
                // Said even when quiet: they go with the run's state.
                if ignored.files > 0 {
                    let mut names = ignored.named.join(", ");
                    if ignored.named.len() == crew_core::provider::TeardownReport::NAMED {
                        names.push_str(", …");
                    }
                    say!(
                        "{task}: {} ignored file(s) the agent wrote ({}), removed with the run: {}",
                        ignored.files,
                        crate::summary::bytes(ignored.bytes),
                        crate::ui::sanitize(&names)
                    );
                }
            }
            TaskCleaned::Unfinished { task } if args.dry_run => {
                say!("would remove {task}'s worktree, which its host's death left unfinished")
            }
            TaskCleaned::Unfinished { task } => {
                if !ui.quiet {
                    say!(
                        "{task}: its worktree, which its host's death left unfinished (nothing of an agent's in it), removed"
                    )
                }
            }
            TaskCleaned::Kept { task, why } => say!(
                "{task}: kept — {why} (as recorded in {})",
                ctx.store().manifest_path(&run_id)
            ),
        }
    }
    let cleaned = result?;
    let never_written = if cleaned.never_written {
        ", which was never written (its creation was interrupted)"
    } else {
        ""
    };
    if args.dry_run {
        match cleaned.never_written {
            true => say!("would remove run {run_id}{never_written}"),
            false => say!("would remove the state of run {run_id}"),
        }
    } else if !ui.quiet {
        say!("removed run {run_id}{never_written}");
    }
    Ok(Outcome::Success)
}
