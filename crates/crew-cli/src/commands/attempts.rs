//! Best of N: `crew compare` (a task's attempts side by side) and `crew pick` (one kept as the
//! task's result, the others' branches deleted when they hold nothing else).

use camino::Utf8Path;
use crew_core::model::{RunManifest, TaskRecord};
use crew_core::{StateStore, TaskId};
use crew_worktree::inspect::{BranchDrop, branch_files, drop_branch};

use crate::context::Context;
use crate::summary::check_cell;
use crate::ui::{Table, Ui, between, cell, duration, sanitize, styled, task_style, truncate};
use crate::{CliError, Outcome};

/// A task's attempts side by side: status, files, lines, check, cost.
///
/// For a task run several times (`crew run --attempts N`, `attempts = N` in a team): what
/// each attempt changed, whether its check passed, what it cost, and which files each one
/// touched. Keep one with `crew pick`.
#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// The task (`<run>:<task>`, `<runPrefix>:<task>`, `<task>`), named without the attempt.
    pub task: String,
    /// `{run_id, task, prompt, attempts: [{number, task_id, status, branch, files, insertions,
    /// deletions, check, usage, picked}]}`.
    #[arg(long)]
    pub json: bool,
}

/// Keep one attempt as the task's result; delete the other attempts' branches.
///
/// A branch is deleted only when it still ends where its attempt left it and no worktree
/// holds it: anything committed on it since is kept, and crew says so. `crew land` of the run
/// then lands the picked attempt.
#[derive(Debug, clap::Args)]
pub struct PickArgs {
    /// The task (`<run>:<task>`, `<runPrefix>:<task>`, `<task>`), named without the attempt.
    pub task: String,
    /// The attempt to keep: its number (`2` for `<task>.2`).
    pub attempt: u32,
    /// Keep it even though its check failed.
    #[arg(long)]
    pub force: bool,
}

/// One attempt as `compare` shows it.
struct Attempt<'a> {
    record: &'a TaskRecord,
    number: u32,
    picked: bool,
    branch: Option<String>,
    files: Vec<(String, usize, usize)>,
}

impl Attempt<'_> {
    fn lines(&self) -> (usize, usize) {
        self.files
            .iter()
            .fold((0, 0), |(added, removed), (_, a, r)| {
                (added + a, removed + r)
            })
    }
}

