//! `crew worktrees …`: crew's worktrees and task branches in this repository.

pub mod list;
pub mod prune;
pub mod refill;

use crew_core::RunId;
use crew_worktree::listing::{self, BranchScope, WorktreeListing};

use crate::context::Context;
use crate::ui::Ui;
use crate::{CliError, Outcome};

#[derive(Debug, clap::Subcommand)]
// Each subcommand's arguments are built only when it is the one invoked: `crew agents list`
// answers in a couple of milliseconds, and building the whole command tree was a tenth of that.
#[command(defer = true)]
pub enum WorktreesCommand {
    /// List crew's worktrees and task branches in this repository.
    List(list::ListArgs),
    /// Remove crew's worktrees and task branches that hold no work.
    Prune(prune::PruneArgs),
    /// Fill the worktree pool up to `[worktree] pool_size` (what a run's end starts by itself).
    #[command(hide = true)]
    Refill(refill::RefillArgs),
}

pub async fn run(command: WorktreesCommand, ui: Ui) -> Result<Outcome, CliError> {
    match command {
        WorktreesCommand::List(args) => list::cmd_worktrees_list(args, ui).await,
        WorktreesCommand::Prune(args) => prune::cmd_worktrees_prune(args, ui).await,
        WorktreesCommand::Refill(args) => refill::cmd_worktrees_refill(args, ui).await,
    }
}

/// crew's worktrees and, as far as `scope` says, task branches of the repository holding this
/// workspace.
pub fn listing(ctx: &Context, scope: BranchScope<'_>) -> Result<Option<WorktreeListing>, CliError> {
    let Some(repo_root) = ctx.workspace().repo_root() else {
        return Ok(None);
    };
    listing::list(repo_root, &ctx.config().worktree, ctx.store(), scope)
        .map(Some)
        .map_err(CliError::internal)
}

/// How many kept worktrees or unmerged branches the warning names; beyond, it counts them.
const ATTENTION_NAMES: usize = 3;

/// The one-line warning of what needs the user: worktrees kept after their task (work that is
/// on no branch), and, with `runs` (`crew runs list`, where runs are reviewed: the runs it
/// shows), those runs' task branches whose work is not merged. `crew run` names kept worktrees
/// only: unmerged branches are what every run leaves, and saying so at each start is noise.
/// Only the branches of the runs shown are judged, so that a long history costs nothing here.
pub fn warn_attention(ctx: &Context, runs: Option<&[RunId]>) {
    if ctx.ui.quiet {
        return;
    }
    let scope = runs.map_or(BranchScope::None, BranchScope::OfRuns);
    let Ok(Some(listing)) = listing(ctx, scope) else {
        return;
    };
    let (worktrees, branches) = listing.needs_attention();
    if worktrees.is_empty() && branches.is_empty() {
        return;
    }
    // One short line however many there are: names only while they fit.
    let named = |count: usize, what: &str, names: Vec<String>| {
        if count <= ATTENTION_NAMES {
            format!("{count} {what} ({})", names.join(", "))
        } else {
            format!("{count} {what}")
        }
    };
    let mut parts = Vec::new();
    if !worktrees.is_empty() {
        parts.push(named(
            worktrees.len(),
            "kept worktree(s)",
            worktrees
                .iter()
                .map(|worktree| format!("{}:{}", worktree.run_id, worktree.task_id))
                .collect(),
        ));
    }
    if !branches.is_empty() {
        parts.push(named(
            branches.len(),
            "unmerged task branch(es)",
            branches.iter().map(|branch| branch.name.clone()).collect(),
        ));
    }
    ctx.ui.warn(&format!(
        "{} — see `crew worktrees list`",
        parts.join(" and ")
    ));
}
