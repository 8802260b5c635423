//! `crew land`

use crew_core::TaskId;
use crew_core::model::RunManifest;
use crew_worktree::land::{LandError, LandMode, Landing};

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

#[allow(clippy::print_stdout)]
pub async fn cmd_land(args: LandArgs, ui: Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    let mode = if args.squash {
        LandMode::Squash
    } else if args.rebase {
        LandMode::Rebase
    } else {
        LandMode::Merge
    };
    let landed = land_targets(&ctx, &args.targets, args.into.as_deref(), mode, args.force)?;
    if !ctx.ui.quiet {
        let (names, into) = (landed.tasks.join(", "), &landed.into);
        if landed.from == landed.to {
            println!("nothing to land on {into}: {names} already there");
        } else {
            println!(
                "landed {names} on {into}: {}..{}",
                &landed.from[..12],
                &landed.to[..12]
            );
            if landed.checkout_updated {
                println!("your checkout of {into} is up to date");
            }
            if !landed.checks.is_empty() {
                println!("checks: {}", landed.checks.join(", "));
            }
        }
    }
    Ok(Outcome::Success)
}

/// What a landing did.
#[derive(Debug, Clone)]
pub struct Landed {
    /// The branch the tasks landed on.
    pub into: String,
    /// The tasks, in the order they landed.
    pub tasks: Vec<String>,
    /// The check of each landed task that has one: `fix.2 passed`, `docs failed (exit 1)`.
    pub checks: Vec<String>,
    /// The target's commit before and after (equal when everything was already there).
    pub from: String,
    pub to: String,
    /// The user's checkout of the target was brought up to date.
    pub checkout_updated: bool,
}

/// Lands what `targets` name (tasks, or one run's tasks with work) on `into` (default: the
/// branch the run started from): all of them, or none. A task whose check failed is refused
/// unless `force`. `crew land` and the MCP `land` tool.
pub fn land_targets(
    ctx: &Context,
    targets: &[String],
    into: Option<&str>,
    mode: LandMode,
    force: bool,
) -> Result<Landed, CliError> {
    let repo_root = ctx.workspace().repo_root().ok_or_else(|| {
        CliError::user("this workspace is not in a git repository: its tasks have no branches")
    })?;
    let picked = pick(ctx, targets)?;
    let failed: Vec<String> = picked
        .iter()
        .filter_map(|(manifest, id)| {
            let check = manifest.task(id)?.check.as_ref()?;
            (check.passed == Some(false)).then(|| format!("{id} ({})", check.verdict()))
        })
        .collect();
    if !failed.is_empty() && !force {
        return Err(CliError::user(format!(
            "the check of {} failed: landing would bring in work that does not pass it; nothing was landed",
            failed.join(", ")
        ))
        .with_hint(
            "`crew runs show <run>` shows each check's output; land with --force to take the work all the same",
        ));
    }
    let several = picked.len() > 1;
    let into = match into {
        Some(branch) => branch.to_owned(),
        None => picked
            .first()
            .and_then(|(manifest, _)| manifest.base_branch.clone())
            .ok_or_else(|| {
                CliError::user("the run started from no branch: name one with --into BRANCH")
            })?,
    };
    let mut landings = Vec::new();
    for (manifest, task_id) in &picked {
        let task = manifest.task(task_id).expect("picked from this manifest");
        let Some((_, branch)) = task.work_range() else {
            return Err(CliError::user(format!(
                "task {}:{task_id} has no branch with work (it is {})",
                manifest.run_id, task.status
            )));
        };
        let prefix = &ctx.config().worktree.branch_prefix;
        landings.push(Landing {
            name: task_id.to_string(),
            branch,
            conflict_branch: Some(format!("{prefix}/conflict/{}-{task_id}", manifest.run_id)),
        });
    }
    let landed = crew_worktree::land::land(repo_root, &into, &landings, mode).map_err(|error| {
        let hint = match &error {
            LandError::Conflict {
                task,
                files,
                both_sides: Some(both),
                ..
            } => {
                let agent = picked
                    .iter()
                    .find_map(|(manifest, id)| {
                        (id.as_str() == task).then(|| manifest.task(id).map(|task| task.agent.clone()))
                    })
                    .flatten();
                let others = if several {
                    format!("; or land the others without {task}")
                } else {
                    String::new()
                };
                let files = files.join(", ");
                // A model is asked in words; the shell agent runs its prompt as a script.
                Some(match agent.as_deref() {
                    Some(agent) if agent != "shell" => format!(
                        "both sides are on {both}, with conflict markers in {files}; hand them to an agent: crew run --agent {agent} --workspace-mode worktree --base {both} \"Resolve the conflict markers in {files}, keeping what both sides meant, and remove the markers\", then `crew land <that run> --into {into}` in place of {task}{others}"
                    ),
                    _ => format!(
                        "both sides are on {both}, with conflict markers in {files}: resolve them there (`git switch {both}`, edit, commit), then `git merge {both}` into {into} in place of {task}{others}"
                    ),
                })
            }
            LandError::Conflict { task, .. } if several => Some(format!(
                "land the others without {task}, or bring {task}'s branch up to date with {into} first (`crew diff {task}` shows its work)"
            )),
            LandError::Conflict { task, .. } => Some(format!(
                "bring {task}'s branch up to date with {into} first (`crew diff {task}` shows its work)"
            )),
            LandError::DirtyCheckout { .. } => Some(format!(
                "commit or stash your changes, or land into another branch: crew land … --into <branch>, then merge it into {into} yourself"
            )),
            _ => None,
        };
        CliError::user(error).with_hints(hint)
    })?;
    let checks = picked
        .iter()
        .filter_map(|(manifest, id)| {
            let check = manifest.task(id)?.check.as_ref()?;
            Some(format!("{id} {}", check.verdict()))
        })
        .collect();
    Ok(Landed {
        into,
        checks,
        tasks: landings.into_iter().map(|landing| landing.name).collect(),
        from: landed.from,
        to: landed.to,
        checkout_updated: landed.checkout_updated,
    })
}