pub async fn cmd_compare(args: CompareArgs, ui: Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    let repo_root = repo_root(&ctx)?;
    let (manifest, task) = find(&ctx, &args.task)?;
    let mut attempts = Vec::new();
    for record in manifest.attempts_of(&task) {
        let attempt = record.attempt_of.as_ref().expect("an attempt");
        let files = match record.work_range() {
            Some((base, branch)) => branch_files(repo_root, &base, &branch)?,
            None => Vec::new(),
        };
        attempts.push(Attempt {
            record,
            number: attempt.number,
            picked: attempt.picked,
            branch: record.work_range().map(|(_, branch)| branch),
            files,
        });
    }
    let spec = format!("{}:{task}", manifest.run_id);
    if args.json {
        let value = serde_json::json!({
            "run_id": manifest.run_id,
            "task": task,
            "prompt": attempts.first().map(|attempt| attempt.record.prompt.clone()),
            "attempts": attempts.iter().map(|attempt| {
                let (insertions, deletions) = attempt.lines();
                serde_json::json!({
                    "number": attempt.number,
                    "task_id": attempt.record.id,
                    "status": attempt.record.status,
                    "branch": attempt.branch,
                    "files": attempt.files.iter().map(|(path, added, removed)| serde_json::json!({
                        "path": path, "insertions": added, "deletions": removed,
                    })).collect::<Vec<_>>(),
                    "insertions": insertions,
                    "deletions": deletions,
                    "check": attempt.record.check,
                    "usage": attempt.record.usage,
                    "picked": attempt.picked,
                })
            }).collect::<Vec<_>>(),
        });
        say!("{value:#}");
        return Ok(Outcome::Success);
    }
    // The prompt's first line with words on it, shortened: enough to know which task it is.
    let prompt = attempts
        .first()
        .and_then(|attempt| {
            attempt
                .record
                .prompt
                .lines()
                .find(|line| !line.trim().is_empty())
        })
        .map(|line| truncate(&sanitize(line.trim()), 60))
        .unwrap_or_default();
    say!("{spec}: {} attempts of {prompt:?}\n", attempts.len());
    let mut table = Table::new(&[
        "ATTEMPT", "STATUS", "FILES", "+/-", "CHECK", "COST", "DURATION", "BRANCH",
    ]);
    for attempt in &attempts {
        let record = attempt.record;
        let (added, removed) = attempt.lines();
        let marker = if attempt.picked { " (picked)" } else { "" };
        table.row(vec![
            cell(format!("{}{marker}", attempt.number)),
            styled(record.status.as_str(), task_style(record.status)),
            cell(attempt.files.len().to_string()),
            cell(if attempt.branch.is_some() {
                format!("+{added} -{removed}")
            } else {
                "-".to_owned()
            }),
            record.check.as_ref().map_or_else(|| cell("-"), check_cell),
            cell(
                record
                    .usage
                    .and_then(|usage| usage.cost_usd)
                    .map_or_else(|| "-".to_owned(), |cost| format!("${cost:.2}")),
            ),
            cell(
                between(record.started_at, record.finished_at)
                    .filter(|_| record.started_at.is_some())
                    .map_or_else(|| "-".to_owned(), duration),
            ),
            cell(attempt.branch.clone().unwrap_or_else(|| "-".to_owned())),
        ]);
    }
    say!(no_newline: "{}", table.render(&ctx.ui));
    let mut paths: Vec<&str> = attempts
        .iter()
        .flat_map(|attempt| attempt.files.iter().map(|(path, _, _)| path.as_str()))
        .collect();
    paths.sort_unstable();
    paths.dedup();
    if !paths.is_empty() {
        let numbers: Vec<String> = attempts
            .iter()
            .map(|attempt| attempt.number.to_string())
            .collect();
        let mut header = vec!["FILE"];
        header.extend(numbers.iter().map(String::as_str));
        let mut files = Table::new(&header);
        for path in paths {
            let mut row = vec![cell(sanitize(path))];
            for attempt in &attempts {
                row.push(cell(
                    attempt
                        .files
                        .iter()
                        .find(|(other, _, _)| other == path)
                        .map_or_else(
                            || "·".to_owned(),
                            |(_, added, removed)| format!("+{added} -{removed}"),
                        ),
                ));
            }
            files.row(row);
        }
        say!(no_newline: "\n{}", files.render(&ctx.ui));
    }
    let failed: Vec<String> = attempts
        .iter()
        .filter_map(|attempt| {
            let check = attempt.record.check.as_ref()?;
            let last = check.output_tail.lines().last()?;
            (check.passed == Some(false)).then(|| {
                format!(
                    "{}: check {}: {}",
                    attempt.record.id,
                    check.verdict(),
                    sanitize(last)
                )
            })
        })
        .collect();
    if !failed.is_empty() {
        say!("\n{}", failed.join("\n"));
    }
    if !attempts.iter().any(|attempt| attempt.picked) {
        say!(
            "\nsee one: crew diff {}.<N>; keep one: crew pick {spec} <N>",
            spec
        );
    }
    Ok(Outcome::Success)
}

pub async fn cmd_pick(args: PickArgs, ui: Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    let repo_root = repo_root(&ctx)?.to_owned();
    let (manifest, task) = find(&ctx, &args.task)?;
    let spec = format!("{}:{task}", manifest.run_id);
    let attempts = manifest.attempts_of(&task);
    let Some(chosen) = attempts.iter().find(|record| {
        record
            .attempt_of
            .as_ref()
            .is_some_and(|a| a.number == args.attempt)
    }) else {
        return Err(CliError::user(format!(
            "{spec} has no attempt {}: it ran attempts 1 to {}",
            args.attempt,
            attempts.len()
        ))
        .with_hint(format!("`crew compare {spec}` shows them")));
    };
    if let Some(busy) = attempts.iter().find(|record| !record.status.is_finished()) {
        return Err(CliError::user(format!(
            "attempt {} of {spec} is still {}: pick once every attempt has ended",
            busy.id, busy.status
        ))
        .with_hint(format!(
            "wait for it, or stop it: crew agents stop {}:{}",
            manifest.run_id, busy.id
        )));
    }
    if let Some(earlier) = attempts
        .iter()
        .find(|record| record.attempt_of.as_ref().is_some_and(|a| a.picked))
    {
        if earlier.id == chosen.id {
            if !ctx.ui.quiet {
                say!("{} is {task}'s result already", chosen.id);
            }
            return Ok(Outcome::Success);
        }
        return Err(CliError::user(format!(
            "{spec} has a result already: attempt {} was picked",
            earlier.id
        )));
    }
    if let Some(check) = chosen
        .check
        .as_ref()
        .filter(|check| check.passed == Some(false))
        && !args.force
    {
        return Err(CliError::user(format!(
            "attempt {} did not pass its check ({}: {}): keeping it would make work that fails the task's result",
            chosen.id,
            check.command,
            check.verdict()
        ))
        .with_hint(format!(
            "`crew compare {spec}` shows which attempts passed; `crew pick {spec} {} --force` keeps this one all the same",
            args.attempt
        )));
    }
    let Some((_, chosen_branch)) = chosen.work_range() else {
        return Err(CliError::user(format!(
            "attempt {} ({}) left no work on a branch: there is nothing to keep",
            chosen.id, chosen.status
        ))
        .with_hint(format!(
            "`crew compare {spec}` shows which attempts have work"
        )));
    };
    let mut dropped = Vec::new();
    let mut kept = Vec::new();
    for other in attempts.iter().filter(|record| record.id != chosen.id) {
        let Some((_, branch)) = other.work_range() else {
            continue;
        };
        match drop_attempt(&repo_root, other, &branch) {
            Ok(()) => dropped.push((other.id.clone(), branch)),
            Err(why) => kept.push((branch, why)),
        }
    }
    record_pick(ctx.store(), &manifest, &chosen.id, &dropped)?;
    if !ctx.ui.quiet {
        say!("picked {}: {task}'s result is {chosen_branch}", chosen.id);
        if !dropped.is_empty() {
            let names: Vec<&str> = dropped.iter().map(|(_, branch)| branch.as_str()).collect();
            say!("deleted {}", names.join(", "));
        }
        for (branch, why) in &kept {
            say!(
                "{}",
                ctx.ui
                    .paint(&format!("kept {branch}: {why}"), crate::ui::Style::Warn)
            );
        }
        say!("land it: crew land {}", manifest.run_id);
    }
    Ok(Outcome::Success)
}

