//! `crew diff`

use std::io::Write as _;

use crew_core::model::RunManifest;

use crate::context::Context;
use crate::ui::Ui;
use crate::{CliError, Outcome};

/// A task's work against its base, as git diff prints it (a run: each of its tasks).
///
/// The same output as `git diff <base>..<branch>`; for a run, each task with work after a line
/// naming it.
#[derive(Debug, clap::Args)]
pub struct DiffArgs {
    /// A task (`<run>:<task>`, `<runPrefix>:<task>`, `<task>`) or a run (its id or a prefix).
    pub target: String,
    /// Files changed and lines added and removed, as `git diff --stat`.
    #[arg(long)]
    pub stat: bool,
    /// `{tasks: [{agent_id, base, branch, files_changed, insertions, deletions, patch}]}`.
    #[arg(long)]
    pub json: bool,
}

pub async fn cmd_diff(args: DiffArgs, ui: Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    let repo_root = ctx.workspace().repo_root().ok_or_else(|| {
        CliError::user("this workspace is not in a git repository: its tasks have no branches")
    })?;
    // A task first (`api`, `run:api`), then a run.
    let found = match ctx.project().find_task(&args.target)? {
        Some(found) => Some(found),
        // A task with attempts: its picked one.
        None => match ctx.project().find_attempted(&args.target)? {
            Some((manifest, task)) => {
                let result = crew_live::project::verbs::picked_attempt(&manifest, &task)
                    .map_err(|error| crate::error::not_picked(error, "show its work again"))?;
                Some((manifest, result))
            }
            None => None,
        },
    };
    let (manifest, only) = match found {
        Some((manifest, task)) => (manifest, Some(task)),
        None => (ctx.read_run(&ctx.resolve_run(&args.target)?)?, None),
    };
    let tasks: Vec<_> = manifest
        .tasks
        .iter()
        .filter(|task| only.as_ref().is_none_or(|only| *only == task.id))
        .collect();
    let mut ranges = Vec::new();
    for task in &tasks {
        match task.work_range() {
            Some(range) => ranges.push((task.id.clone(), range)),
            None if only.is_some() => {
                return Err(no_work(&manifest, task));
            }
            None => {}
        }
    }
    let mut out = std::io::stdout().lock();
    let mut json = Vec::new();
    for (task_id, (base, branch)) in &ranges {
        let (stat, [files, insertions, deletions]) =
            crew_worktree::inspect::branch_stat(repo_root, base, branch, 80)?;
        let patch = crew_worktree::inspect::branch_patch(repo_root, base, branch)?;
        let text = if args.stat { stat } else { patch.clone() };
        // An agent's bytes reach a terminal as text: an escape sequence in a file it wrote
        // must not retitle, clear or drive the user's terminal. Piped, the patch stays whole.
        let text = if ctx.ui.terminal {
            neutralised(&text)
        } else {
            text
        };
        if args.json {
            json.push(serde_json::json!({
                "agent_id": format!("{}:{task_id}", manifest.run_id),
                "base": base,
                "branch": branch,
                "files_changed": files,
                "insertions": insertions,
                "deletions": deletions,
                "patch": patch,
            }));
            continue;
        }
        if only.is_none() {
            let header = format!("# {}:{task_id}  {base}..{branch}\n", manifest.run_id);
            if out.write_all(header.as_bytes()).is_err() {
                return Ok(Outcome::Success);
            }
        }
        if out.write_all(text.as_bytes()).is_err() {
            // The reader went away (`| head`): nothing more to say.
            return Ok(Outcome::Success);
        }
    }
    if args.json {
        let value = serde_json::json!({ "tasks": json });
        // Writing into a String cannot fail.
        let _ = writeln!(out, "{value:#}");
    }
    Ok(Outcome::Success)
}

/// A task's work as `git diff <base>..<branch>` prints it.
#[derive(Debug)]
pub struct TaskPatch {
    pub agent_id: String,
    pub base: String,
    pub branch: String,
    pub patch: String,
}

/// The patch of `task` of `manifest`; the message says why there is none (no branch with work,
/// a branch git cannot read). `crew diff`, and the editor's and lead agents' `diff`.
pub fn task_patch(
    ctx: &Context,
    manifest: &RunManifest,
    task: &crew_core::TaskRecord,
) -> Result<TaskPatch, String> {
    let (Some((base, branch)), Some(repo_root)) = (task.work_range(), ctx.workspace().repo_root())
    else {
        return Err(format!(
            "task {}:{} has no branch with work (it is {})",
            manifest.run_id, task.id, task.status
        ));
    };
    let patch = crew_worktree::inspect::branch_patch(repo_root, &base, &branch)
        .map_err(|error| format!("cannot read {branch}: {}", error.message()))?;
    Ok(TaskPatch {
        agent_id: format!("{}:{}", manifest.run_id, task.id),
        base,
        branch,
        patch,
    })
}

fn no_work(manifest: &RunManifest, task: &crew_core::TaskRecord) -> CliError {
    CliError::user(format!(
        "task {}:{} has no branch with work (it is {})",
        manifest.run_id, task.id, task.status
    ))
    .with_hint("a task in `single` mode works in the project itself, and one whose work is kept in its worktree has it there (`crew runs show`)")
}

/// `text` with every control character of each line shown as `�` (tabs as spaces), its
/// lines kept.
fn neutralised(text: &str) -> String {
    let mut shown = crate::ui::sanitize_lines(text, "");
    if text.ends_with('\n') {
        shown.push('\n');
    }
    shown
}
