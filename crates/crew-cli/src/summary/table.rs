//! The summary's table: one row a task (its status, duration, exit, branch, lines changed,
//! where its work is, its check).

use crew_core::model::TaskRecord;
use crew_core::provider::WorkspaceKind;

use super::{check_cell, relative};
use crate::context::Context;
use crate::ui::{Style, between, cell, duration, styled, task_style};

/// The row of `task` (`depth` deep in its family), and the branch it shows.
pub(super) fn task_row(
    ctx: &Context,
    task: &TaskRecord,
    depth: usize,
    checks: bool,
) -> (Vec<(String, Option<Style>)>, Option<String>) {
    let elapsed = between(task.started_at, task.finished_at)
        .filter(|_| task.started_at.is_some())
        .map(duration)
        .unwrap_or_else(|| "-".into());
    let exit = match &task.exit {
        Some(exit) => match (exit.code, exit.signal) {
            (Some(code), _) => code.to_string(),
            (None, Some(signal)) => format!("sig {signal}"),
            _ => "-".into(),
        },
        None => "-".into(),
    };
    let report = task.teardown.as_ref();
    // A workspace never torn down (its host died, or it waits for an answer) still has
    // its branch and its files: say where, as `crew worktrees list` does.
    let untorn = task
        .workspace
        .as_ref()
        .filter(|workspace| report.is_none() && workspace.kind == WorkspaceKind::Worktree);
    let branch = report
        .and_then(|report| report.branch.clone())
        .or_else(|| untorn.and_then(|workspace| workspace.branch.clone()));
    let plus_minus = report
        .and_then(|report| report.diffstat)
        .map(|stat| format!("+{} -{}", stat.insertions, stat.deletions))
        .unwrap_or_else(|| "-".into());
    let work = match (report, &task.workspace) {
        (Some(report), _) if report.preserved.is_some() => {
            format!(
                "kept at {}",
                relative(ctx, report.preserved.as_deref().expect("checked"))
            )
        }
        (_, Some(workspace)) if workspace.kind == WorkspaceKind::Single => {
            "the project root".into()
        }
        (Some(report), Some(_)) if report.branch.is_some() => "on its branch".into(),
        (Some(report), Some(workspace))
            if report.removed && workspace.kind == WorkspaceKind::Worktree =>
        {
            "no changes".into()
        }
        (Some(report), _) if report.removed => "removed (temp)".into(),
        (None, Some(workspace)) if untorn.is_some() => {
            let root = if workspace.root.as_str().is_empty() {
                &workspace.dir
            } else {
                &workspace.root
            };
            if root.is_dir() {
                format!("in its worktree at {}", relative(ctx, root))
            } else {
                "-".into()
            }
        }
        _ => "-".into(),
    };
    let mut row = vec![
        cell(crate::ui::nested(task.id.as_str(), depth)),
        styled(task.status.as_str(), task_style(task.status)),
        cell(elapsed),
        cell(exit),
        cell(branch.clone().unwrap_or_else(|| "-".into())),
        cell(plus_minus),
        cell(work),
    ];
    if checks {
        row.push(match &task.check {
            Some(check) => check_cell(check),
            None => cell("-"),
        });
    }
    (row, branch)
}
