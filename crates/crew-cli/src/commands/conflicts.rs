//! `crew conflicts`

use crate::context::Context;
use crate::ui::{Ui, sanitize};
use crate::{CliError, Outcome};

/// Which task branches of a run would conflict, and in which files.
///
/// With each other, and with the branch the run started from. The branches are merged in memory: nothing is checked out and no branch moves. Without a
/// run, the newest run of this workspace.
#[derive(Debug, clap::Args)]
pub struct ConflictsArgs {
    /// The run id, or a unique prefix of it.
    pub run: Option<String>,
    /// `{run_id, target, branches, overlaps: [{left, right, files}]}`.
    #[arg(long)]
    pub json: bool,
}

pub async fn cmd_conflicts(args: ConflictsArgs, ui: Ui) -> Result<Outcome, CliError> {
    let ctx = Context::discover(ui)?;
    let repo_root = ctx.workspace().repo_root().ok_or_else(|| {
        CliError::user("this workspace is not in a git repository: its tasks have no branches")
    })?;
    let run_id = match &args.run {
        Some(prefix) => ctx.resolve_run(prefix)?,
        None => ctx
            .store()
            .run_ids()?
            .into_iter()
            .next()
            .ok_or_else(|| CliError::user("this workspace has no runs yet"))?,
    };
    let manifest = ctx.read_run(&run_id)?;
    let (branches, _) = radar_sides(&manifest);
    let target = manifest.base_branch.as_deref();
    let overlaps = run_overlaps(repo_root, &manifest)?;
    if args.json {
        let value = serde_json::json!({
            "run_id": run_id,
            "target": target,
            "branches": branches.iter().map(|(task, branch)| serde_json::json!({ "task": task, "branch": branch })).collect::<Vec<_>>(),
            "overlaps": overlaps,
        });
        say!("{value:#}");
        return Ok(Outcome::Success);
    }
    if overlaps.is_empty() {
        let against = target
            .map(|target| format!(" and {target}"))
            .unwrap_or_default();
        say!(
            "no conflicts among the {} task branch(es) of run {run_id}{against}",
            branches.len()
        );
        return Ok(Outcome::Success);
    }
    for overlap in &overlaps {
        say!(
            "{} ↔ {}: {}",
            overlap.left,
            overlap.right,
            sanitize(&overlap.files.join(", "))
        );
    }
    Ok(Outcome::Success)
}

/// A running task's branch and its worktree.
type Working = (String, camino::Utf8PathBuf);

/// The task branches of a run the radar reads, `(task, branch)`, and of those, the branches of
/// tasks still at work with their worktrees: read as each stands, what its agent committed so
/// far (in the agent's own git directory) and what it has not committed yet.
fn radar_sides(manifest: &crew_core::RunManifest) -> (Vec<(String, String)>, Vec<Working>) {
    let mut branches = manifest.task_branches();
    let mut working = Vec::new();
    for task in &manifest.tasks {
        if task.teardown.is_none()
            && let Some(workspace) = task.workspace.as_ref()
            && let Some(branch) = workspace.branch.clone()
        {
            if workspace.kind == crew_core::provider::WorkspaceKind::Worktree {
                working.push((branch.clone(), workspace.root.clone()));
            }
            if !branches.iter().any(|(id, _)| id == task.id.as_str()) {
                branches.push((task.id.to_string(), branch));
            }
        }
    }
    (branches, working)
}

/// The overlaps among a run's task branches (a running task's as its worktree stands, see
/// [`radar_sides`]) and with the branch it started from, without those between attempts of one task:
/// alternatives, of which only one lands.
pub fn run_overlaps(
    repo_root: &camino::Utf8Path,
    manifest: &crew_core::RunManifest,
) -> Result<Vec<crew_worktree::radar::Overlap>, CliError> {
    let (branches, working) = radar_sides(manifest);
    if branches.is_empty() {
        return Ok(Vec::new());
    }
    Ok(crew_worktree::radar::overlaps(
        repo_root,
        &branches,
        &working,
        manifest.base_branch.as_deref(),
    )?
    .into_iter()
    .filter(|overlap| !manifest.rivals(&overlap.left, &overlap.right))
    .collect())
}
