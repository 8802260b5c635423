//! What the summary says under its table of each task: the commands to inspect, compare, merge
//! or answer it, and where its work is when not on its branch, what it was refused, what its
//! agent changed that it should not have.

use crew_core::TaskId;
use crew_core::config::WorkspaceMode;
use crew_core::model::{RunManifest, TaskRecord, TaskStatus};
use crew_core::provider::TeardownReport;

use super::{SummaryFor, bytes, indent_tail, relative};
use crate::context::Context;
use crate::ui::{sanitize, sanitize_lines};

/// The lines about `task` (its `branch`, as its row shows it); `compared` holds the tasks whose
/// attempts were compared already.
pub(super) fn task_notes(
    ctx: &Context,
    manifest: &RunManifest,
    task: &TaskRecord,
    reader: SummaryFor,
    branch: Option<&String>,
    compared: &mut Vec<TaskId>,
) -> Vec<String> {
    let mut next = Vec::new();
    let report = task.teardown.as_ref();
    let findings = report.map_or(&[][..], |report| &report.security[..]);
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
    if let Some(requests) = task
        .requests
        .filter(|requests| requests.allowed > 0 || requests.refused > 0)
    {
        next.push(format!(
            "# {}: network through crew's proxy: {} request(s) let through, {} refused (`crew events --run {}` names each)",
            task.id, requests.allowed, requests.refused, manifest.run_id
        ));
    }
    // What its caps' cgroup measured, against the caps.
    if let Some(used) = task.used.filter(|_| reader == SummaryFor::Review) {
        let caps = if task.resources.is_empty() {
            String::new()
        } else {
            format!(" (caps: {})", task.resources.shown())
        };
        next.push(format!(
            "# {}: used {} MiB of memory at most, {:.1} s of CPU{caps}",
            task.id,
            used.peak_memory >> 20,
            used.cpu_ms as f64 / 1000.0
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
    next
}
