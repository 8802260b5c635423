//! The summary of a run: its task table, then where the work is and the commands to inspect,
//! merge or catch it up.

use std::fmt::Write as _;

use crew_core::CancelCause;
use crew_core::config::WorkspaceMode;
use crew_core::model::{RunManifest, RunStatus, TaskStatus};
use crew_core::provider::{TeardownReport, WorkspaceKind};

use crate::Outcome;
use crate::context::Context;
use crate::ui::{Table, between, cell, duration, sanitize, sanitize_lines, styled, task_style};

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
        let findings = report.map_or(&[][..], |report| &report.security[..]);
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
        table.row(row);
        if let Some(attempt) = &task.attempt_of
            && !compared.contains(&attempt.task)
        {
            compared.push(attempt.task.clone());
            let spec = format!("{}:{}", manifest.run_id, attempt.task);
            next.push(if let Some(picked) = manifest
                .attempts_of(&attempt.task)
                .into_iter()
                .find(|task| task.attempt_of.as_ref().is_some_and(|a| a.picked))
            {
                format!("# {}: attempt {} was picked (`crew compare {spec}`)", attempt.task, picked.id)
            } else {
                format!(
                    "crew compare {spec}   # {} attempts of {}; keep one with `crew pick {spec} <N>`",
                    attempt.of, attempt.task
                )
            });
        }
        if let Some(check) = &task.check
            && check.passed == Some(false)
        {
            next.push(format!(
                "# {}: its check `{}` {}; the end of its output:\n{}",
                task.id,
                sanitize(&check.command),
                check.verdict(),
                indent_tail(&check.output_tail)
            ));
        }
        // Only a branch its teardown saved the work on: an untorn worktree's may hold nothing
        // yet (its agent's work is in its files until `crew runs resume` or `clean` saves it).
        if let (Some(branch), Some(base), Some(_)) = (
            &branch,
            task.workspace
                .as_ref()
                .and_then(|workspace| workspace.base_commit.as_deref()),
            report,
        ) {
            next.push(format!(
                "git diff {}..{branch}   # {}",
                &base[..base.len().min(12)],
                task.id
            ));
            // An attempt is one of several alternatives: it is landed once picked.
            if (findings.is_empty() || reader == SummaryFor::Review) && task.attempt_of.is_none() {
                next.push(format!("git merge {branch}"));
            }
        }
        if let Some(report) = report
            && report.ignored_files > 0
        {
            let mut names = report.ignored_paths.join(", ");
            // The report names at most that many; there may be more.
            if report.ignored_paths.len() == TeardownReport::NAMED {
                names.push_str(", …");
            }
            let place = match (&report.ignored_kept_in, &report.preserved) {
                (Some(kept), _) => format!("kept in {}", relative(ctx, kept)),
                (None, Some(worktree)) => format!("still in {}", relative(ctx, worktree)),
                (None, None) => "removed with the worktree".to_owned(),
            };
            next.push(format!(
                "# {}: {} ignored file(s) the agent wrote ({}), {place}: {}",
                task.id,
                report.ignored_files,
                bytes(report.ignored_bytes),
                sanitize(&names)
            ));
        }
        // Held while it may go on (a finished task's ports went back).
        if let Some(lease) = manifest
            .held_lease(task)
            .filter(|_| reader == SummaryFor::Review)
            && let Some(ports) = lease.port_range()
        {
            next.push(format!(
                "# {}: its lease: ports {ports} (CREW_PORT), name {} (COMPOSE_PROJECT_NAME{})",
                task.id,
                lease.name,
                lease
                    .names
                    .iter()
                    .map(|name| format!(", {name}"))
                    .collect::<String>()
            ));
        }
        if let Some(requests) = task.requests {
            next.push(format!(
                "# {}: network through crew's proxy: {} request(s) let through, {} refused (`crew events --run {}` names each)",
                task.id, requests.allowed, requests.refused, manifest.run_id
            ));
        }
        if let Some(report) = report
            && !report.setup_paths.is_empty()
        {
            let mut names = report.setup_paths.join(", ");
            if report.setup_paths.len() == TeardownReport::NAMED {
                names.push_str(", …");
            }
            next.push(format!(
                "# {}: left out of its work, as the worktree's setup made them: {}",
                task.id,
                sanitize(&names)
            ));
        }
        for finding in findings.iter().filter(|finding| finding.on_branch) {
            next.push(format!(
                "# {}: SECURITY: its branch {} {}, crew's own settings: review it before merging (what loosens the sandbox applies only once you allow it)",
                task.id,
                finding.change,
                relative(ctx, &finding.path)
            ));
        }
        for finding in findings.iter().filter(|finding| !finding.on_branch) {
            let restored = if finding.restored {
                "crew put it back"
            } else {
                "crew could NOT put it back"
            };
            let saved = finding
                .saved
                .as_ref()
                .map(|saved| format!("; the agent's version is kept at {}", relative(ctx, saved)))
                .unwrap_or_default();
            next.push(format!(
                "# {}: SECURITY: the agent {} {} ({restored}{saved})",
                task.id,
                finding.change,
                relative(ctx, &finding.path)
            ));
        }
        if !findings.is_empty() && reader == SummaryFor::RunEnd {
            next.push(format!(
                "# {}: read `crew runs show {}` before merging its work",
                task.id, manifest.run_id
            ));
        }
        if let Some(question) = &task.question
            && task.status == TaskStatus::Waiting
        {
            next.push(format!(
                "crew agents follow-up {} \"<answer>\"   # {} asks: {}",
                task.id,
                task.id,
                sanitize(question)
            ));
            if manifest.status.is_finished() {
                next.push(format!(
                    "crew runs clean {}   # or save {}'s work and remove its workspace",
                    manifest.run_id, task.id
                ));
            }
        }
        if let Some(reason) = task
            .reason
            .as_ref()
            .filter(|_| task.status != TaskStatus::Succeeded)
        {
            next.push(format!(
                "# {}: {}",
                task.id,
                sanitize_lines(reason, "  #   ")
            ));
        }
        if let Some(report) = report
            && let Some(kept) = &report.preserved
            && task.workspace_mode == WorkspaceMode::Dedicated
        {
            // Its workspace is its result: nothing failed, and nothing should remove it.
            next.push(format!(
                "# {}: its work is in its dedicated workspace {} (no branch: a dedicated workspace is not a git checkout), kept until the run is pruned",
                task.id,
                relative(ctx, kept),
            ));
        } else if let Some(report) = report
            && let Some(kept) = &report.preserved
            && let Some(branch) = &report.branch
        {
            // Its work was taken onto its branch before something else kept the worktree.
            let reason = report.preserved_reason.as_deref().unwrap_or("unknown");
            next.push(format!(
                "# {}: its work is on its branch {branch}; its worktree was kept at {}: {}",
                task.id,
                relative(ctx, kept),
                sanitize_lines(reason, "  #   ")
            ));
            if manifest.status.is_finished() && task.status != TaskStatus::Waiting {
                next.push(format!(
                    "crew runs clean {}   # once that is fixed: removes the run and its kept worktree",
                    manifest.run_id
                ));
            }
        } else if let Some(report) = report
            && let Some(kept) = &report.preserved
        {
            let reason = report.preserved_reason.as_deref().unwrap_or("unknown");
            next.push(format!(
                "# {}: WORK NOT ON ITS BRANCH, kept in its worktree at {}: {}",
                task.id,
                relative(ctx, kept),
                sanitize_lines(reason, "  #   ")
            ));
            if manifest.status.is_finished() && task.status != TaskStatus::Waiting {
                next.push(format!(
                    "crew runs clean {}   # once that is fixed: saves {}'s work on its branch, then removes the run",
                    manifest.run_id, task.id
                ));
            }
        }
        let preserved_reason = report
            .and_then(|report| report.preserved_reason.as_deref())
            .map(|reason| format!("teardown: {reason}"));
        if let Some(usage) = &task.usage {
            next.push(format!("# {}: {usage}", task.id));
        }
        for warning in &task.warnings {
            if Some(warning) == preserved_reason.as_ref() {
                continue;
            }
            next.push(format!(
                "# {}: {}",
                task.id,
                sanitize_lines(warning, "  #   ")
            ));
        }
    }
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
    if let Some((branch, moved)) = base_movement(ctx, manifest) {
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

/// How far the branch the run started from moved on since, when it did and the project wants
/// to hear it (`[run] base_moved`).
pub fn base_movement(
    ctx: &Context,
    manifest: &RunManifest,
) -> Option<(String, crew_worktree::leader::BaseMovement)> {
    if ctx.config().run.base_moved == crew_core::config::BaseMoved::Off {
        return None;
    }
    let branch = manifest.base_branch.as_ref()?;
    let moved = crew_worktree::leader::base_movement(
        ctx.workspace().repo_root()?,
        manifest.base.as_deref()?,
        branch,
    )?;
    (moved.gained > 0 || moved.diverged).then(|| (branch.clone(), moved))
}

/// The run's task branches that would conflict with each other or with the branch it started
/// from (the conflict radar); none when that cannot be read.
fn overlaps(ctx: &Context, manifest: &RunManifest) -> Vec<crew_worktree::radar::Overlap> {
    ctx.workspace()
        .repo_root()
        .and_then(|repo_root| crate::commands::conflicts::run_overlaps(repo_root, manifest).ok())
        .unwrap_or_default()
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
