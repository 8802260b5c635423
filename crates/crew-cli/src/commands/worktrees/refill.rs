//! `crew worktrees refill` (hidden): fills crew's worktree pool in the background after a run,
//! so that the next run's first tasks start from recycled worktrees instead of fresh checkouts.

use std::time::Duration;

use crate::context::Context;
use crate::{CliError, Outcome};

/// Fill the worktree pool up to `[worktree] pool_size` (what a run's end starts by itself).
#[derive(Debug, clap::Args)]
pub struct RefillArgs {}

/// How often a refill looks whether a run started, and gives way to it.
const GIVE_WAY_POLL: Duration = Duration::from_millis(100);

pub async fn cmd_worktrees_refill(
    _args: RefillArgs,
    ui: crate::ui::Ui,
) -> Result<Outcome, CliError> {
    // Out of the terminal's session, and last in line for the CPU and the disk: a run that
    // starts meanwhile comes first.
    let _ = rustix::process::setsid();
    crew_live::process::lowest_priority();
    let ctx = Context::discover(ui)?;
    let Some(repo_root) = ctx.workspace().repo_root().map(ToOwned::to_owned) else {
        return Ok(Outcome::Success);
    };
    let store = ctx.store().clone();
    let run_started = move || {
        store
            .running_run_ids()
            .map_or(true, |running| !running.is_empty())
    };
    if run_started() {
        return Ok(Outcome::Success);
    }
    // A checkout cannot be stopped halfway: a run that starts during one ends this process,
    // and the next refill removes what it left.
    let watcher = run_started.clone();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(GIVE_WAY_POLL);
            if watcher() {
                std::process::exit(0);
            }
        }
    });
    crew_worktree::pool::refill_at_head(&repo_root, &ctx.config().worktree, run_started)?;
    Ok(Outcome::Success)
}
