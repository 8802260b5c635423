//! `crew worktrees list`

use crew_worktree::listing::WorktreeState;

use crate::context::Context;
use crate::summary::relative;
use crate::ui::{Style, Table, cell, styled};
use crate::{CliError, Outcome};

/// List crew's worktrees and task branches in this repository.
///
/// Worktrees are active (their task runs), waiting (for an answer), preserved (kept after their
/// task), unfinished (the host preparing it died before its agent started: nothing of an
/// agent's in it; a resumed run makes it again, prune removes it), or orphans:
/// missing_directory, unknown_run, unregistered. Branches are listed with whether their work is
/// already merged into HEAD.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Print JSON: `{"worktrees": [...], "branches": [...], "pooled": N}`.
    #[arg(long)]
    pub json: bool,
}

pub async fn cmd_worktrees_list(args: ListArgs, ui: crate::ui::Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    ctx.reconcile()?;
    let Some(listing) = super::listing(&ctx, crew_worktree::listing::BranchScope::All)? else {
        return Err(CliError::user(format!(
            "{} is not inside a git repository",
            ctx.workspace().root()
        )));
    };
    if args.json {
        say!("{}", serde_json::to_string_pretty(&listing)?);
        return Ok(Outcome::Success);
    }
    if listing.worktrees.is_empty() {
        say!("no crew worktrees");
    } else {
        let mut table = Table::new(&["WORKTREE", "STATE", "UNCOMMITTED", "BRANCH", "PATH"]);
        for worktree in &listing.worktrees {
            let (state, style) = match worktree.state {
                WorktreeState::Active => ("active", Style::Good),
                WorktreeState::Waiting => ("waiting", Style::Warn),
                WorktreeState::Preserved => ("preserved", Style::Warn),
                WorktreeState::MissingDirectory => ("missing directory", Style::Bad),
                WorktreeState::UnknownRun => ("unknown run", Style::Bad),
                WorktreeState::Unregistered => ("unregistered", Style::Bad),
                WorktreeState::Unfinished => ("unfinished", Style::Warn),
            };
            table.row(vec![
                cell(format!("{}:{}", worktree.run_id, worktree.task_id)),
                styled(state, style),
                cell(
                    worktree
                        .uncommitted
                        .map_or_else(|| "-".into(), |count| count.to_string()),
                ),
                cell(worktree.branch.clone().unwrap_or_else(|| "-".into())),
                cell(relative(&ctx, &worktree.path)),
            ]);
        }
        say!(no_newline: "{}", table.render(&ctx.ui));
    }
    if !listing.branches.is_empty() {
        say!();
        let mut table = Table::new(&["BRANCH", "MERGED", "CHECKED OUT", "TIP"]);
        for branch in &listing.branches {
            table.row(vec![
                cell(branch.name.clone()),
                if branch.merged {
                    styled("yes", Style::Good)
                } else {
                    styled("no", Style::Warn)
                },
                cell(if branch.checked_out { "yes" } else { "no" }),
                cell(branch.tip[..12].to_owned()),
            ]);
        }
        say!(no_newline: "{}", table.render(&ctx.ui));
    }
    if listing.pooled > 0 {
        say!("\n{} worktree(s) in crew's recycling pool", listing.pooled);
    }
    Ok(Outcome::Success)
}
