//! The summary of a run: its task table, then where the work is and the commands to inspect,
//! merge or catch it up.

use std::fmt::Write as _;

use crew_core::CancelCause;
use crew_core::config::WorkspaceMode;
use crew_core::model::{RunManifest, RunStatus, TaskStatus};

use crate::Outcome;
use crate::context::Context;
use crate::ui::{Table, sanitize, styled};

mod run;
mod table;
mod tasks;

/// `path` relative to the workspace root when inside it.
pub fn relative(ctx: &Context, path: &camino::Utf8Path) -> String {
    let base = ctx
        .workspace()
        .repo_root()
        .unwrap_or(ctx.workspace().root());
    match path.strip_prefix(base) {
        Ok(rest) if rest.as_str().is_empty() => ".".to_owned(),
        Ok(rest) => rest.to_string(),
        Err(_) => path.to_string(),
    }
}

/// Who reads a summary: the end of a run withholds the merge line of a task whose agent changed
/// git's files until the user has read what it changed in `crew runs show`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SummaryFor {
    RunEnd,
    Review,
}

/// The summary of a finished run: the task table, then where the work is and the commands to
/// inspect or merge it.
pub fn summary(ctx: &Context, manifest: &RunManifest, reader: SummaryFor) -> String {
    let ui = &ctx.ui;
    let checks = manifest.tasks.iter().any(|task| task.check.is_some());
    let mut header = vec![
        "TASK", "STATUS", "DURATION", "EXIT", "BRANCH", "+/-", "WORK",
    ];
    if checks {
        header.push("CHECK");
    }
    let mut table = Table::new(&header);
    let mut next = Vec::new();
    let mut compared = Vec::new();
    for (task, depth) in manifest.family_order() {
        let (row, branch) = table::task_row(ctx, task, depth, checks);
        table.row(row);
        next.extend(tasks::task_notes(
            ctx,
            manifest,
            task,
            reader,
            branch.as_ref(),
            &mut compared,
        ));
    }
    next.extend(run::run_notes(ctx, manifest, reader));
    // A dedicated workspace is kept by design: its work is where it belongs, not stranded.
    let kept = manifest
        .tasks
        .iter()
        .filter(|task| {
            task.status != TaskStatus::Waiting
                && task.workspace_mode != WorkspaceMode::Dedicated
                && task
                    .teardown
                    .as_ref()
                    .is_some_and(|report| report.preserved.is_some())
        })
        .count();
    let kept = if kept > 0 {
        format!(
            " — {}",
            ui.paint(
                &format!("{kept} worktree(s) kept with work not on a branch"),
                crate::ui::Style::Warn
            )
        )
    } else {
        String::new()
    };
    let mut out = format!(
        "\nrun {} {}{kept}\n",
        manifest.run_id,
        ui.run_status(manifest.status)
    );
    if let Some(by) = manifest
        .cancelled_by
        .as_ref()
        .filter(|by| manifest.status == RunStatus::Cancelled || by.cause == CancelCause::FailFast)
    {
        // Writing into a String cannot fail.
        let _ = writeln!(out, "cancelled {by}");
    }
    out.push_str(&table.render(ui));
    if !next.is_empty() {
        out.push('\n');
        for line in next {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}

/// A check's verdict as a table cell, coloured by it.
pub fn check_cell(check: &crew_core::model::CheckRecord) -> (String, Option<crate::ui::Style>) {
    let style = match check.passed {
        Some(true) => crate::ui::Style::Good,
        Some(false) => crate::ui::Style::Bad,
        None => crate::ui::Style::Dim,
    };
    styled(check.verdict(), style)
}

/// A check's output tail, each line indented and made safe to print.
fn indent_tail(tail: &str) -> String {
    let lines: Vec<String> = tail
        .lines()
        .map(|line| format!("  #   {}", sanitize(line)))
        .collect();
    if lines.is_empty() {
        "  #   (it printed nothing)".to_owned()
    } else {
        lines.join("\n")
    }
}

/// A size for people: `812 B`, `4.2 KB`, `1.3 MB`, `2.0 GB`.
pub fn bytes(size: u64) -> String {
    const UNITS: [(f64, &str); 3] = [(1e9, "GB"), (1e6, "MB"), (1e3, "KB")];
    let size_f = size as f64;
    UNITS
        .iter()
        .find(|(unit, _)| size_f >= *unit)
        .map(|(unit, name)| format!("{:.1} {name}", size_f / unit))
        .unwrap_or_else(|| format!("{size} B"))
}

/// The exit outcome of a finished run.
pub fn outcome(manifest: &RunManifest) -> Outcome {
    match manifest.status {
        RunStatus::Completed => Outcome::Success,
        // Cancelled as a run (Ctrl-C, `crew runs cancel`): interrupted. Ended because a person
        // stopped its tasks (`crew agents stop`): a stopped task, exit 1.
        RunStatus::Cancelled if manifest.cancelled_by.is_some() => Outcome::Interrupted,
        _ => Outcome::TaskFailed,
    }
}
