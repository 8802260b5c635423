//! `crew runs clean`

use crew_core::model::{RunManifest, TaskStatus};
use crew_core::provider::{TaskWorkspace, TeardownRequest, WorkspaceKind, WorkspaceProvider};
use crew_worktree::CrewWorkspaces;

use crate::context::Context;
use crate::{CliError, Outcome};

/// Remove a finished run: the workspaces it still keeps, then its state.
///
/// Workspaces kept for a question never answered, preserved by a teardown, or never torn down
/// (a run whose host died) are torn down the careful way first: their work is committed to the task branch, which is kept. A
/// workspace that still cannot be removed safely keeps the run, unless --force. Branches are
/// never deleted here.
#[derive(Debug, clap::Args)]
pub struct CleanArgs {
    /// The run id, or a unique prefix of it.
    pub run: String,
    /// Show what would be done, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Remove the run's state even when one of its workspaces had to be kept, and its
    /// dedicated workspaces with their files.
    #[arg(long)]
    pub force: bool,
}

#[allow(clippy::print_stdout)]
pub async fn cmd_runs_clean(args: CleanArgs, ui: crate::ui::Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    ctx.reconcile()?;
    let run_id = ctx.resolve_run(&args.run)?;
    let manifest = match ctx.read_run(&run_id) {
        Ok(manifest) => manifest,
        Err(_) if never_written(&ctx, &run_id) => return clean_unwritten(&ctx, &run_id, &args),
        Err(error) => return Err(error),
    };
    if manifest.schema_version > crew_core::model::MANIFEST_SCHEMA_VERSION {
        return Err(CliError::user(format!(
            "run {run_id} was written by a newer crew (schema version {}); this crew leaves it as it is",
            manifest.schema_version
        ))
        .with_hint("clean it with the crew that made it"));
    }
    if !manifest.status.is_finished() {
        return Err(CliError::user(format!("run {run_id} is still running"))
            .with_hint(format!("cancel it first: `crew runs cancel {run_id}`")));
    }
    let provider = CrewWorkspaces::new(ctx.config());
    let mut kept = Vec::new();
    for (task, workspace) in kept_workspaces(&manifest) {
        if args.dry_run {
            println!("would tear down {} ({})", workspace.root, task);
            continue;
        }
        let request = TeardownRequest {
            workspace: ctx.workspace().id().clone(),
            repo_root: ctx.workspace().repo_root().map(Into::into),
            run_id: run_id.clone(),
            task_id: task.clone(),
            agent_alive: false,
            keep: false,
        };
        let provider = provider.clone();
        let kind = workspace.kind;
        let result =
            tokio::task::spawn_blocking(move || provider.teardown(&workspace, &request)).await?;
        match result {
            Ok(report) => {
                // Said even when quiet: the run's state, where the record would be, goes.
                for finding in &report.security {
                    println!(
                        "{task}: SECURITY: the agent {} {} ({})",
                        finding.change,
                        finding.path,
                        if finding.restored {
                            "put back, or never reached the repository"
                        } else {
                            "could not be put back"
                        }
                    );
                }
                if !ui.quiet {
                    match (&report.branch, kind) {
                        (Some(branch), WorkspaceKind::Single) => {
                            println!("{task}: its commits saved on {branch}")
                        }
                        (None, WorkspaceKind::Single) => {
                            println!("{task}: its git work taken into the repository")
                        }
                        (Some(branch), _) => {
                            println!("{task}: work saved on {branch}; workspace removed")
                        }
                        (None, _) => println!("{task}: workspace removed"),
                    }
                }
            }
            Err(error) => {
                println!(
                    "{task}: kept — {} (as recorded in {})",
                    error.message,
                    ctx.store().manifest_path(&run_id)
                );
                kept.push(task);
            }
        }
    }
    // A dedicated workspace is the only copy of its task's work (it has no branch).
    let dedicated: Vec<String> = manifest
        .tasks
        .iter()
        .filter(|task| task.workspace_mode == crew_core::config::WorkspaceMode::Dedicated)
        .map(|task| ctx.store().dedicated_dir(&run_id, &task.id))
        .filter(|dir| {
            dir.symlink_metadata()
                .is_ok_and(|metadata| metadata.is_dir())
                && dir
                    .read_dir_utf8()
                    .is_ok_and(|mut entries| entries.next().is_some())
        })
        .map(|dir| dir.to_string())
        .collect();
    if !dedicated.is_empty() && !args.force {
        return Err(CliError::user(format!(
            "run {run_id} holds the only copy of its dedicated tasks' work, which has no branch: {}",
            dedicated.join(", ")
        ))
        .with_hint(format!(
            "copy out what you want to keep, then `crew runs clean {run_id} --force` removes it with the run"
        )));
    }
    if args.dry_run {
        println!("would remove the state of run {run_id}");
        return Ok(Outcome::Success);
    }
    if !kept.is_empty() && !args.force {
        return Err(CliError::user(format!(
            "run {run_id} keeps {} workspace(s) that could not be removed safely",
            kept.len()
        ))
        .with_hint("see `crew worktrees list`; `--force` removes the run's state anyway (the workspaces stay)"));
    }
    ctx.store().remove_run(&run_id)?;
    if !ui.quiet {
        println!("removed run {run_id}");
    }
    Ok(Outcome::Success)
}