/// The attempt of `task` that was picked as its result; until one is, the task has no result
/// to land. `then` is what the user goes on to do once one is picked (`land again`).
pub fn picked_attempt(
    manifest: &RunManifest,
    task: &TaskId,
    then: &str,
) -> Result<TaskId, CliError> {
    let attempts = manifest.attempts_of(task);
    attempts
        .iter()
        .find(|record| record.attempt_of.as_ref().is_some_and(|a| a.picked))
        .map(|record| record.id.clone())
        .ok_or_else(|| {
            let spec = format!("{}:{task}", manifest.run_id);
            CliError::user(format!(
                "task {spec} ran {} attempts and none is picked yet as its result",
                attempts.len()
            ))
            .with_hint(format!(
                "compare them (`crew compare {spec}`), keep one (`crew pick {spec} <N>`), then {then}"
            ))
        })
}

/// The tasks the arguments name, in dependency order: a run's tasks with work, or each task.
fn pick(ctx: &Context, targets: &[String]) -> Result<Vec<(RunManifest, TaskId)>, CliError> {
    let project = ctx.project();
    let mut picked: Vec<(RunManifest, TaskId)> = Vec::new();
    for target in targets {
        if let Some(found) = project.find_task(target)? {
            picked.push(found);
        } else if let Some((manifest, task)) = project.find_attempted(target)? {
            let result = picked_attempt(&manifest, &task, "land again")?;
            picked.push((manifest, result));
        } else {
            let manifest = ctx.read_run(&ctx.resolve_run(target)?)?;
            let mut results = Vec::new();
            for task in &manifest.tasks {
                match &task.attempt_of {
                    Some(attempt) => {
                        let result = picked_attempt(&manifest, &attempt.task, "land again")?;
                        if !results.contains(&result) {
                            results.push(result);
                        }
                    }
                    None if task.work_range().is_some() => results.push(task.id.clone()),
                    None => {}
                }
            }
            picked.extend(results.into_iter().map(|task| (manifest.clone(), task)));
        }
    }
    // A task after those it depends on (stable otherwise).
    let mut ordered: Vec<(RunManifest, TaskId)> = Vec::new();
    while !picked.is_empty() {
        let ready = picked
            .iter()
            .position(|(manifest, id)| {
                let depends_on = manifest
                    .task(id)
                    .map(|task| task.depends_on.clone())
                    .unwrap_or_default();
                depends_on.iter().all(|dep| {
                    !picked
                        .iter()
                        .any(|(other, other_id)| other.run_id == manifest.run_id && other_id == dep)
                })
            })
            .unwrap_or(0);
        ordered.push(picked.remove(ready));
    }
    Ok(ordered)
}
