//! `crew worktrees prune`

use crew_worktree::listing;

use crate::context::Context;
use crate::{CliError, Outcome};

/// Remove crew's worktrees and task branches that hold no work.
///
/// Removes admin entries of vanished directories, clean worktrees of finished or unknown runs,
/// empty stray directories, and task branches already merged into HEAD. Keeps everything with
/// uncommitted or unmerged work, everything locked by you, and everything crew did not make —
/// and says why.
#[derive(Debug, clap::Args)]
pub struct PruneArgs {
    /// Show what would be removed, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub async fn cmd_worktrees_prune(args: PruneArgs, ui: crate::ui::Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    ctx.reconcile()?;
    let Some(repo_root) = ctx.workspace().repo_root() else {
        return Err(CliError::user(format!(
            "{} is not inside a git repository",
            ctx.workspace().root()
        )));
    };
    let (repo_root, settings, store) = (
        repo_root.to_owned(),
        ctx.config().worktree.clone(),
        ctx.store().clone(),
    );
    let dry_run = args.dry_run;
    let what = if dry_run {
        "looking at worktrees"
    } else {
        "pruning worktrees"
    };
    // A spinner only where nothing else reads the output.
    let shown = crate::ui::Ui {
        live: ui.live && !args.json,
        ..ui
    };
    let report = crate::block::while_working(&shown, what, move || {
        listing::prune(&repo_root, &settings, &store, dry_run)
    })
    .await?;
    if args.json {
        say!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(Outcome::Success);
    }
    if ui.quiet {
        return Ok(Outcome::Success);
    }
    let verb = if args.dry_run {
        "would remove"
    } else {
        "removed"
    };
    for path in &report.removed_worktrees {
        say!("{verb} worktree {path}");
    }
    for name in &report.removed_admin_entries {
        say!("{verb} stale registration {name}");
    }
    let branch_verb = if args.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    for branch in &report.deleted_branches {
        say!("{branch_verb} merged branch {branch}");
    }
    if report.emptied_pool > 0 {
        say!(
            "{verb} {} recycled worktree(s) from crew's pool",
            report.emptied_pool
        );
    }
    for (what, why) in &report.kept {
        say!("kept {what}: {why}");
    }
    if report.removed_worktrees.is_empty()
        && report.removed_admin_entries.is_empty()
        && report.deleted_branches.is_empty()
        && report.emptied_pool == 0
    {
        say!("nothing to prune");
    }
    Ok(Outcome::Success)
}