/// How long a run directory may be without its manifest while the run is being made (they are
/// written one right after the other): an older one is a run whose creation was interrupted.
const BEING_MADE: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether the run's directory is there and its manifest never was.
pub(super) fn never_written(ctx: &Context, run_id: &crew_core::RunId) -> bool {
    let missing = |path: &camino::Utf8Path| {
        path.symlink_metadata()
            .is_err_and(|error| error.kind() == std::io::ErrorKind::NotFound)
    };
    ctx.store()
        .run_dir(run_id)
        .symlink_metadata()
        .is_ok_and(|metadata| metadata.is_dir())
        && missing(&ctx.store().manifest_path(run_id))
}

/// Removes a run whose creation was interrupted between its directory and its manifest: no
/// task of it ever started, so it holds no work and no workspace.
#[allow(clippy::print_stdout)]
fn clean_unwritten(
    ctx: &Context,
    run_id: &crew_core::RunId,
    args: &CleanArgs,
) -> Result<Outcome, CliError> {
    let age = ctx
        .store()
        .run_dir(run_id)
        .symlink_metadata()
        .and_then(|metadata| metadata.modified())
        .ok()
        .and_then(|modified| modified.elapsed().ok())
        .unwrap_or_default();
    if age < BEING_MADE {
        return Err(CliError::user(format!(
            "run {run_id} has no manifest yet: it may be being made right now"
        ))
        .with_hint("try again in a few seconds"));
    }
    if args.dry_run {
        println!(
            "would remove run {run_id}, which was never written (its creation was interrupted)"
        );
        return Ok(Outcome::Success);
    }
    ctx.store().remove_run(run_id)?;
    if !ctx.ui.quiet {
        println!("removed run {run_id}, which was never written (its creation was interrupted)");
    }
    Ok(Outcome::Success)
}

/// The workspaces a finished run still keeps: worktrees and temp dirs of waiting tasks, those
/// a teardown preserved, and those never torn down (an interrupted run's); and the `single`
/// tasks never torn down (their agents' commits are in their views of the git directory, and
/// the tripwire's copy is checked).
fn kept_workspaces(manifest: &RunManifest) -> Vec<(crew_core::TaskId, TaskWorkspace)> {
    manifest
        .tasks
        .iter()
        .filter_map(|task| {
            let record = task.workspace.as_ref()?;
            if record.kind == WorkspaceKind::Single {
                let untorn = task.teardown.is_none() || task.status == TaskStatus::Waiting;
                return untorn.then(|| (task.id.clone(), record.to_task_workspace()));
            }
            if !matches!(record.kind, WorkspaceKind::Worktree | WorkspaceKind::Temp) {
                return None;
            }
            let preserved = task
                .teardown
                .as_ref()
                .is_some_and(|report| report.preserved.is_some());
            let waiting = task.status == TaskStatus::Waiting;
            // Never torn down: its host died with it (the run was interrupted). Its work is in
            // the workspace, and perhaps nowhere else.
            let untorn = task.teardown.is_none();
            let root = if record.root.as_str().is_empty() {
                record.dir.clone()
            } else {
                record.root.clone()
            };
            ((preserved || waiting || untorn) && root.exists()).then(|| {
                (
                    task.id.clone(),
                    TaskWorkspace {
                        root,
                        reused: true,
                        ..record.to_task_workspace()
                    },
                )
            })
        })
        .collect()
}
