//! What the summary says of the whole run: its usage, the conflicts between its branches, how
//! far the branch it started from moved on.

use crew_core::model::RunManifest;

use super::SummaryFor;
use crate::context::Context;
use crate::ui::sanitize;

/// The lines about the whole run, after those of its tasks.
pub(super) fn run_notes(ctx: &Context, manifest: &RunManifest, reader: SummaryFor) -> Vec<String> {
    let mut next = Vec::new();
    if let (Some(usage), known) = manifest.usage()
        && manifest.tasks.len() > 1
    {
        next.push(format!(
            "# the run: {usage} ({known} of {} tasks report usage)",
            manifest.tasks.len()
        ));
    }
    if reader == SummaryFor::Review {
        for overlap in overlaps(ctx, manifest) {
            next.push(format!(
                "# conflict: {} ↔ {} in {}   (`crew conflicts {}`)",
                overlap.left,
                overlap.right,
                sanitize(&overlap.files.join(", ")),
                manifest.run_id
            ));
        }
    }
    if let Some((branch, moved)) = ctx.project().base_movement(manifest) {
        let base = manifest.base.as_deref().unwrap_or_default();
        let how = if moved.diverged {
            format!(
                "was rewritten since this run started from {} (that commit is no longer on it; {} commit(s) there now are not in the run's base)",
                &base[..base.len().min(12)],
                moved.gained
            )
        } else {
            format!(
                "gained {} commit(s) since this run started from {}: its task branches are {} behind",
                moved.gained,
                &base[..base.len().min(12)],
                moved.gained
            )
        };
        next.push(format!("# {branch} {how}"));
        for task in &manifest.tasks {
            if let Some(task_branch) = task
                .teardown
                .as_ref()
                .and_then(|report| report.branch.as_ref())
            {
                next.push(format!(
                    "git rebase {branch} {task_branch}   # brings {} up to date",
                    task.id
                ));
            }
        }
    }
    next
}

/// The run's task branches that would conflict with each other or with the branch it started
/// from (the conflict radar); none when that cannot be read.
fn overlaps(ctx: &Context, manifest: &RunManifest) -> Vec<crew_worktree::radar::Overlap> {
    ctx.workspace()
        .repo_root()
        .and_then(|repo_root| crate::commands::conflicts::run_overlaps(repo_root, manifest).ok())
        .unwrap_or_default()
}
