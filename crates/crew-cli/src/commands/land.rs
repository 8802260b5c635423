//! `crew land`

use crew_core::provider::land::LandMode;
use crew_live::LandOptions;

use crate::context::Context;
use crate::ui::Ui;
use crate::{CliError, Outcome};

/// Land tasks' work on a branch, in dependency order: all of them, or none.
///
/// Each result is made away from your checkout; the target moves only when every task landed
/// cleanly. On the first conflict nothing changes, and crew says which task and which files.
/// When the target is checked out here, it moves only if your working tree is clean, and its
/// files are brought up to date as `git merge --ff-only` would.
#[derive(Debug, clap::Args)]
pub struct LandArgs {
    /// Tasks (`<run>:<task>`, `<runPrefix>:<task>`, `<task>`), or one run (all its tasks with work).
    #[arg(required = true)]
    pub targets: Vec<String>,
    /// The branch to land on (default: the branch the run started from).
    #[arg(long, value_name = "BRANCH")]
    pub into: Option<String>,
    /// One commit per task, with its whole change.
    #[arg(long, group = "mode")]
    pub squash: bool,
    /// Each task's commits replayed on the target.
    #[arg(long, group = "mode")]
    pub rebase: bool,
    /// A merge commit per task (the default).
    #[arg(long, group = "mode")]
    pub merge: bool,
    /// Land tasks whose check failed, too.
    #[arg(long)]
    pub force: bool,
}

pub async fn cmd_land(args: LandArgs, ui: Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    let mode = if args.squash {
        LandMode::Squash
    } else if args.rebase {
        LandMode::Rebase
    } else {
        LandMode::Merge
    };
    let options = LandOptions {
        into: args.into,
        mode,
        force: args.force,
    };
    let landed = ctx.project().land(&args.targets, &options)?;
    if !ctx.ui.quiet {
        let (names, into) = (landed.tasks.join(", "), &landed.into);
        if landed.from == landed.to {
            say!("nothing to land on {into}: {names} already there");
        } else {
            say!(
                "landed {names} on {into}: {}..{}",
                &landed.from[..12],
                &landed.to[..12]
            );
            if landed.checkout_updated {
                say!("your checkout of {into} is up to date");
            }
            if !landed.checks.is_empty() {
                say!("checks: {}", landed.checks.join(", "));
            }
        }
    }
    Ok(Outcome::Success)
}