/// Deletes an attempt's branch when it holds nothing but the attempt's work; otherwise says
/// why it stays.
fn drop_attempt(repo_root: &Utf8Path, record: &TaskRecord, branch: &str) -> Result<(), String> {
    if !record.work_is_saved() {
        return Err("its workspace still holds work of its own; `crew runs clean` saves it on the branch first".to_owned());
    }
    let Some(tip) = record
        .teardown
        .as_ref()
        .and_then(|report| report.tip.clone())
    else {
        return Err("crew did not record where the attempt left it, so cannot tell whether it holds more; delete it yourself once you know (git branch -D)".to_owned());
    };
    match drop_branch(repo_root, branch, &tip) {
        BranchDrop::Deleted | BranchDrop::Missing => Ok(()),
        BranchDrop::Moved { tip: now } => Err(format!(
            "it holds commits the attempt did not make (it ends at {} now, not {}); delete it yourself when you no longer need them (git branch -D {branch})",
            &now[..now.len().min(12)],
            &tip[..tip.len().min(12)]
        )),
        BranchDrop::Refused { message } => Err(format!("git would not delete it: {message}")),
    }
}

/// Records the pick: the chosen attempt is the task's result; the dropped ones' branches are
/// gone (so that nothing lists them as unmerged work).
fn record_pick(
    store: &StateStore,
    manifest: &RunManifest,
    chosen: &TaskId,
    dropped: &[(TaskId, String)],
) -> Result<(), CliError> {
    store.update_run(&manifest.run_id, |manifest| {
        if let Some(attempt) = manifest.task_mut(chosen)?.attempt_of.as_mut() {
            attempt.picked = true;
        }
        for (task, branch) in dropped {
            let record = manifest.task_mut(task)?;
            if let Some(report) = record.teardown.as_mut() {
                report.branch = None;
                report.merge_hint = None;
                report.branch_deleted = true;
            }
            record.warnings.push(format!(
                "its branch {branch} was deleted when {chosen} was picked"
            ));
        }
        Ok(())
    })?;
    Ok(())
}

fn repo_root(ctx: &Context) -> Result<&Utf8Path, CliError> {
    ctx.workspace().repo_root().ok_or_else(|| {
        CliError::user("this workspace is not in a git repository: its tasks have no branches")
    })
}

/// The run and task with attempts `spec` names.
fn find(ctx: &Context, spec: &str) -> Result<(RunManifest, TaskId), CliError> {
    if let Some(found) = ctx.project().find_attempted(spec)? {
        return Ok(found);
    }
    if let Some((manifest, task)) = ctx.project().find_task(spec)? {
        let hint = match manifest
            .task(&task)
            .and_then(|record| record.attempt_of.as_ref())
        {
            Some(attempt) => format!(
                "name the task, not the attempt: {}:{}",
                manifest.run_id, attempt.task
            ),
            None => format!("`crew diff {}:{task}` shows its work", manifest.run_id),
        };
        return Err(CliError::user(format!(
            "task {}:{task} is not a task with attempts",
            manifest.run_id
        ))
        .with_hint(hint));
    }
    Err(CliError::user(format!(
        "no task with attempts named {spec:?} in this workspace"
    ))
    .with_hint("`crew run --attempts N` runs each task N times; `crew runs list` shows the runs"))
}
